"""Data-parallel training under ``torchrun``: process group, DDP wrapping, shards, reductions.

``train()`` calls ``setup`` once. Started by ``torchrun --nproc_per_node=N`` (``WORLD_SIZE`` > 1
in the environment) it initialises the default process group (``gloo`` for a CPU model,
``nccl`` for a CUDA model, which moves to ``cuda:LOCAL_RANK``) unless the caller already did.
``train.parallel`` says what the ranks share: ``ddp`` (the default under ``torchrun``): ``wrap``
puts the model in ``DistributedDataParallel``; ``fsdp``: the loop shards it in place
(``headwise.training.fsdp``; a group is made even for one rank). Every rank draws the same
global batch from an identically seeded generator and keeps the contiguous shard
``[rank * B / N, (rank + 1) * B / N)``; since DDP averages gradients over ranks and each rank's
loss is the mean over its (equally many) examples, an update equals one process's update on
the whole global batch, up to floating-point summation order. Only rank 0 writes files.
Without ``WORLD_SIZE`` > 1 every helper is a no-op for a single process.

A command that writes after training (the verdict, the report) ends with ``finish_together``:
rank 0 writes while the other ranks wait, then every rank leaves with rank 0's exit code, so
``torchrun`` never stops rank 0 half-way because another rank finished first.

A signal (Ctrl-C, or the SIGTERM ``torchrun`` forwards) may reach the ranks at different
steps; ``agree_signal`` makes every rank see it at the same step (one small all-reduce per step,
on the host through a gloo group, so a CUDA run does not synchronise its device for it), so all
ranks checkpoint together.
"""

from __future__ import annotations

import gc
import os
import signal
import sys
import time
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor, nn

from headwise.data import Batch
from headwise.errors import ConfigError


@dataclass(frozen=True)
class DistContext:
    """This process's place in a data-parallel run (rank 0 of 1 when not distributed)."""

    rank: int = 0
    world_size: int = 1
    device: torch.device = torch.device("cpu")
    owns_group: bool = False
    host_group: Any = None  # a gloo group for host-side flags (None: the default group)
    parallel: str = "none"  # "none" | "ddp" | "fsdp" (``TrainConfig.parallel``, resolved)

    @property
    def enabled(self) -> bool:
        """Whether more than one process takes part."""
        return self.world_size > 1

    @property
    def sharded(self) -> bool:
        """Whether the model is sharded over the ranks (``parallel: fsdp``)."""
        return self.parallel == "fsdp"

    @property
    def is_main(self) -> bool:
        """Rank 0: the process that writes files, metrics and the progress bar."""
        return self.rank == 0

    def shard(self, batch: Batch) -> Batch:
        """This rank's contiguous share of a global batch.

        Raises:
            ConfigError: the global batch size is not divisible by the world size.
        """
        if not self.enabled:
            return batch
        if batch.size % self.world_size:
            raise ConfigError(f"batch_size: got {batch.size}, expected a multiple of the "
                              f"world size {self.world_size}")
        n = batch.size // self.world_size
        return batch.slice(self.rank * n, (self.rank + 1) * n)

    def all_reduce_sum(self, t: Tensor) -> Tensor:
        """Sum ``t`` over ranks (in place on a copy on this rank's device)."""
        if not self.enabled:
            return t
        out = t.detach().to(self.device).clone()
        dist.all_reduce(out, op=dist.ReduceOp.SUM)
        return out.to(t.device)

    def broadcast(self, obj: Any) -> Any:
        """Rank 0's ``obj`` on every rank (JSON-like Python objects)."""
        if not self.enabled:
            return obj
        box = [obj]
        dist.broadcast_object_list(box, src=0)
        return box[0]

    def gather(self, obj: Any) -> list[Any]:
        """Every rank's ``obj``, by rank."""
        if not self.enabled:
            return [obj]
        out: list[Any] = [None] * self.world_size
        dist.all_gather_object(out, obj)
        return out

    def agree_signal(self, signum: int | None) -> int | None:
        """The signal any rank has received (``None``: none), the same on every rank.

        Every rank must call this at the same step (the loop does, before each step).
        """
        if not self.enabled:
            return signum
        flag = torch.tensor([signum or 0], dtype=torch.int64)
        dist.all_reduce(flag, op=dist.ReduceOp.MAX, group=self.host_group)
        return int(flag[0]) or None

    def barrier(self) -> None:
        """Wait for every rank."""
        if self.enabled:
            dist.barrier()


def resolve_parallel(parallel: str | None) -> str:
    """``train.parallel`` for this process: the default is ``ddp`` under ``torchrun``.

    Raises:
        ConfigError: ``none`` under ``torchrun`` with more than one rank, or ``ddp`` / ``fsdp``
            in a process that ``torchrun`` did not start.
    """
    launched = "WORLD_SIZE" in os.environ or (dist.is_available() and dist.is_initialized())
    world = (dist.get_world_size() if dist.is_available() and dist.is_initialized()
             else int(os.environ.get("WORLD_SIZE", "1")))
    if parallel is None:
        return "ddp" if world > 1 else "none"
    if parallel == "none" and world > 1:
        raise ConfigError(f"train.parallel: got 'none' in a run of {world} ranks, expected "
                          "ddp or fsdp under torchrun (or one process without torchrun)")
    if parallel != "none" and not launched:
        raise ConfigError(f"train.parallel: got {parallel!r} without torchrun, expected none "
                          f"(or start with `torchrun --nproc-per-node N`)")
    return parallel


def setup(model: nn.Module, parallel: str | None = None) -> DistContext:
    """Detect ``torchrun``'s environment and join (or create) the process group.

    The model stays where it is for one process; under DDP or FSDP a CUDA model moves to
    ``cuda:LOCAL_RANK``. ``parallel`` is ``TrainConfig.parallel`` (``resolve_parallel``).

    Raises:
        ConfigError: a ``parallel`` that does not fit how the process was started.
    """
    mode = resolve_parallel(parallel)
    world = int(os.environ.get("WORLD_SIZE", "1"))
    param = next(model.parameters(), None)
    device = param.device if param is not None else torch.device("cpu")
    if mode != "fsdp" and world <= 1 and not (dist.is_available() and dist.is_initialized()):
        return DistContext(device=device)
    owns = False
    if device.type == "cuda":
        device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
        torch.cuda.set_device(device)
        model.to(device)
    if not dist.is_initialized():
        dist.init_process_group(backend="nccl" if device.type == "cuda" else "gloo")
        owns = True
    host = dist.new_group(backend="gloo") if dist.get_backend() != "gloo" else None
    return DistContext(rank=dist.get_rank(), world_size=dist.get_world_size(), device=device,
                       owns_group=owns, host_group=host, parallel=mode)


def wrap(model: nn.Module, ctx: DistContext) -> nn.Module:
    """``DistributedDataParallel(model)`` under DDP, else ``model`` itself (a sharded model
    is sharded in place).

    Hooks and objectives keep addressing the inner model (its hook names are fixed at build
    time); ``find_unused_parameters`` tolerates heads or adapters a task's forward skips.
    """
    if not ctx.enabled or ctx.sharded:
        return model
    from torch.nn.parallel import DistributedDataParallel

    ids = [ctx.device.index] if ctx.device.type == "cuda" else None
    return DistributedDataParallel(model, device_ids=ids, find_unused_parameters=True)


def teardown(ctx: DistContext, failed: bool = False) -> None:
    """Destroy the process group if ``setup`` created it.

    After a successful run every rank first waits for the others (after a failure it does not:
    the other ranks may never arrive), and the DDP wrapper (kept alive by reference cycles
    in its reducer hooks) is collected while the group still exists: a wrapper finalised after
    the group, at interpreter exit, can abort the process (seen as a rare SIGABRT,
    "terminate called without an active exception", on a gloo rank).
    """
    if ctx.owns_group and dist.is_initialized():
        if not failed:
            dist.barrier()
        gc.collect()
        dist.destroy_process_group()
    elif ctx.host_group is not None and dist.is_initialized():  # ours, in the caller's group
        dist.destroy_process_group(ctx.host_group)


FINISH_TIMEOUT = timedelta(hours=2)  # how long the other ranks wait for rank 0's files
LEAVE_S = 60.0  # how long the other ranks wait for torchrun to stop them after a failure
REFUSAL_PATIENCE = timedelta(seconds=10)  # a refusal waits this long for the other ranks
_POLL_S = 0.05
_TORCHRUN_STORE = ("TORCHELASTIC_RUN_ID", "MASTER_ADDR", "MASTER_PORT")  # torchrun's agent store


def finish_together(code: int, patience: timedelta = FINISH_TIMEOUT) -> int | None:
    """The exit code every rank of a ``torchrun`` job leaves with: rank 0's ``code``, given
    once rank 0 has written what it writes (call this after that, on every rank).

    The other ranks wait on ``torchrun``'s own store (the process group is gone by then)
    for rank 0's code and say they have it; rank 0 returns once every rank has it. With a
    failure code, ``torchrun`` stops the ranks still running as soon as one exits: the other
    ranks let rank 0 exit first and leave with its code when ``torchrun`` stops them, so every
    rank exits with ``code`` and none is cut short while rank 0 writes. Without ``torchrun``
    (or on one rank) ``code`` is returned at once: the store that outlives the process group
    is the one ``torchrun``'s agent holds.

    Args:
        code: this rank's exit code (rank 0's is every rank's).
        patience: how long any rank waits for the others (a refusal that only some ranks
            meet must not wait for ranks that went on to train).

    Returns:
        Rank 0's code, or ``None`` on another rank when rank 0 gave none in time.
    """
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world <= 1 or not all(k in os.environ for k in _TORCHRUN_STORE):
        return code  # not torchrun: no store outlives the process group to wait on
    store = dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]),
                          is_master=False, timeout=patience)
    key = ("headwise/finished/" + os.environ["TORCHELASTIC_RUN_ID"]
           + "/" + os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
    if int(os.environ.get("RANK", "0")) == 0:
        store.set(key, str(code))
        deadline = time.monotonic() + patience.total_seconds()
        while store.add(f"{key}/have", 0) < world - 1 and time.monotonic() < deadline:
            time.sleep(_POLL_S)
        return code
    try:
        store.wait([key])
    except dist.DistStoreError:  # rank 0 went on (or failed otherwise): torchrun stops it
        return None
    code = int(store.get(key))
    if code:  # leave with the code when torchrun stops this rank after rank 0's exit
        signal.signal(signal.SIGTERM, lambda *_: _leave(code))
    store.add(f"{key}/have", 1)
    if code:
        time.sleep(LEAVE_S)
    return code


def _leave(code: int) -> None:
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
