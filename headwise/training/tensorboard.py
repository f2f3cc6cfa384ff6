"""TensorBoard sink for ``train.log: [jsonl, tensorboard]``: scalars, constraints, figures.

Event files go to ``out_dir/tensorboard`` (``tensorboard --logdir RUN/tensorboard``). Tags:

- every ``metrics.jsonl`` line of kind ``train`` or ``eval`` (prefix ``train/`` or ``eval/``):
  ``loss``, ``task_loss``, ``lr``, ``grad_norm`` (those present), ``task/NAME/loss``,
  ``task/NAME/accuracy``, ``task/NAME/exact``, ``objective/NAME/loss``,
  ``objective/NAME/weight``;
- constraints, from an evaluation line or from the callbacks' state after every callback ran:
  a mapping ``"constraints": {NAME: {FIELD: number}}`` (e.g. ``violation``, ``multiplier``)
  becomes ``constraints/NAME/FIELD``; the ``--enforce`` callback's latest evaluation point
  (``extra["enforce"]["history"][-1]``) becomes ``constraints/NAME/violation``,
  ``.../multiplier`` and ``.../measured`` for each clause, NAME being the clause's ``name``
  as the user wrote it, else its description (``clause_names``);
- at every checkpoint, each image ``train(figures=...)`` names, drawn on the first held-out
  evaluation batch (a run of the pipeline logs ``roles/heatmap``: role scores, heads x
  ``DATA_ROLES``, drawn as the report draws them). Training sits below analysis, so the
  figures come in as functions from the caller.

A resumed run purges the events logged after the checkpoint it resumes from (TensorBoard's
``purge_step``), as ``metrics.jsonl`` drops those lines.
"""

from __future__ import annotations

import io
import math
from collections.abc import Callable, Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any

import torch
from torch import nn

from headwise.errors import ConfigError

EXTRA = "headwise[tensorboard]"


def require_tensorboard() -> None:
    """Check that TensorBoard's writer can be imported.

    Raises:
        ConfigError: ``log: ... tensorboard is not installed``, naming the extra to install.
    """
    try:
        import tensorboard  # noqa: F401
        from torch.utils.tensorboard import SummaryWriter  # noqa: F401
    except ImportError:
        raise ConfigError(f"log: got tensorboard, but the tensorboard package is not installed; "
                          f"expected it installed (pip install '{EXTRA}') or log: [jsonl]"
                          ) from None


def record_scalars(record: Mapping[str, Any]) -> Iterator[tuple[str, float]]:
    """``(tag, value)`` of the scalars in one ``metrics.jsonl`` line (see module docstring)."""
    prefix = str(record.get("kind", "train"))
    for key in ("loss", "task_loss", "lr", "grad_norm"):
        if _number(record.get(key)):
            yield f"{prefix}/{key}", float(record[key])
    for name, stats in (record.get("tasks") or {}).items():
        for key in ("loss", "accuracy", "exact"):
            if _number(stats.get(key)):
                yield f"{prefix}/task/{name}/{key}", float(stats[key])
    for name, obj in (record.get("objectives") or {}).items():
        for key in ("loss", "weight"):
            if _number(obj.get(key)):
                yield f"{prefix}/objective/{name}/{key}", float(obj[key])
    yield from constraint_scalars(record)


def constraint_scalars(state: Mapping[str, Any]) -> Iterator[tuple[str, float]]:
    """``(tag, value)`` of constraint violations and multipliers in a record or callback state."""
    for name, fields in (state.get("constraints") or {}).items():
        for key, value in (fields or {}).items():
            if _number(value):
                yield f"constraints/{name}/{key}", float(value)
    enforce = state.get("enforce")
    if enforce and enforce.get("history"):
        names = clause_names((enforce.get("clauses") or {}).values())
        for key, clause in (enforce["history"][-1].get("clauses") or {}).items():
            name = names.get(key, f"contract[{key}]").replace("/", "_")  # "/" nests tags
            for field in ("violation", "multiplier", "measured"):
                if _number(clause.get(field)):
                    yield f"constraints/{name}/{field}", float(clause[field])


def clause_names(clauses: Iterable[Mapping[str, Any]]) -> dict[str, str]:
    """``{clause index (str): name}`` of the enforcement record's clause entries (``index``,
    ``description``: the clause's ``name`` as the user wrote it, else its description), for
    TensorBoard tags and the report's legends; a name two clauses share gets its
    ``(contract[I])``, so every curve stays apart."""
    entries = [(str(c["index"]), str(c.get("description") or f"contract[{c['index']}]"))
               for c in clauses]
    seen = [name for _, name in entries]
    return {key: name if seen.count(name) == 1 else f"{name} (contract[{key}])"
            for key, name in entries}


def _number(x: object) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


class TensorBoardSink:
    """Writes the run's scalars and checkpoint figures as TensorBoard event files.

    Args:
        log_dir: where the event files go (created on the first write).
        probe: ``() -> Batch`` returning the batch the figures are drawn on (called once, at
            the first checkpoint with figures).
        figures: tag -> ``fn(model, batch) -> PNG bytes``, logged at every checkpoint.

    Raises:
        ConfigError: TensorBoard is not installed.
    """

    def __init__(self, log_dir: Path, probe: Callable[[], Any],
                 figures: Mapping[str, Callable[[nn.Module, Any], bytes]]) -> None:
        require_tensorboard()
        self.log_dir = Path(log_dir)
        self._probe_fn = probe
        self._figures = dict(figures)
        self._probe: Any = None
        self._purge_step: int | None = None
        self._writer: Any = None

    def purge_after(self, step: int) -> None:
        """Drop events logged after ``step`` (a resumed run logs them again)."""
        self._purge_step = step + 1

    @property
    def writer(self) -> Any:
        """The ``SummaryWriter``, opened on first use (with the purge step of a resume)."""
        if self._writer is None:
            from torch.utils.tensorboard import SummaryWriter

            self._writer = SummaryWriter(str(self.log_dir), purge_step=self._purge_step)
        return self._writer

    def write(self, record: Mapping[str, Any]) -> None:
        """Log the scalars of one ``metrics.jsonl`` line at its step."""
        step = int(record["step"])
        for tag, value in record_scalars(record):
            self.writer.add_scalar(tag, value, step)
        self.writer.flush()

    def after_callbacks(self, state: Any) -> None:
        """Log constraints from the callbacks' state (``TrainState.extra``); a training callback."""
        if state.rank != 0:
            return
        for tag, value in constraint_scalars(state.extra):
            self.writer.add_scalar(tag, value, state.step)
        self.writer.flush()

    @torch.no_grad()
    def checkpoint(self, step: int, model: nn.Module) -> None:
        """Add each figure of ``model`` at ``step`` as an image under its tag."""
        if not self._figures:
            return
        batch = self._batch(model)
        for tag, figure in self._figures.items():
            self.writer.add_image(tag, _decode_png(figure(model, batch)), step, dataformats="HWC")
        self.writer.flush()

    def _batch(self, model: nn.Module) -> Any:
        if self._probe is None:
            self._probe = self._probe_fn()
        return self._probe.to(next(model.parameters()).device)

    def close(self) -> None:
        """Flush and close the event file."""
        if self._writer is not None:
            self._writer.close()
            self._writer = None


def _decode_png(png: bytes) -> Any:
    """(H, W, 3) uint8 pixels of a PNG (matplotlib's reader; alpha dropped)."""
    import matplotlib.image
    import numpy as np

    pixels = matplotlib.image.imread(io.BytesIO(png), format="png")  # (H, W, 4) floats in [0, 1]
    return (np.asarray(pixels)[..., :3] * 255).round().astype(np.uint8)
