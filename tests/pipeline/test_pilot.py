"""``headwise plan --pilot N``: which clauses and floors move in N plain steps."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from headwise.cli import main
from headwise.contract import verify
from headwise.pipeline import compile_spec
from headwise.pipeline.heldout import enforcement_data
from headwise.pipeline.pilot import pilot
from headwise.runspec import load_spec

SPEC = """
model: {n_layers: 1, n_heads: 2, d_model: 32, vocab_size: 12, max_seq_len: 10}
data: {tasks: {copy: {length: 4}}, eval_examples: 64}
train: {steps: 40, batch_size: 16, lr: 3.0e-3, eval_every: 20, seed: 0}
contract:
  - {head: L0.H1, score: previous_token, at_least: 0.9}
  - {task: copy, at_least: 0.9}
"""


def test_the_pilot_reports_each_clause_before_and_after_plain_steps(
        capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    torch.set_num_threads(1)
    spec = load_spec(SPEC)
    untrained = verify(compile_spec(spec).model, spec.contract,
                       enforcement_data(compile_spec(spec)))
    rows = pilot(compile_spec(spec), spec.contract, 40)
    floor = rows[1]
    assert floor.floor and not rows[0].floor
    assert floor.before == untrained.results[1].measured
    assert floor.after is not None and floor.before is not None
    # The change towards the bound is the decrease of the violation 0.9 - accuracy.
    assert floor.towards == pytest.approx((0.9 - floor.before) - (0.9 - floor.after))
    assert floor.after > floor.before + 0.3  # copy learns in 40 steps
    path = tmp_path / "spec.yaml"
    path.write_text(SPEC)
    assert main(["plan", str(path), "--pilot", "5"]) == 0
    out = capsys.readouterr().out
    assert "pilot: the first 5 plain steps (enforcement set)" in out
    assert "task copy: accuracy" in out and "P(holds)" in out
    assert main(["plan", str(path), "--pilot", "0"]) == 2


def test_the_pilot_is_the_first_steps_of_the_spec_schedule_and_forecasts_its_end(
        tmp_path: Path) -> None:
    """A 20-step pilot of a 40-step spec ends where a real run is at step 20 (its warm-up and
    learning rate are the full schedule's, not a 20-step one's), and forecasts each clause."""
    from headwise.pipeline.options import RunOptions
    from headwise.pipeline.run import train_run

    torch.set_num_threads(1)
    spec = load_spec(SPEC)
    rows = pilot(compile_spec(spec), spec.contract, 20)
    path = tmp_path / "spec.yaml"
    path.write_text(SPEC)
    run = train_run(path, tmp_path / "run", RunOptions(progress=False, forecast_every=20,
                                                     warn=lambda line: None))
    at_20 = run.train.extra["clause_watch"]["history"][0]
    assert at_20["step"] == 20
    assert [r.after for r in rows] == [at_20["clauses"][str(r.index)]["measured"]
                                       for r in rows]
    for r in rows:
        assert r.forecast is not None
        assert 0.0 <= r.forecast.probability <= 1.0
        assert r.forecast.interval[0] <= r.forecast.value <= r.forecast.interval[1]


CONSISTENT = """
model: {n_layers: 1, n_heads: 2, d_model: 32, vocab_size: 12, max_seq_len: 10}
data: {tasks: {copy: {length: 4}}, eval_examples: 64}
heads:
  L0.H1: {mask: previous_token}
train: {steps: 1000, batch_size: 16, lr: 3.0e-3, eval_every: 25, seed: 0}
contract:
  - {head: L0.H1, score: previous_token, at_least: 0.95}
  - {head: L0.H0, score: previous_token, at_most: 0.3}
  - {task: copy, at_least: 0.95}
"""


def test_the_pilot_forecast_value_sits_on_the_side_of_the_bound_its_probability_says(
        capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch,
        tmp_path: Path) -> None:
    """A clause held at 1.000 by a mask against ``>= 0.95`` and one near 0.2 against
    ``<= 0.3``, from 5% of the budget (the forecaster of 10%, whose value regression alone
    puts the second at 1 and spans the whole range): each printed value is on the side of its
    bound that its printed probability says."""
    torch.set_num_threads(1)
    monkeypatch.setenv("COLUMNS", "250")
    path = tmp_path / "spec.yaml"
    path.write_text(CONSISTENT)
    assert main(["plan", str(path), "--pilot", "50"]) == 0
    pilot_out = capsys.readouterr().out.split("pilot: the first 50 plain steps")[1]
    rows = [[cell.strip() for cell in line.split("│")[1:-1]]
            for line in pilot_out.splitlines() if line.startswith("│")]
    assert [r[0] for r in rows] == ["0", "1", "2"]
    assert rows[0][3] == "1.000"  # the masked head, after the pilot
    bounds = {"0": (0.95, None), "1": (None, 0.3), "2": (0.95, None)}
    for row in rows:
        probability, shown = row[-1].split(", ", 1)
        value, interval = shown.split(" ", 1)
        at_least, at_most = bounds[row[0]]
        value_holds = ((at_least is None or float(value) >= at_least)
                       and (at_most is None or float(value) <= at_most))
        assert value_holds == (float(probability) >= 0.5), row
        # an interval is printed only where it is narrower than the value's range [0, 1]
        assert interval == "(its 90% interval is the whole range)" or (
            interval.startswith("[") and interval != "[0, 1]"), row
