"""Exact resume: a run killed with SIGKILL (or interrupted with SIGINT/SIGTERM) at a random step
and resumed ends bitwise equal to an uninterrupted run (CPU), including dropout, objective
weights changed by callbacks, AdamW state, and (after an interrupt) ``metrics.jsonl``."""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from headwise.training import latest_checkpoint, list_checkpoints

SCRIPT = Path(__file__).with_name("run_train.py")
STEPS = 40
# dropout (its RNG must resume), biases, tied embeddings; evaluations every 10 steps (the
# callback raises the objective weight at each), checkpoints every 5
ARGS = ["--steps", str(STEPS), "--dropout", "0.1", "--bias", "all", "--tied", "--eval-every",
        "10", "--checkpoint-every", "5", "--warmup", "5"]


def _run(out: Path, *extra: str) -> subprocess.Popen[bytes]:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    env.pop("WORLD_SIZE", None)
    return subprocess.Popen([sys.executable, str(SCRIPT), str(out), *ARGS, *extra], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)


def _finish(proc: subprocess.Popen[bytes]) -> None:
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err.decode()[-3000:]


def _last_step(path: Path) -> int:
    if not path.is_file():
        return 0
    steps = [json.loads(line)["step"] for line in path.read_text().splitlines()
             if line.endswith("}")]
    return max(steps, default=0)


def test_sigkill_then_resume_is_bitwise_identical(tmp_path: Path) -> None:
    kill_at = random.Random().randint(7, STEPS - 6)  # after the step-5 checkpoint
    ref, run = tmp_path / "ref", tmp_path / "run"
    reference = _run(ref)
    victim = _run(run, "--sleep", "0.05")
    deadline = time.monotonic() + 120
    while _last_step(run / "metrics.jsonl") < kill_at:
        assert victim.poll() is None, "the run finished before it could be killed"
        assert time.monotonic() < deadline
        time.sleep(0.005)
    victim.send_signal(signal.SIGKILL)
    victim.wait()
    _finish(reference)
    killed_ckpt = latest_checkpoint(run)
    assert killed_ckpt is not None
    steps_before = [s for s, _ in list_checkpoints(run)]
    assert 5 <= steps_before[-1] < STEPS and not (run / "model.safetensors").exists()
    _finish(_run(run, "--resume"))

    a, b = load_file(ref / "model.safetensors"), load_file(run / "model.safetensors")
    assert a.keys() == b.keys()
    for key in a:
        assert torch.equal(a[key], b[key]), f"{key} differs after resume (killed at {kill_at})"
    # the optimizer state and objective weights of the final checkpoints agree too
    ta = load_file(ref / "checkpoints" / f"step_{STEPS:07d}" / "trainer.safetensors")
    tb = load_file(run / "checkpoints" / f"step_{STEPS:07d}" / "trainer.safetensors")
    for key in ta:
        assert torch.equal(ta[key], tb[key]), key
    ja = json.loads((ref / "checkpoints" / f"step_{STEPS:07d}" / "trainer.json").read_text())
    jb = json.loads((run / "checkpoints" / f"step_{STEPS:07d}" / "trainer.json").read_text())
    assert ja["objective_weights"] == jb["objective_weights"]
    assert ja["objective_weights"]["pattern"] == pytest.approx(0.1 * 1.5 ** 4)
    assert ja["extra"] == jb["extra"] == {"evals": 4}
    # metrics were truncated at the resumed checkpoint and rewritten once per step
    lines = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    train_steps = [r["step"] for r in lines if r["kind"] == "train"]
    assert train_steps == list(range(1, STEPS + 1))


def _metrics(path: Path) -> list[dict[str, object]]:
    """The metric lines without wall-clock times."""
    lines = [json.loads(x) for x in path.read_text().splitlines()]
    return [{k: v for k, v in r.items() if k != "elapsed_s"} for r in lines]


def test_sigint_then_resume_is_bitwise_identical_with_equal_metrics(tmp_path: Path) -> None:
    # log_every=3 does not divide checkpoint_every=5 nor the interrupt step: the logging
    # window in progress must survive the checkpoint for metrics.jsonl to come out equal
    stop_at = random.Random().randint(2, STEPS - 6)
    ref, run = tmp_path / "ref", tmp_path / "run"
    reference = _run(ref, "--log-every", "3")
    victim = _run(run, "--sleep", "0.05", "--log-every", "3")
    deadline = time.monotonic() + 120
    while not list_checkpoints(run) or _last_step(run / "metrics.jsonl") < stop_at:
        assert victim.poll() is None, "the run finished before it could be interrupted"
        assert time.monotonic() < deadline
        time.sleep(0.005)
    victim.send_signal(signal.SIGINT)  # SIGTERM: tests/lifecycle
    _, err = victim.communicate(timeout=60)
    assert victim.returncode == 130, err.decode()[-3000:]
    _finish(reference)
    step = list_checkpoints(run)[-1][0]
    assert stop_at <= step < STEPS
    _finish(_run(run, "--resume", "--log-every", "3"))
    a, b = load_file(ref / "model.safetensors"), load_file(run / "model.safetensors")
    for key in a:
        assert torch.equal(a[key], b[key]), f"{key} differs after an interrupt at step {step}"
    assert _metrics(run / "metrics.jsonl") == _metrics(ref / "metrics.jsonl")
