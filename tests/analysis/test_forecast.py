"""The role forecaster: packaged data loaded without pickle, fitting, known outcomes, clauses."""

from __future__ import annotations

import json
import pickle
from importlib import resources

import pytest
import torch

from headwise import Head
from headwise.analysis.contract import Contract
from headwise.analysis.forecast import (
    CLASSES,
    NONE_FEATURES,
    ROLE_FEATURES,
    EarlyFeatures,
    Forecaster,
    HeadForecast,
    early_features,
    forecast_heads,
    linear_forecast,
    load_forecaster,
)
from headwise.analysis.forecast_contract import forecast_clauses, measured_text
from headwise.analysis.role_table import TOP_ROLE_CANDIDATES, RoleTable
from headwise.analysis.trajectories import Trajectory
from headwise.runspec import contract_from_list

ROLES = list(TOP_ROLE_CANDIDATES)


def _traj(curves: list[dict[str, list[float]]], steps: list[int]) -> Trajectory:
    """A trajectory of len(curves) heads (layer 0) whose role scores follow ``curves``."""
    heads = [Head(0, i) for i in range(len(curves))]
    tables = []
    for c, step in enumerate(steps):
        vals = torch.tensor([[curve.get(r, [0.02] * len(steps))[c] for r in ROLES]
                             for curve in curves], dtype=torch.float64)
        tables.append((step, RoleTable(heads, ROLES, vals)))
    return Trajectory(tables)


def test_packaged_forecaster_loads_without_pickle(monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(*args: object, **kwargs: object) -> None:
        raise AssertionError("the forecaster must not be unpickled")

    monkeypatch.setattr(pickle, "load", refuse)
    monkeypatch.setattr(pickle, "loads", refuse)
    monkeypatch.setattr(torch, "load", refuse)
    f = load_forecaster()
    raw = json.loads(resources.files("headwise.data").joinpath("forecaster_v2.json")
                     .read_text("utf-8"))
    assert raw["format"] == "headwise-forecaster" and raw["version"] == f.version == "2"
    assert f.role_weight.shape == (len(ROLE_FEATURES),)
    assert f.none_weight.shape == (len(NONE_FEATURES),)
    # the accuracy the report quotes comes from the benchmark's held-out runs
    m = f.measured
    for key in ("held_out_seeds_accuracy", "held_out_configs_accuracy", "baseline_accuracy",
                "n_runs", "command"):
        assert key in m
    # consistent with how it was measured: every configuration x fit seed, fresh seeds unseen
    assert m["n_runs"] == len(m["configs"]) * len(m["seeds"])
    assert m["fresh_runs"] == len(m["configs"]) * len(m["fresh_seeds"])
    assert not set(m["seeds"]) & set(m["fresh_seeds"])
    assert ("--suite" in m["command"]) == any(c.startswith("suite-") for c in m["configs"])
    # the calibration quoted with it covers every held-out head once, in adjacent bins
    bins = m["calibration_held_out_seeds"]
    assert sum(b["heads"] for b in bins) == m["n_heads"]
    assert [b["from"] for b in bins[1:]] == [b["to"] for b in bins[:-1]] and bins[-1]["to"] == 1
    assert all(0.0 <= b["accuracy"] <= 1.0 for b in bins)
    assert set(m["below_baseline"]) <= set(m["configs"])


def test_measured_text_quotes_the_benchmark_and_its_top_calibration_bin() -> None:
    measured = {"fraction": 0.2, "held_out_seeds_accuracy": 0.81, "held_out_configs_accuracy":
                0.803, "baseline_accuracy": 0.61, "n_runs": 65, "n_heads": 310,
                "calibration_held_out_seeds": [
                    {"from": 0.0, "to": 0.9, "heads": 139, "accuracy": 0.7},
                    {"from": 0.9, "to": 1.0, "heads": 171, "accuracy": 0.895}],
                "configs": ["a", "b", "levers"], "below_baseline": ["levers"]}
    text = measured_text(measured)
    assert "81.0% (held-out seeds), 80.3% (held-out configurations)" in text
    assert "linear baseline 61.0%; 65 runs, 310 heads" in text
    assert ("forecasts stated at 90% or more were right 89.5% of the time (171 held-out "
            "heads)") in text
    assert "below the baseline on 1 of 3 benchmark configurations (levers)" in text
    measured["below_baseline"] = []
    assert "below the baseline on 0 of 3 benchmark configurations (docs/" in measured_text(
        measured)
    del measured["calibration_held_out_seeds"], measured["below_baseline"]
    assert "stated at" not in measured_text(measured)
    assert "below the baseline" not in measured_text(measured)
    assert measured_text({}) == "no benchmark measurement recorded for this forecaster"


def test_load_rejects_other_files(tmp_path: pytest.TempPathFactory) -> None:
    path = tmp_path / "f.json"  # type: ignore[operator]
    path.write_text(json.dumps({"format": "something else"}))
    with pytest.raises(ValueError, match="format"):
        load_forecaster(path)
    good = json.loads(load_forecaster().to_json())
    good["role_weight"] = good["role_weight"][:-1]
    path.write_text(json.dumps(good))
    with pytest.raises(ValueError, match="role_weight"):
        load_forecaster(path)
    good = json.loads(load_forecaster().to_json())
    good["none_bias"] = [float("nan")]
    path.write_text(json.dumps(good))
    with pytest.raises(ValueError, match="none_bias"):
        load_forecaster(path)
    good = json.loads(load_forecaster().to_json())
    good["version"] = "1"  # v1 was fit on runs scored before the role definitions were unified
    path.write_text(json.dumps(good))
    with pytest.raises(ValueError, match="version"):
        load_forecaster(path)


def test_json_round_trip_keeps_predictions(tmp_path: pytest.TempPathFactory) -> None:
    f = load_forecaster()
    path = tmp_path / "f.json"  # type: ignore[operator]
    path.write_text(f.to_json())
    g = load_forecaster(path)
    x = EarlyFeatures(torch.randn(5, len(ROLES), len(ROLE_FEATURES), dtype=torch.float64),
                      torch.randn(5, len(NONE_FEATURES), dtype=torch.float64))
    assert torch.allclose(f.probabilities(x), g.probabilities(x))
    assert f.probabilities(x).shape == (5, len(CLASSES))
    assert torch.allclose(f.probabilities(x).sum(1), torch.ones(5, dtype=torch.float64))


STEPS = list(range(50, 1050, 50))  # 20 checkpoints; the first 20% are steps 50..200


def test_packaged_forecaster_predicts_known_outcomes() -> None:
    # Three heads whose early signals leave no doubt: one already a strong first-token head,
    # one whose previous-token score climbs steeply from 0.2, one flat at 0.02 on every role.
    n = len(STEPS)
    curves = [{"first_token": [0.9] * n},
              {"previous_token": [min(1.0, 0.2 + 0.1 * c) for c in range(n)]},
              {}]
    traj = _traj(curves, STEPS)
    assert [traj.final_role(h) for h in traj.heads] == ["first_token", "previous_token", "none"]
    pred = forecast_heads(traj, load_forecaster(), n=4)
    assert [p.role for p in pred] == ["first_token", "previous_token", "none"]
    assert all(p.confidence > 0.5 for p in pred)
    # committed: first_token since the first checkpoint; the climber became
    # previous_token (>= 0.25) at its second checkpoint
    assert [p.committed_at for p in pred] == [50, 100, 50]


def test_fit_learns_a_rule_the_baseline_cannot_see() -> None:
    # Synthetic runs: each head's final role is the role whose early score is *largest*, even
    # when another role's early slope is steeper (it later saturates). A linear extrapolation
    # follows the slope; the fitted model learns the rule from other runs.
    gen = torch.Generator().manual_seed(0)

    def run() -> tuple[Trajectory, list[str]]:
        curves, labels = [], []
        for _ in range(8):
            win, fast = torch.randperm(len(ROLES), generator=gen)[:2].tolist()
            hi = 0.3 + 0.3 * float(torch.rand((), generator=gen))
            curves.append({ROLES[win]: [hi + 0.4 * c / 20 for c in range(20)],
                           # climbs 0.06 per checkpoint over the first four, then stalls
                           ROLES[fast]: [min(hi - 0.25 + 0.06 * c, hi - 0.05)
                                         for c in range(20)]})
            labels.append(ROLES[win])
        return _traj(curves, STEPS), labels

    fit_runs = [run() for _ in range(10)]
    assert all(t.final_role(h) == lab for t, ls in fit_runs
               for h, lab in zip(t.heads, ls, strict=True))
    feats = EarlyFeatures.cat([early_features(t, 4) for t, _ in fit_runs])
    labels = [lab for _, ls in fit_runs for lab in ls]
    f = Forecaster.fit(feats, labels, version="test")
    test_runs = [run() for _ in range(5)]
    hits = [p == lab for t, ls in test_runs
            for p, lab in zip([r for r, _ in f.predict(t, 4)], ls, strict=True)]
    base = [p == lab for t, ls in test_runs
            for p, lab in zip(linear_forecast(t, 4), ls, strict=True)]
    assert sum(hits) / len(hits) >= 0.95
    assert sum(base) / len(base) < 0.5


def _contract(clauses: list[dict]) -> Contract:
    return contract_from_list(clauses, n_layers=1, n_heads=3, tasks=["copy"])


def test_clause_forecasts() -> None:
    heads = [HeadForecast(Head(0, 0), "previous_token", 0.9, 100),
             HeadForecast(Head(0, 1), "none", 0.8, None),
             HeadForecast(Head(0, 2), "first_token", 0.7, None)]
    c = _contract([
        {"head": "L0.H0", "score": "previous_token", "at_least": 0.9},
        {"head": "L0.H1", "score": "previous_token", "at_least": 0.9},
        {"head": "L0.H2", "score": "first_token", "at_most": 0.2},
        {"any_of": "L0.H1,L0.H2", "score": "first_token", "at_least": 0.5},
        {"all_of": "L0.*", "score": "previous_token", "at_least": 0.5},
        {"head": "L0.H2", "score": "entropy", "at_least": 0.5},
        {"ablate": "L0.H0", "task": "copy", "metric": "accuracy", "drop_at_least": 0.3},
    ])
    got = forecast_clauses(c, heads)
    assert [g.verdict for g in got] == ["pass", "fail", "fail", "pass", "fail", "not forecast",
                                        "not forecast"]
    assert [str(h.head) for h in got[4].heads] == ["L0.H1", "L0.H2"]
    assert "contract[1]" in got[1].message() and "L0.H1 forecast none" in got[1].message()


def test_forecast_every_needs_evaluation_points(tmp_path: pytest.TempPathFactory,
                                                capsys: pytest.CaptureFixture[str]) -> None:
    from headwise.cli import main

    spec = tmp_path / "s.yaml"  # type: ignore[operator]
    spec.write_text("model: {n_layers: 1, n_heads: 2, d_model: 16, vocab_size: 12, "
                    "max_seq_len: 10}\ndata: {tasks: {copy: {length: 3}}}\n"
                    "train: {steps: 2, batch_size: 4}\n")
    out = str(tmp_path / "run")  # type: ignore[operator]
    assert main(["train", str(spec), "--out", out, "--forecast-every", "5", "--quiet"]) == 2
    assert "train.eval_every" in capsys.readouterr().err
    assert main(["train", str(spec), "--out", out, "--forecast-every", "-1", "--quiet"]) == 2
    assert "--forecast-every" in capsys.readouterr().err
    from headwise.errors import SpecError
    from headwise.pipeline.run import train_run

    with pytest.raises(SpecError, match=r"^--forecast-every: got -3, expected an integer >= 1"):
        train_run(spec, tmp_path / "lib", forecast_every=-3)  # type: ignore[operator]
