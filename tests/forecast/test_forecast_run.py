"""End to end on one small run: honest trajectories, forecast warnings, `analyze --forecast`.

One 1-layer run (module fixture, ~10 s on a loaded core) trains with `forecast_every`; its
contract asks L0.H0 (masked to the previous token) and L0.H1 (which nothing asks to be one)
to be previous-token heads, so the second clause fails in the end.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from html import escape as html_escape
from pathlib import Path

import pytest

from headwise.cli import main
from headwise.pipeline.options import RunOptions
from headwise.pipeline.run import RunOutcome, train_run
from headwise.pipeline.run_report import write_run_report

pytestmark = pytest.mark.slow

SPEC = """\
name: forecast-warning
model: {n_layers: 1, n_heads: 2, d_model: 32, vocab_size: 12, max_seq_len: 10}
data:
  tasks:
    copy: {length: 4}
  eval_examples: 256
train: {steps: 200, batch_size: 32, lr: 3.0e-3, eval_every: 20, checkpoint_every: 20, seed: 0}
heads:
  L0.H0: {mask: previous_token}
contract:
  - {name: "masked previous-token head", head: L0.H0, score: previous_token, at_least: 0.9}
  - {name: "L0.H1 is a previous-token head", head: L0.H1, score: previous_token, at_least: 0.9}
  - {name: "copy still learnt", task: copy, metric: accuracy, at_least: 0.5}
"""


@dataclass
class Run:
    outcome: RunOutcome
    warnings: list[str]
    report: dict


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> Run:
    root = tmp_path_factory.mktemp("forecast")
    spec = root / "spec.yaml"
    spec.write_text(SPEC)
    warnings: list[str] = []
    outcome = train_run(spec, root / "run", RunOptions(progress=False, forecast_every=40,
                                                       warn=warnings.append))
    paths = write_run_report(outcome.run_dir, outcome.compiled, outcome.contract)
    return Run(outcome, warnings, json.loads(paths["json"].read_text()))


def test_warning_names_the_clause_that_later_fails(run: Run) -> None:
    assert run.outcome.contract is not None
    verdicts = [c.passed for c in run.outcome.contract.results]
    assert verdicts == [True, False, True]  # the clause really fails at the end
    assert run.warnings, "no forecast warning"
    first = run.warnings[0]
    assert all(w.startswith("clause forecast at step ") for w in run.warnings)  # one voice
    assert "contract[1]" in first and "L0.H1" in first
    assert not any("contract[0]" in w for w in run.warnings)
    # the clause-verdict forecast: its probability, its value, what --enforce would add and
    # what the packaged forecaster was measured to do on runs it was not fit on
    assert int(first.split("clause forecast at step ")[1].split(":")[0]) < 200
    p = float(first.split("P(holds at the end) ")[1].split(",")[0])
    assert p < 0.5
    assert "--enforce would add: pattern objective (previous_token, ce) on L0.H1" in first
    assert "right on" in first and "of suite runs it was not fit on" in first
    forecasts = run.outcome.train.extra["clause_watch"]["forecasts"]
    assert {f["clause"] for f in forecasts} == {"contract[0]", "contract[1]", "contract[2]"}
    assert all(0.0 <= f["interval"][0] <= f["value"] <= f["interval"][1] <= 1.0
               for f in forecasts)


def test_final_trajectory_roles_equal_the_role_table(run: Run) -> None:
    traj, roles = run.report["trajectories"], run.report["roles"]
    assert "induction" in traj["roles"]  # every role the table shows, induction included
    assert set(roles["roles"]) == set(traj["roles"])
    assert traj["steps"][-1] == 200
    assert traj["min_score"] == 0.25
    for h in traj["heads"]:
        label = f"L{h['layer']}.H{h['head']}"
        assert h["final_role"] == roles["top_roles"][label]
        rec = next(r for r in roles["records"] if (r["layer"], r["head"]) == (h["layer"],
                                                                               h["head"]))
        for role, series in h["scores"].items():
            assert series[-1] == pytest.approx(rec[role], abs=1e-9)


def test_report_quotes_the_benchmark_not_the_run(run: Run) -> None:
    traj = run.report["trajectories"]
    assert "forecast_accuracy" not in traj
    f = traj["forecast"]
    from headwise.forecast.roles import load_forecaster

    assert f["forecaster_version"] == "2" and f["measured"] == load_forecaster().measured
    assert [c["verdict"] for c in f["clauses"]][:2] == ["pass", "fail"]  # as verified at the end
    html = (run.outcome.run_dir / "report.html").read_text()
    assert "benchmark accuracy from the first 20% of checkpoints on held-out runs" in html
    from headwise.forecast.role_scores import load_role_score_forecaster, measured_text_scores

    # the score forecaster's view beside it, quoting its benchmark figures on fresh runs
    assert f["score_forecaster_measured"] == load_role_score_forecaster().measured
    assert "score forecasts from the first 20% of checkpoints" in html
    for h in f["heads"]:
        s = h["score_forecast"]
        assert s["role"] in ("none", *s["scores"]) and isinstance(s["decided"], bool)
        for v in s["scores"].values():
            assert 0.0 <= v["interval"][0] <= v["value"] <= v["interval"][1] <= 1.0
        assert s["text"].startswith("undecided: ") != s["decided"]
    assert html_escape(measured_text_scores(f["score_forecaster_measured"])) in html


def test_analyze_forecast_cli(run: Run, tmp_path: Path,
                              capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "a.json"
    assert main(["analyze", str(run.outcome.run_dir), "--forecast", "--json", str(out)]) == 0
    text = capsys.readouterr().out
    assert "forecast (forecaster v2)" in text and "held-out" in text
    assert "final score, 90% interval" in text and "score forecasts from the first 20%" in text
    task_line = next(line for line in text.splitlines() if line.startswith("contract[2]"))
    assert "not forecast (the forecaster predicts each head's top role" in task_line
    result = json.loads(out.read_text())
    assert [h["head"] for h in result["forecast"]["heads"]] == ["L0.H0", "L0.H1"]
    assert main(["analyze", "--hf", str(tmp_path), "--forecast"]) == 2


def test_fit_forecaster_cli_and_using_its_file(run: Run, tmp_path: Path,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    from headwise.forecast.roles import fit_forecaster, load_forecaster
    from headwise.pipeline.run_report import run_trajectory

    spec = tmp_path / "seed1.yaml"
    spec.write_text(SPEC.replace("seed: 0", "seed: 1"))
    other = train_run(spec, tmp_path / "seed1", RunOptions(progress=False))
    d, d1 = str(run.outcome.run_dir), str(other.run_dir)
    out = tmp_path / "mine.json"
    # the same run twice would grade a fit on its own training data
    assert main(["fit-forecaster", d, d, "--out", str(out)]) == 2
    assert "given twice; expected distinct runs" in capsys.readouterr().err
    assert main(["fit-forecaster", d, d1, "--out", str(out)]) == 0
    assert "fit on 2 of your runs" in capsys.readouterr().out
    trajs = [run_trajectory(r.run_dir, r.compiled) for r in (run.outcome, other)]
    assert all(t is not None for t in trajs)
    assert load_forecaster(out).measured == fit_forecaster(trajs).measured  # type: ignore[arg-type]
    # finished work is not overwritten; bad input is one line, exit 2
    assert main(["fit-forecaster", d, d1, "--out", str(out)]) == 2
    assert "exists; pass --overwrite" in capsys.readouterr().err
    assert main(["fit-forecaster", d, "--out", str(tmp_path / "one.json")]) == 2
    assert "expected at least 2" in capsys.readouterr().err
    # analyze --forecast --forecaster FILE forecasts with it and quotes its own measurement
    assert main(["analyze", d, "--forecast", "--forecaster", str(out)]) == 0
    assert "fit on 2 of your runs" in capsys.readouterr().out
    bad = tmp_path / "bad.json"
    bad.write_text('{"format": "something else"}')
    assert main(["analyze", d, "--forecast", "--forecaster", str(bad)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and f"error: --forecaster: {bad}: format: expected" in err[0]
    assert main(["analyze", d, "--forecaster", str(out)]) == 2
    assert "only used with --forecast" in capsys.readouterr().err
