"""Role-score forecasts with intervals: the decision rule, coverage on synthetic runs whose
final scores are known, off-range widening, and loading without pickle."""

from __future__ import annotations

import json
import pickle

import pytest
import torch

from headwise.analysis.role_table import SHOWN_MIN_SCORE, TOP_ROLE_CANDIDATES, RoleTable
from headwise.analysis.trajectories import Trajectory
from headwise.forecast.role_scores import (
    COVERAGE,
    OUTSIDE_WIDEN,
    RoleRun,
    RoleScoreForecaster,
    decide,
    load_role_score_forecaster,
)
from headwise.heads import Head

STEPS = list(range(10, 210, 10))  # 20 checkpoints


def synthetic_run(finals: torch.Tensor, gen: torch.Generator, noise: float = 0.02,
                  n_heads: int = 4) -> RoleRun:
    """Scores that move on a straight line from a low start to ``finals`` (N, R) by the last
    step, with Gaussian noise on every checkpoint but the last: the end is known exactly."""
    n, r = finals.shape
    start = torch.rand(n, r, generator=gen, dtype=torch.float64) * 0.2
    heads = [Head(i // n_heads, i % n_heads) for i in range(n)]
    tables = []
    for c, step in enumerate(STEPS):
        t = step / STEPS[-1]
        vals = start + (finals - start) * t
        if c < len(STEPS) - 1:
            vals = vals + noise * torch.randn(n, r, generator=gen, dtype=torch.float64)
        tables.append((step, RoleTable(heads, list(TOP_ROLE_CANDIDATES), vals.clamp(0, 1))))
    return RoleRun(Trajectory(tables), context={"n_layers": 2, "n_heads": n_heads,
                                                "tasks": ["copy"]})


def random_finals(gen: torch.Generator, n: int = 8) -> torch.Tensor:
    return torch.rand(n, len(TOP_ROLE_CANDIDATES), generator=gen, dtype=torch.float64)


@pytest.fixture(scope="module")
def fitted() -> RoleScoreForecaster:
    gen = torch.Generator().manual_seed(0)
    return RoleScoreForecaster.fit([synthetic_run(random_finals(gen), gen) for _ in range(30)])


def test_decide_follows_the_intervals() -> None:
    thr = SHOWN_MIN_SCORE
    # a clear top role far above the threshold and every rival
    assert decide({"induction": (0.8, 0.7, 0.9), "self": (0.1, 0.0, 0.2)}) == ("induction", True)
    # the top role's interval straddles the threshold
    assert decide({"induction": (0.3, thr - 0.1, 0.4), "self": (0.0, 0.0, 0.1)}) == (
        "induction", False)
    # a rival's interval reaches above the top role's lower end
    assert decide({"induction": (0.8, 0.6, 1.0), "self": (0.5, 0.4, 0.65)}) == (
        "induction", False)
    # at the edges: a top role's lower end on the threshold decides; a rival reaching
    # exactly that lower end does not leave it decided
    assert decide({"induction": (0.5, thr, 0.7), "self": (0.1, 0.0, 0.2)}) == ("induction", True)
    assert decide({"induction": (0.8, 0.6, 1.0), "self": (0.5, 0.4, 0.6)}) == (
        "induction", False)
    # none, and no interval reaches the threshold; none, and one does
    assert decide({"induction": (0.1, 0.0, 0.2)}) == ("none", True)
    assert decide({"induction": (0.2, 0.1, 0.3)}) == ("none", False)
    assert decide({}) == ("none", True)  # no defined score: nothing can reach the threshold


def test_intervals_cover_fresh_synthetic_runs_at_the_stated_rate(fitted) -> None:
    """Split-conformal coverage is at least COVERAGE in expectation on exchangeable runs;
    with ~2,900 scores its standard error is ~0.006, so 0.03 below it is a 5-sigma miss."""
    gen = torch.Generator().manual_seed(1)
    inside = total = 0
    for _ in range(20):
        finals = random_finals(gen)
        run = synthetic_run(finals, gen)
        for frac_n in (4, 8):  # 20% and 40% of the checkpoints
            for i, f in enumerate(fitted.forecast(run, frac_n)):
                for j, role in enumerate(TOP_ROLE_CANDIDATES):
                    _, lo, hi = f.scores[role]
                    inside += lo <= float(finals[i, j]) <= hi
                    total += 1
    assert inside / total >= COVERAGE - 0.03


def test_decided_heads_are_right_and_heads_ending_at_the_threshold_are_undecided(fitted) -> None:
    gen = torch.Generator().manual_seed(2)
    clear = torch.full((8, len(TOP_ROLE_CANDIDATES)), 0.05, dtype=torch.float64)
    clear[:, 0] = 0.9  # every head ends with a clear top role
    near = torch.full((8, len(TOP_ROLE_CANDIDATES)), 0.05, dtype=torch.float64)
    near[:, 1] = SHOWN_MIN_SCORE  # every head ends exactly at the threshold
    for f in fitted.forecast(synthetic_run(clear, gen), 12):  # from 60% of the run
        assert f.decided and f.role == TOP_ROLE_CANDIDATES[0], f
    # An interval that covers the final score covers the threshold here, so at least
    # COVERAGE of these heads read undecided in expectation (320 heads: standard error ~0.017).
    undecided = [not f.decided for _ in range(20) for n in (4, 12)
                 for f in fitted.forecast(synthetic_run(near, gen), n)]
    assert sum(undecided) / len(undecided) >= COVERAGE - 0.05


def test_intervals_narrow_as_more_of_the_run_is_seen(fitted) -> None:
    finals = torch.full((8, len(TOP_ROLE_CANDIDATES)), 0.5, dtype=torch.float64)
    run = synthetic_run(finals, torch.Generator().manual_seed(7), noise=0.0)
    widths = []
    for n in (4, 8, 12):
        for f in fitted.forecast(run, n):
            for _, lo, hi in f.scores.values():
                assert 0.0 < lo and hi < 1.0  # not clipped: the width is the interval's own
        _, lo, hi = fitted.forecast(run, n)[0].scores[TOP_ROLE_CANDIDATES[0]]
        widths.append(hi - lo)
    assert widths[0] > widths[1] > widths[2] > 0, widths


def test_an_off_range_run_widens_every_interval_and_says_why(fitted) -> None:
    gen = torch.Generator().manual_seed(3)
    finals = random_finals(gen, 16)
    inside = synthetic_run(finals, torch.Generator().manual_seed(4))
    wide = synthetic_run(finals, torch.Generator().manual_seed(4), n_heads=8)
    a, b = fitted.forecast(inside, 4), fitted.forecast(wide, 4)
    assert not a[0].outside
    assert any("n_heads 8 outside the fitted 4 to 4" in w for w in b[0].outside)
    role = TOP_ROLE_CANDIDATES[0]
    for fa, fb in zip(a, b, strict=True):
        va, la, ha = fa.scores[role]
        vb, lb, hb = fb.scores[role]
        assert va == pytest.approx(vb)
        if 0 < la and ha < 1 and 0 < lb and hb < 1:  # neither end clipped to [0, 1]
            assert hb - lb == pytest.approx(OUTSIDE_WIDEN * (ha - la))
    enforced = RoleRun(inside.traj, enforced=True, context=inside.context)
    assert any("fitted on plain runs only, this is enforced" in w
               for w in fitted.forecast(enforced, 4)[0].outside)


def test_json_round_trip_never_unpickles(fitted, tmp_path, monkeypatch) -> None:
    path = tmp_path / "f.json"
    path.write_text(fitted.to_json())

    def refuse(*a, **k):
        raise AssertionError("unpickled")

    monkeypatch.setattr(pickle, "loads", refuse)
    monkeypatch.setattr(pickle, "load", refuse)
    monkeypatch.setattr(torch, "load", refuse)
    back = load_role_score_forecaster(path)
    run = synthetic_run(random_finals(torch.Generator().manual_seed(5)),
                        torch.Generator().manual_seed(5))
    assert [f.to_dict() for f in back.forecast(run, 4)] == [
        f.to_dict() for f in fitted.forecast(run, 4)]


@pytest.mark.parametrize(("field", "value", "message"), [
    ("format", "other", "format: expected"),
    ("weight", [1.0], "weight: expected 13 finite numbers"),
    ("half_widths", [0.1, -0.1, 0.1, 0.1, 0.1], "half_widths: expected scales > 0 and widths >= 0"),
    ("bias", "x", "bias: expected a finite number"),
    ("ranges", {"features": {}}, "ranges.features: expected finite [low, high]"),
    ("version", 1, "version/features"),
    (("ranges", "features", "seen"), [float("nan"), 1.0], "ranges.features: expected finite"),
    (("ranges", "features", "seen"), [0.9, 0.1], "ranges.features: expected finite"),
    (("ranges", "n_heads"), [8, 2], "ranges.n_heads: expected integers"),
    (("ranges", "n_layers"), [1.5, 2], "ranges.n_layers: expected integers"),
])
def test_malformed_files_name_the_field(fitted, tmp_path, field, value, message) -> None:
    d = json.loads(fitted.to_json())
    if isinstance(field, tuple):  # a nested field
        *path, last = field
        inner = d
        for key in path:
            inner = inner[key]
        inner[last] = value
    else:
        d[field] = value
    path = tmp_path / "f.json"
    path.write_text(json.dumps(d))
    with pytest.raises(ValueError, match=message.replace("[", r"\[")):
        load_role_score_forecaster(path)


def test_fit_needs_two_runs_with_three_checkpoints() -> None:
    gen = torch.Generator().manual_seed(6)
    run = synthetic_run(random_finals(gen), gen)
    with pytest.raises(ValueError, match="expected at least 2"):
        RoleScoreForecaster.fit([run])
    short = RoleRun(run.traj.upto(2))
    with pytest.raises(ValueError, match=r"runs\[1\]: 2 checkpoint"):
        RoleScoreForecaster.fit([run, short])


def test_a_measured_record_missing_what_reports_quote_is_refused(fitted, tmp_path) -> None:
    d = json.loads(fitted.to_json())
    d["measured"] = {"fraction": 0.2, "fresh": {"heads": 10}}
    path = tmp_path / "f.json"
    path.write_text(json.dumps(d))
    with pytest.raises(ValueError, match="measured: expected an object with the benchmark"):
        load_role_score_forecaster(path)


def test_a_run_with_one_checkpoint_is_refused(fitted) -> None:
    run = synthetic_run(random_finals(torch.Generator().manual_seed(8)),
                        torch.Generator().manual_seed(8))
    with pytest.raises(ValueError, match="1 checkpoint"):
        fitted.forecast(RoleRun(run.traj.upto(1)), 1)


def test_a_summary_of_a_one_checkpoint_run_has_no_score_forecast(fitted) -> None:
    from headwise.contract.forecast import forecast_summary
    from headwise.forecast.roles import load_forecaster

    run = synthetic_run(random_finals(torch.Generator().manual_seed(9)),
                        torch.Generator().manual_seed(9))
    one = forecast_summary(run.traj.upto(1), load_forecaster(), scores=fitted)
    assert all("score_forecast" not in h for h in one["heads"])
    two = forecast_summary(run.traj, load_forecaster(), scores=fitted)
    assert all("score_forecast" in h for h in two["heads"])
