"""Head-level interventions (ablate, patch, scale, steer) and the per-head hook_result."""

from __future__ import annotations

import pytest
import torch
from torch import Tensor

from headwise.config import preset
from headwise.hooks import Hook, ablate, patch, scale, steer
from headwise.model import Transformer, build_model

Z1 = "blocks.1.attn.hook_z"
Z0 = "blocks.0.attn.hook_z"


@pytest.fixture
def model() -> Transformer:
    return build_model(preset("tiny"), seed=0).eval()  # L=2, H=3, Dh=4, D=12, V=17


@pytest.fixture
def tokens() -> Tensor:
    return torch.randint(0, 17, (2, 5))


def z_with(model: Transformer, tokens: Tensor, hooks: list[Hook]) -> dict[str, Tensor]:
    with model.hooks(hooks):
        _, cache = model.run_with_cache(tokens, [Z0, Z1])
    return {Z0: cache[Z0], Z1: cache[Z1]}


@pytest.mark.parametrize("h", [0, 1, 2])
def test_zero_ablation_zeroes_one_head_and_keeps_the_rest_bitwise(model: Transformer,
                                                                   tokens: Tensor, h: int) -> None:
    base = z_with(model, tokens, [])
    out = z_with(model, tokens, ablate(model, f"L1.H{h}"))
    assert torch.equal(out[Z1][:, :, h], torch.zeros(2, 5, 4))
    others = [i for i in range(3) if i != h]
    assert torch.equal(out[Z1][:, :, others], base[Z1][:, :, others])
    assert torch.equal(out[Z0], base[Z0])  # the earlier layer is untouched


def test_zero_ablation_changes_the_output_by_the_head_contribution(model: Transformer,
                                                                    tokens: Tensor) -> None:
    """Ablating L1.H2 at z removes exactly z_2 W_O[:, cols of head 2] from the attn output."""
    names = [Z1, "blocks.1.hook_attn_out"]
    _, base = model.run_with_cache(tokens, names)
    with model.hooks(ablate(model, "L1.H2")):
        _, abl = model.run_with_cache(tokens, names)
    w_o = model.blocks[1].attn.o_proj.weight[:, 8:12]  # (D, Dh) columns of head 2
    removed = base[Z1][:, :, 2] @ w_o.T
    torch.testing.assert_close(abl["blocks.1.hook_attn_out"],
                               base["blocks.1.hook_attn_out"] - removed, atol=1e-6, rtol=0)


def test_ablation_across_layers_and_selector_forms(model: Transformer, tokens: Tensor) -> None:
    out = z_with(model, tokens, ablate(model, "*.H1"))
    assert torch.equal(out[Z0][:, :, 1], torch.zeros(2, 5, 4))
    assert torch.equal(out[Z1][:, :, 1], torch.zeros(2, 5, 4))
    out = z_with(model, tokens, ablate(model, ["L0.H0", "L1.H0-1"]))
    assert out[Z0][:, :, 0].abs().sum() == 0 and out[Z1][:, :, :2].abs().sum() == 0
    assert out[Z1][:, :, 2].abs().sum() > 0


@pytest.mark.parametrize("h", [0, 2])
def test_patch_reproduces_source_head(model: Transformer, h: int) -> None:
    tok_a = torch.randint(0, 17, (2, 5))
    tok_b = torch.randint(0, 17, (2, 5))
    _, cache_b = model.run_with_cache(tok_b, [Z0, Z1])
    base_a = z_with(model, tok_a, [])
    out = z_with(model, tok_a, patch(model, cache_b, f"L1.H{h}"))
    assert torch.equal(out[Z1][:, :, h], cache_b[Z1][:, :, h])
    others = [i for i in range(3) if i != h]
    assert torch.equal(out[Z1][:, :, others], base_a[Z1][:, :, others])
    # patching every head of a layer reproduces B's attention output of that layer
    out_name = "blocks.1.hook_attn_out"
    _, ref_b = model.run_with_cache(tok_b, [out_name])
    with model.hooks(patch(model, cache_b, "L1.*")):
        _, patched = model.run_with_cache(tok_a, [out_name])
    torch.testing.assert_close(patched[out_name], ref_b[out_name], atol=1e-6, rtol=0)


def test_patch_from_head_restricted_cache(model: Transformer) -> None:
    tok_a, tok_b = torch.randint(0, 17, (2, 5)), torch.randint(0, 17, (2, 5))
    _, cache_b = model.run_with_cache(tok_b, [Z1], heads="L1.H1")
    out = z_with(model, tok_a, patch(model, cache_b, "L1.H1"))
    assert torch.equal(out[Z1][:, :, 1], cache_b.head(Z1, 1))
    with pytest.raises(KeyError, match="head 2 not cached"):
        with model.hooks(patch(model, cache_b, "L1.H2")):
            model(tok_a)
    with pytest.raises(KeyError, match="was not cached"):
        patch(model, cache_b, "L0.H0")


def test_patch_shape_mismatch_is_a_clear_error(model: Transformer) -> None:
    _, cache_b = model.run_with_cache(torch.randint(0, 17, (2, 4)), [Z1])
    with pytest.raises(ValueError, match="does not match"):
        with model.hooks(patch(model, cache_b, "L1.H0")):
            model(torch.randint(0, 17, (2, 5)))


def test_mean_ablation_equals_explicit_mean(model: Transformer, tokens: Tensor) -> None:
    reference = torch.randint(0, 17, (6, 7))  # longer than the input: first 5 positions used
    _, ref = model.run_with_cache(reference, [Z1])
    expected = ref[Z1][:, :5, 1].mean(0)  # (T, Dh): mean over reference examples, per position
    base = z_with(model, tokens, [])
    out = z_with(model, tokens, ablate(model, "L1.H1", mode="mean", reference=reference))
    for b in range(2):
        torch.testing.assert_close(out[Z1][b, :, 1], expected, atol=1e-6, rtol=0)
    assert torch.equal(out[Z1][:, :, [0, 2]], base[Z1][:, :, [0, 2]])


def test_resample_ablation_takes_whole_reference_examples(model: Transformer,
                                                          tokens: Tensor) -> None:
    reference = torch.randint(0, 17, (4, 5))
    _, ref = model.run_with_cache(reference, [Z1])
    out = z_with(model, tokens, ablate(model, "L1.H0", mode="resample", reference=reference,
                                       seed=3))
    for b in range(2):
        got = out[Z1][b, :, 0]  # (T, Dh)
        assert any(torch.equal(got, ref[Z1][r, :, 0]) for r in range(4)), b
    again = z_with(model, tokens, ablate(model, "L1.H0", mode="resample", reference=reference,
                                         seed=3))
    assert torch.equal(again[Z1], out[Z1])


def test_ablate_argument_errors(model: Transformer, tokens: Tensor) -> None:
    with pytest.raises(ValueError, match="mode: got 'half'"):
        ablate(model, "L0.H0", mode="half")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="reference: mode='mean' needs"):
        ablate(model, "L0.H0", mode="mean")
    with pytest.raises(ValueError, match="point: got 'zz'"):
        ablate(model, "L0.H0", point="zz")
    short = ablate(model, "L0.H0", mode="mean", reference=torch.randint(0, 17, (3, 2)))
    with pytest.raises(ValueError, match="reference tokens at least as long"):
        with model.hooks(short):
            model(tokens)
    from headwise.errors import SelectorError

    with pytest.raises(SelectorError, match="2 layers x 3 heads"):
        ablate(model, "L2.H0")


@pytest.mark.parametrize("factor", [0.0, 0.5, -2.0])
def test_scale(model: Transformer, tokens: Tensor, factor: float) -> None:
    base = z_with(model, tokens, [])
    out = z_with(model, tokens, scale(model, "L1.H1", factor))
    torch.testing.assert_close(out[Z1][:, :, 1], factor * base[Z1][:, :, 1])
    assert torch.equal(out[Z1][:, :, [0, 2]], base[Z1][:, :, [0, 2]])


def test_ablate_pattern_point_uses_explicit_head_only(model: Transformer,
                                                      tokens: Tensor) -> None:
    """Ablating L1.H0's pattern makes that head explicit; its z becomes 0 (zero pattern)."""
    for block in model.blocks:  # the split machinery at this short length
        block.attn.explicit_max_keys = 0
    base = z_with(model, tokens, [])
    out = z_with(model, tokens, ablate(model, "L1.H0", point="pattern"))
    assert torch.equal(out[Z1][:, :, 0], torch.zeros(2, 5, 4))
    assert torch.equal(out[Z1][:, :, 1:], base[Z1][:, :, 1:])


def test_steer_adds_a_vector(model: Transformer, tokens: Tensor) -> None:
    vec = torch.randn(12)
    name = "blocks.0.hook_resid_post"
    _, base = model.run_with_cache(tokens, [name])
    with model.hooks(steer(name, vec, coeff=2.0)):
        _, cache = model.run_with_cache(tokens, [name])
    torch.testing.assert_close(cache[name], base[name] + 2.0 * vec)


@pytest.mark.parametrize("cfg_name", ["tiny", "tiny-gqa-rope", "tiny-encoder"])
def test_hook_result_sums_to_attn_out(cfg_name: str) -> None:
    cfg = preset(cfg_name)
    model = build_model(cfg, seed=0).eval()
    with torch.no_grad():  # non-zero biases so the bias term matters
        for block in model.blocks:
            if block.attn.o_proj.bias is not None:
                block.attn.o_proj.bias.normal_()
    tokens = torch.randint(0, cfg.vocab_size, (2, 5))
    plain = model(tokens)
    names = ["blocks.1.attn.hook_result", "blocks.1.hook_attn_out", "blocks.1.attn.hook_z"]
    logits, cache = model.run_with_cache(tokens, names)
    torch.testing.assert_close(logits, plain, atol=1e-5, rtol=0)
    result = cache["blocks.1.attn.hook_result"]  # (B, T, H, D)
    o = model.blocks[1].attn.o_proj
    bias = o.bias if o.bias is not None else torch.zeros(cfg.d_model)
    torch.testing.assert_close(result.sum(2) + bias, cache["blocks.1.hook_attn_out"],
                               atol=1e-5, rtol=0)
    Dh = cfg.d_head
    z = cache["blocks.1.attn.hook_z"]
    for h in range(cfg.n_heads):  # head h's contribution: z_h @ W_O[:, h*Dh:(h+1)*Dh]^T
        torch.testing.assert_close(result[:, :, h], z[:, :, h] @ o.weight[:, h * Dh:(h + 1) * Dh].T,
                                   atol=1e-5, rtol=0)


def test_ablating_result_equals_ablating_z(model: Transformer, tokens: Tensor) -> None:
    with model.hooks(ablate(model, "L1.H1", point="result")):
        by_result = model(tokens)
    with model.hooks(ablate(model, "L1.H1")):
        by_z = model(tokens)
    torch.testing.assert_close(by_result, by_z, atol=1e-5, rtol=0)


@pytest.mark.parametrize("point", ["pattern", "attn_scores"])
def test_mean_ablation_of_square_points_with_longer_reference(model: Transformer,
                                                               tokens: Tensor, point: str) -> None:
    """(B, h, T, T) points are cut to the input's T x T block of the reference (regression)."""
    reference = torch.randint(0, 17, (4, 7))
    name = f"blocks.1.attn.hook_{point}"
    _, ref = model.run_with_cache(reference, [name], heads="L1.H0")
    expected = ref[name][:, 0, :5, :5].mean(0)  # (T, T)
    seen: list[Tensor] = []
    with model.hooks(ablate(model, "L1.H0", mode="mean", reference=reference, point=point),
                     Hook(name, lambda x, c: seen.append(x.clone()), (0,))):
        model(tokens)
    for b in range(2):
        torch.testing.assert_close(seen[0][b, 0], expected)
    short = torch.randint(0, 17, (4, 3))
    with pytest.raises(ValueError, match="has 3 positions, the input has 5"):
        with model.hooks(ablate(model, "L1.H0", mode="mean", reference=short, point=point)):
            model(tokens)
