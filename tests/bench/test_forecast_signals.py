"""The forecast benchmark's training signals: gradient alignment against finite differences,
objectives, and their arrays beside a trajectory."""

from __future__ import annotations

import math

import pytest
import torch

from bench.lab.forecast_signals import (
    Signals,
    attach_signals,
    gradient_signals,
    signals_from_dict,
)
from headwise import Head, ModelConfig, build_model
from headwise.analysis.role_table import TOP_ROLE_CANDIDATES, RoleTable
from headwise.analysis.roles import role_scores
from headwise.analysis.trajectories import Trajectory, score_checkpoints
from headwise.control.objectives import PatternObjective
from headwise.data.batch import Batch
from headwise.model.hook_point import Hook
from headwise.patterns import role_target


def _model() -> torch.nn.Module:
    cfg = ModelConfig(n_layers=1, n_heads=3, d_model=24, vocab_size=11, max_seq_len=9)
    return build_model(cfg, seed=0).double().eval()


def _batch(B: int = 5, T: int = 7) -> Batch:
    gen = torch.Generator().manual_seed(1)
    tokens = torch.randint(0, 11, (B, T), generator=gen)
    tokens[:, 4:] = tokens[:, :3]  # some repeats, so duplicate_token and induction are defined
    targets = torch.randint(0, 11, (B, T), generator=gen)
    return Batch(tokens, targets, None, torch.zeros(B, dtype=torch.long))


def _loss_along(model: torch.nn.Module, batch: Batch, head: int, e: torch.Tensor,
                t: float) -> float:
    """Task loss (mean per-example token cross-entropy, in float64) with head ``head``'s
    pattern replaced by ``A + t * e``."""
    def shift(x: torch.Tensor, ctx: object) -> torch.Tensor:
        return x + t * e[:, None]

    with torch.no_grad(), model.hooks(Hook("blocks.0.attn.hook_pattern", shift, (head,))):
        logits = model(batch.tokens, attention_mask=None, task_ids=batch.task_ids)
    ce = torch.nn.functional.cross_entropy(logits.double().transpose(1, 2), batch.targets,
                                           reduction="none")  # (B, T)
    return float(ce.mean())


def test_alignment_is_the_cosine_of_descent_with_each_role() -> None:
    # Independent of the backward pass: the directional derivative of the loss along
    # E_r = W_r - A (on r's defined rows), by central finite differences through a hook that
    # moves the pattern, is -<D, E_r>. So align_r * |E_r| / (-dL/dt) = 1 / |D on r's rows|
    # must be the same for roles defined on the same rows, and signs must agree.
    model, batch = _model(), _batch()
    sig = gradient_signals(model, batch)
    assert sig.alignment.shape == (3, len(TOP_ROLE_CANDIDATES))
    _, cache = model.run_with_cache(batch.tokens, names=["blocks.0.attn.hook_pattern"])
    pattern = cache["blocks.0.attn.hook_pattern"].double()  # (B, H, T, T)
    for head in range(3):
        inv_norms: dict[bytes, list[float]] = {}
        for j, role in enumerate(TOP_ROLE_CANDIDATES):
            tgt = role_target(role, batch.tokens, None, True)
            if not bool(tgt.rows.any()):
                assert math.isnan(sig.alignment[head, j])  # next_token on a causal model
                continue
            a = pattern[:, head]
            e = (tgt.weights.double() - a) * tgt.rows[..., None]
            h = 1e-5
            slope = (_loss_along(model, batch, head, e, h)
                     - _loss_along(model, batch, head, e, -h)) / (2 * h)
            cos = float(sig.alignment[head, j])
            assert -1.0 <= cos <= 1.0
            assert (cos > 0) == (slope < 0) or abs(slope) < 1e-9
            rows = tgt.rows.numpy().tobytes()
            inv_norms.setdefault(rows, []).append(cos * float(e.norm()) / -slope)
        # previous_token, first_token and self share their rows (every query but the first);
        # duplicate_token and induction theirs (the repeated tokens)
        assert sorted(len(v) for v in inv_norms.values()) == [2, 3]
        for same_rows in inv_norms.values():
            assert max(same_rows) == pytest.approx(min(same_rows), rel=1e-5)
    # the loss itself is task_loss's float32 cross-entropy
    assert sig.loss == pytest.approx(_loss_along(model, batch, 0, torch.zeros(5, 7, 7), 0.0),
                                     rel=1e-6)


def _ce(model: torch.nn.Module, batch: Batch) -> float:
    with torch.no_grad():
        logits = model(batch.tokens, attention_mask=None, task_ids=batch.task_ids)
    return float(torch.nn.functional.cross_entropy(logits.double().transpose(1, 2),
                                                   batch.targets, reduction="none").mean())


def _fd_grad(f: object, weights: list[torch.Tensor], rows: list[slice]) -> torch.Tensor:
    """Central finite-difference gradient of ``f()`` over ``weights[i][rows[i]]``, flattened."""
    out = []
    for w, sl in zip(weights, rows, strict=True):
        view = w.data[sl].view(-1)
        for i in range(view.numel()):
            keep = float(view[i])
            view[i] = keep + 1e-5
            up = f()  # type: ignore[operator]
            view[i] = keep - 1e-5
            down = f()  # type: ignore[operator]
            view[i] = keep
            out.append((up - down) / 2e-5)
    return torch.tensor(out, dtype=torch.float64)


def test_parameter_alignment_matches_finite_differences_of_role_scores() -> None:
    # Reference: role_scores (the package's definition of a score) and the loss, each
    # differentiated by finite differences over one head's own q_proj / k_proj rows.
    cfg = ModelConfig(n_layers=2, n_heads=2, d_model=8, vocab_size=11, max_seq_len=9)
    model = build_model(cfg, seed=0).double().eval()
    batch = _batch()
    sig = gradient_signals(model, batch)
    dh = 4
    for h in (Head(0, 1), Head(1, 0)):
        layer, head = h.layer, h.head
        attn = model.blocks[layer].attn
        rows = [slice(head * dh, (head + 1) * dh)] * 2
        weights = [attn.q_proj.weight, attn.k_proj.weight]
        descent = -_fd_grad(lambda: _ce(model, batch), weights, rows)
        assert math.isnan(sig.param_alignment[layer * 2 + head,
                                              TOP_ROLE_CANDIDATES.index("next_token")])
        for role in ("previous_token", "duplicate_token", "first_token"):
            j = TOP_ROLE_CANDIDATES.index(role)

            def score(role: str = role, h: Head = h) -> float:
                return role_scores(model, batch.tokens, heads=str(h), roles=[role]).get(h, role)

            g = _fd_grad(score, weights, rows)
            want = float(g @ descent / (g.norm() * descent.norm()))
            assert float(sig.param_alignment[layer * 2 + head, j]) == pytest.approx(
                want, abs=1e-4)


def test_a_pattern_objective_pulls_its_head_towards_its_role() -> None:
    model, batch = _model(), _batch()
    obj = PatternObjective(model, "L0.H1", "previous_token", kind="ce", weight=100.0)
    sig = gradient_signals(model, batch, [obj])
    j = TOP_ROLE_CANDIDATES.index("previous_token")
    row = torch.nan_to_num(sig.alignment[1], nan=-2.0)
    assert int(row.argmax()) == j and float(row[j]) > 0
    plain = gradient_signals(model, batch)
    assert float(sig.alignment[1, j]) > float(plain.alignment[1, j])
    assert sig.loss > plain.loss  # the objective's term joins the loss
    assert torch.allclose(sig.alignment[0], plain.alignment[0], equal_nan=True)


def test_signals_stack_beside_a_trajectory_through_json() -> None:
    heads, roles = [Head(0, 0), Head(0, 1)], list(TOP_ROLE_CANDIDATES)
    tables = [(s, RoleTable(heads, roles, torch.rand(2, len(roles), dtype=torch.float64)))
              for s in (10, 20, 30)]
    align = {s: torch.rand(2, len(roles), dtype=torch.float64) for s in (10, 20, 30)}
    align[20][1, 5] = math.nan
    d = Trajectory(tables).to_dict()
    d["loss"] = [1.0 / s for s in (10, 20, 30)]
    for i, h in enumerate(d["heads"]):
        for key, sign in (("alignment", 1.0), ("param_alignment", -1.0)):
            h[key] = {r: [None if math.isnan(float(align[s][i, j])) else
                          sign * float(align[s][i, j]) for s in (10, 20, 30)]
                      for j, r in enumerate(roles)}
    signals = signals_from_dict(d)
    assert signals is not None
    back = attach_signals(Trajectory.from_dict(d), signals)
    assert torch.allclose(back.loss, torch.tensor([0.1, 0.05, 1 / 30], dtype=torch.float64))
    assert torch.allclose(back.alignment, torch.stack([align[s] for s in (10, 20, 30)]),
                          equal_nan=True)
    assert torch.allclose(back.param_alignment, -back.alignment, equal_nan=True)
    assert signals_from_dict(Trajectory(tables).to_dict()) is None  # a summary without them
    with pytest.raises(ValueError, match="no signals at checkpoints"):
        attach_signals(Trajectory(tables), {10: Signals(1.0, align[10], align[10])})


def test_signals_of_each_checkpoint_model() -> None:
    model, batch = _model(), _batch()
    other = build_model(ModelConfig(n_layers=1, n_heads=3, d_model=24, vocab_size=11,
                                    max_seq_len=9), seed=1).double().eval()
    traj = score_checkpoints(
        [(20, other), (10, model)],
        lambda m: role_scores(m, batch.tokens, roles=list(TOP_ROLE_CANDIDATES)))
    traj = attach_signals(traj, {10: gradient_signals(model, batch),
                                 20: gradient_signals(other, batch)})
    assert traj.steps == [10, 20]
    assert traj.loss.tolist() == [gradient_signals(model, batch).loss,
                                  gradient_signals(other, batch).loss]
    assert torch.allclose(traj.alignment[1], gradient_signals(other, batch).alignment,
                          equal_nan=True)
    heads = [Head(0, 0)]
    tables = [(1, RoleTable(heads, ["self"], torch.zeros(1, 1, dtype=torch.float64)))]
    with pytest.raises(ValueError, match="signals"):
        attach_signals(Trajectory(tables), {1: Signals(1.0, torch.zeros(2, 6), torch.zeros(2, 6))})
