"""RunLog: the sinks ``train.log`` names — ``metrics.jsonl`` always, TensorBoard on request.

``train()`` writes every metrics line, resume truncation and checkpoint event through one
``RunLog``; only rank 0 writes (the others hold a no-op). See ``headwise.training.tensorboard``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import torch
from torch import nn

from headwise.data import Mixture
from headwise.training.config import TrainConfig
from headwise.training.metrics import MetricsWriter

TENSORBOARD_DIR = "tensorboard"
Figures = Mapping[str, Callable[[nn.Module, Any], bytes]]  # tag -> fn(model, batch) -> PNG


class RunLog:
    """``metrics.jsonl`` plus, with ``"tensorboard" in config.log``, TensorBoard event files.

    Args:
        out_dir: the run directory (``None``: nothing is written).
        enabled: whether this process writes (rank 0).
        config: the run's config (``log``, and the evaluation seed for the heatmap's batch).
        eval_data: the held-out mixture whose first batch the figures are drawn on.
        figures: images logged at checkpoints (``train(figures=...)``).
    """

    def __init__(self, out_dir: Path | None, enabled: bool, config: TrainConfig,
                 eval_data: Mixture, figures: Figures) -> None:
        self.jsonl = MetricsWriter(out_dir, enabled)
        self.tensorboard = None
        if out_dir is not None and enabled and "tensorboard" in config.log:
            from headwise.training.evaluate import EVAL_SEED_OFFSET
            from headwise.training.tensorboard import TensorBoardSink

            def probe() -> Any:  # the first batch ``evaluate`` draws
                gen = torch.Generator().manual_seed(config.seed + EVAL_SEED_OFFSET)
                return eval_data.sample(config.batch_size, gen)

            self.tensorboard = TensorBoardSink(Path(out_dir) / TENSORBOARD_DIR, probe, figures)

    @property
    def callbacks(self) -> list[Callable[[Any], None]]:
        """Callbacks to run after the user's (they log the callbacks' state)."""
        return [self.tensorboard.after_callbacks] if self.tensorboard is not None else []

    def truncate_after(self, step: int) -> None:
        """Drop what was logged after ``step`` (a resumed run logs it again)."""
        self.jsonl.truncate_after(step)
        if self.tensorboard is not None:
            self.tensorboard.purge_after(step)

    def write(self, record: dict[str, Any]) -> None:
        """Log one metrics line to every sink."""
        self.jsonl.write(record)
        if self.tensorboard is not None:
            self.tensorboard.write(record)

    def checkpoint(self, step: int, model: nn.Module) -> None:
        """A checkpoint was saved at ``step``: log what is logged at checkpoints."""
        if self.tensorboard is not None:
            self.tensorboard.checkpoint(step, model)

    def close(self) -> None:
        """Flush and close the sinks."""
        if self.tensorboard is not None:
            self.tensorboard.close()
