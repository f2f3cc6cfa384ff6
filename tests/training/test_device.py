"""Device choice: names, resolution on this machine, errors naming the device, CLI exit 2.

CUDA availability is simulated with ``monkeypatch`` where a test is about the *logic* (so the
test means the same on a CPU-only and on a GPU machine); tests marked ``cuda`` run real CUDA
work and are skipped without a device.
"""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import torch

from headwise.cli import main
from headwise.config import ModelConfig
from headwise.data import CopyTask, Mixture
from headwise.errors import ConfigError
from headwise.model import build_model
from headwise.training import TrainConfig, make_optimizer, resolve_device, train
from headwise.training.checkpoint import load_checkpoint, save_checkpoint
from headwise.training.device import check_device_name, place

CFG = ModelConfig(n_layers=1, n_heads=2, d_model=16, d_ff=24, vocab_size=12, max_seq_len=12)


def _no_cuda(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)


def _fake_cuda(monkeypatch: pytest.MonkeyPatch, count: int) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: count)


@pytest.mark.parametrize("name", ["auto", "cpu", "cuda", "cuda:0", "cuda:12"])
def test_valid_names(name: str) -> None:
    assert check_device_name(name) == name
    assert TrainConfig(device=name).device == name


@pytest.mark.parametrize("name", ["gpu", "CUDA", "cuda:", "cuda:x", "cuda:-1", "mps", "", 0,
                                  None, "cpu:0"])
def test_invalid_names_name_the_field(name: object) -> None:
    with pytest.raises(ConfigError, match=r"^device: got .*, expected auto, cpu, cuda or cuda:N$"):
        TrainConfig(device=name)  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match=r"^train\.device: got "):
        TrainConfig.from_dict({"device": name})


def test_auto_picks_cuda_only_when_available(monkeypatch: pytest.MonkeyPatch) -> None:
    _no_cuda(monkeypatch)
    assert resolve_device("auto") == torch.device("cpu")
    assert resolve_device("cpu") == torch.device("cpu")
    _fake_cuda(monkeypatch, 2)
    assert resolve_device("auto") == torch.device("cuda")
    assert resolve_device("cuda:1") == torch.device("cuda", 1)


def test_unavailable_cuda_is_an_error_naming_the_device(monkeypatch: pytest.MonkeyPatch) -> None:
    _no_cuda(monkeypatch)
    with pytest.raises(ConfigError, match=r"^--device: got 'cuda:0', but CUDA is not available"):
        resolve_device("cuda:0", "--device")
    _fake_cuda(monkeypatch, 2)
    with pytest.raises(ConfigError, match=r"got 'cuda:2', but only 2 CUDA device\(s\) are "
                                          r"visible \(cuda:0-cuda:1\)"):
        resolve_device("cuda:2")


def test_place_moves_the_model_and_auto_keeps_a_cpu_model_on_cpu_without_cuda(
        monkeypatch: pytest.MonkeyPatch) -> None:
    _no_cuda(monkeypatch)
    model = build_model(CFG, seed=0)
    assert place(model, "auto") == torch.device("cpu")
    assert place(model, "cpu") == torch.device("cpu")
    assert next(model.parameters()).device.type == "cpu"


def test_train_refuses_an_unavailable_device_before_touching_anything(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    _no_cuda(monkeypatch)
    data = Mixture({"copy": CopyTask(length=4, vocab_size=12)})
    with pytest.raises(ConfigError, match=r"^train\.device: got 'cuda', but CUDA is not"):
        train(build_model(CFG, seed=0), data, TrainConfig(steps=2, batch_size=4, device="cuda"),
              out_dir=tmp_path / "run", progress=False)
    assert not (tmp_path / "run").exists()


SPEC = """
model: {n_layers: 1, n_heads: 2, d_model: 16, vocab_size: 12, max_seq_len: 12}
data:
  tasks:
    copy: {task: copy, length: 4}
train: {steps: 2, batch_size: 4, DEVICE}
"""


@pytest.mark.parametrize("argv_device, spec_device, expected", [
    (["--device", "gpu"], "", "--device: got 'gpu', expected auto, cpu, cuda or cuda:N"),
    (["--device", "cuda:1"], "", "--device: got 'cuda:1', but CUDA is not available"),
    ([], "device: cuda", "train.device: got 'cuda', but CUDA is not available"),
    ([], "device: tpu", "train.device: got 'tpu', expected auto, cpu, cuda or cuda:N"),
])
def test_cli_train_exits_2_with_one_line_naming_the_device(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str],
        argv_device: list[str], spec_device: str, expected: str) -> None:
    _no_cuda(monkeypatch)
    spec = tmp_path / "spec.yaml"
    spec.write_text(SPEC.replace(", DEVICE", f", {spec_device}" if spec_device else ""))
    code = main(["train", str(spec), "--out", str(tmp_path / "run"), "--quiet", *argv_device])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1, err
    assert expected in err[0], err


@pytest.mark.parametrize("command", ["demo", "verify", "analyze", "explain"])
def test_every_model_command_takes_device_and_refuses_a_bad_one(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], command: str,
        monkeypatch: pytest.MonkeyPatch) -> None:
    _no_cuda(monkeypatch)
    run = tmp_path / "run"
    argv = {"demo": ["demo", "--out", str(run)],
            "verify": ["verify", str(tmp_path / "spec.yaml"), "--run", str(run)],
            "analyze": ["analyze", str(run)],
            "explain": ["explain", str(run), "--head", "L0.H0", "--input", "1 2"]}[command]
    assert main([*argv, "--device", "cuda"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1, err
    assert "--device: got 'cuda', but CUDA is not available" in err[0], err


def test_fused_adamw_on_cpu_matches_the_reference_update() -> None:
    model = build_model(CFG, seed=0)
    reference = copy.deepcopy(model)
    config = TrainConfig(lr=1e-2, weight_decay=0.1)
    fused = make_optimizer(model, config)
    assert all(g["fused"] for g in fused.param_groups)
    decay = [p for p in reference.parameters() if p.dim() >= 2]
    no_decay = [p for p in reference.parameters() if p.dim() < 2]
    ref = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1},
                             {"params": no_decay, "weight_decay": 0.0}], lr=1e-2,
                            foreach=False)
    tokens = torch.randint(0, 12, (3, 7))
    for _ in range(3):
        for m, opt in ((model, fused), (reference, ref)):
            opt.zero_grad()
            m(tokens).pow(2).mean().backward()
            opt.step()
    for (name, a), b in zip(model.named_parameters(), reference.parameters(), strict=True):
        torch.testing.assert_close(a, b, atol=1e-6, rtol=1e-5, msg=name)


def test_checkpoint_resumes_with_this_runs_optimizer_implementation(tmp_path: Path) -> None:
    """A checkpoint written by a non-fused optimizer loads into a fused one (and keeps it)."""
    model = build_model(CFG, seed=0)
    plain = torch.optim.AdamW(model.parameters(), lr=1e-3, foreach=False)
    model(torch.randint(0, 12, (2, 5))).sum().backward()
    plain.step()
    path = save_checkpoint(tmp_path, 1, model, plain)
    fused = torch.optim.AdamW(model.parameters(), lr=1e-3, fused=True)
    load_checkpoint(path, model, fused)
    assert fused.param_groups[0]["fused"] is True
    state = fused.state[next(iter(model.parameters()))]
    torch.testing.assert_close(state["exp_avg"], plain.state[next(iter(model.parameters()))]
                               ["exp_avg"])


def _tiny_run(device: str, steps: int = 3, **kw: object) -> torch.nn.Module:
    model = build_model(CFG, seed=0)
    train(model, Mixture({"copy": CopyTask(length=4, vocab_size=12)}),
          TrainConfig(steps=steps, batch_size=8, device=device, **kw),  # type: ignore[arg-type]
          progress=False)
    return model


@pytest.mark.cuda
def test_cuda_training_matches_cpu_and_checkpoint_loads_on_cpu(tmp_path: Path) -> None:
    cpu = _tiny_run("cpu")
    gpu = _tiny_run("cuda")
    assert next(gpu.parameters()).device.type == "cuda"
    for (name, a), b in zip(cpu.named_parameters(), gpu.parameters(), strict=True):
        torch.testing.assert_close(a, b.cpu(), atol=1e-4, rtol=1e-3, msg=name)
    opt = make_optimizer(gpu, TrainConfig())
    path = save_checkpoint(tmp_path, 3, gpu, opt)
    back = build_model(CFG, seed=1)
    load_checkpoint(path, back, make_optimizer(back, TrainConfig()))
    for a, b in zip(back.parameters(), gpu.parameters(), strict=True):
        assert torch.equal(a, b.cpu())


@pytest.mark.cuda
def test_cuda_bf16_training_step_is_finite_and_close_to_float32() -> None:
    f32 = _tiny_run("cuda", steps=2)
    bf16 = _tiny_run("cuda", steps=2, bf16=True)
    for a, b in zip(f32.parameters(), bf16.parameters(), strict=True):
        assert torch.isfinite(b).all()
        torch.testing.assert_close(a, b, atol=2e-2, rtol=2e-2)


@pytest.mark.slow
def test_compiled_training_matches_eager() -> None:
    """``train.compile: true`` trains the same model (to float tolerance) as eager mode."""
    eager = _tiny_run("cpu", steps=3)
    compiled = _tiny_run("cpu", steps=3, compile=True)
    for (name, a), b in zip(eager.named_parameters(), compiled.parameters(), strict=True):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-4, msg=name)
