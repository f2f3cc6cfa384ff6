"""A 2-process CPU torchrun (DDP, gloo) run equals a 1-process run at the same global batch."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import torch
from safetensors.torch import load_file

SCRIPT = Path(__file__).with_name("run_tiny.py")
# no dropout (per-rank masks differ by design) and no biases: a key bias has an exactly zero
# gradient, so Adam would amplify rounding noise in it, which differs with the summation order.
ARGS = ["--steps", "12", "--batch", "8", "--dropout", "0", "--bias", "none"]


def _env() -> dict[str, str]:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    for key in ("WORLD_SIZE", "RANK", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(key, None)
    return env


def test_two_process_ddp_equals_one_process(tmp_path: Path) -> None:
    one, two = tmp_path / "one", tmp_path / "two"
    single = subprocess.Popen([sys.executable, str(SCRIPT), str(one), *ARGS], env=_env(),
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    ddp = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone",
                          "--nproc_per_node=2", str(SCRIPT), str(two), *ARGS],
                         env=_env(), capture_output=True, timeout=300)
    out, err = single.communicate(timeout=300)
    assert single.returncode == 0, err.decode()[-3000:]
    assert ddp.returncode == 0, ddp.stderr.decode()[-3000:]

    a, b = load_file(one / "model.safetensors"), load_file(two / "model.safetensors")
    assert a.keys() == b.keys()
    for key in a:
        torch.testing.assert_close(b[key], a[key], rtol=1e-4, atol=2e-5, msg=key)
    init = load_file(one / "checkpoints" / "step_0000005" / "model.safetensors")
    moved = max(float((a[k] - init[k]).abs().max()) for k in a)
    assert moved > 1e-3  # training really changed the weights after step 5

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
