"""``headwise train`` with ``train.parallel: fsdp`` under torchrun (2 CPU ranks): with a pattern
objective, a frozen head, a contract and ``--enforce`` it equals one process at the same global
batch, and its run directory verifies, reports (trajectories from the sharded checkpoints) and
exports (a Llama-shaped model) without torchrun."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from headwise.cli import main
from headwise.pipeline.compile import compile_spec
from headwise.runspec import load_spec

SPEC = """
model: {n_layers: 2, n_heads: 3, d_head: 6, d_model: 18, d_ff: 24, vocab_size: 12,
        max_seq_len: 10, dropout: 0.0, bias: none, norm_type: rmsnorm, activation: swiglu,
        positional: rope}
data: {tasks: {copy: {length: 4}}, eval_examples: 32}
train: {steps: 8, batch_size: 8, lr: 0.03, eval_every: 4, checkpoint_every: 4,
        parallel: PARALLEL}
heads:
  L0.H1: {objective: {target: previous_token, weight: 0.5}}
  L1.H0: {freeze: true}
contract:
  - {head: L0.H1, score: previous_token, at_least: 0.3}
"""
DRIVER = "import sys\nfrom headwise.cli import main\nsys.exit(main(sys.argv[1:]))\n"


@pytest.mark.slow
def test_fsdp_train_equals_one_process_then_verifies_and_exports_without_torchrun(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    for key in ("WORLD_SIZE", "RANK", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(key, None)
    driver = tmp_path / "headwise_main.py"
    driver.write_text(DRIVER)
    for mode in ("none", "fsdp"):
        (tmp_path / f"{mode}.yaml").write_text(SPEC.replace("PARALLEL", mode))
    # Sharded training keeps no evaluation point's model: enforcement stops at the first hold.
    args = ["--quiet", "--threads", "1", "--enforce", "--set", "enforce.stop=first_hold"]
    one = subprocess.Popen([sys.executable, str(driver), "train", str(tmp_path / "none.yaml"),
                            "--out", str(tmp_path / "one"), *args], env=env,
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    two = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone",
                          "--nproc-per-node=2", str(driver), "train", str(tmp_path / "fsdp.yaml"),
                          "--out", str(tmp_path / "two"), *args], env=env, capture_output=True,
                         text=True, timeout=300)
    out, err = one.communicate(timeout=300)
    assert one.returncode == 0, err.decode()[-3000:]
    assert two.returncode == 0, two.stderr[-3000:]
    assert two.stdout.count("contract HOLDS") == 1  # rank 0 alone prints
    a = load_file(tmp_path / "one" / "model.safetensors")
    b = load_file(tmp_path / "two" / "model.safetensors")
    assert a.keys() == b.keys()
    for key in a:
        torch.testing.assert_close(b[key], a[key], rtol=0, atol=1e-5, msg=key)
    # the frozen head's rows are still the initial ones
    init = compile_spec(load_spec(tmp_path / "fsdp.yaml")).model.state_dict()
    for key in ("q_proj", "k_proj", "v_proj"):
        name = f"blocks.1.attn.{key}.weight"
        assert torch.equal(b[name][0:6], init[name][0:6]), name
        assert not torch.equal(b[name][6:18], init[name][6:18]), name
    # enforcement saw the same violations and set the same multipliers as one process: the
    # clause failed at step 4 (multiplier > 0) and held at step 8
    h1 = json.loads((tmp_path / "one" / "enforcement.json").read_text())["history"]
    h2 = json.loads((tmp_path / "two" / "enforcement.json").read_text())["history"]
    assert [h["passed"] for h in h2] == [h["passed"] for h in h1] == [False, True]
    for x, y in zip(h1, h2, strict=True):
        assert abs(x["clauses"]["0"]["multiplier"] - y["clauses"]["0"]["multiplier"]) < 1e-5
        assert abs(x["clauses"]["0"]["measured"] - y["clauses"]["0"]["measured"]) < 1e-5
    assert h2[0]["clauses"]["0"]["multiplier"] > 0.01

    run = tmp_path / "two"
    capsys.readouterr()
    assert main(["verify", str(tmp_path / "fsdp.yaml"), "--run", str(run)]) == 0
    assert main(["report", str(run)]) == 0
    report = json.loads((run / "report.json").read_text())
    assert report["trajectories"]  # read from the sharded checkpoints
    assert main(["export", str(run), "--hf", str(tmp_path / "hf")]) == 0
    assert json.loads((tmp_path / "hf" / "config.json").read_text())["model_type"] == "llama"


@pytest.mark.slow
def test_a_failing_sharded_run_keeps_its_verdict_and_a_refusal_is_one_line(
        tmp_path: Path) -> None:
    """Under torchrun with ``parallel: fsdp`` a contract that fails is printed once, the run's
    report written, and every rank exits 1 itself (none is stopped by torchrun while rank 0
    writes); a spec refused on every rank is one line, from rank 0."""
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    for key in ("WORLD_SIZE", "RANK", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(key, None)
    driver = tmp_path / "headwise_main.py"
    driver.write_text(DRIVER)
    failing = SPEC.replace("PARALLEL", "fsdp").replace("steps: 8", "steps: 4").replace(
        "at_least: 0.3", "at_least: 0.9999")
    (tmp_path / "fail.yaml").write_text(failing)
    (tmp_path / "bad.yaml").write_text(failing.replace("lr: 0.03", "lr: -1"))
    torchrun = [sys.executable, "-m", "torch.distributed.run", "--standalone",
                "--nproc-per-node=2", str(driver), "train"]
    run = tmp_path / "run"
    done = subprocess.run([*torchrun, str(tmp_path / "fail.yaml"), "--out", str(run),
                           "--quiet", "--threads", "1"], env=env, capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 1, done.stderr[-3000:]
    assert done.stdout.count("contract FAILS") == 1, done.stdout[-3000:]
    assert (run / "report.html").is_file() and (run / "report.json").is_file()
    assert json.loads((run / "contract.json").read_text())["passed"] is False
    codes = [line.split(":", 1)[1].split()[0] for line in done.stderr.splitlines()
             if line.strip().startswith("exitcode")]
    assert codes == ["1", "1"], done.stderr[-3000:]  # both ranks exited 1 on their own
    refused = subprocess.run([*torchrun, str(tmp_path / "bad.yaml"), "--out",
                              str(tmp_path / "bad"), "--quiet"], env=env, capture_output=True,
                             text=True, timeout=300)
    said = [line for line in (refused.stdout + refused.stderr).splitlines()
            if "headwise train:" in line]
    assert len(said) == 1 and "train.lr" in said[0], refused.stderr[-3000:]
    codes = [line.split(":", 1)[1].split()[0] for line in refused.stderr.splitlines()
             if line.strip().startswith("exitcode")]
    assert set(codes) <= {"2"} and codes, refused.stderr[-3000:]
