"""Integrity: every command that reads a run or a checkpoint checks its manifest; weights files
with edited alias metadata or non-floating tensors are refused (exit 2 naming the file)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from cli_runs import write_spec

from headwise.cli import main
from headwise.config import ModelConfig
from headwise.errors import CheckpointError
from headwise.model import build_model
from headwise.training import list_checkpoints, load_weights
from headwise.training.safetensors_io import ALIASES_KEY, model_tensors, save_tensors, save_weights

from .test_run_lifecycle import SPEC

CFG = ModelConfig(n_layers=1, n_heads=2, d_model=8, d_ff=12, vocab_size=12, max_seq_len=8,
                  tie_embeddings=True)


@pytest.fixture(scope="module")
def trained(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    root = tmp_path_factory.mktemp("integrity")
    spec = write_spec(SPEC, root)
    assert main(["train", str(spec), "--out", str(root / "run"), "--quiet"]) == 0
    return spec, root / "run"


def _copy(trained: tuple[Path, Path], tmp_path: Path) -> tuple[Path, Path]:
    spec, run = trained
    shutil.copytree(run, tmp_path / "run")
    return spec, tmp_path / "run"


def _flip(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[-3] ^= 0x01  # one bit of the last tensor's data: safetensors itself cannot notice
    path.write_bytes(bytes(data))


@pytest.mark.parametrize("name", ["model.safetensors", "config.json", "spec.yaml", "run.json"])
def test_every_reader_refuses_a_changed_run_file(
        trained: tuple[Path, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str],
        name: str) -> None:
    spec, run = _copy(trained, tmp_path)
    if name.endswith(".safetensors"):
        _flip(run / name)
    else:
        (run / name).write_text((run / name).read_text() + "\n")
    for argv in (["verify", str(spec), "--run", str(run)], ["analyze", str(run)],
                 ["report", str(run)], ["explain", str(run), "--head", "L0.H0", "--input",
                                        "copy"]):
        assert main(argv) == 2, argv
        err = capsys.readouterr().err.strip()
        assert "\n" not in err and f"{run / name}: contents do not match the sha256" in err


def test_edited_trainer_json_is_refused_on_resume_and_report(
        trained: tuple[Path, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    spec, run = _copy(trained, tmp_path)
    step, ckpt = list_checkpoints(run)[0]
    meta = json.loads((ckpt / "trainer.json").read_text())
    meta["step"] = step + 1  # resuming from the wrong place must not pass silently
    (ckpt / "trainer.json").write_text(json.dumps(meta))
    assert main(["report", str(run)]) == 2
    assert f"{ckpt / 'trainer.json'}: contents do not match" in capsys.readouterr().err
    for _, later in list_checkpoints(run)[1:]:  # the edited checkpoint becomes the latest
        shutil.rmtree(later)
    assert main(["train", str(spec), "--out", str(run), "--resume", "--quiet"]) == 2
    assert f"{ckpt / 'trainer.json'}: contents do not match" in capsys.readouterr().err


def test_alias_metadata_must_match_the_models_ties(tmp_path: Path) -> None:
    model = build_model(CFG, seed=0)
    assert model_tensors(model)[1] == {"unembed.weight": "embed.weight"}
    save_weights(model, tmp_path / "ok.safetensors")
    load_weights(build_model(CFG, seed=1), tmp_path / "ok.safetensors")
    tensors = {k: v for k, v in model.state_dict().items() if k != "unembed.weight"}
    swapped = {"unembed.weight": "embed.weight",
               "blocks.0.attn.q_proj.weight": "blocks.0.attn.k_proj.weight"}
    save_tensors({k: v for k, v in tensors.items() if k != "blocks.0.attn.q_proj.weight"},
                 tmp_path / "swap.safetensors", {ALIASES_KEY: json.dumps(swapped)})
    with pytest.raises(CheckpointError, match=r"swap\.safetensors: metadata 'headwise\.aliases'"
                                              r" maps 'blocks\.0\.attn\.q_proj\.weight'"):
        load_weights(build_model(CFG, seed=1), tmp_path / "swap.safetensors")
    save_tensors(tensors, tmp_path / "list.safetensors", {ALIASES_KEY: "[1]"})
    with pytest.raises(CheckpointError, match="is not a JSON object"):
        load_weights(build_model(CFG, seed=1), tmp_path / "list.safetensors")


@pytest.mark.parametrize("dtype", [torch.int64, torch.bool, torch.uint8])
def test_non_floating_weights_are_refused(tmp_path: Path, dtype: torch.dtype) -> None:
    model = build_model(CFG, seed=0)
    tensors, aliases = model_tensors(model)
    tensors = dict(tensors)
    tensors["blocks.0.attn.v_proj.weight"] = tensors["blocks.0.attn.v_proj.weight"].to(dtype)
    save_tensors(tensors, tmp_path / "w.safetensors", {ALIASES_KEY: json.dumps(aliases)})
    with pytest.raises(CheckpointError, match=rf"'blocks\.0\.attn\.v_proj\.weight' has dtype "
                                              rf"{dtype}, expected a floating-point tensor"):
        load_weights(build_model(CFG, seed=1), tmp_path / "w.safetensors")
