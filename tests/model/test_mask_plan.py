"""The mask plan of one forward against the allowed mask built element by element.

Every dimension a distinct size (B=2, H=3, T=5) so that a broadcast over the wrong axis fails.
"""

from __future__ import annotations

import pytest
import torch
from ref_attention import full_allowed

from headwise.model.mask_plan import MaskPlan, mask_plan

B, H, T = 2, 3, 5


def _padding() -> torch.Tensor:
    return torch.tensor([[True] * T, [False, False] + [True] * (T - 2)])


def _head_mask(batched: bool) -> torch.Tensor:
    g = torch.Generator().manual_seed(7)
    m = torch.rand((B, H, T, T) if batched else (H, T, T), generator=g) > 0.4
    m[..., 1, :] = False  # query 1 has no key in any head
    return m


def test_causal_alone_is_left_to_the_kernels() -> None:
    assert mask_plan(T, True) == MaskPlan()
    assert mask_plan(T, False) == MaskPlan()


@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("padding, head", [(True, "none"), (False, "per_head"),
                                           (True, "per_head"), (False, "per_example"),
                                           (True, "per_example")])
def test_plan_equals_the_elementwise_mask(causal: bool, padding: bool, head: str) -> None:
    kp = _padding() if padding else None
    hm = None if head == "none" else _head_mask(head == "per_example")
    model_plan = mask_plan(T, causal, kp)  # what Transformer.hidden builds
    plan = mask_plan(T, causal, head_mask=hm, base=model_plan)  # a layer narrows it
    assert plan.allowed is not None and plan.row_ok is not None
    want = full_allowed(B, H, T, causal, kp, hm)  # (B, H, T, T)
    assert torch.equal(plan.allowed.expand(B, H, T, T), want)
    assert torch.equal(plan.row_ok.expand(B, H, T, 1), want.any(-1, keepdim=True))
    direct = mask_plan(T, causal, kp, hm)  # all at once: the same plan
    assert torch.equal(direct.allowed.expand(B, H, T, T), want)  # type: ignore[union-attr]


def test_a_layer_without_a_head_mask_shares_the_models_plan() -> None:
    model_plan = mask_plan(T, True, _padding())
    assert mask_plan(T, True, base=model_plan) is model_plan


def test_at_heads_selects_heads_and_keeps_a_shared_plan() -> None:
    plan = mask_plan(T, True, head_mask=_head_mask(False))
    idx = torch.tensor([2, 0])
    part = plan.at_heads(idx)
    want = full_allowed(1, H, T, True, None, _head_mask(False))[:, [2, 0]]
    assert torch.equal(part.allowed, want)  # type: ignore[arg-type]
    assert torch.equal(part.row_ok, want.any(-1, keepdim=True))  # type: ignore[arg-type]
    shared = mask_plan(T, True, _padding())  # (B, 1, T, T): every head the same
    assert shared.at_heads(idx) is shared
    assert MaskPlan().at_heads(idx) == MaskPlan()
