"""A 2-process CPU torchrun (DDP, gloo) run equals a 1-process run at the same global batch, and
an interrupted torchrun run leaves a checkpoint from which it resumes exactly."""

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

from headwise.training import list_checkpoints

SCRIPT = Path(__file__).with_name("run_train.py")
# no dropout (per-rank masks differ by design) and no biases: a key bias has an exactly zero
# gradient, so Adam would amplify rounding noise in it, which differs with the summation order.
ARGS = ["--steps", "12", "--batch", "8", "--dropout", "0", "--bias", "none", "--tied"]


def _env() -> dict[str, str]:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    for key in ("WORLD_SIZE", "RANK", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(key, None)
    return env


def _torchrun(out: Path, *extra: str) -> list[str]:
    return [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
            str(SCRIPT), str(out), *extra]


def test_two_process_ddp_equals_one_process(tmp_path: Path) -> None:
    one, two = tmp_path / "one", tmp_path / "two"
    single = subprocess.Popen([sys.executable, str(SCRIPT), str(one), *ARGS], env=_env(),
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    ddp = subprocess.run(_torchrun(two, *ARGS), env=_env(), capture_output=True, timeout=300)
    out, err = single.communicate(timeout=300)
    assert single.returncode == 0, err.decode()[-3000:]
    assert ddp.returncode == 0, ddp.stderr.decode()[-3000:]

    a, b = load_file(one / "model.safetensors"), load_file(two / "model.safetensors")
    assert a.keys() == b.keys()
    for key in a:
        torch.testing.assert_close(b[key], a[key], rtol=1e-4, atol=2e-5, msg=key)
    init = load_file(one / "checkpoints" / "step_0000004" / "model.safetensors")
    moved = max(float((a[k] - init[k]).abs().max()) for k in a)
    assert moved > 1e-3  # training really changed the weights after step 4

    # both ranks took part: the checkpoint holds one dropout RNG state per rank
    rng = load_file(two / "checkpoints" / "step_0000012" / "trainer.safetensors")
    assert {k for k in rng if k.startswith("rng.torch.")} == {"rng.torch.0", "rng.torch.1"}

    # rank 0 alone wrote the metrics; they are summed over both ranks' shards
    rec_a = [json.loads(x) for x in (one / "metrics.jsonl").read_text().splitlines()]
    rec_b = [json.loads(x) for x in (two / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rec_a] == [r["step"] for r in rec_b]
    for ra, rb in zip(rec_a, rec_b, strict=True):
        for name, stats in ra["tasks"].items():
            assert rb["tasks"][name]["examples"] == stats["examples"]
            assert abs(rb["tasks"][name]["loss"] - stats["loss"]) < 1e-4


@pytest.mark.slow
def test_sigterm_to_torchrun_checkpoints_all_ranks_at_one_step_and_resumes_exactly(
        tmp_path: Path) -> None:
    """SIGTERM to ``torchrun`` (which forwards it to both workers): the ranks agree on one step,
    save a checkpoint there together (one RNG state per rank) and exit 130; resumed under
    ``torchrun``, the run ends with the weights of an uninterrupted 2-process run, bitwise."""
    steps = 20
    args = ["--steps", str(steps), "--batch", "8", "--dropout", "0.1", "--bias", "none", "--tied"]
    stop_at = random.Random().randint(5, steps - 6)  # after the step-4 checkpoint
    ref, run = tmp_path / "ref", tmp_path / "run"
    reference = subprocess.Popen(_torchrun(ref, *args), env=_env(), stdout=subprocess.PIPE,
                                 stderr=subprocess.PIPE)
    victim = subprocess.Popen(_torchrun(run, *args, "--sleep", "0.1"), env=_env(),
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    deadline = time.monotonic() + 240
    metrics = run / "metrics.jsonl"
    while not metrics.is_file() or max((json.loads(x)["step"] for x in metrics.read_text(
            ).splitlines() if x.endswith("}")), default=0) < stop_at:
        assert victim.poll() is None, victim.communicate()[1].decode()[-3000:]
        assert time.monotonic() < deadline
        time.sleep(0.005)
    victim.send_signal(signal.SIGTERM)
    _, err = victim.communicate(timeout=120)
    assert victim.returncode != 0, err.decode()[-3000:]
    step, ckpt = list_checkpoints(run)[-1]
    assert stop_at <= step < steps and not (run / "model.safetensors").exists()
    trainer = load_file(ckpt / "trainer.safetensors")
    assert {k for k in trainer if k.startswith("rng.torch.")} == {"rng.torch.0", "rng.torch.1"}
    out, err = reference.communicate(timeout=240)
    assert reference.returncode == 0, err.decode()[-3000:]
    resumed = subprocess.run(_torchrun(run, *args, "--resume"), env=_env(),
                             capture_output=True, timeout=240)
    assert resumed.returncode == 0, resumed.stderr.decode()[-3000:]
    a, b = load_file(ref / "model.safetensors"), load_file(run / "model.safetensors")
    for key in a:
        assert torch.equal(a[key], b[key]), f"{key} differs after an interrupt at step {step}"
