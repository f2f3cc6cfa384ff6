"""TrainConfig: the validated, frozen settings of one training run."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, fields
from typing import Any

from headwise.errors import ConfigError, did_you_mean, field_error
from headwise.training.device import check_device_name


@dataclass(frozen=True)
class TrainConfig:
    """Optimiser, schedule, evaluation and checkpoint settings.

    Args:
        steps: optimiser updates in total.
        batch_size: global batch size B (split evenly over data-parallel ranks).
        lr: peak learning rate of AdamW.
        weight_decay: decoupled weight decay, applied to matrices and embeddings (parameters
            with 2 or more dims) only; never to biases, norm weights or other 1-D parameters.
        betas: AdamW's (beta1, beta2).
        warmup_steps: linear warm-up from ``lr / warmup_steps`` to ``lr``.
        min_lr_ratio: the cosine decay ends at ``lr * min_lr_ratio`` after ``steps`` updates.
        grad_clip: clip the global gradient norm to this value; 0 turns clipping off.
        seed: seeds the data generator (training) and, offset by ``EVAL_SEED_OFFSET``, the
            evaluation generator; ``torch.manual_seed(seed + rank)`` seeds dropout. The model's
            initialisation is the caller's (``build_model(config, seed=...)``).
        eval_every: evaluate (and call callbacks) every this many steps and at the end; 0: never.
        eval_batches: evaluation batches of ``batch_size`` examples each.
        checkpoint_every: save a checkpoint every this many steps and at the end; 0: never.
        log_every: write a training line to ``metrics.jsonl`` every this many steps.
        bf16: run forward passes under bfloat16 autocast (on whatever device trains).
        device: ``auto`` (CUDA when available, else CPU), ``cpu``, ``cuda`` or ``cuda:N``;
            checked for syntax here and for availability when training starts.
        compile: wrap the model's forward in ``torch.compile`` for training (see
            docs/benchmarks.md for when it pays); the weights and checkpoints are unchanged.
        log: where metrics go: ``jsonl`` (``metrics.jsonl``, always; the report and resume
            read it) and optionally ``tensorboard`` (event files in ``out_dir/tensorboard``;
            needs the ``headwise[tensorboard]`` extra, see ``headwise.training.tensorboard``).
        parallel: how ranks started by ``torchrun`` share the work: ``ddp`` (each rank holds
            the whole model, ``headwise.training.distributed``), ``fsdp`` (each rank holds 1/N
            of the parameters, gradients and optimizer state, ``headwise.training.fsdp``) or
            ``none`` (one process; an error under ``torchrun`` with more than one rank).
            Default (``None``): ``ddp`` under ``torchrun``, ``none`` otherwise.

    Raises:
        ConfigError: naming the field, its value and what is allowed.
    """

    steps: int = 1000
    batch_size: int = 32
    lr: float = 1e-3
    weight_decay: float = 0.01
    betas: tuple[float, float] = (0.9, 0.999)
    warmup_steps: int = 0
    min_lr_ratio: float = 0.1
    grad_clip: float = 1.0
    seed: int = 0
    eval_every: int = 0
    eval_batches: int = 4
    checkpoint_every: int = 0
    log_every: int = 10
    bf16: bool = False
    log: tuple[str, ...] = ("jsonl",)
    device: str = "auto"
    compile: bool = False
    parallel: str | None = None

    def __post_init__(self) -> None:
        for name, low in (("steps", 1), ("batch_size", 1), ("warmup_steps", 0), ("seed", 0),
                          ("eval_every", 0), ("eval_batches", 1), ("checkpoint_every", 0),
                          ("log_every", 1)):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < low:
                raise field_error(name, value, f"an integer >= {low}")
        if not _number(self.lr) or self.lr <= 0:
            raise field_error("lr", self.lr, "a positive number")
        if not _number(self.weight_decay) or self.weight_decay < 0:
            raise field_error("weight_decay", self.weight_decay, "a number >= 0")
        if not _number(self.min_lr_ratio) or not 0 <= self.min_lr_ratio <= 1:
            raise field_error("min_lr_ratio", self.min_lr_ratio, "a number in [0, 1]")
        if not _number(self.grad_clip) or self.grad_clip < 0:
            raise field_error("grad_clip", self.grad_clip, "a number >= 0 (0: no clipping)")
        betas = self.betas
        if (not isinstance(betas, (tuple, list)) or len(betas) != 2
                or not all(_number(b) and 0 <= b < 1 for b in betas)):
            raise field_error("betas", betas, "two numbers in [0, 1), e.g. [0.9, 0.999]")
        object.__setattr__(self, "betas", (float(betas[0]), float(betas[1])))
        for name in ("bf16", "compile"):
            if not isinstance(getattr(self, name), bool):
                raise field_error(name, getattr(self, name), "true or false")
        check_device_name(self.device)
        if self.parallel is not None and self.parallel not in PARALLEL:
            raise field_error("parallel", self.parallel,
                              f"one of {list(PARALLEL)}" + did_you_mean(str(self.parallel),
                                                                        PARALLEL))
        if self.parallel == "fsdp" and self.compile:
            raise field_error("compile", self.compile, "false with parallel: fsdp (a sharded "
                              "model's forward is not compiled)")
        object.__setattr__(self, "log", _log_sinks(self.log))
        if self.warmup_steps > self.steps:
            raise field_error("warmup_steps", self.warmup_steps,
                              f"an integer <= steps={self.steps}")

    def lr_at(self, step: int) -> float:
        """Learning rate for update ``step`` (0-based): linear warm-up, then cosine decay.

        ``lr * (step + 1) / warmup_steps`` during warm-up; afterwards
        ``lr * (r + (1 - r) * (1 + cos(pi * p)) / 2)`` with ``r = min_lr_ratio`` and
        ``p = (step - warmup_steps) / (steps - warmup_steps)``.
        """
        if step < self.warmup_steps:
            return self.lr * (step + 1) / self.warmup_steps
        p = (step - self.warmup_steps) / max(1, self.steps - self.warmup_steps)
        r = self.min_lr_ratio
        return self.lr * (r + (1 - r) * 0.5 * (1 + math.cos(math.pi * min(p, 1.0))))

    def to_dict(self) -> dict[str, Any]:
        """A plain (JSON-ready) dict that ``from_dict`` turns back into an equal config."""
        d = asdict(self)
        d["betas"] = list(self.betas)
        d["log"] = list(self.log)
        return d

    @classmethod
    def from_dict(cls, data: dict[str, Any], path: str = "train") -> TrainConfig:
        """Build from a mapping, rejecting unknown keys by name (with ``path`` prefixed).

        Raises:
            ConfigError: an unknown key (with the closest valid one), or an invalid value.
        """
        if not isinstance(data, dict):
            raise ConfigError(f"{path}: got {type(data).__name__}, expected a mapping of fields")
        names = [f.name for f in fields(cls)]
        for key in data:
            if key not in names:
                extra = did_you_mean(str(key), names)
                raise ConfigError(f"{path}.{key}: unknown field{extra}")
        try:
            return cls(**data)
        except ConfigError as e:
            raise ConfigError(f"{path}.{e}") from None


def _number(x: object) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


LOG_SINKS = ("jsonl", "tensorboard")
PARALLEL = ("none", "ddp", "fsdp")


def _log_sinks(value: object) -> tuple[str, ...]:
    """Validate ``log``: known sink names, no repeats, ``jsonl`` included, extras installed."""
    expected = f"a list of sinks from {list(LOG_SINKS)} that includes jsonl"
    if isinstance(value, str) or not isinstance(value, (list, tuple)):
        raise field_error("log", value, expected)
    for name in value:
        if name not in LOG_SINKS:
            raise field_error("log", list(value), expected + did_you_mean(name, LOG_SINKS))
    if "jsonl" not in value or len(set(value)) != len(value):
        raise field_error("log", list(value), expected + " (each once; metrics.jsonl feeds "
                          "the report and resume)")
    if "tensorboard" in value:
        from headwise.training.tensorboard import require_tensorboard

        require_tensorboard()
    return tuple(value)
