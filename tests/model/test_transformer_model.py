"""The whole model: hook shapes with distinct dimensions, variants, causality, embeddings."""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

from headwise.config import ModelConfig, preset
from headwise.model import (
    MLP,
    GatedMLP,
    LayerNorm,
    RMSNorm,
    SinusoidalPositional,
    build_model,
    check_tokens,
)

# every dimension distinct: B=2, T=5, H=3, Dh=4, D=10 (!= H*Dh=12), F=20, V=17, L=2
DISTINCT = ModelConfig(n_layers=2, n_heads=3, d_head=4, d_model=10, d_ff=20, vocab_size=17,
                       max_seq_len=7)


def test_hook_shapes_with_distinct_dimensions() -> None:
    model = build_model(DISTINCT, seed=0)
    B, T, H, Dh, D, F, V = 2, 5, 3, 4, 10, 20, 17
    tokens = torch.randint(0, V, (B, T))
    names = list(model.hook_points())
    logits, cache = model.run_with_cache(tokens, names)
    expected = {
        "hook_embed": (B, T, D), "hook_pos_embed": (T, D), "hook_logits": (B, T, V),
        "ln_final.hook_normalized": (B, T, D),
    }
    for layer in range(2):
        p = f"blocks.{layer}."
        expected.update({
            p + "hook_resid_pre": (B, T, D), p + "ln1.hook_normalized": (B, T, D),
            p + "attn.hook_q": (B, T, H, Dh), p + "attn.hook_k": (B, T, H, Dh),
            p + "attn.hook_v": (B, T, H, Dh), p + "attn.hook_attn_scores": (B, H, T, T),
            p + "attn.hook_pattern": (B, H, T, T), p + "attn.hook_z": (B, T, H, Dh),
            p + "attn.hook_result": (B, T, H, D), p + "hook_attn_out": (B, T, D),
            p + "hook_resid_mid": (B, T, D), p + "ln2.hook_normalized": (B, T, D),
            p + "mlp.hook_pre": (B, T, F), p + "mlp.hook_post": (B, T, F),
            p + "hook_mlp_out": (B, T, D), p + "hook_resid_post": (B, T, D),
        })
    assert {k: tuple(v.shape) for k, v in cache.items()} == expected
    assert logits.shape == (B, T, V)
    assert model.blocks[0].attn.q_proj.weight.shape == (H * Dh, D)
    assert model.blocks[0].attn.o_proj.weight.shape == (D, H * Dh)


def test_gqa_rope_hook_shapes() -> None:
    cfg = preset("tiny-gqa-rope")  # H=4, Hkv=2, Dh=6, D=24, F=40, V=19
    model = build_model(cfg, seed=0)
    B, T = 3, 7
    _, cache = model.run_with_cache(torch.randint(0, 19, (B, T)), lambda n: n.startswith(
        "blocks.1."))
    shapes = {k.removeprefix("blocks.1."): tuple(v.shape) for k, v in cache.items()}
    assert shapes["attn.hook_q"] == (B, T, 4, 6) and shapes["attn.hook_rot_q"] == (B, T, 4, 6)
    assert shapes["attn.hook_k"] == (B, T, 2, 6) and shapes["attn.hook_rot_k"] == (B, T, 2, 6)
    assert shapes["attn.hook_v"] == (B, T, 2, 6)
    assert shapes["attn.hook_pattern"] == (B, 4, T, T) and shapes["attn.hook_z"] == (B, T, 4, 6)
    assert shapes["mlp.hook_pre"] == shapes["mlp.hook_pre_linear"] == (B, T, 40)


VARIANTS = [
    {"positional": p} for p in ("learned", "sinusoidal", "rope", "none")
] + [{"norm_type": t, "norm": n} for t in ("layernorm", "rmsnorm") for n in ("pre", "post")] + [
    {"activation": a} for a in ("relu", "gelu", "gelu_tanh", "silu", "swiglu")
] + [
    {"bias": "none"}, {"bias": "qkv"}, {"tie_embeddings": True}, {"attn_only": True},
    {"n_kv_heads": 1}, {"n_kv_heads": 2, "positional": "rope"}, {"causal": False},
    {"dropout": 0.1}, {"n_token_types": 2, "embed_norm": True, "norm": "post"},
]


@pytest.mark.parametrize("changes", VARIANTS, ids=[str(v) for v in VARIANTS])
def test_every_variant_builds_runs_and_trains(changes: dict) -> None:
    cfg = ModelConfig(n_layers=2, n_heads=4, d_model=16, d_ff=24, vocab_size=13,
                      max_seq_len=9).replace(**changes)
    model = build_model(cfg, seed=0)
    tokens = torch.randint(0, 13, (2, 9))
    am = torch.ones(2, 9, dtype=torch.long)
    am[1, 6:] = 0
    logits = model(tokens, attention_mask=am)
    assert logits.shape == (2, 9, 13) and torch.isfinite(logits).all()
    # train: 40 AdamW steps memorising next tokens of the batch must cut the loss by half
    targets = tokens.roll(-1, 1).masked_fill(am == 0, -100)
    targets[:, -1] = -100
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    losses = []
    for _ in range(40):
        loss = torch.nn.functional.cross_entropy(
            model(tokens, attention_mask=am).transpose(1, 2), targets, ignore_index=-100)
        opt.zero_grad()
        loss.backward()
        grads = [p.grad for p in model.parameters()]
        assert all(g is not None and torch.isfinite(g).all() for g in grads)
        opt.step()
        losses.append(float(loss.detach()))
    assert losses[-1] < 0.5 * losses[0], (changes, losses[0], losses[-1])
    model.eval()
    with torch.no_grad():
        torch.testing.assert_close(model(tokens), model(tokens), atol=0, rtol=0)


def test_variant_modules_are_the_chosen_ones() -> None:
    base = ModelConfig(n_layers=1, n_heads=2, d_model=8, vocab_size=5, max_seq_len=4)
    assert isinstance(build_model(base).blocks[0].ln1, LayerNorm)
    assert isinstance(build_model(base.replace(norm_type="rmsnorm")).blocks[0].ln1, RMSNorm)
    assert isinstance(build_model(base.replace(activation="swiglu")).blocks[0].mlp, GatedMLP)
    assert isinstance(build_model(base).blocks[0].mlp, MLP)
    assert build_model(base.replace(attn_only=True)).blocks[0].mlp is None
    assert build_model(base.replace(norm="post")).ln_final is None
    assert build_model(base.replace(positional="none")).pos_embed is None
    assert build_model(base.replace(bias="none")).blocks[0].attn.q_proj.bias is None
    qkv = build_model(base.replace(bias="qkv")).blocks[0]
    assert qkv.attn.q_proj.bias is not None and qkv.attn.o_proj.bias is None
    assert qkv.mlp.up_proj.bias is None


def test_tied_embeddings_share_storage() -> None:
    model = build_model(ModelConfig(tie_embeddings=True), seed=0)
    assert model.unembed.weight is model.embed.weight
    assert model.unembed.weight.data_ptr() == model.embed.weight.data_ptr()
    with torch.no_grad():
        model.embed.weight[3, 5] = 7.0
    assert model.unembed.weight[3, 5] == 7.0
    untied = build_model(ModelConfig(tie_embeddings=False), seed=0)
    assert untied.unembed.weight.data_ptr() != untied.embed.weight.data_ptr()


@pytest.mark.parametrize("d_model", [12, 7])
def test_sinusoidal_positions_equal_closed_form(d_model: int) -> None:
    T = 11
    table = SinusoidalPositional(T, d_model)(T)
    expected = torch.empty(T, d_model)
    for t in range(T):
        for i in range(d_model):
            angle = t / 10000 ** ((i - i % 2) / d_model)
            expected[t, i] = math.sin(angle) if i % 2 == 0 else math.cos(angle)
    torch.testing.assert_close(table, expected, atol=1e-6, rtol=0)


def test_model_adds_sinusoidal_positions() -> None:
    cfg = ModelConfig(n_layers=1, n_heads=2, d_model=8, vocab_size=5, max_seq_len=6,
                      positional="sinusoidal")
    model = build_model(cfg, seed=0)
    tokens = torch.randint(0, 5, (2, 6))
    _, cache = model.run_with_cache(tokens, ["blocks.0.hook_resid_pre", "hook_pos_embed"])
    torch.testing.assert_close(cache["blocks.0.hook_resid_pre"],
                               model.embed(tokens) + SinusoidalPositional(6, 8)(6))


def test_norms_equal_torch_and_formula() -> None:
    x = torch.randn(2, 5, 10) * 3 + 1
    ln = LayerNorm(10)
    with torch.no_grad():
        ln.weight.copy_(torch.randn(10))
        ln.bias.copy_(torch.randn(10))
    ref = nn.functional.layer_norm(x, (10,), ln.weight, ln.bias, 1e-5)
    torch.testing.assert_close(ln(x), ref)
    rms = RMSNorm(10, eps=1e-6)
    with torch.no_grad():
        rms.weight.copy_(torch.randn(10))
    expected = x / torch.sqrt((x ** 2).mean(-1, keepdim=True) + 1e-6) * rms.weight
    torch.testing.assert_close(rms(x), expected)


def test_layernorm_explicit_path_equals_fused() -> None:
    model = build_model(DISTINCT, seed=0)
    tokens = torch.randint(0, 17, (2, 5))
    plain = model(tokens)
    names = ["blocks.0.hook_resid_pre", "blocks.0.ln1.hook_normalized"]
    logits, cache = model.run_with_cache(tokens, names)
    torch.testing.assert_close(logits, plain, atol=1e-5, rtol=0)
    x = cache["blocks.0.hook_resid_pre"]
    mean = x.mean(-1, keepdim=True)
    var = ((x - mean) ** 2).mean(-1, keepdim=True)
    torch.testing.assert_close(cache["blocks.0.ln1.hook_normalized"],
                               (x - mean) / torch.sqrt(var + 1e-5), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("activation, fn", [
    ("relu", lambda x: x.clamp(min=0)),
    ("gelu", lambda x: 0.5 * x * (1 + torch.erf(x / math.sqrt(2)))),
    ("gelu_tanh", lambda x: 0.5 * x * (1 + torch.tanh(math.sqrt(2 / math.pi)
                                                        * (x + 0.044715 * x ** 3)))),
    ("silu", lambda x: x / (1 + torch.exp(-x))),
])
def test_mlp_activation_closed_form(activation: str, fn) -> None:  # type: ignore[no-untyped-def]
    mlp = MLP(nn.Linear(6, 9), nn.Linear(9, 6), activation)
    x = torch.randn(2, 3, 6)
    expected = mlp.down_proj(fn(mlp.up_proj(x)))
    torch.testing.assert_close(mlp(x), expected, atol=1e-6, rtol=0)


def test_swiglu_closed_form() -> None:
    mlp = GatedMLP(nn.Linear(6, 9), nn.Linear(6, 9), nn.Linear(9, 6))
    x = torch.randn(2, 3, 6)
    g = mlp.gate_proj(x)
    expected = mlp.down_proj(g * torch.sigmoid(g) * mlp.up_proj(x))
    torch.testing.assert_close(mlp(x), expected, atol=1e-6, rtol=0)


CAUSAL = {
    "tiny": preset("tiny"),
    "gqa-rope": preset("tiny-gqa-rope"),
    "post-sinusoidal": preset("tiny").replace(norm="post", positional="sinusoidal"),
    "mqa-none": preset("tiny-gqa-rope").replace(n_kv_heads=1, positional="none"),
}


@pytest.mark.parametrize("explicit", [False, True], ids=["fused", "explicit"])
@pytest.mark.parametrize("name", sorted(CAUSAL))
def test_causality(name: str, explicit: bool) -> None:
    cfg = CAUSAL[name]
    model = build_model(cfg, seed=0).eval()
    T = 9
    tokens = torch.randint(0, cfg.vocab_size, (2, T))
    hooks = [(f"blocks.{l}.attn.hook_pattern", lambda p, c: None)
             for l in range(cfg.n_layers)] if explicit else []
    with model.hooks(hooks), torch.no_grad():
        base = model(tokens)
        for t in range(T - 1):
            changed = tokens.clone()
            changed[:, t + 1:] = (changed[:, t + 1:] + 1 + t) % cfg.vocab_size
            out = model(changed)
            torch.testing.assert_close(out[:, :t + 1], base[:, :t + 1], atol=1e-6, rtol=0)
            assert not torch.allclose(out[:, t + 1:], base[:, t + 1:])


def test_encoder_is_not_causal() -> None:
    """The causality test can fail: a bidirectional model's early outputs do change."""
    model = build_model(preset("tiny-encoder"), seed=0).eval()
    tokens = torch.randint(0, 17, (1, 6))
    changed = tokens.clone()
    changed[0, 5] = (changed[0, 5] + 1) % 17
    assert not torch.allclose(model(tokens)[0, 0], model(changed)[0, 0])


def test_padding_does_not_change_real_positions() -> None:
    model = build_model(preset("tiny-encoder"), seed=0).eval()
    tokens = torch.randint(0, 17, (1, 4))
    padded = torch.cat([tokens, torch.randint(0, 17, (1, 3))], dim=1)
    am = torch.tensor([[1, 1, 1, 1, 0, 0, 0]])
    torch.testing.assert_close(model(padded, attention_mask=am)[:, :4], model(tokens),
                               atol=1e-5, rtol=0)


@pytest.mark.parametrize("bad, match", [
    ({"tokens": torch.zeros(2, 3)}, "tokens: expected a \\(B, T\\) long tensor"),
    ({"tokens": torch.zeros(3, dtype=torch.long)}, "tokens: expected a \\(B, T\\) long"),
    ({"attention_mask": torch.ones(2, 4)}, "attention_mask: expected shape \\(2, 3\\)"),
    ({"task_ids": torch.zeros(3, dtype=torch.long)}, "task_ids: expected shape \\(2,\\)"),
    ({"tokens": torch.zeros(1, 17, dtype=torch.long)}, "exceeds max_seq_len=16"),
])
def test_bad_inputs_name_the_tensor(bad: dict, match: str) -> None:
    model = build_model(preset("tiny"), seed=0)
    kwargs = {"tokens": torch.zeros(2, 3, dtype=torch.long), **bad}
    with pytest.raises(ValueError, match=match):
        model(**kwargs)
    if "max_seq_len" not in match:  # the entry check says the same, without a forward
        with pytest.raises(ValueError, match=match):
            check_tokens(vocab_size=17, **kwargs)


@pytest.mark.parametrize("ids", [[[0, 17, 3]], [[-1, 2, 3]]])
def test_token_range_is_checked_where_data_enters_not_in_forward(ids: list) -> None:
    """``check_tokens`` and ``run_with_cache`` name the range; forward reads no token values."""
    model = build_model(preset("tiny"), seed=0)
    tokens = torch.tensor(ids)
    with pytest.raises(ValueError, match=r"tokens: ids must lie in \[0, 17\), got range"):
        check_tokens(tokens, 17)
    with pytest.raises(ValueError, match=r"tokens: ids must lie in \[0, 17\)"):
        model.run_with_cache(tokens, ["hook_embed"])
    with pytest.raises(IndexError):  # torch's own embedding check, without a host read here
        model(tokens)


def test_seeded_build_is_reproducible_and_leaves_global_rng() -> None:
    state = torch.get_rng_state()
    a, b = build_model(preset("tiny"), seed=5), build_model(preset("tiny"), seed=5)
    assert torch.equal(torch.get_rng_state(), state)
    for (na, pa), (_, pb) in zip(a.named_parameters(), b.named_parameters(), strict=True):
        assert torch.equal(pa, pb), na


def test_segment_ids_for_a_model_without_segments_are_refused_not_ignored() -> None:
    model = build_model(ModelConfig(n_layers=1, n_heads=2, d_model=8, vocab_size=10,
                                    max_seq_len=6), seed=0)
    tokens = torch.randint(0, 10, (2, 5))
    with pytest.raises(ValueError, match=r"^token_type_ids: given, but the model has no "):
        model(tokens, token_type_ids=torch.zeros_like(tokens))
    bert = build_model(ModelConfig(n_layers=1, n_heads=2, d_model=8, vocab_size=10,
                                   max_seq_len=6, n_token_types=2, causal=False, norm="post"),
                       seed=0)
    assert bert(tokens, token_type_ids=torch.ones_like(tokens)).shape == (2, 5, 10)
