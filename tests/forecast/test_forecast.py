"""The role forecaster: packaged data loaded without pickle, fitting, known outcomes, clauses."""

from __future__ import annotations

import json
import pickle
from importlib import resources
from pathlib import Path

import pytest
import torch

from headwise import Head
from headwise.analysis.role_table import TOP_ROLE_CANDIDATES, RoleTable
from headwise.analysis.trajectories import Trajectory
from headwise.contract import Contract, forecast_clauses, parse_contract
from headwise.forecast.roles import (
    CLASSES,
    NONE_FEATURES,
    ROLE_FEATURES,
    EarlyFeatures,
    Forecaster,
    HeadForecast,
    calibration,
    early_features,
    fit_forecaster,
    forecast_heads,
    linear_forecast,
    load_forecaster,
    measured_text,
)

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
    # and agrees with the quoted accuracy: the bins' right forecasts add up to it
    right = sum(b["accuracy"] * b["heads"] for b in bins)
    assert right == pytest.approx(m["held_out_seeds_accuracy"] * m["n_heads"], abs=0.5)
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
    assert "below the baseline on 1 of 3 benchmark configurations: levers (docs/" in text
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
    good["role_std"] = [0.0] * len(good["role_std"])
    path.write_text(json.dumps(good))
    with pytest.raises(ValueError, match="role_std: expected scales > 0"):
        load_forecaster(path)
    for measured in (5, [], {"held_out_runs_accuracy": 0.5},
                     {**load_forecaster().measured, "calibration_held_out_seeds": [{}]}):
        good = json.loads(load_forecaster().to_json())
        good["measured"] = measured  # what reports quote from it must be there
        path.write_text(json.dumps(good))
        with pytest.raises(ValueError, match=f"^{path}: measured: expected an object with"):
            load_forecaster(path)
    for not_a_file in (tmp_path, path.with_name("absent.json")):  # type: ignore[attr-defined]
        with pytest.raises(ValueError, match=f"^{not_a_file}: "):
            load_forecaster(not_a_file)
    path.write_text("[" * 100_000 + "]" * 100_000)
    with pytest.raises(ValueError, match=f"^{path}: not valid JSON"):
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


def _rule_run(gen: torch.Generator, stalls: bool = True) -> tuple[Trajectory, list[str]]:
    """A synthetic run of 8 heads whose final role is the role whose early score is *largest*,
    though another role's early slope is steeper (it later saturates): a linear extrapolation
    follows the slope, a fitted model can learn the rule from other runs. ``stalls=False``:
    the same early curves, but the steep role keeps climbing and ends on top."""
    curves, labels = [], []
    for _ in range(8):
        win, fast = torch.randperm(len(ROLES), generator=gen)[:2].tolist()
        hi = 0.3 + 0.3 * float(torch.rand((), generator=gen))
        cap = hi - 0.05 if stalls else 1.0
        curves.append({ROLES[win]: [hi + 0.4 * c / 20 for c in range(20)],
                       # climbs 0.06 per checkpoint over the first four, then stalls (or not)
                       ROLES[fast]: [min(hi - 0.25 + 0.06 * c, cap) for c in range(20)]})
        labels.append(ROLES[win] if stalls else ROLES[fast])
    return _traj(curves, STEPS), labels


def test_fit_learns_a_rule_the_baseline_cannot_see() -> None:
    gen = torch.Generator().manual_seed(0)
    fit_runs = [_rule_run(gen) for _ in range(10)]
    assert all(t.final_role(h) == lab for t, ls in fit_runs
               for h, lab in zip(t.heads, ls, strict=True))
    feats = EarlyFeatures.cat([early_features(t, 4) for t, _ in fit_runs])
    labels = [lab for _, ls in fit_runs for lab in ls]
    f = Forecaster.fit(feats, labels, version="test")
    test_runs = [_rule_run(gen) for _ in range(5)]
    hits = [p == lab for t, ls in test_runs
            for p, lab in zip([r for r, _ in f.predict(t, 4)], ls, strict=True)]
    base = [p == lab for t, ls in test_runs
            for p, lab in zip(linear_forecast(t, 4), ls, strict=True)]
    assert sum(hits) / len(hits) >= 0.95
    assert sum(base) / len(base) < 0.5


def test_fit_forecaster_is_measured_on_runs_it_was_not_fit_on(tmp_path: Path) -> None:
    gen = torch.Generator().manual_seed(1)
    runs = [_rule_run(gen)[0] for _ in range(5)]
    f = fit_forecaster(runs)
    m = f.measured
    assert (m["n_runs"], m["n_heads"], m["fraction"]) == (5, 40, 0.2)

    def fit_on(trajs: list[Trajectory]) -> Forecaster:  # every prefix of >= 2 checkpoints
        feats = [early_features(t, n) for t in trajs for n in range(2, len(STEPS) + 1)]
        labels = [t.final_role(h) for t in trajs for _ in range(2, len(STEPS) + 1)
                  for h in t.heads]
        return Forecaster.fit(EarlyFeatures.cat(feats), labels, version="2")

    # each run is forecast (from its first 4 of 20 checkpoints) by a fit on the other four
    held_out = [(c, p == t.final_role(h))
                for i, t in enumerate(runs)
                for (p, c), h in zip(fit_on(runs[:i] + runs[i + 1:]).predict(t, 4), t.heads,
                                     strict=True)]
    right = sum(r for _, r in held_out)
    base = sum(p == t.final_role(h) for t in runs
               for p, h in zip(linear_forecast(t, 4), t.heads, strict=True))
    assert m["held_out_runs_accuracy"] == round(right / 40, 4) >= 0.9
    assert m["baseline_accuracy"] == round(base / 40, 4) < 0.5
    assert m["calibration_held_out_runs"] == calibration(held_out)
    top = m["calibration_held_out_runs"][-1]
    # the forecaster itself is fit on every run, and survives a JSON round trip
    x = early_features(runs[0], 4)
    assert torch.allclose(f.probabilities(x), fit_on(runs).probabilities(x))
    path = tmp_path / "mine.json"
    path.write_text(f.to_json())
    back = load_forecaster(path)
    assert back.measured == m and torch.allclose(back.probabilities(x), f.probabilities(x))
    assert measured_text(m) == (f"fit on 5 of your runs; each forecast from its first 20% of "
                                f"checkpoints by a fit on the others: "
                                f"{m['held_out_runs_accuracy']:.1%} of 40 heads (linear "
                                f"baseline {m['baseline_accuracy']:.1%}); forecasts stated at "
                                f"90% or more were right {top['accuracy']:.1%} of the time "
                                f"({top['heads']} held-out heads)")
    with pytest.raises(ValueError, match="at least 2"):
        fit_forecaster(runs[:1])
    with pytest.raises(ValueError, match=r"runs\[2\]: the same trajectory as runs\[0\]"):
        fit_forecaster([runs[0], runs[1], runs[0]])
    with pytest.raises(ValueError, match=r"runs\[1\]: 2 checkpoint\(s\), so its first 20% is all"):
        fit_forecaster([runs[0], runs[1].upto(2)])
    with pytest.raises(ValueError, match="l2: got -1"):
        fit_forecaster(runs[:2], l2=-1.0)
    # the measurement never grades a run with a fit that saw it: two runs whose identical-looking
    # early curves end opposite ways are each forecast by the other's rule, so all are wrong
    # (a fit on both would get some right), while the extrapolation gets the second run right
    pair = [_rule_run(gen)[0], _rule_run(gen, stalls=False)[0]]
    pm = fit_forecaster(pair).measured
    assert (pm["held_out_runs_accuracy"], pm["baseline_accuracy"]) == (0.0, 0.5)


def _contract(clauses: list[dict]) -> Contract:
    return parse_contract(clauses, n_layers=1, n_heads=3, tasks=["copy"])


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
    from headwise.pipeline.options import RunOptions
    from headwise.pipeline.run import train_run

    with pytest.raises(SpecError, match=r"^--forecast-every: got -3, expected an integer >= 1"):
        train_run(spec, tmp_path / "lib", RunOptions(forecast_every=-3))  # type: ignore[operator]


def test_train_forecasts_with_the_forecaster_file_given(tmp_path: Path) -> None:
    from headwise.errors import SpecError
    from headwise.pipeline import RunOptions, train_run

    spec = tmp_path / "s.yaml"
    spec.write_text("model: {n_layers: 1, n_heads: 2, d_model: 16, vocab_size: 12, "
                    "max_seq_len: 10}\ndata: {tasks: {copy: {length: 3}}}\n"
                    "train: {steps: 4, batch_size: 4, eval_every: 1}\n"
                    "contract:\n  - {head: L0.H0, score: previous_token, at_least: 0.5}\n")
    # a forecaster that always says `none` (its none logit dwarfs every role's)
    d = json.loads(load_forecaster().to_json())
    d["none_bias"] = [100.0]
    mine = tmp_path / "always_none.json"
    mine.write_text(json.dumps(d))
    warnings: list[str] = []
    train_run(spec, tmp_path / "run", RunOptions(progress=False, forecast_every=2,
                                                 forecaster=mine, warn=warnings.append))
    # one line per clause and point, naming the role forecast's reason from the file given
    assert warnings and all(w.startswith("clause forecast at step") for w in warnings)
    assert all("the role forecast says it fails: L0.H0 forecast none" in w for w in warnings)
    with pytest.raises(SpecError, match=r"^--forecaster: only used with --forecast-every"):
        train_run(spec, tmp_path / "r2", RunOptions(forecaster=mine))
    with pytest.raises(SpecError, match=r"^--forecaster: .*missing\.json: file not found"):
        train_run(spec, tmp_path / "r3", RunOptions(forecast_every=2,
                                                  forecaster=tmp_path / "missing.json"))
    assert not (tmp_path / "r2").exists() and not (tmp_path / "r3").exists()
