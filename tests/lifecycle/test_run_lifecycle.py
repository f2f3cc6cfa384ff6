"""Run lifecycle through the CLI: resume semantics, interrupts, run-relative paths, full disks.

Every case runs ``headwise.cli.main`` in-process on a tiny spec (seconds); the interrupt test
runs the real console entry in a subprocess and sends it SIGINT / SIGTERM.
"""

from __future__ import annotations

import errno
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import yaml
from cli_runs import cli, digest, write_spec
from safetensors.torch import load_file

from headwise import atomic
from headwise.training import list_checkpoints

SPEC: dict[str, Any] = {
    "model": {"n_layers": 1, "n_heads": 2, "d_model": 8, "d_ff": 12, "vocab_size": 12,
              "max_seq_len": 8},
    "data": {"tasks": {"copy": {"length": 3}}},
    "train": {"steps": 6, "batch_size": 4, "checkpoint_every": 2, "eval_every": 3,
              "eval_batches": 1, "log_every": 1},
    "contract": [{"head": "L0.H0", "score": "previous_token", "at_most": 1.0}],
}


def test_resume_continues_or_refuses(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    spec, run = write_spec(SPEC, tmp_path), tmp_path / "run"
    # nothing to resume: an empty or missing directory is refused, not trained from scratch
    code, _, err = cli(capsys, "train", str(spec), "--out", str(run), "--resume", "--quiet")
    assert code == 2 and "no run to resume" in err and len(err.strip().splitlines()) == 1
    assert not (run / "model.safetensors").exists()
    code, _, err = cli(capsys, "train", str(spec), "--out", str(run), "--resume", "--overwrite")
    assert code == 2 and "conflicting options" in err
    assert cli(capsys, "train", str(spec), "--out", str(run), "--quiet")[0] == 0
    # a finished run resumes from its last checkpoint and ends with the same weights
    weights = digest(run / "model.safetensors")
    code, out, _ = cli(capsys, "train", str(spec), "--out", str(run), "--resume", "--quiet")
    assert code == 0 and "resuming from step 6" in out
    assert digest(run / "model.safetensors") == weights
    # a run without checkpoints is refused and left as it is
    (tmp_path / "x").mkdir()
    spec0, run0 = write_spec(SPEC, tmp_path / "x", checkpoint_every=0), tmp_path / "run0"
    assert cli(capsys, "train", str(spec0), "--out", str(run0), "--quiet")[0] == 0
    before = digest(run0 / "model.safetensors")
    code, _, err = cli(capsys, "train", str(spec0), "--out", str(run0), "--resume")
    assert code == 2 and "no checkpoint to resume from" in err
    assert digest(run0 / "model.safetensors") == before
    # the enforce flag must match the run's
    code, _, err = cli(capsys, "train", str(spec), "--out", str(run), "--resume", "--enforce")
    assert code == 2 and "--enforce: the run" in err and "without --enforce" in err


def test_steps_flag_and_rerun_after_setup_interrupt(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    spec, run = write_spec(SPEC, tmp_path), tmp_path / "run"
    run.mkdir()
    # what a run interrupted during set-up leaves: spec.yaml and run.json, no work
    (run / "spec.yaml").write_text(spec.read_text())
    (run / "run.json").write_text(json.dumps({"format": "headwise-run/1", "enforce": False,
                                              "spec_dir": None}))
    code, out, _ = cli(capsys, "train", str(spec), "--out", str(run), "--steps", "4",
                        "--quiet")
    assert code == 0 and "trained 4 steps" in out and "contract HOLDS: 1 clause, 0 failed" in out
    assert [s for s, _ in list_checkpoints(run)] == [2, 4]
    code, _, err = cli(capsys, "train", str(spec), "--out", str(run), "--quiet")
    assert code == 2 and "already holds a run" in err
    assert cli(capsys, "train", str(spec), "--out", str(run), "--steps", "0")[0] == 2


def test_text_corpus_relative_to_spec_works_after_training(
        tmp_path: Path, capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "specs").mkdir()
    (tmp_path / "specs" / "corpus.txt").write_text("the quick brown fox jumps over it. " * 40)
    spec = {"model": {"n_layers": 1, "n_heads": 2, "d_model": 8, "vocab_size": 256,
                      "max_seq_len": 8},
            "data": {"tasks": {"lm": {"task": "text", "path": "corpus.txt", "seq_len": 6}}},
            "train": {"steps": 2, "batch_size": 4, "eval_batches": 1, "eval_every": 2}}
    (tmp_path / "specs" / "lm.yaml").write_text(yaml.safe_dump(spec))
    monkeypatch.chdir(tmp_path)
    assert cli(capsys, "train", "specs/lm.yaml", "--out", "runs/lm", "--quiet")[0] == 0
    for argv in (["analyze", "runs/lm"], ["report", "runs/lm"],
                 ["explain", "runs/lm", "--head", "L0.H1", "--input", "lm"]):
        code, _, err = cli(capsys, *argv)
        assert code == 0 and "error" not in err, (argv, err)


def test_full_disk_is_one_line_and_keeps_earlier_files(
        tmp_path: Path, capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    spec, run = write_spec(SPEC, tmp_path), tmp_path / "run"
    assert cli(capsys, "train", str(spec), "--out", str(run), "--quiet")[0] == 0
    report, weights = (run / "report.html").read_bytes(), digest(run / "model.safetensors")

    def full(f: Any, data: bytes) -> None:
        f.write(data[: len(data) // 2])  # a partial write, then the disk is full
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(atomic, "_write_all", full)
    code, _, err = cli(capsys, "report", str(run))
    assert code == 2 and len(err.strip().splitlines()) == 1
    assert "report.json: cannot write (No space left on device)" in err
    assert (run / "report.html").read_bytes() == report  # the old report is intact
    code, _, err = cli(capsys, "train", str(spec), "--out", str(run), "--resume", "--quiet")
    assert code == 2 and "No space left on device" in err and len(err.strip().splitlines()) == 1
    assert digest(run / "model.safetensors") == weights
    assert not [p for p in run.rglob("*") if ".tmp" in p.name]  # no temporary files left
    monkeypatch.undo()
    assert cli(capsys, "verify", str(spec), "--run", str(run))[0] == 0


ENTRY = "import sys; from headwise.cli import main; sys.exit(main())"


def _cli_proc(*argv: str) -> subprocess.Popen[str]:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    return subprocess.Popen([sys.executable, "-c", ENTRY, *argv], env=env, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)


@pytest.mark.slow
@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
def test_interrupt_checkpoints_prints_one_line_and_resumes(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], signum: int) -> None:
    spec, run = write_spec(SPEC, tmp_path, steps=600, checkpoint_every=1000, eval_every=0,
                      log_every=7), tmp_path / "run"
    proc = _cli_proc("train", str(spec), "--out", str(run), "--steps", "500", "--quiet")
    deadline = time.monotonic() + 120
    while not (run / "metrics.jsonl").is_file() or (run / "metrics.jsonl").stat().st_size < 500:
        assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
        time.sleep(0.02)
    proc.send_signal(signum)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err
    line = err.strip()
    assert "\n" not in line and "Traceback" not in line
    step = int(line.split("interrupted at step ")[1].split(";")[0])
    printed = f"headwise train {spec} --out {run} --resume --steps 500 --quiet"
    assert line.endswith(f"resume with: {printed}")
    assert [s for s, _ in list_checkpoints(run)] == [step]
    code, out, err = cli(capsys, *printed.split()[1:])  # exactly as printed (in this process)
    assert code == 0, err
    assert f"resuming from step {step}" in out and "trained 500 steps" in out


def test_diverging_loss_is_one_line_exit_1_and_keeps_the_last_checkpoint(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    spec, run = write_spec(SPEC, tmp_path, steps=40, checkpoint_every=2, log_every=5, lr=1e6,
                      grad_clip=0, eval_every=0), tmp_path / "run"
    code, _, err = cli(capsys, "train", str(spec), "--out", str(run), "--quiet")
    assert code == 1 and len(err.strip().splitlines()) == 1, err
    assert "training diverged: loss is nan at step" in err and "likely cause" in err
    steps = [s for s, _ in list_checkpoints(run)]
    assert steps and f"the last checkpoint (step {steps[-1]}) is kept" in err
    diverged = int(err.split("at step ")[1].split(";")[0])
    assert steps[-1] < diverged  # no checkpoint of the diverged weights
    for _, path in list_checkpoints(run):
        weights = load_file(path / "model.safetensors")
        assert all(bool(v.isfinite().all()) for v in weights.values())


def test_version(capsys: pytest.CaptureFixture[str]) -> None:
    from headwise import __version__

    code, out, _ = cli(capsys, "--version")
    assert code == 0 and out.strip() == f"headwise {__version__}"
