"""The kept model of an enforced run: the weights of the last evaluation point at which the
whole contract was certified (else held) on the enforcement set.

Constrained training runs its whole budget with the constraints kept, and the model it ships is
the one of the last evaluation point at which the contract was certified, else past every
clause's guard, else held (``headwise.contract.enforce``; ``enforce.stop: end``; with
``first_hold`` that point is the last one anyway). The ``Enforcer`` keeps those weights at each
such point: in ``kept.safetensors`` in the run directory (so a resumed run still has them; its
sha256 is recorded with the step in the enforcement state, which checkpoints carry), or in
memory when training writes no run directory. ``restore`` puts them back at the end.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import torch
from torch import Tensor, nn

from headwise.contract.record import EnforcementRecord
from headwise.errors import CheckpointError
from headwise.training.safetensors_io import load_weights, save_weights, sha256_file

KEPT = "kept.safetensors"


@dataclass
class KeptModel:
    """Where the kept weights go: ``out_dir / KEPT`` (written by ``rank`` 0), or memory."""

    memory: dict[str, Tensor] | None = field(default=None, repr=False)

    def keep(self, model: nn.Module, out_dir: Path | None, rank: int,
             record: EnforcementRecord, step: int) -> None:
        """Keep ``model``'s weights as those of ``step``; ``record`` gets ``kept_step`` and
        (with a run directory) the file's ``kept_sha256``."""
        record.kept_step = step
        if out_dir is None:
            self.memory = {k: v.detach().clone() for k, v in model.state_dict().items()}
            return
        if rank == 0:
            record.kept_sha256 = save_weights(model, Path(out_dir) / KEPT)

    def restore(self, model: nn.Module, out_dir: Path | None,
                record: EnforcementRecord) -> None:
        """Load the kept weights into ``model``.

        Raises:
            CheckpointError: the kept file is missing or is not the one the run recorded.
        """
        if out_dir is None:
            if self.memory is None:
                raise CheckpointError("enforcement: no kept model in memory for step "
                                      f"{record.kept_step}")
            with torch.no_grad():
                model.load_state_dict(self.memory)
            return
        path = Path(out_dir) / KEPT
        if not path.is_file() or sha256_file(path) != record.kept_sha256:
            raise CheckpointError(f"{path}: missing or not the model kept at step "
                                  f"{record.kept_step}; expected the file this run "
                                  "wrote (retrain the run)")
        load_weights(model, path)
