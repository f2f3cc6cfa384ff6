"""Resume continues the same run: the printed command, recorded flags, refusals, lost run.json.

The reference is an uninterrupted run with the same command line: an interrupted run resumed
with exactly the command the interrupt line prints must end bitwise equal to it (weights,
metrics apart from timings, enforcement history and multipliers, verdicts). Interrupts are
delivered in-process as a real SIGINT at a chosen step, so the cases are deterministic.
"""

from __future__ import annotations

import json
import os
import shlex
import signal
from pathlib import Path
from typing import Any

import pytest
import yaml
from cli_runs import cli, digest, write_spec

from headwise.training import list_checkpoints, loop

SPEC: dict[str, Any] = {
    "model": {"n_layers": 1, "n_heads": 2, "d_model": 8, "d_ff": 12, "vocab_size": 12,
              "max_seq_len": 8},
    "data": {"tasks": {"copy": {"length": 3}}, "eval_examples": 32},
    "train": {"steps": 30, "batch_size": 4, "checkpoint_every": 4, "eval_every": 3,
              "eval_batches": 1, "log_every": 2},
    # not reached in these few steps: enforcement acts at every evaluation point to the end
    "contract": [{"name": "L0.H1 previous", "head": "L0.H1", "score": "previous_token",
                  "at_least": 0.95}],
}
FLAGS = ["--enforce", "--steps", "12", "--enforce-budget", "1.25", "--quiet"]


def _interrupt_at(monkeypatch: pytest.MonkeyPatch, at: int) -> None:
    """Send this process SIGINT during step ``at`` (0-based) of the next training loop."""
    step = loop._step

    def signalling(run: Any, model: Any, i: int, *args: Any) -> float:
        if i == at:
            os.kill(os.getpid(), signal.SIGINT)
        return step(run, model, i, *args)

    monkeypatch.setattr(loop, "_step", signalling)


def _state(run: Path) -> dict[str, Any]:
    """Everything a run's training decides: weights, metrics lines (less timings), verdicts."""
    lines = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    for line in lines:
        line.pop("elapsed_s", None)
    return {"weights": digest(run / "model.safetensors"), "metrics": lines,
            "enforcement": json.loads((run / "enforcement.json").read_text()),
            "contract": json.loads((run / "contract.json").read_text())}


def _resume_argv(err: str) -> list[str]:
    line = err.strip()
    assert "\n" not in line and "resume with: headwise train " in line, err
    return shlex.split(line.split("resume with: ")[1])[1:]  # less the program name


def test_interrupted_enforced_run_resumed_as_printed_is_bitwise_equal(
        tmp_path: Path, capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    spec = write_spec(SPEC, tmp_path)
    assert cli(capsys, "train", str(spec), "--out", str(tmp_path / "a"), *FLAGS)[0] == 1
    reference = _state(tmp_path / "a")
    assert reference["enforcement"]["steps"] == 15  # 12 x 1.25: the budget is in force
    assert reference["enforcement"]["enforced"] and reference["enforcement"]["evaluations"] == 5
    with monkeypatch.context() as m:
        _interrupt_at(m, 6)  # mid-way between evaluation points and checkpoints
        code, _, err = cli(capsys, "train", str(spec), "--out", str(tmp_path / "b"), *FLAGS)
    assert code == 130 and "interrupted at step 7;" in err
    assert [s for s, _ in list_checkpoints(tmp_path / "b")] == [4, 7]
    argv = _resume_argv(err)
    assert argv == ["train", str(spec), "--out", str(tmp_path / "b"), "--resume", *FLAGS[:1],
                    "--enforce-budget", "1.25", "--steps", "12", "--quiet"]
    code, out, _ = cli(capsys, *argv)
    assert code == 1 and "resuming from step 7" in out
    assert _state(tmp_path / "b") == reference
    # --resume alone reuses the run's flags: the same run again
    with monkeypatch.context() as m:
        _interrupt_at(m, 9)
        assert cli(capsys, "train", str(spec), "--out", str(tmp_path / "c"), *FLAGS)[0] == 130
    assert cli(capsys, "train", str(spec), "--out", str(tmp_path / "c"), "--resume",
                "--quiet")[0] == 1
    assert _state(tmp_path / "c") == reference
    assert json.loads((tmp_path / "c" / "run.json").read_text())["step"] == 15


def test_lost_run_json_is_recovered_from_the_checkpoint(
        tmp_path: Path, capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    spec = write_spec(SPEC, tmp_path)
    assert cli(capsys, "train", str(spec), "--out", str(tmp_path / "a"), *FLAGS)[0] == 1
    with monkeypatch.context() as m:
        _interrupt_at(m, 1)  # before the first evaluation point: no enforcement state yet
        assert cli(capsys, "train", str(spec), "--out", str(tmp_path / "b"), *FLAGS)[0] == 130
    (tmp_path / "b" / "run.json").unlink()
    code, out, err = cli(capsys, "train", str(spec), "--out", str(tmp_path / "b"),
                          "--resume", "--quiet")
    assert code == 1 and "resuming from step 2" in out, err
    assert _state(tmp_path / "b") == _state(tmp_path / "a")
    # a checkpoint that does not record the flags: refused, never guessed
    with monkeypatch.context() as m:
        _interrupt_at(m, 1)
        assert cli(capsys, "train", str(spec), "--out", str(tmp_path / "c"), *FLAGS)[0] == 130
    (tmp_path / "c" / "run.json").unlink()
    meta = list_checkpoints(tmp_path / "c")[-1][1] / "trainer.json"
    data = json.loads(meta.read_text())
    del data["extra"]["run"]
    meta.write_text(json.dumps(data))
    code, _, err = cli(capsys, "train", str(spec), "--out", str(tmp_path / "c"), "--resume",
                        "--quiet")
    assert code == 2 and len(err.strip().splitlines()) == 1
    assert "run.json: missing" in err and "does not record the run's flags" in err


@pytest.mark.parametrize(("argv", "named"), [
    (["--enforce-budget", "1.1"], "--enforce-budget: the run"),
    (["--allow-unenforced"], "--allow-unenforced: the run"),
    (["--steps", "10"], "--steps: got 10, but the run"),
    (["--seed", "4"], "--seed: the run"),
    (["--set", "train.lr=0.01"], "--set train.lr: the run"),
])
def test_a_differing_flag_on_resume_is_refused_naming_it(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch,
        argv: list[str], named: str) -> None:
    spec, run = write_spec(SPEC, tmp_path), tmp_path / "run"
    with monkeypatch.context() as m:
        _interrupt_at(m, 4)
        assert cli(capsys, "train", str(spec), "--out", str(run), *FLAGS)[0] == 130
    before = sorted(p.name for p in run.iterdir()), run.joinpath("run.json").read_bytes()
    code, _, err = cli(capsys, "train", str(spec), "--out", str(run), "--resume", *argv)
    assert code == 2 and len(err.strip().splitlines()) == 1, err
    assert named in err and ("--resume reuses the run's" in err or "not shorten" in err), err
    assert (sorted(p.name for p in run.iterdir()), run.joinpath("run.json").read_bytes()) \
        == before


def test_resume_with_a_larger_steps_extends_the_run(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    spec, run = write_spec(SPEC, tmp_path), tmp_path / "run"
    assert cli(capsys, "train", str(spec), "--out", str(run), "--steps", "8", "--quiet")[0] \
        in (0, 1)
    code, out, _ = cli(capsys, "train", str(spec), "--out", str(run), "--resume", "--steps",
                        "14", "--quiet")
    assert "resuming from step 8" in out and "trained 14 steps" in out, out
    assert json.loads((run / "run.json").read_text())["steps"] == 14
    assert [s for s, _ in list_checkpoints(run)][-1] == 14
    # the extension is now the run's: --steps 14 again, or none, resumes it as it is
    assert "trained 14 steps" in cli(capsys, "train", str(spec), "--out", str(run),
                                      "--resume", "--quiet")[1]
    code, out, _ = cli(capsys, "report", str(run))
    assert code == 0 and "report of the weights of step 14:" in out


def test_seed_and_set_are_recorded_in_the_spec_and_checked_like_the_file(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    spec = write_spec(SPEC, tmp_path)
    argv = ["--seed", "3", "--set", "train.lr=2e-3", "--set", "data.tasks.copy.length=2",
            "--steps", "6", "--quiet"]
    assert cli(capsys, "train", str(spec), "--out", str(tmp_path / "a"), *argv)[0] in (0, 1)
    saved = yaml.safe_load((tmp_path / "a" / "spec.yaml").read_text())
    assert saved["train"]["seed"] == 3 and saved["train"]["lr"] == 2e-3
    assert saved["data"]["tasks"]["copy"] == {"length": 2}
    assert json.loads((tmp_path / "a" / "run.json").read_text())["set"] == [
        "train.lr=2e-3", "data.tasks.copy.length=2", "train.seed=3"]
    # the same spec written in a file trains the same weights
    edited = json.loads(json.dumps(SPEC))
    edited["train"].update(seed=3, lr=2e-3)
    edited["data"]["tasks"]["copy"]["length"] = 2
    (tmp_path / "edited.yaml").write_text(yaml.safe_dump(edited))
    assert cli(capsys, "train", str(tmp_path / "edited.yaml"), "--out", str(tmp_path / "b"),
                "--steps", "6", "--quiet")[0] in (0, 1)
    assert digest(tmp_path / "a" / "model.safetensors") == \
        digest(tmp_path / "b" / "model.safetensors")
    # a bad value is refused like the same value in the file: one line naming the field
    for bad, field in ((["--set", "train.lr=-1"], "train.lr"),
                       (["--set", "train.stepz=3"], "train.stepz"),
                       (["--set", "model.n_layers.x=1"], "--set model.n_layers.x"),
                       (["--set", "novalue"], "--set: got 'novalue'"),
                       (["--seed", "-2"], "--seed: got -2")):
        code, _, err = cli(capsys, "train", str(spec), "--out", str(tmp_path / "c"), *bad)
        assert code == 2 and f"headwise train: error: {field}" in err, (bad, err)
        assert len(err.strip().splitlines()) == 1 and not (tmp_path / "c").exists()
