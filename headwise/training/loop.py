"""train(): one explicit loop — AdamW, warm-up + cosine, clipping, objectives, eval, checkpoints.

Each step: set the learning rate for the step, draw the global batch from the seeded data
generator (keep this rank's shard), forward with the objectives' hooks attached, task loss plus
objective terms, backward, clip the global gradient norm, AdamW step. Every ``log_every`` steps
a ``"train"`` line goes to ``metrics.jsonl``; every ``eval_every`` steps (and at the end) an
``"eval"`` line, then the callbacks get a ``TrainState`` (they may change objective weights,
keep state in ``state.extra``, or set ``state.stop``; a callback with a ``call_every``
attribute is called every that many steps and at the end instead, with the last record as
metrics); every ``checkpoint_every`` steps (and at the end) a checkpoint is saved.
``resume=True`` restores the latest checkpoint's weights, optimizer, RNG states, objective
weights and callback state, so the run continues exactly as if never interrupted (bitwise on
CPU). Under ``torchrun`` the ranks share the work as ``config.parallel`` says: DDP
(``headwise.training.distributed``), or FSDP2 sharding (``headwise.training.fsdp``: the model
is sharded in place before the optimizer is made, its checkpoints are
``headwise.training.sharded_checkpoint``'s, and it is whole again at the end).
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Callable, Mapping, Sequence
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor, nn

from headwise.atomic import write_bytes_atomic
from headwise.control.objective import Objective, taking_part
from headwise.data import Mixture
from headwise.dtensors import is_dtensor
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
from headwise.training.evaluate import EVAL_SEED_OFFSET, evaluate, forward
from headwise.training.interrupt import Interrupted, catch_signals
from headwise.training.metrics import LogWindow, task_loss
from headwise.training.progress import ProgressBar
from headwise.training.run_log import Figures, RunLog
from headwise.training.safetensors_io import save_weights

if TYPE_CHECKING:  # sharded training imports torch.distributed.tensor; plain runs never do
    from headwise.training.fsdp import Sharding

# Fields that must match a checkpoint's for an exact resume.
_RESUME_FIELDS = ("batch_size", "lr", "weight_decay", "betas", "warmup_steps", "min_lr_ratio",
                  "grad_clip", "seed", "bf16")


# The entry of ``TrainState.extra`` that scales the learning rate (a callback's decision, saved
# in checkpoints with the rest of the callback state, so a resumed run takes the same steps).
LR_SCALE = "lr_scale"


@dataclass
class TrainState:
    """What callbacks see at an evaluation point (or at their own cadence: ``call_every``).

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
            Its entry ``LR_SCALE`` (``"lr_scale"``), when a callback sets it above 1, makes
            the learning rate that factor times the peak rate ``config.lr`` from the next step
            on, in place of the schedule (enforcement's pace); at 1 the schedule resumes.
        stop: set to True to end training after this point.
    """

    step: int
    model: nn.Module
    metrics: dict[str, Any]
    config: TrainConfig
    objectives: Sequence[Objective]
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
    fused = all(p.device.type in ("cpu", "cuda") and p.is_floating_point()
                for p in decay + no_decay)
    # A sharded model's replicated parameters (task gates) get groups of their own: one fused
    # update cannot mix sharded and whole tensors.
    groups = [{"params": [p for p in params if is_dtensor(p) == sharded],
               "weight_decay": wd}
              for params, wd in ((decay, config.weight_decay), (no_decay, 0.0))
              for sharded in (True, False)]
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
          objectives: Sequence[Objective] = (),
          callbacks: Sequence[Callable[[TrainState], None]] = (),
          optimizer_hooks: Sequence[Callable[[torch.optim.Optimizer], None]] = (),
          resume: bool = False, eval_data: Mixture | None = None,
          progress: bool = True, figures: Figures | None = None,
          extra: Mapping[str, Any] | None = None) -> TrainResult:
    """Train ``model`` on ``data`` (see the module docstring for the step).

    Args:
        model: the model (seeded by the caller); levers (masks, gates, freezing, LoRA) are
            applied to it before the call.
        data: the training mixture; task ids index ``data.names``.
        config: optimiser, schedule, evaluation and checkpoint settings.
        out_dir: run directory for ``metrics.jsonl``, checkpoints, ``model.safetensors`` and
            ``config.json``; ``None`` writes nothing.
        objectives: loss terms (``headwise.control.Objective``: ``name``, ``weight``,
            ``prepare(batch)``, ``hooks()``, ``loss(...)``).
        callbacks: called with a ``TrainState`` at each evaluation point (one with an
            ``call_every`` attribute: every that many steps and at the last, instead).
        optimizer_hooks: called once with the optimizer (e.g. to register step hooks).
        resume: continue from ``latest_checkpoint(out_dir)`` if there is one (a run that a
            callback stopped stays stopped: the resume only re-evaluates and rewrites the
            final weights).
        eval_data: held-out mixture (default: ``data`` with the evaluation seed).
        progress: show a progress bar (rank 0).
        figures: with ``"tensorboard" in config.log``, images logged at every checkpoint:
            tag -> ``fn(model, batch) -> PNG bytes`` on the first held-out batch (the pipeline
            passes the role-score heatmap; ``headwise.pipeline.run_analysis.role_heatmap_png``).
            None under ``parallel: fsdp`` (drawn on rank 0 alone, which cannot run a sharded
            model by itself).
        extra: entries put in the callback state (``TrainState.extra``) from the start, so
            every checkpoint holds them; on resume they replace the checkpoint's entries of the
            same keys (the pipeline records the run's flags here).

    Raises:
        ConfigError: data that does not fit the model, ``resume`` without ``out_dir``, two
            objectives with one name, a config that differs from the checkpoint's in a field
            exact resume needs, a ``parallel`` that does not fit how the process started.
        CheckpointError: a corrupt or mismatched checkpoint.
    """
    if resume and out_dir is None:
        raise ConfigError("resume: got True without out_dir, expected a run directory")
    names = [obj.name for obj in objectives]
    for name in names:
        if names.count(name) > 1:
            raise ConfigError(f"objectives: name {name!r} appears {names.count(name)} times, "
                              f"expected unique names (weights are saved by name)")
    cfg = getattr(model, "config", None)
    for mix in (data, eval_data):
        if mix is not None and cfg is not None:
            mix.check_model(cfg.vocab_size, cfg.max_seq_len, cfg.causal)
    place(model, config.device, "train.device")
    ctx = setup(model, config.parallel)
    try:
        # Sharded before the optimizer is made: it holds each rank's shards.
        sharding = None
        if ctx.sharded:
            from headwise.training.fsdp import shard

            sharding = shard(model, ctx)
        run = _start(model, data, eval_data or data, config,
                     Path(out_dir) if out_dir is not None else None,
                     list(objectives), list(callbacks), list(optimizer_hooks), progress, ctx,
                     {} if sharding is not None else dict(figures or {}))
        run.sharding = sharding
        if resume:
            _restore(run)
        run.extra.update(extra or {})
        result = _run(run)
    except BaseException:
        teardown(ctx, failed=True)
        raise
    teardown(ctx)
    return result


@dataclass
class _Run:
    """One ``train()`` call: what the steps work with, and the state that moves per step."""

    model: nn.Module
    data: Mixture
    eval_data: Mixture
    config: TrainConfig
    out_dir: Path | None
    objectives: list[Objective]
    callbacks: list[Callable[[TrainState], None]]
    optimizer: torch.optim.AdamW
    gen: torch.Generator
    ctx: DistContext
    writer: RunLog
    progress: bool
    window: LogWindow
    start: int = 0
    done: int = 0
    saved: int = 0
    stopped: bool = False
    extra: dict[str, Any] = field(default_factory=dict)
    metrics: dict[str, Any] = field(default_factory=dict)
    grad_norm: Tensor | None = None
    sharding: Sharding | None = None


def _start(model: nn.Module, data: Mixture, eval_data: Mixture, config: TrainConfig,
           out_dir: Path | None, objectives: list[Objective],
           callbacks: list[Callable[[TrainState], None]],
           optimizer_hooks: list[Callable[[torch.optim.Optimizer], None]], progress: bool,
           ctx: DistContext, figures: Figures) -> _Run:
    """The optimizer, the seeded generators and the run log of a fresh run."""
    optimizer = make_optimizer(model, config)
    for hook in optimizer_hooks:
        hook(optimizer)
    gen = torch.Generator().manual_seed(config.seed)
    # The global RNG drives dropout; a resume overwrites this with the checkpoint's state.
    torch.manual_seed(config.seed + ctx.rank)
    writer = RunLog(out_dir, ctx.is_main, config, eval_data, figures)
    return _Run(model, data, eval_data, config, out_dir, objectives,
                callbacks, optimizer, gen, ctx, writer, progress,
                LogWindow.empty(objectives, len(data.names), ctx.device))


def _restore(run: _Run) -> None:
    """Continue from the latest checkpoint of ``run.out_dir``, if any (exact resume)."""
    assert run.out_dir is not None
    if run.ctx.is_main:
        clean_checkpoints(run.out_dir)
    run.ctx.barrier()
    ckpt = latest_checkpoint(run.out_dir)
    if ckpt is None:
        return
    if run.sharding is not None:
        from headwise.training.sharded_checkpoint import load_sharded_checkpoint

        info = load_sharded_checkpoint(ckpt, run.model, run.optimizer, run.ctx)
    else:
        info = load_checkpoint(ckpt, run.model, run.optimizer)
    _check_resume_config(run.config, info.config, ckpt)
    run.start = run.done = run.saved = info.step
    run.extra, run.stopped = info.extra, info.stopped
    if info.data_rng is not None:
        run.gen.set_state(info.data_rng)
    if info.torch_rng:
        torch.set_rng_state(info.torch_rng[min(run.ctx.rank, len(info.torch_rng) - 1)])
    if info.cuda_rng and run.ctx.device.type == "cuda":
        torch.cuda.set_rng_state_all(info.cuda_rng)
    for obj in run.objectives:
        if obj.name in info.objective_weights:
            obj.weight = info.objective_weights[obj.name]
    run.writer.truncate_after(info.step)
    _restore_window(run.window, info.log, info.log_tensors, run.ctx, len(run.objectives))


def _window_state(run: _Run) -> tuple[dict[str, Any], dict[str, Tensor]]:
    """The logging window in progress (the sums since the last ``"train"`` line) as checkpoint
    JSON and tensors: this process's own, or under ``torchrun`` every rank's (``r{rank}.``
    before each tensor's name; each rank restores its own). Every rank calls this."""
    w = run.window
    sums, names = w.sums.state()
    mine = {"stats": w.stats, "loss_sum": w.loss_sum, **{f"sums.{k}": v for k, v in sums.items()}}
    if run.ctx.world_size == 1:
        return {"since_log": w.steps, "names": names}, mine
    parts = run.ctx.gather(({k: v.detach().cpu() for k, v in mine.items()}, names))
    return ({"since_log": w.steps, "rank_names": [n for _, n in parts]},
            {f"r{r}.{k}": v for r, (t, _) in enumerate(parts) for k, v in t.items()})


def _restore_window(w: LogWindow, log: dict[str, Any], tensors: dict[str, Tensor],
                    ctx: DistContext, n_objectives: int) -> None:
    """Continue the logging window a checkpoint saved (``_window_state``), so a resumed run
    writes the same ``metrics.jsonl`` as an uninterrupted one; a checkpoint without one (or of
    another number of ranks or objectives) starts an empty window."""
    if ctx.world_size == 1:
        prefix, names = "", log.get("names")
    else:
        per_rank = log.get("rank_names")
        prefix = f"r{ctx.rank}."
        names = per_rank[ctx.rank] if isinstance(per_rank, list) and len(
            per_rank) == ctx.world_size else None
    if not isinstance(names, list) or len(names) != n_objectives or (
            f"{prefix}stats" not in tensors or f"{prefix}loss_sum" not in tensors):
        return
    w.stats.copy_(tensors[f"{prefix}stats"])
    w.loss_sum.copy_(tensors[f"{prefix}loss_sum"])
    w.sums.load({k[len(prefix) + len("sums."):]: v for k, v in tensors.items()
                 if k.startswith(f"{prefix}sums.")}, names)
    w.steps = int(log["since_log"])


def _run(run: _Run) -> TrainResult:
    """The steps from ``run.start`` to ``config.steps`` (or a stop), then the final weights."""
    config, ctx = run.config, run.ctx
    step_model = torch.compile(wrap(run.model, ctx)) if config.compile else wrap(run.model, ctx)
    # Hooks are made once (attached around each training forward, after the objectives'
    # ``prepare``, which may run forwards of its own): a compiled model sees the same hook
    # objects at every step (no recompilation but where an idle lever joins or leaves).
    hooks = {id(obj): obj.hooks() for obj in run.objectives}
    params = [p for g in run.optimizer.param_groups for p in g["params"]]
    bar = ProgressBar(config.steps, run.start, run.progress and ctx.is_main)
    t0 = time.perf_counter()
    run.model.train()  # once: evaluation and callbacks restore it (re-set after them)
    # Under torchrun a signal reaches every rank (Ctrl-C twice: terminal, then torchrun).
    with ExitStack() as stack:
        stack.callback(run.writer.close)
        stack.callback(bar.close)
        signalled = stack.enter_context(catch_signals(escalate=ctx.world_size == 1))
        for step in range(run.start, config.steps if not run.stopped else run.start):
            signum = ctx.agree_signal(signalled.signum)
            if signum is not None:  # Ctrl-C / SIGTERM: checkpoint here and stop
                raise _interrupted(run, signum)
            lr = _step(run, step_model, step, hooks, params)
            _after_step(run, lr, bar, t0)
            if run.stopped:
                break
    return _finish(run)


def _step(run: _Run, step_model: Callable[..., Tensor], step: int,
          hooks: dict[int, list[Any]], params: list[Tensor]) -> float:
    """One optimisation step on the next batch; returns its learning rate."""
    config, ctx = run.config, run.ctx
    scale = float(run.extra.get(LR_SCALE, 1.0))
    lr = config.lr * scale if scale > 1.0 else config.lr_at(step)
    for group in run.optimizer.param_groups:
        group["lr"] = lr
    batch = ctx.shard(run.data.sample(config.batch_size, run.gen))
    if ctx.device.type != "cpu":
        batch = batch.to(ctx.device)
    attached = [h for obj in taking_part(run.objectives) for h in hooks[id(obj)]]
    logits, terms = forward(step_model, run.model, batch, run.objectives, config.bf16,
                            ctx.device, attached, step)
    loss, step_stats = task_loss(logits, batch, len(run.data.names))
    total = loss
    for term, _ in terms:
        total = total + term
    run.optimizer.zero_grad(set_to_none=True)
    total.backward()
    if run.sharding is not None:
        run.sharding.sync_grads()
    if config.grad_clip > 0:
        run.grad_norm = (run.sharding.clip_grad_norm(params, config.grad_clip)
                         if run.sharding is not None else clip_grad_norm(params, config.grad_clip))
    run.optimizer.step()
    run.done = step + 1
    run.window.add(step_stats, total, terms)
    return lr


def _after_step(run: _Run, lr: float, bar: ProgressBar, t0: float) -> None:
    """The periodic work after a step: the ``"train"`` line, evaluation, the checkpoint."""
    config, done = run.config, run.done
    if done % config.log_every == 0 or done == config.steps:
        record = run.window.record(run.ctx, done, lr, run.data.names, run.grad_norm, t0)
        run.writer.write(record)
        if not math.isfinite(record["loss"]):
            raise _diverged(record["loss"], done, lr, run.objectives, run.out_dir)
        bar.update(done, record["loss"], record["tasks"])
        run.window = LogWindow.empty(run.objectives, len(run.data.names), run.ctx.device)
        run.metrics = record
    else:
        bar.update(done)
    evaluating = bool(config.eval_every) and (done % config.eval_every == 0
                                              or done == config.steps)
    if evaluating:
        run.metrics = {"kind": "eval", "step": done, **_evaluate(run)}
        run.writer.write(run.metrics)
    due = [cb for cb in run.callbacks if _due(cb, done, config.steps, evaluating)]
    if due or evaluating:  # the run log's callbacks log what the others decided
        due += run.writer.callbacks
    if due:
        run.stopped, run.extra = _call_back(due, run.ctx, done, run.model, run.metrics, config,
                                            run.objectives, run.optimizer, run.out_dir,
                                            run.extra)
        run.model.train()
    last = done == config.steps or run.stopped
    if run.out_dir is not None and config.checkpoint_every and (
            done % config.checkpoint_every == 0 or last):
        loss_sum = float(run.window.loss_sum)  # a host read, at checkpoints only
        if not math.isfinite(loss_sum):  # never checkpoint a diverged model
            raise _diverged(loss_sum, done, lr, run.objectives, run.out_dir)
        _checkpoint(run)
        run.writer.checkpoint(done, run.model)


def _due(callback: Callable[[TrainState], None], done: int, steps: int,
         evaluating: bool) -> bool:
    """Whether ``callback`` runs after update ``done``: at evaluation points, or, for one with
    its own cadence (a ``call_every`` attribute, a positive number of steps), every that many
    steps and at the last (``headwise.contract.Enforcer``: enforcement measures at its own
    cadence, whatever the evaluation points')."""
    every = getattr(callback, "call_every", None)
    if every:
        return done % int(every) == 0 or done == steps
    return evaluating


def _evaluate(run: _Run) -> dict[str, Any]:
    """Held-out evaluation with the run's settings (seeded: the same batches every time)."""
    config = run.config
    return evaluate(run.model, run.eval_data, batch_size=config.batch_size,
                    n_batches=config.eval_batches, seed=config.seed + EVAL_SEED_OFFSET,
                    objectives=run.objectives, bf16=config.bf16, ctx=run.ctx)


def _interrupted(run: _Run, signum: int) -> Interrupted:
    """Checkpoint the steps done (every rank takes part) and say where, for ``raise``."""
    path = None
    if run.out_dir is not None:
        if run.saved != run.done:
            _checkpoint(run)
        found = list_checkpoints(run.out_dir)
        path = found[-1][1] if found else None  # stopped at step 0 of a fresh run: none yet
    return Interrupted(run.done, signum, path)


def _finish(run: _Run) -> TrainResult:
    """Write the final weights and ``config.json`` (rank 0) and describe the run."""
    if run.done == run.start and run.config.eval_every:  # resumed at the end: report only
        run.metrics = {"kind": "eval", "step": run.done, **_evaluate(run)}
    if run.sharding is not None:  # the whole model on every rank again, no process group
        run.sharding.unshard()
    weights = None
    if run.out_dir is not None:
        weights = run.out_dir / "model.safetensors"
        if run.ctx.is_main:
            save_weights(run.model, weights)
            if cfg := getattr(run.model, "config", None):
                write_bytes_atomic(run.out_dir / "config.json",
                                   json.dumps(cfg.to_dict(), indent=1).encode())
        run.ctx.barrier()
    steps = [s for s, _ in list_checkpoints(run.out_dir)] if run.out_dir is not None else []
    return TrainResult(step=run.done, metrics=run.metrics, weights_path=weights,
                       checkpoints=steps, stopped_early=run.stopped, extra=run.extra)


def _call_back(callbacks: list[Callable[[TrainState], None]], ctx: DistContext, step: int,
               model: nn.Module, metrics: dict[str, Any], config: TrainConfig,
               objectives: list[Objective], optimizer: torch.optim.Optimizer,
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


def _checkpoint(run: _Run) -> None:
    """Save a checkpoint at ``run.done``; it keeps the logging window in progress (the sums
    since the last ``"train"`` line, every rank's), so that a resumed run writes the same
    ``metrics.jsonl`` as an uninterrupted one."""
    assert run.out_dir is not None
    ctx = run.ctx
    rng = ctx.gather(torch.get_rng_state())
    log, log_tensors = _window_state(run)
    if run.sharding is not None:  # every rank writes its shard
        from headwise.training.sharded_checkpoint import save_sharded_checkpoint

        save_sharded_checkpoint(run.out_dir, run.done, run.model, run.optimizer, ctx,
                                data_generator=run.gen, torch_rng=rng,
                                objective_weights={o.name: float(o.weight)
                                                   for o in run.objectives},
                                extra=run.extra, config=run.config.to_dict(),
                                stopped=run.stopped, log=log, log_tensors=log_tensors)
        run.saved = run.done
        return
    if ctx.is_main:
        save_checkpoint(run.out_dir, run.done, run.model, run.optimizer,
                        data_generator=run.gen, torch_rng=rng,
                        objective_weights={o.name: float(o.weight) for o in run.objectives},
                        extra=run.extra, config=run.config.to_dict(), stopped=run.stopped,
                        log=log, log_tensors=log_tensors)
    ctx.barrier()
    run.saved = run.done


def _diverged(loss: float, step: int, lr: float, objectives: list[Objective],
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
