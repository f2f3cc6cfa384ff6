"""Corrupt, mismatched and malicious checkpoints: clear CheckpointErrors, nothing executed."""

from __future__ import annotations

import json
import os
import pickle
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from headwise.errors import CheckpointError
from headwise.interop import load_converted, load_hf, supported_model_types


def _copy(src: Path, dst: Path) -> Path:
    shutil.copytree(src, dst)
    return dst


def _rewrite_weights(path: Path, edit) -> None:
    state = load_file(str(path / "model.safetensors"))
    edit(state)
    save_file(state, str(path / "model.safetensors"))


def _as_bin(path: Path) -> None:
    state = load_file(str(path / "model.safetensors"))
    os.remove(path / "model.safetensors")
    torch.save(state, path / "pytorch_model.bin")


def test_pytorch_bin_loads_same_as_safetensors(hf_model_dir, batch, tmp_path):
    _, path = hf_model_dir("llama-gqa")
    ref = load_hf(path)
    alt = _copy(path, tmp_path / "bin")
    _as_bin(alt)
    tokens, _ = batch
    torch.testing.assert_close(load_hf(alt)(tokens), ref(tokens), atol=0, rtol=0)


def test_sharded_safetensors_loads(hf_model_dir, batch, tmp_path):
    hf, _ = hf_model_dir("gpt2")
    hf.save_pretrained(tmp_path, max_shard_size="20KB")
    assert (tmp_path / "model.safetensors.index.json").is_file()
    assert not (tmp_path / "model.safetensors").exists()
    tokens, _ = batch
    with torch.no_grad():
        torch.testing.assert_close(load_hf(tmp_path)(tokens), hf(tokens).logits, atol=1e-4,
                                   rtol=0)


def test_missing_shard_is_named(hf_model_dir, tmp_path):
    hf, _ = hf_model_dir("gpt2")
    hf.save_pretrained(tmp_path, max_shard_size="20KB")
    index = json.loads((tmp_path / "model.safetensors.index.json").read_text())
    shard = sorted(set(index["weight_map"].values()))[-1]
    os.remove(tmp_path / shard)
    with pytest.raises(CheckpointError, match=f"shard '{shard}' not found"):
        load_hf(tmp_path)


def test_missing_key_is_named(hf_model_dir, tmp_path):
    _, path = hf_model_dir("llama-gqa")
    alt = _copy(path, tmp_path / "m")
    _rewrite_weights(alt, lambda s: s.pop("model.layers.1.self_attn.k_proj.weight"))
    with pytest.raises(CheckpointError, match=r"missing key 'layers\.1\.self_attn\.k_proj\."
                                              r"weight' \(needed for our blocks\.1\.attn\.k_proj"):
        load_hf(alt)


def test_wrong_shape_names_key_and_shapes(hf_model_dir, tmp_path):
    _, path = hf_model_dir("gpt2")
    alt = _copy(path, tmp_path / "m")

    def edit(s):
        s["transformer.h.0.attn.c_attn.weight"] = torch.zeros(24, 70)

    _rewrite_weights(alt, edit)
    with pytest.raises(CheckpointError, match=r"'h\.0\.attn\.c_attn\.weight': got shape "
                                              r"\(24, 70\), expected \(24, 72\)"):
        load_hf(alt)


def test_unexpected_key_strict_and_lenient(hf_model_dir, batch, tmp_path):
    _, path = hf_model_dir("bert")
    alt = _copy(path, tmp_path / "m")
    _rewrite_weights(alt, lambda s: s.__setitem__("classifier.weight", torch.zeros(2, 24)))
    with pytest.raises(CheckpointError, match=r"unexpected keys \['classifier\.weight'\]"):
        load_hf(alt)
    tokens, _ = batch
    torch.testing.assert_close(load_hf(alt, strict=False).hidden(tokens),
                               load_hf(path).hidden(tokens), atol=0, rtol=0)


@pytest.mark.parametrize("fmt", ["safetensors", "bin"])
def test_truncated_file(hf_model_dir, tmp_path, fmt):
    _, path = hf_model_dir("gpt2")
    alt = _copy(path, tmp_path / "m")
    if fmt == "bin":
        _as_bin(alt)
    file = alt / ("model.safetensors" if fmt == "safetensors" else "pytorch_model.bin")
    data = file.read_bytes()
    file.write_bytes(data[: len(data) // 2])
    with pytest.raises(CheckpointError, match=rf"{file.name}: .*truncated or corrupt"):
        load_hf(alt)


def test_unknown_architecture_lists_supported(hf_model_dir, tmp_path):
    _, path = hf_model_dir("gpt2")
    alt = _copy(path, tmp_path / "m")
    cfg = json.loads((alt / "config.json").read_text())
    cfg["model_type"] = "t5"
    (alt / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(CheckpointError, match=r"model_type: got 't5', expected one of "
                                              r"\['bert', 'gpt2', 'llama', 'mistral', 'qwen2'\]"):
        load_hf(alt)
    assert supported_model_types() == ["bert", "gpt2", "llama", "mistral", "qwen2"]


@pytest.mark.parametrize(("family", "field", "value"), [
    ("llama-gqa", "rope_scaling", {"rope_type": "linear", "factor": 2.0}),
    ("llama-gqa", "final_logit_softcapping", 30.0),
    ("llama-gqa", "hidden_act", "gelu"),
    ("bert", "position_embedding_type", "relative_key"),
    ("bert", "is_decoder", True),
    ("gpt2", "scale_attn_by_inverse_layer_idx", True),
    ("gpt2", "scale_attn_weights", False),  # HF then skips the 1/sqrt(d_head) scale
    ("gpt2", "activation_function", "mish"),
    ("gpt2", "n_layer", None),
])
def test_unsupported_config_field_is_named(hf_model_dir, tmp_path, family, field, value):
    _, path = hf_model_dir(family)
    alt = _copy(path, tmp_path / "m")
    cfg = json.loads((alt / "config.json").read_text())
    if field == "rope_scaling":  # transformers 5 writes rope_parameters instead
        cfg.pop("rope_parameters", None)
    cfg[field] = value
    (alt / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(CheckpointError, match=rf"config\.json {field}"):
        load_hf(alt)


def test_scaled_rope_parameters_refused(hf_model_dir, tmp_path):
    _, path = hf_model_dir("llama-gqa")
    alt = _copy(path, tmp_path / "m")
    cfg = json.loads((alt / "config.json").read_text())
    cfg["rope_parameters"] = {"rope_type": "llama3", "rope_theta": 5e5, "factor": 8.0}
    (alt / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(CheckpointError, match=r"rope_parameters\.rope_type: got 'llama3'"):
        load_hf(alt)


def test_legacy_rope_scaling_beside_rope_parameters_refused(hf_model_dir, tmp_path):
    """transformers 5 reads a legacy rope_scaling even where rope_parameters is plain RoPE."""
    _, path = hf_model_dir("llama-gqa")
    alt = _copy(path, tmp_path / "m")
    cfg = json.loads((alt / "config.json").read_text())
    assert cfg["rope_parameters"]["rope_type"] == "default"
    cfg["rope_scaling"] = {"rope_type": "linear", "factor": 2.0}
    (alt / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(CheckpointError, match=r"config\.json rope_scaling: got"):
        load_hf(alt)
    cfg["rope_scaling"] = {"rope_type": "default"}  # plain RoPE spelled out: still loads
    (alt / "config.json").write_text(json.dumps(cfg))
    load_hf(alt)


class _Evil:
    """Unpickling this would call os.system and create a marker file."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


def test_malicious_pickle_is_refused_and_nothing_runs(hf_model_dir, tmp_path):
    _, path = hf_model_dir("gpt2")
    alt = _copy(path, tmp_path / "m")
    _as_bin(alt)
    marker = tmp_path / "pwned"
    state = torch.load(alt / "pytorch_model.bin", weights_only=True)
    state["transformer.wte.weight"] = _Evil(marker)
    torch.save(state, alt / "pytorch_model.bin")
    # The payload is live: an unsafe load (weights_only=False) runs it and makes a marker.
    live = tmp_path / "live"
    state["transformer.wte.weight"] = _Evil(live)
    torch.save(state, tmp_path / "live.bin")
    torch.load(tmp_path / "live.bin", weights_only=False)
    assert live.exists()
    assert not marker.exists()
    with pytest.raises(CheckpointError, match=r"pytorch_model\.bin: refused to load.*"
                                              r"weights_only=True"):
        load_hf(alt)
    assert not marker.exists()


def test_raw_pickle_bin_is_refused(hf_model_dir, tmp_path):
    """A legacy (non-zip) pickle whose __reduce__ runs code is refused as well."""
    _, path = hf_model_dir("gpt2")
    alt = _copy(path, tmp_path / "m")
    os.remove(alt / "model.safetensors")
    marker = tmp_path / "pwned"
    (alt / "pytorch_model.bin").write_bytes(pickle.dumps({"x": _Evil(marker)}, protocol=2))
    with pytest.raises(CheckpointError, match="refused to load|cannot read"):
        load_hf(alt)
    assert not marker.exists()


def test_no_weights_and_no_config(tmp_path):
    with pytest.raises(CheckpointError, match=r"config\.json: file not found"):
        load_hf(tmp_path)
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "gpt2", "n_layer": 1,
                                                      "n_head": 2, "n_embd": 8,
                                                      "vocab_size": 10, "n_positions": 8}))
    with pytest.raises(CheckpointError, match="no weights found"):
        load_hf(tmp_path)


def test_converted_dir_errors(hf_model_dir, tmp_path):
    from headwise.interop import convert

    _, path = hf_model_dir("gpt2")
    out = convert(path, tmp_path / "conv")
    _rewrite_weights(out, lambda s: s.pop("blocks.0.ln1.bias"))
    with pytest.raises(CheckpointError, match=r"missing key 'blocks\.0\.ln1\.bias'"):
        load_converted(out)
