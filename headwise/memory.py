"""Memory estimates checked before large allocations, so a huge spec is refused, not swapped.

``check_memory(what, nbytes)`` compares an estimate with what this process can still get: the
smaller of the machine's available memory (``MemAvailable``) and the room left under an
address-space limit (``RLIMIT_AS``, e.g. ``ulimit -v``). Estimates are deliberately simple
(float32 parameters, AdamW state, the largest activations); they catch specs that are off by
orders of magnitude (``d_model: 1e9``), not tight budgets.
"""

from __future__ import annotations

import resource
from typing import TYPE_CHECKING

from headwise.errors import HeadwiseError

if TYPE_CHECKING:
    from headwise.config import ModelConfig

GIB = 1 << 30


class ResourceError(HeadwiseError, MemoryError):
    """A spec or input needs more memory than this process can get (exit code 2)."""


def _meminfo(key: str) -> int | None:
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith(key + ":"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    return None


def _vm_size() -> int:
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmSize:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return 0


def available_bytes() -> int | None:
    """Bytes this process can still allocate, or ``None`` when unknown (not Linux)."""
    limits = []
    free = _meminfo("MemAvailable")
    if free is not None:
        limits.append(free)
    soft, _ = resource.getrlimit(resource.RLIMIT_AS)
    if soft != resource.RLIM_INFINITY:
        limits.append(max(soft - _vm_size(), 0))
    return min(limits) if limits else None


def check_memory(what: str, nbytes: int) -> None:
    """Refuse an allocation of about ``nbytes`` that cannot fit.

    Raises:
        ResourceError: naming ``what``, the estimate and the available memory.
    """
    free = available_bytes()
    if free is not None and nbytes > free:
        raise ResourceError(f"{what}: needs about {nbytes / GIB:.3g} GiB, but only "
                            f"{free / GIB:.3g} GiB is available; expected a smaller size")


def n_params(c: ModelConfig) -> int:
    """Number of parameters of the model ``build_model(c)`` builds (weights and biases)."""
    assert c.d_head is not None and c.n_kv_heads is not None and c.d_ff is not None
    qkv_bias, bias = c.bias in ("all", "qkv"), c.bias == "all"
    q, kv = c.n_heads * c.d_head, c.n_kv_heads * c.d_head
    attn = c.d_model * (q + 2 * kv) + q * c.d_model + qkv_bias * (q + 2 * kv) + bias * c.d_model
    n_up = 2 if c.activation == "swiglu" else 1
    mlp = 0 if c.attn_only else (c.d_model * c.d_ff * (n_up + 1)
                                 + bias * (n_up * c.d_ff + c.d_model))
    norm = c.d_model * (1 if c.norm_type == "rmsnorm" else 1 + bias)
    n_norms = c.n_layers * (1 if c.attn_only else 2) + (c.norm == "pre") + c.embed_norm
    embed = c.vocab_size * c.d_model * (1 if c.tie_embeddings else 2)
    pos = c.max_seq_len * c.d_model if c.positional == "learned" else 0
    return (c.n_layers * (attn + mlp) + n_norms * norm + embed + pos
            + c.n_token_types * c.d_model)


def model_bytes(c: ModelConfig) -> int:
    """float32 parameters plus the model's fixed buffers (sinusoidal or rotary tables)."""
    assert c.d_head is not None
    tables = c.max_seq_len * max(c.d_model, c.d_head) * 2 if c.positional != "learned" else 0
    return 4 * (n_params(c) + tables)


def training_bytes(c: ModelConfig, batch_size: int, seq_len: int) -> int:
    """Training memory: parameters, gradients and AdamW moments, plus activations of one
    batch (per layer: residual-sized tensors, FFN hidden, attention patterns; then logits)."""
    assert c.d_ff is not None
    tokens = batch_size * seq_len
    per_layer = tokens * (8 * c.d_model + 3 * c.d_ff) + batch_size * c.n_heads * seq_len ** 2 * 3
    activations = c.n_layers * per_layer + 3 * tokens * c.vocab_size
    return 4 * (4 * n_params(c) + activations)
