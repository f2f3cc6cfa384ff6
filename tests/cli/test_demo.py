"""`headwise demo`: the bundled spec trains, its contract holds, and the run directory is full."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from headwise.cli import main
from headwise.cli.demo import demo_spec_path
from headwise.runspec import load_spec


@pytest.fixture(autouse=True)
def _one_thread() -> None:
    torch.set_num_threads(1)


def test_demo_spec_is_bundled_and_uses_every_kind_of_lever() -> None:
    spec = load_spec(demo_spec_path())
    assert len(spec.data.tasks) >= 2
    assert any(r.mask is not None for r in spec.heads)
    assert any(r.objective is not None for r in spec.heads)
    assert spec.gates is not None and any(r.tasks for r in spec.heads)
    assert spec.contract and spec.train.eval_every and spec.train.checkpoint_every


def _check_run(run: Path, steps: int) -> None:
    for name in ("spec.yaml", "config.json", "model.safetensors", "metrics.jsonl",
                 "contract.json", "report.json", "report.html"):
        assert (run / name).is_file(), name
    assert (run / "checkpoints").is_dir()
    verdict = json.loads((run / "contract.json").read_text())
    assert verdict["passed"], verdict
    report = json.loads((run / "report.json").read_text())
    assert report["contract"]["passed"]
    assert {"roles", "importance", "supervised", "walkthroughs", "trajectories"} <= set(report)
    # The report agrees with itself: the masked previous-token head shows similarity 1.0, and
    # the walkthrough's axes name the tokens ([<bos>, <copy>, s.., <sep>, s..]), not their ids.
    sup = {s["head"]: s for s in report["supervised"]}
    assert sup["L0.H0"]["similarity"] == pytest.approx(1.0)
    labels = report["walkthroughs"][0]["labels"]
    assert labels[0] == "<bos>" and "<sep>" in labels and labels[2].startswith("s")
    html = (run / "report.html").read_text()
    assert "<img" in html and "data:image/png;base64," in html and 'src="http' not in html
    lines = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    assert lines[-1]["step"] == steps


def test_demo_short_run_end_to_end(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    run = tmp_path / "demo"
    assert main(["demo", "--out", str(run), "--steps", "120", "--quiet"]) == 0
    _check_run(run, 120)
    out = capsys.readouterr().out
    assert "contract HOLDS" in out and str(run / "report.html") in out
    # The run directory serves the other subcommands.
    assert main(["verify", str(run / "spec.yaml"), "--run", str(run)]) == 0
    assert main(["analyze", str(run), "--json", str(tmp_path / "a.json")]) == 0
    records = json.loads((tmp_path / "a.json").read_text())["roles"]
    assert len(records) == 4 and records[0]["previous_token"] == pytest.approx(1.0)
    assert main(["explain", str(run), "--head", "L0.H2", "--input", "copy"]) == 0
    assert "checks (max |difference|" in capsys.readouterr().out
    (run / "report.html").unlink()
    assert main(["report", str(run)]) == 0 and (run / "report.html").is_file()


@pytest.mark.slow
def test_full_demo(tmp_path: Path) -> None:
    spec = load_spec(demo_spec_path())
    assert main(["demo", "--out", str(tmp_path / "demo"), "--quiet"]) == 0
    _check_run(tmp_path / "demo", spec.train.steps)


def test_demo_refuses_bad_steps(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["demo", "--steps", "0"]) == 2
    assert "--steps: got 0" in capsys.readouterr().err


def test_demo_never_replaces_another_specs_run(tmp_path: Path,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "spec.yaml").write_text("name: mine\nmodel: {}\n")
    (tmp_path / "model.safetensors").write_bytes(b"precious")
    assert main(["demo", "--out", str(tmp_path)]) == 2
    assert "holds a run of another spec" in capsys.readouterr().err
    assert (tmp_path / "model.safetensors").read_bytes() == b"precious"


@pytest.mark.slow
def test_bundled_examples_behave_as_the_tutorial_says(tmp_path: Path) -> None:
    """docs/tutorial.md: without gates the demo's contract fails; enforce.yaml fails plainly
    and holds with --enforce."""
    examples = demo_spec_path().parent
    assert main(["train", str(examples / "demo_no_gates.yaml"), "--out",
                 str(tmp_path / "no_gates"), "--quiet"]) == 1
    verdict = json.loads((tmp_path / "no_gates" / "contract.json").read_text())
    assert [c["passed"] for c in verdict["clauses"]] == [True, True, False, False]
    enforce = str(examples / "enforce.yaml")
    assert main(["train", enforce, "--out", str(tmp_path / "plain"), "--quiet"]) == 1
    assert main(["train", enforce, "--out", str(tmp_path / "on"), "--quiet", "--enforce"]) == 0
