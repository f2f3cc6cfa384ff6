"""Which SDPA call grouped-query attention makes, and that every call gives the same numbers.

On CUDA only the flash backend takes ``enable_gqa``, and flash takes neither a mask nor
float32; any other ``enable_gqa`` call silently falls back to the math kernel. So k/v are
expanded to all heads (``repeat_interleave``) when a mask is given or the dtype is float32,
and ``enable_gqa`` is kept only for unmasked half precision. Checked here on the CPU by
recording the arguments SDPA receives, and against explicit maths with the same weights.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch
import torch.nn.functional as F
from ref_attention import full_allowed, fused_from, make_attention, plan_for, reference_attention

from headwise.model.kernels import gqa_kv

B, T, D, H, HKV, DH = 2, 5, 12, 6, 2, 4  # group of 3: a wrong repeat order cannot pass


class _Recorder:
    def __init__(self) -> None:
        self.calls: list[dict[str, Any]] = []
        self.sdpa = F.scaled_dot_product_attention

    def __call__(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, **kw: Any
                 ) -> torch.Tensor:
        self.calls.append({"q_heads": q.shape[1], "k_heads": k.shape[1], "dtype": q.dtype,
                           "masked": kw.get("attn_mask") is not None,
                           "enable_gqa": kw.get("enable_gqa", False)})
        return self.sdpa(q, k, v, **kw)


@pytest.mark.parametrize("dtype, padded, expect_gqa", [
    (torch.float32, False, False),   # float32: flash cannot run it -> expand
    (torch.float32, True, False),    # masked -> expand
    (torch.bfloat16, True, False),   # masked half precision -> expand
    (torch.bfloat16, False, True),   # unmasked half precision: enable_gqa (flash on CUDA)
    (torch.float16, False, True),
])
def test_gqa_path_taken(monkeypatch: pytest.MonkeyPatch, dtype: torch.dtype, padded: bool,
                        expect_gqa: bool) -> None:
    attn = make_attention(D, H, HKV, DH, causal=True, dtype=dtype)
    fused_from(attn)  # the SDPA call a masked short sequence would make
    rec = _Recorder()
    monkeypatch.setattr(F, "scaled_dot_product_attention", rec)
    x = torch.randn(B, T, D, dtype=dtype)
    pad = torch.tensor([[True] * T, [False, False] + [True] * (T - 2)]) if padded else None
    with torch.no_grad():
        attn(x, plan_for(attn, pad))
    assert len(rec.calls) == 1
    call = rec.calls[0]
    assert call["masked"] == padded
    assert call["enable_gqa"] is expect_gqa
    assert call["k_heads"] == (HKV if expect_gqa else H)


def test_expanded_kv_follow_the_group_mapping() -> None:
    """Query head h reads kv head h // (H / H_kv): the expansion repeats each kv head in place."""
    k = torch.randn(B, HKV, T, DH)
    v = torch.randn(B, HKV, T, DH)
    ke, ve, flag = gqa_kv(k, v, H // HKV, masked=True)
    assert not flag
    for h in range(H):
        assert torch.equal(ke[:, h], k[:, h // (H // HKV)])
        assert torch.equal(ve[:, h], v[:, h // (H // HKV)])
    same = gqa_kv(k, v, 1, masked=True)
    assert same[0] is k and same[1] is v and not same[2]


@pytest.mark.parametrize("padded", [False, True])
def test_expanded_gqa_equals_explicit_maths(padded: bool) -> None:
    attn = make_attention(D, H, HKV, DH, causal=True)
    x = torch.randn(B, T, D)
    pad = torch.tensor([[True] * T, [False] + [True] * (T - 1)]) if padded else None
    out = attn(x, plan_for(attn, pad))
    ref, _, _ = reference_attention(attn, x, full_allowed(B, H, T, True, pad))
    torch.testing.assert_close(out, ref, atol=1e-5, rtol=0)


def test_half_precision_enable_gqa_equals_expanded() -> None:
    """The unmasked bf16 path (enable_gqa) and the expanded one agree to bf16 precision."""
    attn = make_attention(D, H, HKV, DH, causal=True, dtype=torch.bfloat16)
    x = torch.randn(B, T, D, dtype=torch.bfloat16)
    with torch.no_grad():
        fused = attn(x)
        ref, _, _ = reference_attention(attn.float(), x.float(),
                                        full_allowed(B, H, T, True))
    torch.testing.assert_close(fused.float(), ref, atol=3e-2, rtol=3e-2)
