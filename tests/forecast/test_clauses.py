"""Clause-verdict forecasts: margins, the early features, the fitted forecaster on
synthetic runs whose outcome is known by construction, calibration against closed forms,
off-range honesty and plain-JSON persistence."""

from __future__ import annotations

import json
import math
import pickle
from pathlib import Path

import pytest
import torch

from headwise.forecast.clauses import (
    CALIBRATION_PRIOR,
    FEATURES,
    OUTSIDE_SHRINK,
    SQUASH,
    ClauseForecaster,
    ClauseForecasters,
    ClauseTrajectory,
    features,
    load_clause_forecasters,
)
from headwise.forecast.fitting import interpolate, isotonic

TOTAL = 400
STEPS = tuple(range(20, TOTAL + 1, 20))


def run(start: float, end: float, noise: float, gen: torch.Generator, bound: float = 0.5,
        enforced: bool = False, n_layers: int = 2) -> ClauseTrajectory:
    """A score clause ``>= bound`` whose value moves linearly from ``start`` to ``end`` with
    Gaussian noise; its outcome is whether the noiseless end meets the bound."""
    values = [start + (end - start) * s / TOTAL for s in STEPS]
    noisy = [min(max(v + noise * float(torch.randn(1, generator=gen)), 0.0), 1.0)
             for v in values]
    return ClauseTrajectory(STEPS, tuple(noisy), (noise or 0.01,) * len(STEPS), bound, None,
                            TOTAL, enforced, 0.0, 1.0, final=end, holds=end >= bound,
                            context={"n_layers": n_layers, "n_heads": 4, "tasks": ["copy"],
                                     "kind": "score"})


NOISE = 0.005


def family(n: int, seed: int, **kw: object) -> list[ClauseTrajectory]:
    gen = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(n):
        start, end = (float(x) for x in torch.rand(2, generator=gen))
        out.append(run(start, end, NOISE, gen, **kw))  # type: ignore[arg-type]
    return out


def test_margin_is_the_signed_distance_to_the_nearer_bound() -> None:
    t = ClauseTrajectory((1,), (0.5,), (None,), 0.2, 0.6, 10, False, 0.0, 1.0)
    assert t.margin(0.5) == pytest.approx(0.1)  # 0.6 - 0.5 < 0.5 - 0.2
    assert t.margin(0.1) == pytest.approx(-0.1)
    loss = ClauseTrajectory((1,), (2.0,), (None,), None, 2.5, 10, False, 0.0, math.inf)
    assert loss.scale == 2.5 and loss.margin(2.0) == pytest.approx(0.5 / 2.5)


def test_the_features_extrapolate_a_line_exactly() -> None:
    # value = 0.1 + 0.5 * step / 400: at 20% (steps <= 80) the line through the latest half of
    # the early points reaches 0.6 at the end, 0.05 short of the bound 0.65
    values = tuple(0.1 + 0.5 * s / TOTAL for s in STEPS)
    t = ClauseTrajectory(STEPS, values, (0.01,) * len(STEPS), 0.65, None, TOTAL, False, 0.0, 1.0)
    f = dict(zip(FEATURES, features(t, 0.2), strict=True))  # margins squashed by tanh
    assert f["slope"] == pytest.approx(math.tanh(0.5))
    assert f["margin_line"] == pytest.approx(math.tanh(SQUASH * (0.6 - 0.65)))
    assert f["margin_now"] == pytest.approx(math.tanh(SQUASH * (0.1 + 0.5 * 80 / TOTAL - 0.65)))
    assert f["held_share"] == 0.0 and f["enforced"] == 0.0
    assert (f["kind=task"], f["kind=score"], f["kind=ablation"], f["floor"]) == (0, 0, 0, 1)


def test_the_clause_kind_tells_apart_runs_whose_early_points_are_the_same() -> None:
    # the same flat, failing early values: task floors whose task is learnt later (they
    # hold at the end) and score floors that never move (they fail); only the kind differs
    gen = torch.Generator().manual_seed(5)
    runs = []
    for i in range(120):
        kind = "task" if i % 2 else "score"
        start = 0.1 + 0.2 * float(torch.rand(1, generator=gen))
        values = tuple(start if s <= 0.3 * TOTAL else (0.95 if kind == "task" else start)
                       for s in STEPS)
        runs.append(ClauseTrajectory(STEPS, values, (0.01,) * len(STEPS), 0.9, None, TOTAL,
                                     False, 0.0, 1.0, final=values[-1],
                                     holds=kind == "task",
                                     context={"n_layers": 2, "n_heads": 4, "tasks": ["copy"],
                                              "kind": kind}))
    model = ClauseForecaster.fit(runs, 0.2)
    for t in runs[:20]:
        p = model.forecast(t).probability
        assert (p > 0.9) if t.context["kind"] == "task" else (p < 0.1)


def test_forecaster_learns_a_known_outcome_on_fresh_runs() -> None:
    model = ClauseForecaster.fit(family(300, 0), 0.2)
    fresh = family(200, 1)
    right = [(model.forecast(t).probability >= 0.5) == t.holds for t in fresh]
    # the outcome is a function of the line, which the four early points pin down up to the
    # noise: the least-squares line's end has standard error NOISE * sqrt(1/n + (1 - mean x)^2
    # / sum (x - mean x)^2); a run ending three of those from the bound must be right
    x = torch.tensor([s / TOTAL for s in STEPS if s <= 0.2 * TOTAL])
    se = NOISE * float((1 / len(x) + (1 - x.mean()) ** 2 / ((x - x.mean()) ** 2).sum()).sqrt())
    near = [abs((t.final or 0) - 0.5) < 3 * se for t in fresh]
    assert sum(near) < len(fresh) // 4
    assert all(r for r, n in zip(right, near, strict=True) if not n)
    rising = run(0.2, 0.9, 0.0, torch.Generator())
    falling = run(0.8, 0.1, 0.0, torch.Generator())
    assert model.forecast(rising).probability > 0.9
    assert model.forecast(falling).probability < 0.1
    f = model.forecast(rising)
    assert f.interval[0] <= f.value <= f.interval[1] and f.outside == ()


def test_value_interval_covers_fresh_runs_about_as_stated() -> None:
    model = ClauseForecaster.fit(family(300, 0), 0.4)
    fresh = family(300, 2)
    covered = [model.forecast(t).interval[0] <= (t.final or 0) <= model.forecast(t).interval[1]
               for t in fresh]
    assert 0.8 <= sum(covered) / len(covered) <= 1.0  # split-conformal at 0.9


def test_off_range_runs_lower_confidence_and_say_why() -> None:
    model = ClauseForecaster.fit(family(200, 0), 0.2)
    inside = run(0.2, 0.9, 0.0, torch.Generator())
    bigger = run(0.2, 0.9, 0.0, torch.Generator(), n_layers=6)
    enforced = run(0.2, 0.9, 0.0, torch.Generator(), enforced=True)
    masked = ClauseTrajectory(inside.steps, inside.values, inside.stderrs, inside.at_least,
                              None, TOTAL, False, 0.0, 1.0,
                              context={**inside.context, "levers": ["gate", "mask"]})
    p_in = model.forecast(inside).probability
    for other, word in ((bigger, "n_layers 6"), (enforced, "plain runs only"),
                        (masked, "head levers not in the fitted runs: gate, mask")):
        f = model.forecast(other)
        assert any(word in why for why in f.outside)
        assert abs(f.probability - 0.5) < abs(p_in - 0.5)
    assert model.forecast(bigger).probability == pytest.approx(0.5 + (p_in - 0.5)
                                                               * OUTSIDE_SHRINK)


def test_isotonic_map_is_pool_adjacent_violators_by_hand() -> None:
    scores = torch.tensor([4.0, 1.0, 3.0, 2.0, 5.0], dtype=torch.float64)
    held = torch.tensor([1.0, 1.0, 1.0, 0.0, 0.0], dtype=torch.float64)
    # in score order the outcomes are 1, 0, 1, 1, 0: the first two pool (mean score 1.5,
    # 1 of 2), then the last three (mean score 4, 2 of 3); smoothed by one pseudo-outcome
    # half held: (1 + 0.5) / 3 and (2 + 0.5) / 4
    xs, ps = isotonic(scores, held, 1.0)
    assert xs == pytest.approx([1.5, 4.0]) and ps == pytest.approx([0.5, 0.625])
    assert interpolate(xs, ps, 0.0) == pytest.approx(0.5)
    assert interpolate(xs, ps, 2.75) == pytest.approx(0.5625)
    assert interpolate(xs, ps, 9.0) == pytest.approx(0.625)
    # smoothing can break the order (1 of 1 becomes 0.75, 9 of 10 becomes 0.86): pooled again
    xs, ps = isotonic(torch.arange(11.0, dtype=torch.float64),
                      torch.tensor([0.0] + [1.0] * 10, dtype=torch.float64), 1.0)
    assert ps == sorted(ps) and ps[0] == pytest.approx(0.5 / 2)


def test_stated_probabilities_follow_a_known_non_logistic_truth() -> None:
    # a flat score clause at level v (bound 0.5) holds with probability 0.05 below 0.25,
    # 0.5 up to 0.75 and 0.95 above: monotone in v but no logistic curve of the features;
    # the isotonic map on cross-fitted logits recovers the steps, the logit alone does not
    def truth(v: float) -> float:
        return 0.05 if v < 0.25 else 0.5 if v < 0.75 else 0.95

    def sample(n: int, seed: int) -> list[ClauseTrajectory]:
        gen = torch.Generator().manual_seed(seed)
        out = []
        for _ in range(n):
            v, u = (float(x) for x in torch.rand(2, generator=gen))
            out.append(ClauseTrajectory(STEPS, (v,) * len(STEPS), (0.01,) * len(STEPS), 0.5,
                                        None, TOTAL, False, 0.0, 1.0, final=v,
                                        holds=u < truth(v), context={"kind": "score"}))
        return out

    model = ClauseForecaster.fit(sample(2000, 0), 0.2)
    fresh = sample(400, 1)
    stated = [model.forecast(t).probability for t in fresh]
    raw = [float(torch.sigmoid(((torch.tensor(features(t, 0.2), dtype=torch.float64)
                                 - model.mean) / model.std) @ model.weight + model.bias))
           for t in fresh]
    true = [truth(t.values[0] or 0.0) for t in fresh]
    error = sum(abs(p - q) for p, q in zip(stated, true, strict=True)) / len(fresh)
    raw_error = sum(abs(p - q) for p, q in zip(raw, true, strict=True)) / len(fresh)
    # each step's share comes from >= 500 runs (standard error <= 0.023); linear
    # interpolation between knots blurs the two edges
    assert error < 0.05 < raw_error, (error, raw_error)
    assert CALIBRATION_PRIOR > 0 and 0 < min(stated) and max(stated) < 1


def test_forecasters_round_trip_through_plain_json_without_pickle(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    models = ClauseForecasters(tuple(ClauseForecaster.fit(family(100, 0), f)
                                     for f in (0.1, 0.2, 0.4)), {"accuracy": 0.9})
    path = tmp_path / "f.json"
    path.write_text(models.to_json())

    def refuse(*args: object, **kwargs: object) -> None:
        raise AssertionError("unpickled")

    monkeypatch.setattr(pickle, "loads", refuse)
    monkeypatch.setattr(torch, "load", refuse)
    back = load_clause_forecasters(path)
    t = run(0.3, 0.7, 0.0, torch.Generator())
    for seen, fraction in ((0.05, 0.1), (0.1, 0.1), (0.3, 0.2), (0.9, 0.4)):
        assert back.at(seen).fraction == fraction
        assert back.at(seen).forecast(t) == models.at(seen).forecast(t)
    assert back.measured == {"accuracy": 0.9}


@pytest.mark.parametrize(("edit", "field"), [
    (lambda d: d.update(format="x"), "format"),
    (lambda d: d.update(models=[]), "models"),
    (lambda d: d["models"][0].update(weight=[1.0]), "models\\[0\\].weight"),
    (lambda d: d["models"][0].update(std=[0.0] * len(FEATURES)), "models\\[0\\].std"),
    (lambda d: d["models"][0].update(residual="wide"), "models\\[0\\].residual"),
    (lambda d: d["models"][0].pop("calibration"), "models\\[0\\].calibration"),
    (lambda d: d["models"][0].update(calibration={"logit": [0.0, 1.0],
                                                  "probability": [0.9, 0.1]}),
     "models\\[0\\].calibration"),
    (lambda d: d["models"][0].pop("ranges"), "models\\[0\\].ranges"),
    (lambda d: d["models"][0]["ranges"].pop("tasks"), "models\\[0\\].ranges.tasks"),
    (lambda d: d["models"][0]["ranges"]["features"].update(slope=[0.0]),
     "models\\[0\\].ranges.features"),
])
def test_malformed_forecaster_files_name_the_field(edit: object, field: str) -> None:
    d = json.loads(ClauseForecasters((ClauseForecaster.fit(family(60, 0), 0.2),)).to_json())
    edit(d)  # type: ignore[operator]
    with pytest.raises(ValueError, match=f"f.json: {field}"):
        ClauseForecasters.from_json(json.dumps(d), "f.json")


def test_fit_refuses_one_kind_of_outcome() -> None:
    always = [t for t in family(50, 0) if t.holds]
    with pytest.raises(ValueError, match="both kinds"):
        ClauseForecaster.fit(always, 0.2)
    with pytest.raises(ValueError, match="groups: expected at least two"):
        ClauseForecaster.fit(family(50, 0), 0.2, groups=[0] * 50)


def test_the_packaged_forecasters_quote_runs_they_were_not_fit_on() -> None:
    bundle = load_clause_forecasters()
    m = bundle.measured
    assert m["fresh_seeds"] and not set(m["fit_seeds"]) & set(m["fresh_seeds"])
    assert m["configs_seeds"] and not set(m["fit_configs_seeds"]) & set(m["configs_seeds"])
    for block in ("fresh", "configs"):
        for model in bundle.models:
            quoted = m[block][str(model.fraction)]
            assert quoted["n"] > 0 and 0 <= quoted["ece"] <= 1 and 0 <= quoted["accuracy"] <= 1
        assert all(len(model.calibration[0]) >= 2 for model in bundle.models)
    for model in bundle.models:  # the pooled figures are the two sets' clauses together
        key = str(model.fraction)
        fresh, configs, pooled = m["fresh"][key], m["configs"][key], m["pooled"][key]
        assert pooled["n"] == fresh["n"] + configs["n"]
        mixed = (fresh["accuracy"] * fresh["n"] + configs["accuracy"] * configs["n"]) / pooled["n"]
        assert abs(pooled["accuracy"] - mixed) < 1e-3


@pytest.mark.parametrize(("at_least", "at_most", "low", "high", "kind"), [
    (0.95, None, 0.0, 1.0, "score"), (None, 0.3, 0.0, 1.0, "score"),
    (0.9, None, 0.0, 1.0, "task"), (0.3, None, -1.0, 1.0, "ablation"),
    (None, 2.3, 0.0, math.inf, "task"), (0.1, 0.02, -1.0, 1.0, "exclusive")])
def test_the_packaged_forecasts_value_agrees_with_their_probability(
        at_least: float | None, at_most: float | None, low: float, high: float,
        kind: str) -> None:
    """At every fraction, for early values across the range, flat, rising and falling: the
    probability is the calibrated classifier's, the printed value holds exactly when the
    probability is at least one half (an exclusive clause's value, the listed tasks' smallest
    drop, against its floor only: its cap is on the other tasks' drops), it lies in its
    interval, and an interval is flagged as the whole range exactly when it is."""
    bundle = load_clause_forecasters()
    top = 4.0 if math.isinf(high) else high
    for model in bundle.models:
        for start in torch.linspace(low, top, 6).tolist():
            for end in torch.linspace(low, top, 6).tolist():
                steps = tuple(int(TOTAL * model.fraction * k / 4) for k in (1, 2, 3, 4))
                values = tuple(start + (end - start) * k / 4 for k in (1, 2, 3, 4))
                t = ClauseTrajectory(steps, values, (0.01,) * 4, at_least, at_most, TOTAL,
                                     False, low, high,
                                     context={"n_layers": 2, "n_heads": 4, "kind": kind})
                f = model.forecast(t)
                z = (torch.tensor(features(t, model.fraction), dtype=torch.float64)
                     - model.mean) / model.std
                p = interpolate(*model.calibration, float(z @ model.weight + model.bias))
                if f.outside:
                    p = 0.5 + (p - 0.5) * OUTSIDE_SHRINK
                assert f.probability == pytest.approx(p, abs=1e-12)
                holds = (f.value >= at_least if kind == "exclusive"  # type: ignore[operator]
                         else t.margin(f.value) >= 0)
                assert holds == f.holds, (model.fraction, values, f)
                assert f.interval[0] <= f.value <= f.interval[1]
                assert f.spans_range == (f.interval == (low, high))
                assert ("[" in f.value_text()) != f.spans_range
