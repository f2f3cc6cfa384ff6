"""Checkpoints: round trip of weights (tied), optimizer and RNG; corruption names the file."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from headwise.config import ModelConfig
from headwise.errors import CheckpointError, ConfigError
from headwise.model import build_model
from headwise.training import (
    TrainConfig,
    latest_checkpoint,
    list_checkpoints,
    load_checkpoint,
    load_weights,
    make_optimizer,
    save_checkpoint,
    save_weights,
)
from headwise.training.checkpoint import CHECKPOINT_FILES
from headwise.training.manifest import write_manifest

CFG = ModelConfig(n_layers=1, n_heads=2, d_model=8, d_ff=12, vocab_size=11, max_seq_len=6,
                  tie_embeddings=True)


def _trained(seed: int = 0) -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    model = build_model(CFG, seed=seed)
    opt = make_optimizer(model, TrainConfig(steps=2, batch_size=2))
    for _ in range(2):
        tokens = torch.randint(0, 11, (3, 6))
        model(tokens).logsumexp(-1).mean().backward()
        opt.step()
        opt.zero_grad()
    return model, opt


def test_round_trip_restores_weights_optimizer_and_rng(tmp_path: Path) -> None:
    model, opt = _trained()
    gen = torch.Generator().manual_seed(5)
    torch.rand(3, generator=gen)
    path = save_checkpoint(tmp_path, 7, model, opt, data_generator=gen,
                           objective_weights={"obj": 0.25}, extra={"k": [1, 2]},
                           config={"seed": 1})
    assert path == tmp_path / "checkpoints" / "step_0000007"
    stored = load_file(path / "model.safetensors")
    assert "embed.weight" in stored and "unembed.weight" not in stored  # tied: stored once

    fresh = build_model(CFG, seed=1)
    fresh_opt = make_optimizer(fresh, TrainConfig(steps=2, batch_size=2))
    info = load_checkpoint(path, fresh, fresh_opt)
    for (n, a), (_, b) in zip(model.state_dict().items(), fresh.state_dict().items(),
                              strict=True):
        assert torch.equal(a, b), n
    assert fresh.unembed.weight is fresh.embed.weight
    for p, q in zip(opt.param_groups[0]["params"], fresh_opt.param_groups[0]["params"],
                    strict=True):
        for key in ("exp_avg", "exp_avg_sq", "step"):
            assert torch.equal(opt.state[p][key], fresh_opt.state[q][key])
    assert (info.step, info.objective_weights, info.extra) == (7, {"obj": 0.25}, {"k": [1, 2]})
    assert info.data_rng is not None
    restored = torch.Generator()
    restored.set_state(info.data_rng)
    assert torch.equal(torch.rand(4, generator=restored), torch.rand(4, generator=gen))
    assert latest_checkpoint(tmp_path) == path


def _corrupt(path: Path, how: str) -> None:
    data = path.read_bytes()
    if how == "truncate":
        path.write_bytes(data[: len(data) // 2])
    else:  # flip one byte in the tensor data (safetensors itself would not notice)
        i = len(data) - 3
        path.write_bytes(data[:i] + bytes([data[i] ^ 0xFF]) + data[i + 1:])


@pytest.mark.parametrize("name", ["model.safetensors", "trainer.safetensors"])
@pytest.mark.parametrize("how", ["truncate", "flip"])
def test_corrupt_file_is_named(tmp_path: Path, name: str, how: str) -> None:
    model, opt = _trained()
    path = save_checkpoint(tmp_path, 3, model, opt)
    _corrupt(path / name, how)
    with pytest.raises(CheckpointError, match=f"{path / name}.*(truncated or corrupt)"):
        load_checkpoint(path, build_model(CFG), make_optimizer(model, TrainConfig()))


def test_bad_trainer_json_and_missing_file(tmp_path: Path) -> None:
    model, opt = _trained()
    path = save_checkpoint(tmp_path, 3, model, opt)
    (path / "trainer.json").write_text('{"format": "headwise-trainer/1", "st')
    with pytest.raises(CheckpointError, match="trainer.json: contents do not match the sha256"):
        load_checkpoint(path, build_model(CFG))
    write_manifest(path, CHECKPOINT_FILES)  # a manifest that agrees: the JSON itself is checked
    with pytest.raises(CheckpointError, match="trainer.json: not valid JSON"):
        load_checkpoint(path, build_model(CFG))
    path = save_checkpoint(tmp_path, 4, model, opt)
    (path / "model.safetensors").unlink()
    with pytest.raises(CheckpointError, match="model.safetensors: file not found"):
        load_checkpoint(path, build_model(CFG))


def test_truncated_weights_file_without_manifest(tmp_path: Path) -> None:
    model, _ = _trained()
    save_weights(model, tmp_path / "w.safetensors")
    _corrupt(tmp_path / "w.safetensors", "truncate")
    with pytest.raises(CheckpointError, match=r"w\.safetensors: not a readable safetensors"):
        load_weights(build_model(CFG), tmp_path / "w.safetensors")


def test_mismatched_model_names_the_key(tmp_path: Path) -> None:
    model, _ = _trained()
    save_weights(model, tmp_path / "w.safetensors")
    wider = build_model(CFG.replace(d_ff=16))
    with pytest.raises(CheckpointError, match="'blocks.0.mlp.up_proj.weight' has shape"):
        load_weights(wider, tmp_path / "w.safetensors")
    attn_only = build_model(CFG.replace(attn_only=True))
    with pytest.raises(CheckpointError, match="unexpected tensor 'blocks.0.ln2.bias'"):
        load_weights(attn_only, tmp_path / "w.safetensors")
    save_weights(attn_only, tmp_path / "a.safetensors")
    with pytest.raises(CheckpointError, match="missing tensor 'blocks.0.ln2.weight'"):
        load_weights(build_model(CFG), tmp_path / "a.safetensors")


def test_optimizer_mismatch_names_the_parameter(tmp_path: Path) -> None:
    model, opt = _trained()
    path = save_checkpoint(tmp_path, 3, model, opt)
    other = build_model(CFG)
    other.embed.weight.requires_grad_(False)  # frozen now, trainable then
    with pytest.raises(CheckpointError, match="'embed.weight', which is not a trainable"):
        load_checkpoint(path, other, make_optimizer(other, TrainConfig()))


def test_latest_ignores_incomplete_and_temporary(tmp_path: Path) -> None:
    model, opt = _trained()
    save_checkpoint(tmp_path, 2, model, opt)
    (tmp_path / "checkpoints" / ".tmp-step_0000009-123").mkdir()
    (tmp_path / "checkpoints" / "step_0000008").mkdir()  # no trainer.json: incomplete
    assert [s for s, _ in list_checkpoints(tmp_path)] == [2]
    assert latest_checkpoint(tmp_path) == tmp_path / "checkpoints" / "step_0000002"
    save_checkpoint(tmp_path, 2, model, opt)  # saving a step again replaces it
    assert [s for s, _ in list_checkpoints(tmp_path)] == [2]
    assert json.loads((tmp_path / "checkpoints/step_0000002/trainer.json").read_text())["step"] == 2
    assert latest_checkpoint(tmp_path / "nothing") is None


def test_resume_with_changed_config_is_refused(tmp_path: Path) -> None:
    from headwise.data import CopyTask, Mixture
    from headwise.training import train

    data = Mixture({"copy": CopyTask(length=2, vocab_size=11)})
    config = TrainConfig(steps=2, batch_size=4, checkpoint_every=1)
    train(build_model(CFG, seed=0), data, config, out_dir=tmp_path, progress=False)
    with pytest.raises(ConfigError, match="train.lr: got 0.01, but the checkpoint"):
        train(build_model(CFG, seed=0), data, TrainConfig(steps=3, batch_size=4, lr=0.01),
              out_dir=tmp_path, resume=True, progress=False)


def test_clean_restores_a_checkpoint_moved_aside_and_drops_partial_writes(tmp_path: Path) -> None:
    from headwise.training import clean_checkpoints

    model, opt = _trained()
    path = save_checkpoint(tmp_path, 6, model, opt)
    root = path.parent
    path.rename(root / ".old-step_0000006-999")  # crash between the two renames of a re-save
    (root / ".tmp-step_0000007-999").mkdir()  # crash while writing step 7
    assert latest_checkpoint(tmp_path) is None
    clean_checkpoints(tmp_path)
    assert sorted(p.name for p in root.iterdir()) == ["step_0000006"]
    fresh = build_model(CFG)
    assert load_checkpoint(path, fresh, make_optimizer(fresh, TrainConfig())).step == 6


def test_the_same_weights_always_give_the_same_file_bytes(tmp_path) -> None:
    """The safetensors writer emits metadata in hash order, different from call to call; the
    files headwise writes are canonical, so one training run's weights hash the same twice."""
    import hashlib

    from safetensors.torch import load_file

    from headwise.training.safetensors_io import save_tensors

    tensors = {"b": torch.arange(6.0).reshape(2, 3), "a": torch.ones(4, dtype=torch.float16)}
    digests = set()
    for i in range(8):  # metadata given in both orders, several times
        meta = {"format": "pt", "x": "1"} if i % 2 else {"x": "1", "format": "pt"}
        path = tmp_path / f"w{i}.safetensors"
        assert save_tensors(tensors, path, meta) == hashlib.sha256(path.read_bytes()).hexdigest()
        digests.add(hashlib.sha256(path.read_bytes()).hexdigest())
        back = load_file(path)  # the library's own reader accepts the canonical header
        assert set(back) == set(tensors) and all(torch.equal(back[k], v)
                                                for k, v in tensors.items())
        assert int.from_bytes(path.read_bytes()[:8], "little") % 8 == 0
    assert len(digests) == 1
