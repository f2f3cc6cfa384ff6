"""Role scores on hand-made patterns, against TransformerLens's formulas and explicit maths."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch

from headwise import Head, Hook, ModelConfig, build_model
from headwise.analysis.probe_inputs import induction_probe
from headwise.analysis.role_table import RoleTable
from headwise.analysis.roles import (
    role_scores,
    role_sums,
    scores_from_patterns,
    target_similarity,
)


def _diag(T: int, offset: int) -> torch.Tensor:
    """Pattern with all mass on key q + offset (clamped into range)."""
    a = torch.zeros(T, T)
    for q in range(T):
        a[q, min(max(q + offset, 0), T - 1)] = 1.0
    return a


def _uniform_causal(T: int) -> torch.Tensor:
    return torch.ones(T, T).tril() / torch.arange(1, T + 1)[:, None]


def _induction_pattern(P: int) -> torch.Tensor:
    a = torch.zeros(2 * P, 2 * P)
    a[:P, 0] = 1.0
    for q in range(P, 2 * P):
        a[q, q - P + 1] = 1.0
    return a


# --- independent reference: TransformerLens head_detector ("mul"), numpy as in TL -------------
def _tl_dup(tokens: np.ndarray) -> np.ndarray:
    token_pattern = np.tile(tokens, (len(tokens), 1))
    eq = np.equal(token_pattern, token_pattern.T).astype(int)
    np.fill_diagonal(eq, 0)
    return np.tril(eq).astype(float)


def _tl_detection(kind: str, tokens: np.ndarray) -> np.ndarray:
    T = len(tokens)
    if kind == "previous_token":
        d = np.zeros((T, T))
        d[1:, :-1] = np.eye(T - 1)
        return np.tril(d)
    if kind == "duplicate_token":
        return _tl_dup(tokens)
    dup = _tl_dup(tokens)
    shifted = np.roll(dup, 1, axis=1)
    return np.tril(np.concatenate([np.zeros((T, 1)), shifted[:, 1:]], axis=1))


def _tl_score(pattern: np.ndarray, detection: np.ndarray) -> float:
    return float((pattern * detection).sum() / pattern.sum())


def _scores(pattern: torch.Tensor, tokens: torch.Tensor, **kw: object) -> dict[str, float]:
    out = scores_from_patterns(pattern[None, None].double(), tokens[None], **kw)  # type: ignore
    return {k: float(v[0]) for k, v in out.items()}


def test_exact_previous_token_pattern() -> None:
    tokens = induction_probe(64, 1, 8, torch.Generator().manual_seed(1))[0]
    s = _scores(_diag(16, -1), tokens)
    assert s["previous_token"] == pytest.approx(1.0)
    assert s["induction"] == pytest.approx(0.0, abs=1e-12)
    assert s["self"] == pytest.approx(0.0, abs=1e-12)
    assert s["previous_token_tl"] == pytest.approx(15 / 16)  # TL counts row 0 as well


def test_exact_induction_pattern_stripe_vs_tl() -> None:
    P = 12
    tokens = induction_probe(64, 1, P, torch.Generator().manual_seed(2))[0]
    assert len(set(tokens[:P].tolist())) == P  # distinct half
    s = _scores(_induction_pattern(P), tokens)
    assert s["induction"] == pytest.approx(1.0)
    assert s["induction_tl"] == pytest.approx(0.5)
    assert s["previous_token"] < 0.1


def test_uniform_has_maximal_entropy() -> None:
    T = 10
    tokens = torch.arange(T)
    assert _scores(_uniform_causal(T), tokens)["entropy"] == pytest.approx(1.0)
    peaked = torch.softmax(torch.randn(T, T) * 3 + torch.triu(torch.full((T, T), -1e9), 1), -1)
    assert _scores(peaked, tokens)["entropy"] < 0.99
    assert _scores(_diag(T, -1), tokens)["entropy"] == pytest.approx(0.0, abs=1e-9)


def test_offset_signs_on_diagonals() -> None:
    T = 9
    tokens = torch.arange(T)
    below = _scores(_diag(T, -1), tokens, causal=False)
    above = _scores(_diag(T, +1), tokens, causal=False)
    assert below["previous_token"] == pytest.approx(1.0) and below["next_token"] == 0.0
    assert above["next_token"] == pytest.approx(1.0) and above["previous_token"] == 0.0
    assert math.isnan(_scores(_diag(T, -1), tokens)["next_token"])  # undefined when causal


def test_first_token_self_local() -> None:
    T = 8
    sink = torch.zeros(T, T)
    sink[:, 0] = 1.0
    s = _scores(sink, torch.arange(T), window=2)
    assert s["first_token"] == pytest.approx(1.0)
    assert s["self"] == pytest.approx(0.0)
    # local(2) is |q - k| < 2, the local(2) mask: only row 1 has key 0 within it (rows 1-7)
    assert s["local"] == pytest.approx(1 / 7)
    assert _scores(torch.eye(T), torch.arange(T))["self"] == pytest.approx(1.0)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_agrees_with_transformerlens_mul_formula(seed: int) -> None:
    g = torch.Generator().manual_seed(seed)
    B, h, T = 3, 2, 14
    tokens = torch.randint(0, 5, (B, T), generator=g)  # many duplicates
    logits = torch.randn(B, h, T, T, generator=g) * 2
    pat = torch.softmax(logits.masked_fill(~torch.ones(T, T, dtype=torch.bool).tril(),
                                           float("-inf")), -1).double()
    ours = scores_from_patterns(pat, tokens)
    for kind in ("previous_token", "duplicate_token", "induction"):
        for head in range(h):
            ref = np.mean([_tl_score(pat[b, head].numpy(), _tl_detection(kind, tokens[b].numpy()))
                           for b in range(B)])
            assert float(ours[f"{kind}_tl"][head]) == pytest.approx(ref, abs=1e-12)
    # our previous-token score renormalises TL's to the T - 1 rows that have a previous token
    for head in range(h):
        ref = np.mean([_tl_score(pat[b, head].numpy(), _tl_detection("previous_token",
                                                                     tokens[b].numpy()))
                       for b in range(B)])
        assert float(ours["previous_token"][head]) == pytest.approx(ref * T / (T - 1))


def test_duplicate_token_explicit() -> None:
    tokens = torch.tensor([5, 6, 5, 7, 6, 5])
    a = torch.zeros(6, 6)
    a[0, 0] = a[1, 1] = a[3, 3] = 1.0
    a[2, 0] = 1.0  # 5 -> earlier 5: hit
    a[4, 1] = 0.5  # 6 -> earlier 6: half
    a[4, 4] = 0.5
    a[5, 0] = 0.25
    a[5, 2] = 0.25  # 5 -> earlier 5s at 0 and 2: half
    a[5, 5] = 0.5
    assert _scores(a, tokens)["duplicate_token"] == pytest.approx((1 + 0.5 + 0.5) / 3)


def test_padding_matches_unpadded() -> None:
    P = 6
    tokens = induction_probe(40, 2, P, torch.Generator().manual_seed(3))
    pat = torch.stack([_induction_pattern(P)] * 2)[:, None].double()
    base = scores_from_patterns(pat, tokens)
    padded_tok = torch.cat([tokens, torch.zeros(2, 3, dtype=torch.long)], 1)
    padded_pat = torch.zeros(2, 1, 2 * P + 3, 2 * P + 3, dtype=torch.double)
    padded_pat[:, :, : 2 * P, : 2 * P] = pat
    padded_pat[:, :, 2 * P:, 0] = 1.0
    mask = torch.cat([torch.ones(2, 2 * P), torch.zeros(2, 3)], 1)
    padded = scores_from_patterns(padded_pat, padded_tok, mask)
    for role in ("previous_token", "induction", "entropy", "first_token", "induction_tl"):
        assert float(padded[role][0]) == pytest.approx(float(base[role][0])), role


def _model(**kw: object) -> torch.nn.Module:
    cfg = ModelConfig(n_layers=2, n_heads=3, d_model=24, vocab_size=40, max_seq_len=32,
                      attn_only=True, **kw)  # type: ignore[arg-type]
    return build_model(cfg, seed=0).eval()


def test_role_scores_with_injected_pattern() -> None:
    model = _model()
    P = 8
    tokens = induction_probe(40, 5, P, torch.Generator().manual_seed(4))
    prev = _diag(2 * P, -1)
    ind = _induction_pattern(P)

    def inject(x: torch.Tensor, ctx: object) -> torch.Tensor:
        return torch.stack([prev, ind], 0)[None].expand(x.shape[0], 2, 2 * P, 2 * P).clone()

    with model.hooks(Hook("blocks.1.attn.hook_pattern", inject, heads=(0, 2))):
        table = role_scores(model, tokens, heads="L1.*", batch_size=2)
    assert table.get("L1.H0", "previous_token") == pytest.approx(1.0)
    assert table.get("L1.H2", "induction") == pytest.approx(1.0)
    assert table.get("L1.H2", "induction_tl") == pytest.approx(0.5)
    assert table.top_role("L1.H0") == "previous_token"
    assert table.top_role("L1.H2") == "induction"
    assert table.get("L1.H1", "induction") < 0.5


def test_role_scores_match_explicit_patterns() -> None:
    """Patterns recomputed from the weights by explicit maths give the same scores."""
    model = _model(positional="learned")
    tokens = induction_probe(40, 4, 7, torch.Generator().manual_seed(5))
    table = role_scores(model, tokens, heads="L0.*", batch_size=3)
    x = model.embed.weight[tokens] + model.pos_embed(tokens.shape[1])  # type: ignore
    x = model.blocks[0].ln1(x)
    attn = model.blocks[0].attn
    T = tokens.shape[1]
    q = attn.q_proj(x).view(4, T, 3, 8).transpose(1, 2)
    k = attn.k_proj(x).view(4, T, 3, 8).transpose(1, 2)
    scores = q @ k.transpose(-1, -2) / math.sqrt(8)
    pat = torch.softmax(scores.masked_fill(~torch.ones(T, T, dtype=torch.bool).tril(), -1e30),
                        -1).detach().double()
    ref = scores_from_patterns(pat, tokens)
    for role in ("previous_token", "induction", "entropy", "duplicate_token_tl", "self"):
        for h in range(3):
            assert table.get(Head(0, h), role) == pytest.approx(float(ref[role][h]), abs=1e-5)


def test_target_similarity() -> None:
    model = _model()
    T = 10
    tokens = torch.randint(0, 40, (3, T))
    prev = _diag(T, -1)
    with model.hooks(Hook("blocks.0.attn.hook_pattern",
                          lambda x, ctx: prev.expand_as(x).clone(), heads=(1,))):
        same = target_similarity(model, tokens, prev, heads="L0.H1")
        unif = target_similarity(model, tokens, torch.ones(T, T), heads="L0.H1")
    assert same.get("L0.H1", "target") == pytest.approx(1.0)
    # overlap of a one-hot row with uniform over q + 1 keys is 1 / (q + 1)
    assert unif.get("L0.H1", "target") == pytest.approx(np.mean([1 / (q + 1) for q in range(T)]))


def test_role_table_views() -> None:
    t = RoleTable([Head(0, 0), Head(1, 2)], ["previous_token", "induction", "next_token"],
                  torch.tensor([[0.9, 0.1, math.nan], [0.2, 0.7, math.nan]], dtype=torch.float64))
    recs = t.to_records()
    assert json.loads(json.dumps(recs))[1] == {"layer": 1, "head": 2, "previous_token": 0.2,
                                                "induction": 0.7,
                                                "next_token": None}
    assert t.top_role("L1.H2") == "induction"
    assert t.top_role("L1.H2", min_score=0.8) == "none"
    assert "L1.H2" in str(t) and "induction" in str(t)
    assert RoleTable.from_records(recs).get("L0.H0", "previous_token") == pytest.approx(0.9)
    with pytest.raises(KeyError, match="roles"):
        t.get("L0.H0", "copying")


def test_only_scored_heads_patterns_are_computed() -> None:
    """Every head stays on the fused kernel; the scored head's pattern alone is computed (the
    short sequence keeps the fused machinery: no explicit pass at any length)."""
    model = _model()
    seen: list[tuple[int, tuple[int, ...]]] = []
    for layer, block in enumerate(model.blocks):
        block.attn.explicit_max_keys = 0
        original = block.attn._pattern

        def record(q, k, allowed, heads, layer=layer, original=original):  # type: ignore
            seen.append((layer, tuple(heads)))
            return original(q, k, allowed, heads)

        block.attn._pattern = record  # type: ignore[method-assign]
        block.attn._explicit = None  # type: ignore[assignment]  # never on the explicit path
    role_scores(model, torch.randint(0, 40, (2, 8)), heads="L1.H2",
                roles=["previous_token"])
    assert seen == [(1, (2,))]


def test_scores_measured_in_eval_mode_and_mode_restored() -> None:
    model = _model(dropout=0.5).train()
    tokens = torch.randint(0, 40, (3, 8))
    a = role_scores(model, tokens, roles=["previous_token", "entropy"])
    b = role_scores(model, tokens, roles=["previous_token", "entropy"])
    assert torch.equal(a.values, b.values) and model.training


def test_bidirectional_model_next_token_head() -> None:
    model = _model(causal=False)
    T = 9
    nxt = _diag(T, +1)

    with model.hooks(Hook("blocks.0.attn.hook_pattern",
                          lambda x, ctx: nxt.expand_as(x).clone(), heads=(1,))):
        table = role_scores(model, torch.randint(0, 40, (2, T)), heads="L0.*",
                            roles=["next_token", "previous_token", "entropy"])
    assert table.get("L0.H1", "next_token") == pytest.approx(1.0)
    assert table.get("L0.H1", "previous_token") == pytest.approx(0.0)
    assert table.top_role("L0.H1") == "next_token"
    assert 0.0 < table.get("L0.H0", "next_token") < 0.5  # a random head spreads attention


def test_analysis_rejects_a_headset_of_another_model() -> None:
    """Every analysis entry point resolves heads through ``headwise.heads.select_heads``: a
    HeadSet built for another shape is an error naming both shapes, not silently misread."""
    from headwise import HeadSet, SelectorError
    from headwise.analysis import ablation_importance, activation_patching
    from headwise.data import Batch
    from headwise.report.viewer import attention_viewer

    model = _model()  # 2 layers x 3 heads
    other = HeadSet.parse("L0.H0", 3, 3)
    tokens = torch.randint(0, 40, (2, 6), generator=torch.Generator().manual_seed(0))
    batch = Batch(tokens, tokens, None, torch.zeros(2, dtype=torch.long))
    calls = [
        lambda: role_scores(model, tokens, heads=other, roles=["self"]),
        lambda: target_similarity(model, tokens, torch.eye(6), heads=other),
        lambda: activation_patching(model, tokens, tokens, lambda x: x.sum(), heads=other),
        lambda: ablation_importance(model, batch, heads=other, n_boot=2),
        lambda: attention_viewer(model, tokens[0], heads=other),
    ]
    for call in calls:
        with pytest.raises(SelectorError, match=r"3 layers x 3 heads, the model has 2 layers x "
                                                r"3 heads"):
            call()


def test_role_score_standard_error_is_the_spread_of_its_groups() -> None:
    """With every sequence defining as many rows (a fixed-length probe), the ratio estimator's
    standard error is the sample standard deviation of the groups' own scores (each group
    scored alone) over sqrt(groups); the pooled score is their mean."""
    from headwise.analysis.importance_matrix import STDERR_GROUPS

    model = _model(positional="learned")
    tokens = induction_probe(40, 4 * STDERR_GROUPS, 7, torch.Generator().manual_seed(3))
    table = role_scores(model, tokens, heads="L0.*", batch_size=5)  # batches cut across groups
    for role in ("previous_token", "induction"):
        for h in range(3):
            head = Head(0, h)
            per_group = torch.tensor([role_scores(model, part, heads="L0.*").get(head, role)
                                      for part in tokens.split(4)], dtype=torch.float64)
            assert table.get(head, role) == pytest.approx(float(per_group.mean()), abs=1e-9)
            expected = float(per_group.std() / math.sqrt(STDERR_GROUPS))
            assert expected > 0 and table.error(head, role) == pytest.approx(expected, rel=1e-6)
    one = role_scores(model, tokens[:1], heads="L0.H0", roles=["previous_token"])
    assert math.isnan(one.error("L0.H0", "previous_token"))  # one sequence: no spread to read


def _skewness(x: torch.Tensor) -> float:
    dev = x - x.mean()
    return float(dev.pow(3).mean() / dev.square().mean() ** 1.5)


def test_role_score_skewness_is_that_of_its_sequences_scored_alone() -> None:
    """With every sequence defining as many rows, the ratio's linearised values are each
    sequence's own score less the pooled one (times its rows): their skewness is that of the
    sequences' scores, each sequence scored alone, jackknifed (``n g - (n - 1) mean_i g_(i)``,
    ``g`` the sample skewness ``m3 / m2^1.5`` and ``g_(i)`` that without sequence ``i``)."""
    model = _model(positional="learned")
    tokens = induction_probe(40, 24, 7, torch.Generator().manual_seed(4))
    table = role_scores(model, tokens, heads="L0.*", batch_size=5)
    for role in ("previous_token", "induction"):
        for h in range(3):
            head = Head(0, h)
            alone = torch.tensor([role_scores(model, t[None], heads="L0.*").get(head, role)
                                  for t in tokens], dtype=torch.float64)
            n = alone.numel()
            left_out = sum(_skewness(torch.cat([alone[:i], alone[i + 1:]])) for i in range(n))
            expected = n * _skewness(alone) - (n - 1) * left_out / n
            assert table.skewness(head, role) == pytest.approx(expected, abs=1e-4)  # fp32 runs


@pytest.mark.parametrize("role", ["previous_token", "induction", "self", "uniform", "entropy",
                                  "previous_token_tl", "induction_tl", "duplicate_token_tl",
                                  "copying"])
def test_per_row_role_sums_add_up_to_the_pooled_ones(role: str) -> None:
    g = torch.Generator().manual_seed(5)
    patterns = torch.rand(6, 3, 9, 9, generator=g, dtype=torch.float64).tril()
    patterns = patterns / patterns.sum(-1, keepdim=True)
    tokens = torch.randint(0, 5, (6, 9), generator=g)
    copy = torch.rand(3, 5, generator=g) > 0.5
    pooled = role_sums(patterns, tokens, roles=[role], copy_top1=copy)[role]
    rows = role_sums(patterns, tokens, roles=[role], copy_top1=copy, per_row=True)[role]
    assert rows[0].shape == rows[1].shape == (6, 3)
    for a, b in zip(rows, pooled, strict=True):
        assert torch.allclose(a.sum(0), b, rtol=1e-12, atol=1e-12)
