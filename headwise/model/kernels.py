"""Attention's kernel helpers: CPU-friendly softmax over keys, GQA k/v for SDPA, and a causal
attention pass in blocks of queries that also returns its pattern.

Used by ``headwise.model.attention``; measured by ``bench/bench_attention_kernel.py``.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

# Below this many keys PyTorch's CPU softmax leaves its vectorised kernel for a scalar loop.
CPU_SOFTMAX_WIDTH = 16

# Queries per block of ``causal_blocked``: a (B*H, 64, T) block of scores stays in cache while it
# is scaled, masked, normalised and multiplied by v (bench/bench_attention_kernel.py --captures).
QUERY_BLOCK = 64


def softmax_keys(scores: Tensor) -> Tensor:
    """``softmax(scores, dim=-1)``, padded on CPU when a row has fewer than 16 keys.

    PyTorch's CPU softmax (forward and backward) falls back to a scalar loop when the softmax
    axis is shorter than its vector width: forward + backward of a (64, 1, 14, 14) softmax takes
    ~3x as long as this padded one, and ~6x as long as a (64, 1, 16, 16) one
    (``bench/bench_attention_kernel.py --softmax``, docs/benchmarks.md).
    Padding the row with ``-inf`` keys to 16 puts it back on the vector kernel; the extra keys
    get exactly 0 and the real keys the same probabilities to float rounding. Longer rows (and
    other devices) go straight to ``torch.softmax``.
    """
    T = scores.shape[-1]
    if T >= CPU_SOFTMAX_WIDTH or scores.device.type != "cpu":
        return torch.softmax(scores, dim=-1)
    padded = F.pad(scores, (0, CPU_SOFTMAX_WIDTH - T), value=float("-inf"))
    return torch.softmax(padded, dim=-1)[..., :T].contiguous()


def gqa_kv(k: Tensor, v: Tensor, group: int, masked: bool) -> tuple[Tensor, Tensor, bool]:
    """k and v (B, H_kv, T, Dh) as SDPA should get them, and its ``enable_gqa`` flag.

    ``enable_gqa`` is kept only for an unmasked half-precision call: on CUDA only the flash
    backend supports it, and flash takes neither a mask nor float32, so any other call would
    fall back to the math kernel (full T x T scores). There k/v are expanded to all H heads
    (``repeat_interleave`` over the group, as HuggingFace does), which every backend supports.

    Returns:
        ``(k, v, enable_gqa)``; k/v unchanged when ``group == 1`` or ``enable_gqa`` is True.
    """
    if group == 1:
        return k, v, False
    if not masked and k.dtype in (torch.float16, torch.bfloat16):
        return k, v, True
    return k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1), False


def causal_blocked(q: Tensor, k: Tensor, v: Tensor, bias: Tensor, scale: float,
                   block: int = QUERY_BLOCK) -> tuple[Tensor, Tensor]:
    """Causal attention of every head, with its pattern, one block of queries at a time.

    For the queries ``[q0, q1)`` only the keys ``[0, q1)`` can be attended, so each block's
    scores ``q k^T * scale + bias`` cover those keys only (about half the matmuls and softmax
    of a full ``T x T`` pass) and are normalised and multiplied by v while still in cache; the
    pattern's other entries stay exactly 0. Same numbers as the full pass: every row's softmax
    sees the same finite scores (the skipped keys would get ``exp(-inf) = 0``).

    Args:
        q, k, v: (B, H, T, Dh), k and v already one per query head.
        bias: (T, T) additive causal mask (0 on and below the diagonal, ``-inf`` above).
        scale: the scores' factor (``1 / sqrt(Dh)``).
        block: queries per block.

    Returns:
        ``(z, pattern)``: (B, H, T, Dh) and (B, H, T, T).
    """
    B, H, T, Dh = q.shape
    qf, vf = q.reshape(B * H, T, Dh), v.reshape(B * H, T, Dh)
    kt = k.reshape(B * H, T, Dh).transpose(-1, -2)
    pattern = q.new_zeros(B * H, T, T)
    z = q.new_empty(B * H, T, Dh)
    for q0 in range(0, T, block):
        q1 = min(T, q0 + block)
        scores = torch.baddbmm(bias[q0:q1, :q1], qf[:, q0:q1], kt[:, :, :q1], alpha=scale)
        scores = torch.softmax(scores, dim=-1, out=scores)
        pattern[:, q0:q1, :q1] = scores
        torch.bmm(scores, vf[:, :q1], out=z[:, q0:q1])
    return z.view(B, H, T, Dh), pattern.view(B, H, T, T)
