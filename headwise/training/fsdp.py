"""Sharded data parallelism (``train.parallel: fsdp``): FSDP2 ``fully_shard`` per block, and back.

``shard(model, ctx)`` applies ``torch.distributed.fsdp.fully_shard`` to every block and then to
the whole model (whose own group holds the embeddings, the final norm and the unembedding, so
tied embedding weights stay one tensor). Each parameter becomes a ``DTensor`` holding
``ceil(rows / N)`` of its rows on each of the N ranks; a block's full parameters exist only
while its forward or backward runs (all-gathered, then freed), and gradients are
reduce-scattered, averaged over ranks like DDP's. Per rank, parameters, gradients and AdamW's
two moments therefore take ~1/N of one process's memory.

Every lever keeps working: masks, pattern objectives and role bounds read activations (hook
points fire inside the forward as before); head-scoped LoRA adapters live inside their block and
are sharded with it; per-head freezing masks the gradient of the gathered parameter
(``FreezeHandle``); task gates' ``log_alpha`` (read outside the forward by the L0 penalty) stay
whole on every rank, *replicated*: their gradients are averaged by ``Sharding.sync_grads``.
Compute runs in float32 or under bfloat16 autocast as ``train.bf16`` says (no FSDP mixed
precision policy), so an ``fsdp`` update equals a ``none`` or ``ddp`` one up to summation order.

``Sharding.unshard()`` gathers every parameter (``DTensor.full_tensor``, on every rank) and
returns the model to the plain module it was (class, hooks and parameters), so that what
follows training (verification, the report, ``model.safetensors``) needs no process group.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor, nn
from torch.distributed import _composable_state
from torch.distributed.fsdp import FSDPModule, fully_shard, register_fsdp_forward_method
from torch.distributed.tensor import DTensor

from headwise.training.distributed import DistContext

# Parameters read outside a forward pass (so they cannot be sharded with their block).
REPLICATED = ("head_gate.",)


@dataclass
class _Saved:
    """What ``fully_shard`` changes on one module: its class, hook tables and attributes."""

    cls: type
    hooks: dict[str, dict[Any, Any]]
    keys: set[str]


_HOOK_TABLES = ("_forward_pre_hooks", "_forward_pre_hooks_with_kwargs", "_forward_hooks",
                "_forward_hooks_with_kwargs", "_forward_hooks_always_called")


@dataclass
class Sharding:
    """A model sharded in place by ``shard``.

    Attributes:
        model: the sharded model (the same object the caller passed).
        ctx: the process group's context.
        replicated: parameters kept whole on every rank (their gradients need ``sync_grads``).
    """

    model: nn.Module
    ctx: DistContext
    replicated: list[nn.Parameter]
    _saved: dict[int, tuple[nn.Module, _Saved]] = field(default_factory=dict)

    def sync_grads(self) -> None:
        """Average the replicated parameters' gradients over ranks (after ``backward``)."""
        grads = [p.grad for p in self.replicated if p.grad is not None]
        if not grads or self.ctx.world_size == 1:
            return
        flat = torch.cat([g.reshape(-1) for g in grads])
        dist.all_reduce(flat, op=dist.ReduceOp.SUM)
        flat /= self.ctx.world_size
        offset = 0
        for g in grads:
            g.copy_(flat[offset:offset + g.numel()].view_as(g))
            offset += g.numel()

    def clip_grad_norm(self, params: list[Tensor], max_norm: float) -> Tensor:
        """Scale every gradient so that the global L2 norm is at most ``max_norm``.

        ``norm = sqrt(sum over ranks of |local shard grads|^2 + |replicated grads|^2)``
        (replicated gradients are counted once), ``coef = min(1, max_norm / (norm + 1e-6))``,
        as ``torch.nn.utils.clip_grad_norm_`` and the single-process loop compute it.
        """
        local: list[DTensor] = []
        whole: list[Tensor] = []
        for p in params:
            if p.grad is not None:
                if isinstance(p.grad, DTensor):
                    local.append(p.grad)
                else:
                    whole.append(p.grad)
        sq = torch.zeros((), dtype=torch.float32, device=self.ctx.device)
        for d in local:
            sq = sq + d.to_local().float().pow(2).sum()
        if self.ctx.world_size > 1:
            dist.all_reduce(sq, op=dist.ReduceOp.SUM)
        for w in whole:
            sq = sq + w.float().pow(2).sum()
        total = sq.sqrt()
        coef = torch.clamp(max_norm / (total + 1e-6), max=1.0)
        for d in local:
            d.to_local().mul_(coef.to(d.dtype))
        for w in whole:
            w.mul_(coef.to(w.dtype))
        return total

    @torch.no_grad()
    def unshard(self) -> None:
        """Gather every parameter on every rank and undo ``fully_shard`` (class, hooks, state).

        Every rank must call this (one all-gather per sharded parameter, in model order).
        """
        full: dict[int, nn.Parameter] = {}
        for module in self.model.modules():
            for name, p in list(module._parameters.items()):
                if p is None or not isinstance(p, DTensor):
                    continue
                if id(p) not in full:  # a tied weight is gathered once and stays tied
                    full[id(p)] = nn.Parameter(p.full_tensor().clone(),
                                               requires_grad=p.requires_grad)
                module._parameters[name] = full[id(p)]
        for module, saved in self._saved.values():
            module.__class__ = saved.cls
            for table, hooks in saved.hooks.items():
                current = getattr(module, table)
                current.clear()
                current.update(hooks)
            for key in set(module.__dict__) - saved.keys:
                del module.__dict__[key]
            _composable_state._module_state_mapping.pop(module, None)
        self._saved.clear()


def _blocks(model: nn.Module) -> list[nn.Module]:
    blocks = getattr(model, "blocks", None)
    return list(blocks) if isinstance(blocks, nn.ModuleList) else []


def shard(model: nn.Module, ctx: DistContext) -> Sharding:
    """Shard ``model`` in place over ``ctx``'s ranks: ``fully_shard`` each block, then the root.

    Call after the levers are applied (masks, LoRA, gates, freezing) and before the optimizer
    is made, on every rank. Rank 0's parameters and buffers are broadcast first (as DDP does
    when it wraps a model), so a lever initialised from an unseeded RNG (a LoRA ``A``) is the
    same on every rank.

    Returns:
        The ``Sharding``; ``unshard()`` it when training ends.
    """
    if ctx.world_size > 1:
        with torch.no_grad():
            for t in [*model.parameters(), *model.buffers()]:
                dist.broadcast(t.data, src=0)
    replicated = [p for n, p in model.named_parameters()
                  if any(part in n for part in REPLICATED)]
    ignored = set(replicated)
    saved = {id(m): (m, _Saved(type(m), {t: dict(getattr(m, t)) for t in _HOOK_TABLES},
                                set(m.__dict__)))
             for m in model.modules()}
    kwargs: dict[str, Any] = {"ignored_params": ignored} if ignored else {}
    if ctx.device.type == "cpu":
        from torch.distributed.device_mesh import init_device_mesh

        kwargs["mesh"] = init_device_mesh("cpu", (ctx.world_size,))
    for block in _blocks(model):
        fully_shard(block, **kwargs)
    fully_shard(model, **kwargs)
    if callable(getattr(model, "hidden", None)):  # a forward of its own: gather there too
        register_fsdp_forward_method(model, "hidden")
    assert isinstance(model, FSDPModule)
    return Sharding(model, ctx, replicated, saved)
