"""Per-head masks: builders vs explicit rules, one-hot patterns, fused == explicit == reference."""

from __future__ import annotations

import math

import pytest
import torch

from headwise import SelectorError
from headwise.control import (
    apply_masks,
    block_diagonal,
    causal,
    first_token,
    from_graph,
    from_matrix,
    local,
    previous_token,
    remove_masks,
    self_only,
)
from headwise.hooks import Hook

from .conftest import make

T = 7


def rule(fn) -> torch.Tensor:  # type: ignore[no-untyped-def]
    return torch.tensor([[bool(fn(i, j)) for j in range(T)] for i in range(T)])


SEG = [0, 0, 0, 1, 1, 2, 2]
EDGES = [(1, 0), (2, 0), (3, 1), (6, 6)]


@pytest.mark.parametrize("spec, expected", [
    (causal(), rule(lambda i, j: j <= i)),
    (previous_token(), rule(lambda i, j: j == i - 1)),
    (self_only(), rule(lambda i, j: j == i)),
    (first_token(), rule(lambda i, j: j == 0)),
    (local(3), rule(lambda i, j: abs(i - j) < 3)),
    (block_diagonal([3, 2, 2]), rule(lambda i, j: SEG[i] == SEG[j])),
    (block_diagonal(2), rule(lambda i, j: i // 2 == j // 2)),
    (from_matrix(rule(lambda i, j: (i + j) % 3 == 0)), rule(lambda i, j: (i + j) % 3 == 0)),
    (from_graph(EDGES), rule(lambda i, j: (i, j) in EDGES)),
])
def test_builders_match_their_rule(spec, expected) -> None:  # type: ignore[no-untyped-def]
    assert torch.equal(spec.build(T, "cpu"), expected)


def test_from_matrix_crops_to_shorter_inputs() -> None:
    m = torch.rand(9, 9) > 0.5
    assert torch.equal(from_matrix(m).build(5), m[:5, :5])


def test_previous_token_pattern_is_exactly_one_hot() -> None:
    model = make()
    apply_masks(model, {"L0.H1": previous_token()})
    tokens = torch.randint(0, 23, (3, 9))
    _, cache = model.run_with_cache(tokens, ["blocks.0.attn.hook_pattern",
                                             "blocks.0.attn.hook_z"], heads="L0.H1")
    pattern = cache.head("blocks.0.attn.hook_pattern", 1)  # (B, T, T)
    expected = torch.zeros(9, 9)
    expected[torch.arange(1, 9), torch.arange(0, 8)] = 1.0
    assert torch.equal(pattern, expected.expand(3, 9, 9))
    # row 0 has no allowed key: zero output by design
    assert torch.equal(cache.head("blocks.0.attn.hook_z", 1)[:, 0], torch.zeros(3, 6))


def _reference_z(q, k, v, allowed):  # type: ignore[no-untyped-def]
    """Explicit attention per head with a bool mask (rows without keys give zeros)."""
    scores = torch.einsum("bqhd,bkhd->bhqk", q, k) / math.sqrt(q.shape[-1])
    scores = scores.masked_fill(~allowed, float("-inf"))
    row_ok = allowed.any(-1, keepdim=True)
    pattern = torch.softmax(scores.masked_fill(~row_ok, 0.0), -1) * row_ok
    return torch.einsum("bhqk,bkhd->bqhd", pattern, v)


@pytest.mark.parametrize("kv", [4, 2])
def test_fused_equals_explicit_and_reference_with_per_head_masks(kv: int) -> None:
    model = make(n_kv_heads=kv)
    masks = {"L0.H0": previous_token(), "L0.H2": local(2), "L1.H1": first_token(),
             "L1.H3": block_diagonal([4, 5])}
    tokens = torch.randint(0, 23, (2, 9))
    seen: dict[int, tuple[int, ...]] = {}

    def probe(layer: int):  # type: ignore[no-untyped-def]
        def fn(x, ctx):  # type: ignore[no-untyped-def]
            seen[layer] = model.blocks[layer].attn.explicit_heads()
        return fn

    with apply_masks(model, masks):
        names = [f"blocks.{l}.attn.hook_{p}" for l in range(2) for p in "qkvz"]
        with model.hooks(*[Hook(f"blocks.{l}.attn.hook_z", probe(l)) for l in range(2)]):
            fused, cache = model.run_with_cache(tokens, names)
        assert seen == {0: (), 1: ()}  # masks materialise no pattern
        everything = [Hook(f"blocks.{l}.attn.hook_pattern", lambda x, c: None)
                      for l in range(2)]
        with model.hooks(*everything):
            explicit = model(tokens)
        torch.testing.assert_close(fused, explicit, rtol=0, atol=1e-6)
        causal_tt = torch.ones(9, 9, dtype=torch.bool).tril()
        for layer in range(2):
            allowed = torch.stack([
                causal_tt & (masks[f"L{layer}.H{h}"].build(9) if f"L{layer}.H{h}" in masks
                             else torch.ones(9, 9, dtype=torch.bool)) for h in range(4)])[None]
            k = cache[f"blocks.{layer}.attn.hook_k"].repeat_interleave(4 // kv, dim=2)
            v = cache[f"blocks.{layer}.attn.hook_v"].repeat_interleave(4 // kv, dim=2)
            q = cache[f"blocks.{layer}.attn.hook_q"]  # learned positions: no RoPE step
            ref = _reference_z(q, k, v, allowed)
            torch.testing.assert_close(cache[f"blocks.{layer}.attn.hook_z"], ref,
                                       rtol=0, atol=1e-6)
    assert all(model.blocks[l].attn.head_mask is None for l in range(2))


def test_task_masks_override_per_example_and_combine_with_padding() -> None:
    model = make()
    apply_masks(model, {"L0.H0": previous_token()}, task_masks={1: {"L0.H0": self_only()}})
    tokens = torch.randint(0, 23, (2, 6))
    pad = torch.tensor([[1, 1, 1, 1, 1, 1], [1, 1, 1, 1, 0, 0]])
    _, cache = model.run_with_cache(tokens, ["blocks.0.attn.hook_pattern"], heads="L0.H0",
                                    task_ids=torch.tensor([0, 1]), attention_mask=pad)
    p = cache.head("blocks.0.attn.hook_pattern", 0)
    assert not torch.isnan(p).any()
    assert torch.equal(p[0], torch.eye(6).roll(-1, dims=1).tril())  # previous token
    assert torch.equal(p[1, :4, :4], torch.eye(4))  # self only
    assert torch.equal(p[1, :, 4:], torch.zeros(6, 2))  # padding keys never attended


def test_task_mask_table_per_example_without_a_host_read() -> None:
    """Each example gets its task's table (ids with no specs, and ids above every task with
    specs, get the default), built from the rules; Dynamo traces the lookup without a break
    (no host read of the task ids)."""
    import torch._dynamo as dynamo

    model = make()
    apply_masks(model, {"L0.H0": previous_token()},
                task_masks={1: {"L0.H0": self_only()}, 3: {"L0.H1": first_token()}})
    layer_mask = model.blocks[0].attn.head_mask
    ids = torch.tensor([0, 1, 2, 3, 4, 9])
    out = layer_mask(T, ids, torch.device("cpu"))  # (B, H, T, T)
    prev, own, first = (rule(lambda i, j: j == i - 1), rule(lambda i, j: j == i),
                        rule(lambda i, j: j == 0))
    full = torch.ones(T, T, dtype=torch.bool)
    expected = {0: (prev, full), 1: (own, full), 2: (prev, full), 3: (prev, first),
                4: (prev, full), 9: (prev, full)}
    for b, t in enumerate(ids.tolist()):
        assert torch.equal(out[b, 0], expected[t][0]), t
        assert torch.equal(out[b, 1], expected[t][1]), t
        assert torch.equal(out[b, 2:], full.expand(2, T, T)), t
    dynamo.reset()
    explained = dynamo.explain(lambda i: layer_mask(T, i, torch.device("cpu")))(ids)
    dynamo.reset()
    assert explained.graph_break_count == 0


def test_remove_restores_outputs_bitwise() -> None:
    model = make()
    tokens = torch.randint(0, 23, (2, 8))
    before = model(tokens)
    handle = apply_masks(model, {"L1.*": self_only()})
    assert not torch.equal(model(tokens), before)
    handle.remove()
    assert torch.equal(model(tokens), before)
    apply_masks(model, {"*.H0": first_token()})
    remove_masks(model)
    assert torch.equal(model(tokens), before)


def test_bad_masks_raise_naming_the_problem() -> None:
    model = make()
    with pytest.raises(ValueError, match="from_matrix: matrix got shape \\(3, 4\\)"):
        from_matrix(torch.ones(3, 4, dtype=torch.bool))
    with pytest.raises(ValueError, match="from_matrix: matrix got shape \\(2, 3, 3\\)"):
        from_matrix(torch.ones(2, 3, 3, dtype=torch.bool))
    with pytest.raises(ValueError, match="dtype torch.float32"):
        from_matrix(torch.ones(3, 3))
    apply_masks(model, {"L0.H0": from_matrix(torch.ones(4, 4, dtype=torch.bool))})
    with pytest.raises(ValueError, match="mask is \\(4, 4\\), the input has T=6"):
        model(torch.randint(0, 23, (1, 6)))
    remove_masks(model)
    with pytest.raises(ValueError, match="window got 0"):
        local(0)
    with pytest.raises(ValueError, match="cover 5 positions, the input has T=6"):
        block_diagonal([2, 3]).build(6)
    with pytest.raises(SelectorError, match="L0.H9"):
        apply_masks(model, {"L0.H9": causal()})
    with pytest.raises(ValueError, match="expected a MaskSpec"):
        apply_masks(model, {"L0.H0": torch.ones(4, 4, dtype=torch.bool)})
    with pytest.raises(ValueError, match="L0.H1 is assigned two masks"):
        apply_masks(model, {"L0.H0-1": causal(), "L0.H1": local(2)})


def test_head_and_headset_keys_select_the_same_heads_as_strings() -> None:
    from headwise import Head, HeadSet

    tokens = torch.randint(0, 23, (2, 7))
    outs = []
    for key in ("L1.H0,L1.H3", HeadSet.parse("L1.H0,L1.H3", 2, 4)):
        model = make()
        with apply_masks(model, {key: self_only()}):
            outs.append(model(tokens))
    model = make()
    with apply_masks(model, {Head(1, 0): self_only(), Head(1, 3): self_only()}):
        outs.append(model(tokens))
    assert torch.equal(outs[0], outs[1]) and torch.equal(outs[0], outs[2])
