"""train(): one explicit loop — AdamW, warm-up + cosine, clipping, objectives, eval, checkpoints.

Each step: set the learning rate for the step, draw the global batch from the seeded data
generator (keep this rank's shard), forward with the objectives' hooks attached, task loss plus
objective terms, backward, clip the global gradient norm, AdamW step. Every ``log_every`` steps
a ``"train"`` line goes to ``metrics.jsonl``; every ``eval_every`` steps (and at the end) an
``"eval"`` line, then the callbacks get a ``TrainState`` (they may change objective weights,
keep state in ``state.extra``, or set ``state.stop``); every ``checkpoint_every`` steps (and at
the end) a checkpoint is saved. ``resume=True`` restores the latest checkpoint's weights,
optimizer, RNG states, objective weights and callback state, so the run continues exactly as
if never interrupted (bitwise on CPU).
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Callable, Sequence
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from headwise.data import Mixture
from headwise.errors import ConfigError, TrainingDiverged
from headwise.training.checkpoint import (
    clean_checkpoints,
    latest_checkpoint,
    list_checkpoints,
    load_checkpoint,
    save_checkpoint,
)
from headwise.training.config import TrainConfig
from headwise.training.device import place
from headwise.training.distributed import DistContext, setup, teardown, wrap
from headwise.training.evaluate import (
    EVAL_SEED_OFFSET,
    ObjectiveSums,
    evaluate,
    forward,
)
from headwise.training.interrupt import Interrupted, catch_signals
from headwise.training.metrics import ProgressBar, overall_loss, summarise, task_loss
from headwise.training.run_log import RunLog
from headwise.training.safetensors_io import save_weights, write_bytes_atomic

# Fields that must match a checkpoint's for an exact resume.
_RESUME_FIELDS = ("batch_size", "lr", "weight_decay", "betas", "warmup_steps", "min_lr_ratio",
                  "grad_clip", "seed", "bf16")


@dataclass
class TrainState:
    """What callbacks see at an evaluation point.

    Attributes:
        step: optimiser updates done.
        model: the unwrapped model.
        metrics: this point's evaluation record (see ``evaluate``).
        config: the run's config.
        objectives: the objectives (callbacks may change ``obj.weight``).
        optimizer: the AdamW optimizer.
        out_dir: the run directory or ``None``.
        rank: this process's data-parallel rank (callbacks' decisions come from rank 0).
        extra: JSON-serialisable callback state, saved in checkpoints and restored on resume.
        stop: set to True to end training after this point.
    """

    step: int
    model: nn.Module
    metrics: dict[str, Any]
    config: TrainConfig
    objectives: Sequence[Any]
    optimizer: torch.optim.Optimizer
    out_dir: Path | None
    rank: int = 0
    extra: dict[str, Any] = field(default_factory=dict)
    stop: bool = False


@dataclass(frozen=True)
class TrainResult:
    """The outcome of ``train``.

    Attributes:
        step: updates done in total.
        metrics: the last evaluation record, or the last training line without evaluation.
        weights_path: ``out_dir/model.safetensors`` (``None`` without ``out_dir``).
        checkpoints: steps of the checkpoints in ``out_dir``.
        stopped_early: a callback set ``stop``.
        extra: the callbacks' state at the end.
    """

    step: int
    metrics: dict[str, Any]
    weights_path: Path | None
    checkpoints: list[int]
    stopped_early: bool = False
    extra: dict[str, Any] = field(default_factory=dict)


def make_optimizer(model: nn.Module, config: TrainConfig) -> torch.optim.AdamW:
    """AdamW over trainable parameters: decay on tensors with >= 2 dims, none on 1-D ones.

    The fused kernel (one multi-tensor update instead of per-parameter ops) is used when every
    parameter is a floating-point tensor on CPU or CUDA, where PyTorch implements it.
    """
    decay: list[nn.Parameter] = []
    no_decay: list[nn.Parameter] = []
    for _, p in model.named_parameters():
        if p.requires_grad:
            (decay if p.dim() >= 2 else no_decay).append(p)
    groups = [{"params": decay, "weight_decay": config.weight_decay},
              {"params": no_decay, "weight_decay": 0.0}]
    fused = all(p.device.type in ("cpu", "cuda") and p.is_floating_point()
                for p in decay + no_decay)
    return torch.optim.AdamW([g for g in groups if g["params"]], lr=config.lr,
                             betas=config.betas, fused=fused or None)


def clip_grad_norm(params: Sequence[Tensor], max_norm: float) -> Tensor:
    """Scale gradients so that their global L2 norm is at most ``max_norm``; return the norm.

    The maths of ``torch.nn.utils.clip_grad_norm_`` (``coef = min(1, max_norm / (norm +
    1e-6))``, per-tensor norms by ``_foreach_norm``, in place by ``_foreach_mul_``) without
    its per-call grouping by device and dtype: a training run's parameters share one device,
    grouped once by the caller. No host synchronisation.
    """
    grads = [p.grad for p in params if p.grad is not None]
    if not grads:
        return torch.zeros(())
    by_dtype: dict[torch.dtype, list[Tensor]] = {}
    for g in grads:
        by_dtype.setdefault(g.dtype, []).append(g)
    norms = [n for group in by_dtype.values() for n in torch._foreach_norm(group, 2.0)]
    total = torch.linalg.vector_norm(torch.stack(norms), 2.0)
    coef = torch.clamp(max_norm / (total + 1e-6), max=1.0)
    for group in by_dtype.values():
        torch._foreach_mul_(group, coef.to(group[0].dtype))
    return total


def train(model: nn.Module, data: Mixture, config: TrainConfig, *, out_dir: Path | None = None,
          objectives: Sequence[Any] = (),
          callbacks: Sequence[Callable[[TrainState], None]] = (),
          optimizer_hooks: Sequence[Callable[[torch.optim.Optimizer], None]] = (),
          resume: bool = False, eval_data: Mixture | None = None,
          progress: bool = True) -> TrainResult:
    """Train ``model`` on ``data`` (see the module docstring for the step).

    Args:
        model: the model (seeded by the caller); levers (masks, gates, freezing, LoRA) are
            applied to it before the call.
        data: the training mixture; task ids index ``data.names``.
        config: optimiser, schedule, evaluation and checkpoint settings.
        out_dir: run directory for ``metrics.jsonl``, checkpoints, ``model.safetensors`` and
            ``config.json``; ``None`` writes nothing.
        objectives: duck-typed objectives (``name``, ``weight``, ``hooks()``, ``loss(...)``).
        callbacks: called with a ``TrainState`` at each evaluation point.
        optimizer_hooks: called once with the optimizer (e.g. to register step hooks).
        resume: continue from ``latest_checkpoint(out_dir)`` if there is one (a run that a
            callback stopped stays stopped: the resume only re-evaluates and rewrites the
            final weights).
        eval_data: held-out mixture (default: ``data`` with the evaluation seed).
        progress: show a progress bar (rank 0).

    Raises:
        ConfigError: data that does not fit the model, ``resume`` without ``out_dir``, two
            objectives with one name, a config that differs from the checkpoint's in a field
            exact resume needs.
        CheckpointError: a corrupt or mismatched checkpoint.
    """
    if resume and out_dir is None:
        raise ConfigError("resume: got True without out_dir, expected a run directory")
    out_dir = Path(out_dir) if out_dir is not None else None
    names = [obj.name for obj in objectives]
    for name in names:
        if names.count(name) > 1:
            raise ConfigError(f"objectives: name {name!r} appears {names.count(name)} times, "
                              f"expected unique names (weights are saved by name)")
    cfg = getattr(model, "config", None)
    for mix in (data, eval_data):
        if mix is not None and cfg is not None:
            mix.check_model(cfg.vocab_size, cfg.max_seq_len)
    place(model, config.device, "train.device")
    ctx = setup(model)
    try:
        result = _run(model, data, config, out_dir, list(objectives), list(callbacks),
                      list(optimizer_hooks), resume, eval_data or data, progress, ctx)
    except BaseException:
        teardown(ctx, failed=True)
        raise
    teardown(ctx)
    return result


def _run(model: nn.Module, data: Mixture, config: TrainConfig, out_dir: Path | None,
         objectives: list[Any], callbacks: list[Callable[[TrainState], None]],
         optimizer_hooks: list[Callable[[torch.optim.Optimizer], None]], resume: bool,
         eval_data: Mixture, progress: bool, ctx: DistContext) -> TrainResult:
    device = ctx.device
    optimizer = make_optimizer(model, config)
    for hook in optimizer_hooks:
        hook(optimizer)
    gen = torch.Generator().manual_seed(config.seed)
    # The global RNG drives dropout; a resume overwrites this with the checkpoint's state.
    torch.manual_seed(config.seed + ctx.rank)
    writer = RunLog(out_dir, ctx.is_main, config, eval_data)
    callbacks = [*callbacks, *writer.callbacks]
    start, extra, stopped = 0, {}, False
    info = None
    if resume and out_dir is not None and ctx.is_main:
        clean_checkpoints(out_dir)
    ctx.barrier()
    ckpt = latest_checkpoint(out_dir) if resume and out_dir is not None else None
    if ckpt is not None:
        info = load_checkpoint(ckpt, model, optimizer)
        _check_resume_config(config, info.config, ckpt)
        start, extra, stopped = info.step, info.extra, info.stopped
        if info.data_rng is not None:
            gen.set_state(info.data_rng)
        if info.torch_rng:
            torch.set_rng_state(info.torch_rng[min(ctx.rank, len(info.torch_rng) - 1)])
        if info.cuda_rng and device.type == "cuda":
            torch.cuda.set_rng_state_all(info.cuda_rng)
        for obj in objectives:
            if obj.name in info.objective_weights:
                obj.weight = info.objective_weights[obj.name]
        writer.truncate_after(start)
    ddp = wrap(model, ctx)
    step_model = torch.compile(ddp) if config.compile else ddp
    # Hooks are made once (attached around each training forward, after the objectives'
    # ``prepare``, which may run forwards of its own): a compiled model sees the same hook
    # objects at every step (no recompilation).
    hooks = [h for obj in objectives for h in obj.hooks()]
    bar = ProgressBar(config.steps, start, progress and ctx.is_main)
    state_metrics: dict[str, Any] = {}
    n_tasks = len(data.names)
    # Running sums stay on the device; they are read (synchronised) only at log points.
    stats = torch.zeros(n_tasks, 5, dtype=torch.float64, device=device)
    sums = ObjectiveSums(objectives, device)
    loss_sum = torch.zeros((), dtype=torch.float64, device=device)
    since_log, t0 = 0, time.perf_counter()
    if (info is not None and ctx.world_size == 1  # restore the logging window in progress
            and len(info.log.get("names", ())) == len(objectives)
            and "stats" in info.log_tensors):
        stats.copy_(info.log_tensors["stats"])
        loss_sum.copy_(info.log_tensors["loss_sum"])
        sums.load({k[len("sums."):]: v for k, v in info.log_tensors.items()
                   if k.startswith("sums.")}, info.log["names"])
        since_log = int(info.log["since_log"])
    grad_norm: Tensor | None = None
    done = saved = start
    params = [p for g in optimizer.param_groups for p in g["params"]]
    model.train()  # once: evaluation and callbacks restore it (re-set after them below)
    signals = ExitStack()
    signalled = signals.enter_context(catch_signals(ctx.world_size == 1))
    try:
        for step in range(start, config.steps if not stopped else start):
            if signalled.signum is not None:  # Ctrl-C / SIGTERM: checkpoint here and stop
                path = None
                if out_dir is not None:
                    if saved != done:
                        _checkpoint(ctx, out_dir, done, model, optimizer, gen, objectives,
                                    extra, config, stopped, (stats, loss_sum, sums, since_log))
                    path = list_checkpoints(out_dir)[-1][1]
                raise Interrupted(done, signalled.signum, path)
            lr = config.lr_at(step)
            for group in optimizer.param_groups:
                group["lr"] = lr
            batch = ctx.shard(data.sample(config.batch_size, gen))
            if device.type != "cpu":
                batch = batch.to(device)
            logits, terms = forward(step_model, model, batch, objectives, config.bf16, device,
                                    hooks)
            loss, step_stats = task_loss(logits, batch, n_tasks)
            total = loss
            for term, _ in terms:
                total = total + term
            optimizer.zero_grad(set_to_none=True)
            total.backward()
            if config.grad_clip > 0:
                grad_norm = clip_grad_norm(params, config.grad_clip)
            optimizer.step()
            done = step + 1
            stats += step_stats
            loss_sum += total.detach().double()
            since_log += 1
            sums.add(terms)
            if done % config.log_every == 0 or done == config.steps:
                record = _train_record(ctx, done, lr, stats, loss_sum, since_log, sums,
                                       data.names, grad_norm, t0)
                writer.write(record)
                if not math.isfinite(record["loss"]):
                    raise _diverged(record["loss"], done, lr, objectives, out_dir)
                bar.update(done, record["loss"], record["tasks"])
                stats.zero_()
                sums = ObjectiveSums(objectives, device)
                loss_sum, since_log = torch.zeros_like(loss_sum), 0
                state_metrics = record
            else:
                bar.update(done)
            if config.eval_every and (done % config.eval_every == 0 or done == config.steps):
                state_metrics = evaluate(
                    model, eval_data, batch_size=config.batch_size,
                    n_batches=config.eval_batches, seed=config.seed + EVAL_SEED_OFFSET,
                    objectives=objectives, bf16=config.bf16, ctx=ctx)
                state_metrics = {"kind": "eval", "step": done, **state_metrics}
                writer.write(state_metrics)
                stopped, extra = _call_back(callbacks, ctx, done, model, state_metrics, config,
                                            objectives, optimizer, out_dir, extra)
                model.train()
            last = done == config.steps or stopped
            if out_dir is not None and config.checkpoint_every and (
                    done % config.checkpoint_every == 0 or last):
                if not math.isfinite(float(loss_sum)):  # never checkpoint a diverged model
                    raise _diverged(float(loss_sum), done, lr, objectives, out_dir)
                _checkpoint(ctx, out_dir, done, model, optimizer, gen, objectives, extra,
                            config, stopped, (stats, loss_sum, sums, since_log))
                writer.checkpoint(done, model)
                saved = done
            if stopped:
                break
    finally:
        bar.close()
        writer.close()
        signals.close()
    if done == start and config.eval_every:  # resumed at the end: report, but log nothing new
        state_metrics = {"kind": "eval", "step": done, **evaluate(
            model, eval_data, batch_size=config.batch_size, n_batches=config.eval_batches,
            seed=config.seed + EVAL_SEED_OFFSET, objectives=objectives, bf16=config.bf16,
            ctx=ctx)}
    weights = None
    if out_dir is not None:
        weights = out_dir / "model.safetensors"
        if ctx.is_main:
            save_weights(model, weights)
            if cfg := getattr(model, "config", None):
                write_bytes_atomic(out_dir / "config.json",
                                   json.dumps(cfg.to_dict(), indent=1).encode())
        ctx.barrier()
    steps = [s for s, _ in list_checkpoints(out_dir)] if out_dir is not None else []
    return TrainResult(step=done, metrics=state_metrics, weights_path=weights,
                       checkpoints=steps, stopped_early=stopped, extra=extra)


def _train_record(ctx: DistContext, step: int, lr: float, stats: Tensor, loss_sum: Tensor,
                  n_steps: int, sums: ObjectiveSums, names: list[str],
                  grad_norm: Tensor | None, t0: float) -> dict[str, Any]:
    """The ``"train"`` metrics line, summed over ranks (every rank calls this)."""
    stats = ctx.all_reduce_sum(stats)
    loss = float(ctx.all_reduce_sum(loss_sum))
    record: dict[str, Any] = {
        "kind": "train", "step": step, "lr": lr,
        "loss": loss / ctx.world_size / max(n_steps, 1), "task_loss": overall_loss(stats),
        "tasks": summarise(stats, names),
        "objectives": sums.record(ctx, n_steps),
        "elapsed_s": time.perf_counter() - t0}
    if grad_norm is not None:
        record["grad_norm"] = float(grad_norm)
    return record


def _call_back(callbacks: list[Callable[[TrainState], None]], ctx: DistContext, step: int,
               model: nn.Module, metrics: dict[str, Any], config: TrainConfig,
               objectives: list[Any], optimizer: torch.optim.Optimizer,
               out_dir: Path | None, extra: dict[str, Any]) -> tuple[bool, dict[str, Any]]:
    """Run callbacks; rank 0's decisions (stop, weights, extra) are broadcast to all ranks."""
    state = TrainState(step=step, model=model, metrics=metrics, config=config,
                       objectives=objectives, optimizer=optimizer, out_dir=out_dir,
                       rank=ctx.rank, extra=extra)
    for cb in callbacks:
        cb(state)
    decided = ctx.broadcast({"stop": bool(state.stop), "extra": state.extra,
                             "weights": [float(o.weight) for o in objectives]})
    for obj, w in zip(objectives, decided["weights"], strict=True):
        obj.weight = w
    return decided["stop"], decided["extra"]


def _checkpoint(ctx: DistContext, out_dir: Path, step: int, model: nn.Module,
                optimizer: torch.optim.Optimizer, gen: torch.Generator, objectives: list[Any],
                extra: dict[str, Any], config: TrainConfig, stopped: bool,
                window: tuple[Tensor, Tensor, ObjectiveSums, int]) -> None:
    """Save a checkpoint; ``window`` holds the metric sums since the last ``"train"`` line
    (stats, loss sum, objective sums, steps), kept so that a resumed run writes the same
    ``metrics.jsonl`` as an uninterrupted one (single process only)."""
    rng = ctx.gather(torch.get_rng_state())
    if ctx.is_main:
        stats, loss_sum, sums, since_log = window
        tensors, names = sums.state()
        log_tensors = {"stats": stats, "loss_sum": loss_sum,
                       **{f"sums.{k}": v for k, v in tensors.items()}}
        log = {"since_log": since_log, "names": names} if ctx.world_size == 1 else {}
        save_checkpoint(out_dir, step, model, optimizer, data_generator=gen, torch_rng=rng,
                        objective_weights={o.name: float(o.weight) for o in objectives},
                        extra=extra, config=config.to_dict(), stopped=stopped, log=log,
                        log_tensors=log_tensors if log else None)
    ctx.barrier()


def _diverged(loss: float, step: int, lr: float, objectives: list[Any],
              out_dir: Path | None) -> TrainingDiverged:
    """The one-line error for a non-finite loss, naming the step and the likely cause."""
    bad = [o for o in objectives if not math.isfinite(float(o.weight))]
    cause = (f"the weight of objective {bad[0].name!r} is {float(bad[0].weight)}" if bad else
             f"the learning rate ({lr:.3g}) or a lever weight is too large")
    found = list_checkpoints(out_dir) if out_dir is not None else []
    kept = f"; the last checkpoint (step {found[-1][0]}) is kept" if found else ""
    return TrainingDiverged(f"training diverged: loss is {loss} at step {step}; likely cause: "
                            f"{cause}{kept}")


def _check_resume_config(config: TrainConfig, saved: dict[str, Any] | None, path: Path) -> None:
    if saved is None:
        return
    now = config.to_dict()
    for name in _RESUME_FIELDS:
        if name in saved and saved[name] != now[name]:
            raise ConfigError(f"train.{name}: got {now[name]!r}, but the checkpoint {path} was "
                              f"trained with {saved[name]!r}; exact resume needs the same value")
