"""``train.parallel: fsdp``: 2 CPU ranks (gloo) sharding every block with FSDP2 equal one process at
the same global batch (and DDP where per-rank randomness is by design), keep frozen heads
bitwise frozen, resume bitwise after SIGTERM, and leave an ordinary run that verifies, reports
and exports without torchrun."""

from __future__ import annotations

import json
import os
import random
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from headwise.config import ModelConfig
from headwise.errors import CheckpointError, ConfigError
from headwise.model import build_model
from headwise.training import TrainConfig, list_checkpoints, load_checkpoint
from headwise.training.distributed import DistContext, resolve_parallel
from headwise.training.sharded_checkpoint import load_sharded_checkpoint, load_sharded_weights

SCRIPT = Path(__file__).with_name("run_train.py")
LEVERS = "freeze,lora,masks"


def _env() -> dict[str, str]:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    for key in ("WORLD_SIZE", "RANK", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(key, None)
    return env


def _torchrun(*args: str) -> list[str]:
    return [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2",
            *args]


def _check(proc: subprocess.CompletedProcess[bytes]) -> None:
    assert proc.returncode == 0, proc.stderr.decode()[-3000:]


def _max_diff(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    assert a.keys() == b.keys()
    return max(float((a[k] - b[k]).abs().max()) for k in a)


def test_fsdp_equals_one_process_and_keeps_frozen_heads_bitwise(tmp_path: Path) -> None:
    """Pattern objective, per-head freezing, head-scoped LoRA and a mask: the sharded run's
    final weights equal one process's within 1e-5; the frozen heads' slices equal the initial
    weights bitwise; checkpoints hold one shard per rank with half the rows of each matrix."""
    one, two = tmp_path / "one", tmp_path / "two"
    single = subprocess.Popen([sys.executable, str(SCRIPT), str(one), "--levers", LEVERS],
                              env=_env(), stderr=subprocess.PIPE)
    _check(subprocess.run(_torchrun(str(SCRIPT), str(two), "--parallel", "fsdp", "--levers",
                                    LEVERS), env=_env(), capture_output=True, timeout=300))
    assert single.wait(timeout=300) == 0, single.stderr.read().decode()[-3000:]  # type: ignore
    a, b = load_file(one / "model.safetensors"), load_file(two / "model.safetensors")
    assert _max_diff(a, b) < 1e-5
    init = build_model(ModelConfig(n_layers=2, n_heads=3, d_head=5, d_model=15, d_ff=24,
                                   vocab_size=20, max_seq_len=12, dropout=0.0,
                                   bias="none"), seed=0).state_dict()
    assert _max_diff({k: a[k] for k in init if k in a}, {k: init[k] for k in init if k in a}
                     ) > 1e-3  # the trainable part moved
    # Trainable: L0.H1, L1.H2 (per-head slices) and the MLPs; L1.H2 also has LoRA on L1.H0.
    frozen_rows = {"blocks.0.attn.q_proj.weight": [0, 2], "blocks.0.attn.k_proj.weight": [0, 2],
                   "blocks.0.attn.v_proj.weight": [0, 2]}
    for key, heads in frozen_rows.items():
        for h in heads:
            rows = slice(5 * h, 5 * (h + 1))
            assert torch.equal(b[key][rows], init[key][rows]), key
            assert not torch.equal(b[key][5:10], init[key][5:10]), key  # L0.H1 trained
        assert torch.equal(b["blocks.0.attn.o_proj.weight"][:, 0:5],
                           init["blocks.0.attn.o_proj.weight"][:, 0:5])
    for key in ("embed.weight", "pos_embed.weight", "blocks.1.ln1.weight"):
        assert torch.equal(b[key], init[key]), key
    assert not torch.equal(b["blocks.1.attn.q_proj.lora_B"], torch.zeros(5, 2))  # LoRA trained
    # the model is whole after training: its forward without a process group agrees too
    la, lb = load_file(one / "logits.safetensors"), load_file(two / "logits.safetensors")
    torch.testing.assert_close(lb["logits"], la["logits"], rtol=0, atol=1e-5)
    step, ckpt = list_checkpoints(two)[-1]
    shards = sorted((ckpt / "shards").glob("*.safetensors"))
    assert step == 12 and len(shards) == 2
    halves = [load_file(s)["model.blocks.0.mlp.up_proj.weight"] for s in shards]
    assert [tuple(h.shape) for h in halves] == [(12, 15), (12, 15)]
    torch.testing.assert_close(torch.cat(halves), b["blocks.0.mlp.up_proj.weight"], rtol=0,
                               atol=0)


@pytest.mark.slow
def test_fsdp_learned_gates_bf16_tied_equal_ddp(tmp_path: Path) -> None:
    """Learned task gates (replicated, sampled from each rank's RNG like dropout) with every
    other lever, bfloat16 autocast and tied embeddings: the sharded run equals a DDP run with
    the same per-rank randomness and the same per-rank bf16 rounding."""
    args = ["--levers", LEVERS + ",gates", "--bf16", "--tied"]
    ddp = subprocess.Popen(_torchrun(str(SCRIPT), str(tmp_path / "ddp"), "--parallel", "ddp",
                                     *args), env=_env(), stderr=subprocess.PIPE)
    _check(subprocess.run(_torchrun(str(SCRIPT), str(tmp_path / "fsdp"), "--parallel", "fsdp",
                                    *args), env=_env(), capture_output=True, timeout=300))
    assert ddp.wait(timeout=300) == 0, ddp.stderr.read().decode()[-3000:]  # type: ignore
    a = load_file(tmp_path / "ddp" / "model.safetensors")
    b = load_file(tmp_path / "fsdp" / "model.safetensors")
    assert "blocks.1.attn.head_gate.log_alpha" in b and "unembed.weight" not in b  # tied
    assert _max_diff(a, b) < 1e-5


@pytest.mark.slow
def test_sigterm_and_resume_under_torchrun_is_bitwise(tmp_path: Path) -> None:
    """SIGTERM to torchrun stops both ranks at one step and checkpoints their shards there;
    ``--resume`` on 2 ranks ends with the uninterrupted sharded run's weights, bitwise. The
    checkpoint reads back in one process, and a corrupt shard is refused, naming the file."""
    steps = 16
    # a "train" line every 3 steps: checkpoints (every 4) fall inside logging windows
    args = ["--parallel", "fsdp", "--levers", LEVERS, "--steps", str(steps), "--log-every", "3"]
    ref, run = tmp_path / "ref", tmp_path / "run"
    reference = subprocess.Popen(_torchrun(str(SCRIPT), str(ref), *args), env=_env(),
                                 stderr=subprocess.PIPE)
    victim = subprocess.Popen(_torchrun(str(SCRIPT), str(run), *args, "--sleep", "0.15"),
                              env=_env(), stderr=subprocess.PIPE)
    stop_at = random.Random().randint(5, steps - 4)  # after the step-4 checkpoint
    metrics, deadline = run / "metrics.jsonl", time.monotonic() + 240
    while not metrics.is_file() or max((json.loads(x)["step"] for x in metrics.read_text(
            ).splitlines() if x.endswith("}")), default=0) < stop_at:
        assert victim.poll() is None, victim.stderr.read().decode()[-3000:]  # type: ignore
        assert time.monotonic() < deadline
        time.sleep(0.005)
    victim.send_signal(signal.SIGTERM)
    assert victim.wait(timeout=120) != 0
    step, ckpt = list_checkpoints(run)[-1]
    assert stop_at <= step < steps and not (run / "model.safetensors").exists()
    assert len(list((ckpt / "shards").glob("*.safetensors"))) == 2
    assert reference.wait(timeout=240) == 0, reference.stderr.read().decode()[-3000:]  # type: ignore
    _check(subprocess.run(_torchrun(str(SCRIPT), str(run), *args, "--resume"), env=_env(),
                          capture_output=True, timeout=240))
    a, b = load_file(ref / "model.safetensors"), load_file(run / "model.safetensors")
    for key in a:
        assert torch.equal(a[key], b[key]), f"{key} differs after an interrupt at step {step}"
    # every rank's logging window was checkpointed: the metrics lines are the same too
    def lines(path: Path) -> list[dict]:
        return [{k: v for k, v in json.loads(x).items() if k != "elapsed_s"}
                for x in (path / "metrics.jsonl").read_text().splitlines()]

    assert lines(run) == lines(ref)
    # deterministically: resumed from step 4, inside the window of the line at step 6
    again = tmp_path / "again"
    shutil.copytree(ref, again)
    for later, path in list_checkpoints(again):
        if later > 4:
            shutil.rmtree(path)
    (again / "model.safetensors").unlink()
    _check(subprocess.run(_torchrun(str(SCRIPT), str(again), *args, "--resume"), env=_env(),
                          capture_output=True, timeout=240))
    assert lines(again) == lines(ref)

    # one process reads a sharded checkpoint's weights; the loop's loader refuses it by name
    model = build_model(ModelConfig(n_layers=2, n_heads=3, d_head=5, d_model=15, d_ff=24,
                                    vocab_size=20, max_seq_len=12, bias="none"), seed=1)
    from headwise.control import apply_lora

    apply_lora(model, targets=("q_proj", "v_proj"), heads="L1.H0", rank=2)
    final = list_checkpoints(ref)[-1][1]
    load_sharded_weights(model, final)
    for key, value in model.state_dict().items():
        if key in a:
            assert torch.equal(value, a[key]), key
    with pytest.raises(CheckpointError, match="train.parallel: fsdp on 2 ranks"):
        load_checkpoint(final, model)
    optimizer = torch.optim.AdamW(model.parameters())
    with pytest.raises(CheckpointError, match="written by 2 ranks, resumed on 1; exact resume "
                                              "needs the same number of ranks"):
        load_sharded_checkpoint(final, model, optimizer, DistContext(parallel="fsdp"))
    shard = sorted((final / "shards").glob("*.safetensors"))[1]
    data = bytearray(shard.read_bytes())
    data[-3] ^= 0xFF
    shard.write_bytes(bytes(data))
    with pytest.raises(CheckpointError, match=shard.name):
        load_sharded_weights(model, final)


def test_parallel_field_and_launch_checks(monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(ConfigError, match=r"parallel: got 'fdsp', expected one of \['none', "
                                          r"'ddp', 'fsdp'\] \(did you mean 'fsdp'\?\)"):
        TrainConfig(parallel="fdsp")
    with pytest.raises(ConfigError, match="compile: got True, expected false with parallel"):
        TrainConfig(parallel="fsdp", compile=True)
    assert TrainConfig.from_dict(TrainConfig(parallel="fsdp").to_dict()).parallel == "fsdp"
    for key in ("WORLD_SIZE", "RANK"):
        monkeypatch.delenv(key, raising=False)
    assert resolve_parallel(None) == "none"
    with pytest.raises(ConfigError, match="train.parallel: got 'fsdp' without torchrun"):
        resolve_parallel("fsdp")
    monkeypatch.setenv("WORLD_SIZE", "2")
    assert resolve_parallel(None) == "ddp"
    with pytest.raises(ConfigError, match="got 'none' in a run of 2 ranks"):
        resolve_parallel("none")


def test_one_rank_fsdp_resumes_bitwise_and_matches_none(tmp_path: Path,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """In this process, as ``torchrun --nproc-per-node 1`` would start it: an ``fsdp`` run on
    one rank equals a ``none`` run (up to the clipping norm's summation order), and a run
    resumed from its sharded step-4 checkpoint ends bitwise where the whole run does."""
    import socket

    from headwise.data import CopyTask, Mixture
    from headwise.training import train

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    for key, value in {"WORLD_SIZE": "1", "RANK": "0", "LOCAL_RANK": "0",
                       "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)}.items():
        monkeypatch.setenv(key, value)
    cfg = ModelConfig(n_layers=2, n_heads=3, d_head=5, d_model=15, d_ff=24, vocab_size=20,
                      max_seq_len=12, dropout=0.0, bias="none")
    data = Mixture({"copy": CopyTask(length=4, vocab_size=20)})

    def run(out: Path, parallel: str, resume: bool = False) -> dict[str, torch.Tensor]:
        config = TrainConfig(steps=8, batch_size=4, lr=1e-2, checkpoint_every=4,
                             parallel=parallel)
        model = build_model(cfg, seed=0)
        train(model, data, config, out_dir=out, resume=resume, progress=False,
              optimizer_hooks=[lambda opt: opt.register_step_post_hook(
                  lambda *_: updates.append(1))])
        return {k: v.clone() for k, v in model.state_dict().items()}

    updates: list[int] = []

    whole = run(tmp_path / "whole", "fsdp")
    plain = run(tmp_path / "plain", "none")
    assert _max_diff(whole, plain) < 1e-6
    assert _max_diff(whole, build_model(cfg, seed=0).state_dict()) > 1e-3
    # the same run, resumed from its step-4 checkpoint (later ones removed), ends bitwise equal
    shutil.copytree(tmp_path / "whole", tmp_path / "again")
    for step, path in list_checkpoints(tmp_path / "again"):
        if step > 4:
            shutil.rmtree(path)
    (tmp_path / "again" / "model.safetensors").unlink()
    updates.clear()
    again = run(tmp_path / "again", "fsdp", resume=True)
    assert len(updates) == 4  # it continued from step 4
    for key in whole:
        assert torch.equal(again[key], whole[key]), key


def test_an_unlisted_shard_is_refused_by_name_never_adopted(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A ``*.safetensors`` file added to a sharded checkpoint's ``shards/`` (here a rank's shard
    with its rows scaled, under the name a second rank's shard would have) is refused by name
    on resume and when the checkpoint is read in one process; the reader never lists it."""
    import socket

    from safetensors.torch import save_file

    from headwise.data import CopyTask, Mixture
    from headwise.training import train
    from headwise.training.sharded_checkpoint import _reader

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    for key, value in {"WORLD_SIZE": "1", "RANK": "0", "LOCAL_RANK": "0",
                       "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)}.items():
        monkeypatch.setenv(key, value)
    cfg = ModelConfig(n_layers=1, n_heads=2, d_model=8, d_ff=12, vocab_size=12, max_seq_len=8)
    data = Mixture({"copy": CopyTask(length=3, vocab_size=12)})
    config = TrainConfig(steps=4, batch_size=4, checkpoint_every=2, parallel="fsdp")
    out = tmp_path / "run"
    train(build_model(cfg, seed=0), data, config, out_dir=out, progress=False)
    (out / "model.safetensors").unlink()
    ckpt = list_checkpoints(out)[-1][1]
    (shard,) = (ckpt / "shards").glob("*.safetensors")
    forged = ckpt / "shards" / shard.name.replace("shard-00001", "shard-00002")
    save_file({k: v * 5 for k, v in load_file(shard).items()}, forged)
    with pytest.raises(CheckpointError, match=forged.name):
        train(build_model(cfg, seed=0), data, config, out_dir=out, resume=True, progress=False)
    with pytest.raises(CheckpointError, match=forged.name):
        load_sharded_weights(build_model(cfg, seed=0), ckpt)
    assert _reader(ckpt / "shards").fs.ls(ckpt / "shards") == [str(shard)]
