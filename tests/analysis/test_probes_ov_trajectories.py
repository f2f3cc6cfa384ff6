"""Probe sampling, the OV copying scores on hand-set weights, and trajectory bookkeeping."""

from __future__ import annotations

import math

import pytest
import torch

from headwise import Head, ModelConfig, build_model
from headwise.analysis.ov import copying_eigen_ratio, copying_eigen_ratios, ov_logits, ov_top1
from headwise.analysis.probe_inputs import (
    induction_probe,
    infer_period,
    periodic_probe,
    probe_info,
    random_tokens,
)
from headwise.analysis.role_table import RoleTable
from headwise.analysis.roles import role_scores
from headwise.analysis.trajectories import Trajectory
from headwise.forecast.roles import linear_forecast


def test_induction_probe_distinct_and_repeated() -> None:
    g = torch.Generator().manual_seed(0)
    p = induction_probe(50, 8, 20, g, reserved=4)
    assert p.shape == (8, 40) and torch.equal(p[:, :20], p[:, 20:])
    assert all(len(set(row[:20].tolist())) == 20 for row in p)
    assert int(p.min()) >= 4 and int(p.max()) < 50
    small = induction_probe(10, 4, 20, g)  # vocabulary too small: with replacement
    assert small.shape == (4, 40) and probe_info("induction", 10, 4, 40, True,
                                                 half_len=20)["distinct_effective"] is False
    assert random_tokens(7, 3, 5, g).shape == (3, 5)


def test_periodic_probe_and_period_inference() -> None:
    g = torch.Generator().manual_seed(1)
    p = periodic_probe(64, 3, 7, 30, g)
    assert torch.equal(p[:, 7:], p[:, :-7])
    assert infer_period(p).tolist() == [7, 7, 7]
    assert infer_period(torch.arange(10)[None]).tolist() == [0]
    padded = torch.cat([p[:, :14], torch.zeros(3, 5, dtype=torch.long)], 1)
    mask = torch.cat([torch.ones(3, 14), torch.zeros(3, 5)], 1)
    assert infer_period(padded, mask).tolist() == [7, 7, 7]
    with pytest.raises(ValueError, match="half_len: got 0"):
        induction_probe(10, 1, 0)


def _copy_model(sign: float) -> torch.nn.Module:
    """A 1-layer model whose head 0 has OV = sign * identity on a 16-token vocabulary."""
    cfg = ModelConfig(n_layers=1, n_heads=4, d_model=64, vocab_size=16, max_seq_len=8,
                      attn_only=True, norm_type="rmsnorm", bias=False, positional="none")
    model = build_model(cfg, seed=0)
    with torch.no_grad():
        model.embed.weight.zero_()
        model.embed.weight[:, :16] = torch.eye(16) * 8.0
        model.unembed.weight.copy_(model.embed.weight)
        attn = model.blocks[0].attn
        attn.v_proj.weight.zero_()
        attn.v_proj.weight[:16, :16] = torch.eye(16)
        attn.o_proj.weight.zero_()
        attn.o_proj.weight[:16, :16] = sign * torch.eye(16)
    return model.eval()


def test_copying_scores_on_hand_set_ov_circuit() -> None:
    copy_model, anti = _copy_model(1.0), _copy_model(-1.0)
    h = Head(0, 0)
    # explicit maths: rmsnorm(8 e_t) = 8 e_t (its rms over 64 dims is 1); W_U = 8 I: M = 64 I
    assert torch.allclose(ov_logits(copy_model, h), 64.0 * torch.eye(16), atol=1e-3)
    assert ov_top1(copy_model, h).all() and not ov_top1(anti, h).any()
    assert copying_eigen_ratio(copy_model, h) == pytest.approx(1.0)
    assert copying_eigen_ratio(anti, h) == pytest.approx(-1.0)
    tokens = torch.randint(0, 16, (3, 8))
    assert role_scores(copy_model, tokens, heads="L0.H0",
                       roles=["copying"]).get(h, "copying") == pytest.approx(1.0)
    assert role_scores(anti, tokens, heads="L0.H0",
                       roles=["copying"]).get(h, "copying") == pytest.approx(0.0)


@pytest.mark.parametrize("norm", ["pre", "post"])
def test_copying_eigen_ratios_are_those_of_the_whole_ov_matrix(norm: str) -> None:
    # Reference: the eigenvalues of the whole (V, V) matrix M (rank <= Dh: the rest are ~0).
    cfg = ModelConfig(n_layers=3, n_heads=4, d_model=24, vocab_size=40, max_seq_len=8,
                      norm=norm, embed_norm=norm == "post")
    model = build_model(cfg, seed=1).eval()
    heads = [Head(layer, h) for layer in range(3) for h in range(4)]
    got = copying_eigen_ratios(model, heads)
    for head in heads:
        lam = torch.linalg.eigvals(ov_logits(model, head).double())
        expected = float(lam.sum().real / lam.abs().sum())
        assert got[head] == pytest.approx(expected, abs=1e-4), head
        assert copying_eigen_ratio(model, head) == got[head]


def _table(prev: float, ind: float) -> RoleTable:
    return RoleTable([Head(0, 0), Head(1, 0)], ["previous_token", "induction"],
                     torch.tensor([[prev, 0.0], [0.1, ind]], dtype=torch.float64))


def test_trajectory_commitment_and_linear_forecast() -> None:
    # L0.H0 rises linearly (forecastable); L1.H0 has a late phase change (not forecastable)
    steps = list(range(100, 1100, 100))
    tables = [(s, _table(prev=s / 1000, ind=0.05 if s < 600 else 0.9)) for s in steps]
    traj = Trajectory(list(reversed(tables)))  # order does not matter
    assert traj.steps == steps
    # the role table's shown threshold (0.25): scores of 0.1 and 0.05 are "none"
    assert traj.top_roles("L0.H0")[:3] == ["none", "none", "previous_token"]
    assert traj.top_roles("L1.H0")[:5] == ["none"] * 5
    assert traj.final_role("L1.H0") == "induction"
    assert traj.commitment_step("L1.H0") == 600
    assert traj.commitment_step("L0.H0") == 300
    assert traj.commitment_step("L0.H0", min_score=0.0) == 100
    # baseline from the first two checkpoints: the line 0.1, 0.2 reaches 1.0 at step 1000;
    # the flat start of L1.H0 (0.1 and 0.05) stays under the threshold
    assert linear_forecast(traj, 2) == ["previous_token", "none"]
    d = traj.to_dict()
    assert d["heads"][1]["commitment_step"] == 600 and "forecast_accuracy" not in d
    assert math.isclose(d["heads"][0]["scores"]["previous_token"][-1], 1.0)
    back = Trajectory.from_dict(d)
    assert back.steps == steps and torch.equal(back.values, traj.values)
    assert traj.upto(3).steps == steps[:3]
    with pytest.raises(ValueError, match="tables"):
        Trajectory([])


def test_ov_top1_on_a_token_subset_matches_the_full_table() -> None:
    model = build_model(ModelConfig(n_layers=2, n_heads=2, d_model=16, vocab_size=30,
                                    max_seq_len=8), seed=4)
    full = ov_top1(model, Head(1, 1), chunk=7)
    ids = torch.tensor([[3, 3, 9], [28, 0, 9]])
    sub = ov_top1(model, Head(1, 1), ids)
    # reference: explicit argmax over the explicit (V, V) circuit
    ref = ov_logits(model, Head(1, 1)).argmax(-1) == torch.arange(30)
    assert torch.equal(full, ref)
    keep = torch.zeros(30, dtype=torch.bool)
    keep[[0, 3, 9, 28]] = True
    assert torch.equal(sub, ref & keep)
