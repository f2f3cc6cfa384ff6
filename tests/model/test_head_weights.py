"""Per-head weights (``model.attention.head_weights``): the slices the forward pass applies.

The reference is the module's own forward: its q/k/v/o projections are captured with PyTorch
forward hooks (independent of headwise's hook points) and compared with ``x W^T`` per head.
The kv-head mapping under GQA is written out by hand.
"""

from __future__ import annotations

import pytest
import torch
from torch import Tensor, nn

from headwise.config import ModelConfig
from headwise.control import apply_lora
from headwise.model import build_model
from headwise.model.attention import head_weights

# 4 query heads read 2 kv heads; every dimension distinct (D=24, Dh=6, V=19, T=7).
CFG = ModelConfig(n_layers=2, n_heads=4, n_kv_heads=2, d_model=24, d_head=6, d_ff=40,
                  vocab_size=19, max_seq_len=8, positional="rope", norm_type="rmsnorm",
                  activation="swiglu", bias="none")


def _projections(model: nn.Module, layer: int, tokens: Tensor) -> dict[str, Tensor]:
    """The attention input ``x`` and each projection's output, captured with forward hooks."""
    seen: dict[str, Tensor] = {}
    attn = model.blocks[layer].attn  # type: ignore[index]
    handles = [getattr(attn, n).register_forward_hook(
        lambda mod, inp, out, n=n: seen.update({"x": inp[0], n: out}))
        for n in ("q_proj", "k_proj", "v_proj")]
    handles.append(attn.o_proj.register_forward_hook(
        lambda mod, inp, out: seen.update({"z": inp[0], "o_proj": out})))
    with torch.no_grad():
        model(tokens)
    for h in handles:
        h.remove()
    return seen


@pytest.mark.parametrize("lora", [False, True])
def test_head_weights_reproduce_the_projections(lora: bool) -> None:
    model = build_model(CFG, seed=0)
    if lora:
        apply_lora(model, targets=("q_proj", "k_proj", "v_proj", "o_proj"), heads="L1.H1,L1.H2",
                   rank=2)
        for name, p in model.named_parameters():
            if "lora_B" in name:  # B starts at zero: make the delta visible
                torch.nn.init.normal_(p, std=0.5)
    tokens = torch.randint(0, CFG.vocab_size, (2, 7), generator=torch.Generator().manual_seed(1))
    seen = _projections(model, 1, tokens)
    x, z, Dh = seen["x"], seen["z"], CFG.d_head
    attn = model.blocks[1].attn
    out = torch.zeros_like(seen["o_proj"])
    for h, g in enumerate([0, 0, 1, 1]):  # kv head of each query head, by hand
        w = head_weights(attn, h)
        assert w.kv_head == g
        torch.testing.assert_close(x @ w.q.T, seen["q_proj"][..., h * Dh:(h + 1) * Dh])
        torch.testing.assert_close(x @ w.k.T, seen["k_proj"][..., g * Dh:(g + 1) * Dh])
        torch.testing.assert_close(x @ w.v.T, seen["v_proj"][..., g * Dh:(g + 1) * Dh])
        out = out + z[..., h * Dh:(h + 1) * Dh] @ w.o.T
    torch.testing.assert_close(out, seen["o_proj"])  # no bias: sum of the heads' results


def test_head_out_of_range_names_the_head() -> None:
    attn = build_model(CFG, seed=0).blocks[0].attn
    with pytest.raises(ValueError, match=r"^head: got 4, expected 0-3$"):
        head_weights(attn, 4)
