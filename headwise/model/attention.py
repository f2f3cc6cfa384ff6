"""Multi-head self-attention with a fused path (SDPA) and an explicit path for requested heads.

Per head h (Vaswani et al. 2017)::

    q_h = x W_Q[h], k_h = x W_K[g(h)], v_h = x W_V[g(h)]       g(h) = h // (H / H_kv)  (GQA)
    scores_h = q_h k_h^T / sqrt(Dh)   masked where not allowed
    pattern_h = softmax(scores_h)     (a row with no allowed key is all zeros)
    z_h = pattern_h v_h;  out = concat_h(z_h) W_O + b_O

The module picks its path itself; a capture costs only what it adds:

- no hooks at ``hook_attn_scores`` / ``hook_pattern``: every head runs through
  ``torch.nn.functional.scaled_dot_product_attention``;
- read-only captures (``Hook(read_only=True)``: run_with_cache, pattern objectives) of *some*
  heads: every head still runs fused and the requested heads' scores and patterns are computed
  *beside* it, from views of q and k (one head: nothing gathered). The outputs are
  bit-identical to the no-hook forward, and a loss on a captured pattern still trains q and k;
- hooks on *every* head of the layer (read-only or not): one explicit pass whose pattern gives
  the output (no fused call); outputs equal the fused ones to float rounding (~1e-7), not bit
  for bit. On CPU, read-only pattern captures of a causal layer without other masks, at
  least 128 tokens and without gradient run that pass in blocks of 64 queries
  (``kernels.causal_blocked``): each block's scores cover only the keys it may attend and stay
  in cache from the matmul to v, so capturing every pattern costs little beyond writing it;
- a hook that may write (or reads a gradient) on some heads: those heads are computed
  explicitly and their pattern is on the output's path: q/k/v are gathered once into (fused
  heads, explicit heads) order, the fused kernel runs on the first group only and the explicit
  path on the second (no head is computed twice); the kernel computes each (example, head) on
  its own, so the heads that stay fused give the very same numbers (tested bit for bit);
- on CPU, a sequence of at most ``EXPLICIT_MAX_KEYS`` (15) tokens with hooks there runs *every*
  head explicitly, which is cheaper at that length (PyTorch's CPU kernels, fused and softmax,
  are slowest on rows shorter than 16); outputs equal the fused ones to float rounding.

Explicit scores of a causal layer without other masks are masked inside the matmul (``baddbmm``
onto a cached additive ``-inf`` mask), and a softmax that nothing differentiates and whose
scores no hook reads is written over the scores: each pass over a fresh (B, h, T, T) buffer
costs about as much as the matmul (``bench/bench_attention_kernel.py --captures``).

Optional slots installed by ``headwise.control`` (never set by the builder):
``head_mask`` (structural masks) and ``head_gate`` (task gates).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from headwise.heads import kv_head
from headwise.model.hook_point import HookPoint
from headwise.model.kernels import (
    CPU_SOFTMAX_WIDTH,
    QUERY_BLOCK,
    causal_blocked,
    gqa_kv,
    softmax_keys,
)
from headwise.model.mask_plan import MaskPlan, mask_plan
from headwise.model.positional import Rotary

# On CPU, when hooks ask for some heads' scores or patterns and the sequence has at most this many
# tokens, every head runs on the explicit path: one pass there costs less than the fused kernel
# plus the hooked heads computed beside or split off it (bench/bench_attention_kernel.py).
# The default of ``Attention(explicit_max_keys=...)``.
EXPLICIT_MAX_KEYS = 15

# head_mask(seq_len, task_ids, device) -> bool mask (H|1, T, T) or (B, H|1, T, T), True = may attend
HeadMaskFn = Callable[[int, "Tensor | None", torch.device], "Tensor | None"]


class HeadIndex(NamedTuple):
    """Index tensors for a set of explicit heads (made once per heads and device)."""

    order: Tensor  # (H,) the other heads, then the explicit ones
    kv_order: Tensor  # (H,) the kv head each of ``order`` reads
    back: Tensor  # (H,) the inverse of ``order``
    heads: Tensor  # (h,) the explicit heads
    kv_heads: Tensor  # (h,) the kv head each of them reads


class Attention(nn.Module):
    """Multi-head (optionally grouped-query) self-attention.

    Args:
        q_proj: Linear D -> H*Dh.  k_proj, v_proj: Linear D -> H_kv*Dh.  o_proj: H*Dh -> D.
        n_heads: H.  n_kv_heads: H_kv (divides H).  d_head: Dh.
        causal: mask keys after the query.
        rotary: rotary embedding applied to q and k, or ``None``.
        dropout: attention dropout on the pattern (training only).
        explicit_max_keys: on CPU, sequences of at most this many tokens with hooks on scores
            or patterns run every head explicitly (``None``: ``EXPLICIT_MAX_KEYS``; 0 keeps
            the fused / split paths at every length).
    """

    def __init__(self, q_proj: nn.Module, k_proj: nn.Module, v_proj: nn.Module,
                 o_proj: nn.Module, *, n_heads: int, n_kv_heads: int, d_head: int,
                 causal: bool, rotary: Rotary | None = None, dropout: float = 0.0,
                 explicit_max_keys: int | None = None) -> None:
        super().__init__()
        if n_heads % n_kv_heads:
            raise ValueError(f"n_kv_heads={n_kv_heads} must divide n_heads={n_heads}")
        self.q_proj, self.k_proj, self.v_proj, self.o_proj = q_proj, k_proj, v_proj, o_proj
        self.n_heads, self.n_kv_heads, self.d_head = n_heads, n_kv_heads, d_head
        self.group = n_heads // n_kv_heads
        self.causal = causal
        self.rotary = rotary
        self.dropout = dropout
        self.explicit_max_keys = (EXPLICIT_MAX_KEYS if explicit_max_keys is None
                                  else explicit_max_keys)
        self.head_mask: HeadMaskFn | None = None
        self.head_gate: nn.Module | None = None
        self._index: dict[tuple[tuple[int, ...], torch.device], HeadIndex] = {}
        self._bias: Tensor | None = None  # the explicit path's causal bias (``_causal_bias``)
        self.hook_q = HookPoint(head_axis=2)  # (B, T, H, Dh)
        self.hook_k = HookPoint(head_axis=2, kv_group=self.group)  # (B, T, H_kv, Dh)
        self.hook_v = HookPoint(head_axis=2, kv_group=self.group)  # (B, T, H_kv, Dh)
        if rotary is not None:
            self.hook_rot_q = HookPoint(head_axis=2)
            self.hook_rot_k = HookPoint(head_axis=2, kv_group=self.group)
        self.hook_attn_scores = HookPoint(head_axis=1)  # (B, h, T, T) for explicit heads
        self.hook_pattern = HookPoint(head_axis=1)  # (B, h, T, T) for explicit heads
        self.hook_z = HookPoint(head_axis=2)  # (B, T, H, Dh)
        self.hook_result = HookPoint(head_axis=2)  # (B, T, H, D), only when requested

    def forward(self, x: Tensor, plan: MaskPlan | None = None,
                task_ids: Tensor | None = None) -> Tensor:
        """Args:
            x: (B, T, D) input.
            plan: the forward's causal and key-padding masks (``mask_plan``, built once per
                forward by ``Transformer.hidden``), or ``None``: no padding.
            task_ids: (B,) long task index per example (for masks and gates), or ``None``.

        Returns:
            (B, T, D) attention output, before the residual add.
        """
        B, T, _ = x.shape
        H, Hkv, Dh = self.n_heads, self.n_kv_heads, self.d_head
        q = self.hook_q(self.q_proj(x).view(B, T, H, Dh))
        k = self.hook_k(self.k_proj(x).view(B, T, Hkv, Dh))
        v = self.hook_v(self.v_proj(x).view(B, T, Hkv, Dh))
        if self.rotary is not None:
            q = self.hook_rot_q(self.rotary(q))
            k = self.hook_rot_k(self.rotary(k))
        q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)  # (B, H|Hkv, T, Dh)

        plan = self._layer_plan(T, plan, task_ids, x.device)
        explicit = self.explicit_heads()
        if explicit and T <= self.explicit_max_keys and x.device.type == "cpu":
            explicit = tuple(range(H))  # short rows: cheaper than fused + the hooked heads
        beside = 0 < len(explicit) < H and not (self.hook_attn_scores.writes
                                                or self.hook_pattern.writes)
        if not explicit or beside:
            z = self._fused(q, k, v, plan, self.group)  # (B, H, T, Dh)
            if beside:  # captures of some heads: their patterns beside, off the output
                self._patterns_beside(q, k, plan, explicit)
        elif len(explicit) == H:  # every head: one explicit pass, its output used
            k, v = gqa_kv(k, v, self.group, masked=True)[:2]
            if self._blocked_capture(q, plan):
                z, pattern = causal_blocked(q, k, v, self._causal_bias(T, q),
                                            1.0 / math.sqrt(Dh))
                self.hook_pattern(pattern, explicit)  # read-only: nothing comes back
            else:
                z = self._explicit(q, k, v, plan, explicit)
        else:
            z = self._split(q, k, v, plan, explicit)
        z = self.hook_z(z.transpose(1, 2))  # (B, T, H, Dh)
        if self.head_gate is not None:
            z = self.head_gate(z, task_ids)
        if self.hook_result.active:
            return self._per_head_result(z)
        return self.o_proj(z.reshape(B, T, H * Dh))  # (B, T, D)

    def _layer_plan(self, T: int, plan: MaskPlan | None, task_ids: Tensor | None,
                    device: torch.device) -> MaskPlan:
        """The forward's plan narrowed by this layer's per-head mask, if any.

        This is the kernel's mask: keys only, so padding *queries* still get a (finite) row.
        ``headwise.patterns.allowed_keys`` is the measurement's mask over the same causal and
        padding rules, which also gives padding queries no key (nothing is scored there).
        """
        head = self.head_mask(T, task_ids, device) if self.head_mask is not None else None
        return mask_plan(T, self.causal, head_mask=head, base=plan, device=device)

    def explicit_heads(self) -> tuple[int, ...]:
        """Heads whose scores/patterns the attached hooks ask for (empty: none are computed;
        ``forward`` decides whether they come beside the fused call or on the explicit path)."""
        wanted: set[int] = set()
        for point in (self.hook_attn_scores, self.hook_pattern):
            req = point.requested_heads()
            if req is None:
                continue
            if -1 in req:
                return tuple(range(self.n_heads))
            wanted |= req
        return tuple(sorted(wanted))

    def _fused(self, q: Tensor, k: Tensor, v: Tensor, plan: MaskPlan, group: int) -> Tensor:
        """(B, h, T, Dh) through SDPA, from q (B, h, T, Dh) and k/v (B, h / group, T, Dh)."""
        p = self.dropout if self.training else 0.0
        k, v, gqa = gqa_kv(k, v, group, masked=plan.allowed is not None)
        if plan.allowed is None or plan.row_ok is None:
            return F.scaled_dot_product_attention(q, k, v, dropout_p=p, is_causal=self.causal,
                                                  enable_gqa=gqa)
        # A row with no allowed key would give NaN: let it attend everywhere, then zero it.
        z = F.scaled_dot_product_attention(q, k, v, attn_mask=plan.allowed | ~plan.row_ok,
                                           dropout_p=p, enable_gqa=gqa)
        return z * plan.row_ok

    def _patterns_beside(self, q: Tensor, k: Tensor, plan: MaskPlan,
                         heads: tuple[int, ...]) -> None:
        """Scores and patterns of ``heads`` (not all) for read-only hooks, off the output's
        path; one head is a view of q and k (nothing gathered), several are one gather."""
        if len(heads) == 1:
            h = heads[0]
            q, k = q.narrow(1, h, 1), k.narrow(1, h // self.group, 1)  # (B, 1, T, Dh)
        else:
            index = self._head_index(heads, q.device)
            q, k = q.index_select(1, index.heads), k.index_select(1, index.kv_heads)
        self._pattern(q, k, plan, heads)

    def _blocked_capture(self, q: Tensor, plan: MaskPlan) -> bool:
        """Whether every head's pattern can come from ``causal_blocked``: on CPU, a causal
        layer with no other mask, sequences of at least two query blocks, read-only pattern
        hooks and none on the scores, and nothing that differentiates, drops out or autocasts
        the pattern (the blocks are normalised in place and written into a zeroed buffer)."""
        return (q.device.type == "cpu" and self.causal and plan.allowed is None
                and q.shape[2] >= 2 * QUERY_BLOCK
                and not self.hook_attn_scores.active and not self.hook_pattern.writes
                and not q.requires_grad and not (self.dropout and self.training)
                and not torch.is_autocast_enabled("cpu"))

    def _split(self, q: Tensor, k: Tensor, v: Tensor, plan: MaskPlan,
               explicit: tuple[int, ...]) -> Tensor:
        """(B, H, T, Dh): the fused kernel on the heads not in ``explicit``, the explicit path on
        those, in one gather of q/k/v into (fused heads, explicit heads) order and one gather
        back. Each fused head's numbers are those of a fused call over all heads (the kernel
        computes every (example, head) on its own; tested bit for bit)."""
        index = self._head_index(explicit, q.device)
        n = self.n_heads - len(explicit)
        q = q.index_select(1, index.order)  # (B, H, T, Dh), fused heads first
        k, v = k.index_select(1, index.kv_order), v.index_select(1, index.kv_order)
        z_fused = self._fused(q[:, :n], k[:, :n], v[:, :n], plan.at_heads(index.order[:n]), 1)
        z_exp = self._explicit(q[:, n:], k[:, n:], v[:, n:], plan, explicit)
        return torch.cat([z_fused, z_exp], 1).index_select(1, index.back)

    def _explicit(self, qh: Tensor, kh: Tensor, vh: Tensor, plan: MaskPlan,
                  heads: tuple[int, ...]) -> Tensor:
        """(B, h, T, Dh) of ``heads`` from their q and their kv heads' k/v (B, h, T, Dh)."""
        pattern = self._pattern(qh, kh, plan, heads)
        if self.dropout and self.training:
            pattern = F.dropout(pattern, self.dropout, True)
        return pattern @ vh  # (B, h, T, Dh)

    def _pattern(self, qh: Tensor, kh: Tensor, plan: MaskPlan,
                 heads: tuple[int, ...]) -> Tensor:
        """(B, h, T, T) pattern of ``heads`` from their q and k (B, h, T, Dh); the hooks at
        ``hook_attn_scores`` and ``hook_pattern`` run on the way. ``plan`` is the layer's (all
        heads)."""
        B, h, T, Dh = qh.shape
        scale = 1.0 / math.sqrt(self.d_head)
        # Each pass over a fresh (B, h, T, T) buffer costs about as much as the matmul itself
        # (on CPU, mostly first-touch page faults), so the causal mask is added inside the
        # matmul (baddbmm onto a -inf bias) and a softmax that nothing differentiates or reads
        # the scores of is written over them (not under autocast, which may want a float32
        # pattern from half-precision scores). Causal-only rows always keep their diagonal key:
        # a plain softmax, decided without reading the mask's values (no host synchronisation).
        no_key = None
        if plan.allowed is None and self.causal:
            scores = torch.baddbmm(self._causal_bias(T, qh), qh.reshape(B * h, T, Dh),
                                   kh.reshape(B * h, T, Dh).transpose(-1, -2), alpha=scale)
            scores = scores.view(B, h, T, T)
        else:
            scores = (qh * scale) @ kh.transpose(-1, -2)  # (B, h, T, T)
            if len(heads) < self.n_heads:
                plan = plan.at_heads(self._head_index(heads, qh.device).heads)
            if plan.allowed is not None and plan.row_ok is not None:
                scores = scores.masked_fill_(~plan.allowed, float("-inf"))
                no_key = ~plan.row_ok  # (B|1, h|1, T, 1)
        scores = self.hook_attn_scores(scores, heads)
        if no_key is not None:
            pattern = softmax_keys(scores.masked_fill(no_key, 0.0)).masked_fill(no_key, 0.0)
        elif (T >= CPU_SOFTMAX_WIDTH and not scores.requires_grad
              and not self.hook_attn_scores.active
              and not torch.is_autocast_enabled(scores.device.type)):  # (autocast: float32 out)
            pattern = torch.softmax(scores, dim=-1, out=scores)
        else:
            pattern = softmax_keys(scores)
        return self.hook_pattern(pattern, heads)  # (B, h, T, T)

    def _causal_bias(self, T: int, like: Tensor) -> Tensor:
        """(T, T) additive causal mask: 0 on and below the diagonal, -inf above (made once per
        length, dtype and device)."""
        bias = self._bias
        if bias is None or bias.shape[0] != T or bias.dtype != like.dtype \
                or bias.device != like.device:
            bias = torch.full((T, T), float("-inf"), dtype=like.dtype, device=like.device)
            self._bias = bias = bias.triu_(1)
        return bias

    def _head_index(self, heads: tuple[int, ...], device: torch.device) -> HeadIndex:
        """The index tensors of explicit ``heads`` (made once per heads and device)."""
        key = (heads, device)
        if key not in self._index:
            order = [h for h in range(self.n_heads) if h not in heads] + list(heads)
            back = [order.index(h) for h in range(self.n_heads)]
            idx, wanted = torch.tensor(order, device=device), torch.tensor(heads, device=device)
            self._index[key] = HeadIndex(idx, idx // self.group,
                                         torch.tensor(back, device=device),
                                         wanted, wanted // self.group)
        return self._index[key]

    def _per_head_result(self, z: Tensor) -> Tensor:
        """Per-head contributions to the residual (``hook_result``), then their sum + bias."""
        B, T, H, Dh = z.shape
        weight = effective_weight(self.o_proj)  # (D, H*Dh)
        w = weight.view(weight.shape[0], H, Dh)  # (D, H, Dh)
        result = self.hook_result(torch.einsum("bthd,mhd->bthm", z, w))  # (B, T, H, D)
        out = result.sum(2)
        bias = getattr(self.o_proj, "bias", None)
        return out + bias if bias is not None else out

    def allowed_keys(self, T: int, key_padding: Tensor | None = None,
                     task_ids: Tensor | None = None,
                     device: torch.device | str = "cpu") -> Tensor:
        """(B|1, H|1, T, T) bool: the keys each query may attend, as ``forward`` masks them
        (causal, key padding (B, T) and the per-head mask)."""
        device = torch.device(device)
        plan = self._layer_plan(T, mask_plan(T, self.causal, key_padding, device=device),
                                task_ids, device)
        if plan.allowed is not None:
            return plan.allowed
        allowed = torch.ones(1, 1, T, T, dtype=torch.bool, device=device)
        return allowed.tril() if self.causal else allowed

    def kv_heads(self, heads: Tensor | list[int]) -> Tensor:
        """The kv head each query head reads: ``h // (H / H_kv)``."""
        return torch.as_tensor(heads) // self.group

    def head_weights(self, head: int) -> HeadWeights:
        """The weights query head ``head`` applies (its kv group's under GQA; adapters merged)."""
        return head_weights(self, head)


def effective_weight(linear: nn.Module) -> Tensor:
    """The weight a Linear-like module applies (an adapter exposes ``effective_weight()``)."""
    fn = getattr(linear, "effective_weight", None)
    return fn() if callable(fn) else linear.weight  # type: ignore[return-value]


class HeadWeights(NamedTuple):
    """One query head's slices of the projections: ``q``, ``k``, ``v`` (Dh, D) rows and ``o``
    (D, Dh) columns; ``kv_head`` is the kv head whose k/v rows it reads."""

    q: Tensor
    k: Tensor
    v: Tensor
    o: Tensor
    kv_head: int


def head_weights(attn: Attention, head: int) -> HeadWeights:
    """Effective per-head weights of ``attn`` (the one definition of a head's slices).

    Query head ``h`` owns rows ``h*Dh:(h+1)*Dh`` of ``q_proj`` and columns ``h*Dh:(h+1)*Dh`` of
    ``o_proj``; it reads kv head ``g = h // (H / H_kv)`` (``headwise.heads.kv_head``), rows
    ``g*Dh:(g+1)*Dh`` of ``k_proj`` / ``v_proj``. LoRA adapters contribute through
    ``effective_weight``.

    Raises:
        ValueError: ``head`` out of range.
    """
    if not 0 <= head < attn.n_heads:
        raise ValueError(f"head: got {head}, expected 0-{attn.n_heads - 1}")
    g = kv_head(head, attn.n_heads, attn.n_kv_heads)
    qs, ks = slice(head * attn.d_head, (head + 1) * attn.d_head), slice(
        g * attn.d_head, (g + 1) * attn.d_head)
    return HeadWeights(effective_weight(attn.q_proj)[qs], effective_weight(attn.k_proj)[ks],
                       effective_weight(attn.v_proj)[ks], effective_weight(attn.o_proj)[:, qs], g)
