"""Attention's kernel helpers: CPU-friendly softmax over keys and GQA k/v for SDPA.

Used by ``headwise.model.attention``; measured by ``bench/bench_attention_kernel.py``.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

# Below this many keys PyTorch's CPU softmax leaves its vectorised kernel for a scalar loop.
CPU_SOFTMAX_WIDTH = 16


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
