"""Load HF checkpoints from a local directory into headwise models; convert and reload them.

``load_hf(dir)`` reads ``config.json``, picks the family converter by ``model_type``, translates
the config, maps every tensor through the converter's key table (checking names and shapes) and
returns a ``Transformer`` in eval mode, with the checkpoint's tokenizer as ``model.tokenizer``
when it has a ``tokenizer.json``. Nothing here touches the network.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import torch
from torch import Tensor

from headwise.atomic import (
    MODEL,
    check_empty_dir,
    check_output_dir,
    refuse_directories,
    remove_entries,
    write_bytes_atomic,
)
from headwise.config import ModelConfig
from headwise.errors import CheckpointError, ConfigError
from headwise.interop.bert import POOLER_KEYS, BertPooler
from headwise.interop.converter import Converter
from headwise.interop.hf_config import check_types
from headwise.interop.hub_cache import resolve_model
from headwise.interop.mlm_head import PREFIX as MLM_PREFIX
from headwise.interop.mlm_head import read_mlm_head
from headwise.interop.registry import get_converter
from headwise.interop.tokenizer import load_model_tokenizer
from headwise.interop.weights import (
    PICKLE,
    PICKLE_INDEX,
    SAFETENSORS,
    SAFETENSORS_INDEX,
    read_json,
    read_safetensors,
    read_state_dict,
)
from headwise.jsonfile import read_bounded
from headwise.model import Transformer, build_mlm_head, build_model
from headwise.training.safetensors_io import check_finite, save_tensors

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json",
                   "vocab.txt", "merges.txt", "vocab.json")
# The files of a model directory (an HF checkpoint, an export, a conversion): what replacing
# one deletes first, so that no stale weights or tokenizer survive next to the new ones.
HF_FILES = ("config.json", "generation_config.json", SAFETENSORS, SAFETENSORS_INDEX, PICKLE,
            PICKLE_INDEX, *TOKENIZER_FILES)
MAX_TOKENIZER_FILE_BYTES = 64 << 20  # the largest published tokenizer.json is ~35 MB


def hf_converter(path: str | Path) -> tuple[Converter, ModelConfig]:
    """The converter and our config for the HF directory ``path`` (reads ``config.json`` only).

    Raises:
        CheckpointError: no/invalid ``config.json``, unknown ``model_type`` (listing the
            supported ones), or an unsupported config field (named).
    """
    hf = read_json(Path(path) / "config.json")
    check_types(hf, str(Path(path) / "config.json"))
    converter = get_converter(hf.get("model_type"))
    try:
        config = converter.config_from_hf(hf)
    except ConfigError as e:
        raise CheckpointError(f"{Path(path) / 'config.json'}: translated config invalid: {e}"
                              ) from None
    return converter, config


def convert_state_dict(converter: Converter, config: ModelConfig, hf_state: dict[str, Tensor],
                       *, source: str = "checkpoint", strict: bool = True,
                       dtype: torch.dtype = torch.float32) -> dict[str, Tensor]:
    """Map HF tensors to our parameter names, checking every key and shape.

    Args:
        converter: the family converter.
        config: our config (decides which parameters exist).
        hf_state: HF tensors by HF key (prefixes are stripped here).
        source: name used in error messages (the directory).
        strict: reject HF keys the converter neither uses nor knows to ignore.
        dtype: floating tensors are cast to this dtype.

    Returns:
        Our state dict (tied unembedding included, sharing the embedding tensor).

    Raises:
        CheckpointError: a missing key, a wrong shape, or (strict) unexpected keys, naming them.
    """
    hf = _strip(converter, hf_state, source)
    with torch.device("meta"):  # shapes only: no memory, no initialisation cost
        skeleton = build_model(config, seed=0)
    shapes = {k: tuple(v.shape) for k, v in skeleton.state_dict().items()}
    floating = {k: v.is_floating_point() for k, v in skeleton.state_dict().items()}
    ours: dict[str, Tensor] = {}
    used: set[str] = set()
    for key, shape in shapes.items():
        if key == "unembed.weight" and config.tie_embeddings:
            continue
        rule = converter.rule_for(key)
        if rule is None:
            raise CheckpointError(f"{source}: the {converter.model_type[0]} converter has no "
                                  f"rule for our parameter {key!r}")
        if rule.hf not in hf:
            sample = sorted(hf)[:3]
            raise CheckpointError(f"{source}: missing key {rule.hf!r} (needed for our {key}); "
                                  f"the checkpoint has {len(hf)} keys, e.g. {sample}")
        tensor, expected = hf[rule.hf], rule.hf_shape(shape)
        if tuple(tensor.shape) != expected:
            raise CheckpointError(f"{source}: key {rule.hf!r}: got shape {tuple(tensor.shape)}, "
                                  f"expected {expected} (for our {key})")
        if not tensor.is_floating_point() and floating[key]:
            raise CheckpointError(f"{source}: key {rule.hf!r}: got dtype {tensor.dtype}, "
                                  f"expected a floating-point tensor (for our {key})")
        tensor = rule.apply(tensor)
        ours[key] = tensor.to(dtype) if tensor.is_floating_point() else tensor
        check_finite(ours[key], source, rule.hf, f" (as {dtype})")
        used.add(rule.hf)
    if config.tie_embeddings:
        ours["unembed.weight"] = ours["embed.weight"]
    unexpected = sorted(k for k in hf if k not in used and not converter.is_ignored(k))
    if strict and unexpected:
        raise CheckpointError(f"{source}: unexpected keys {unexpected[:5]} (of {len(unexpected)})"
                              f" not used by the {converter.model_type[0]} converter; pass "
                              "strict=False to ignore them")
    return ours


def load_hf(path: str | Path, *, strict: bool = True, dtype: torch.dtype = torch.float32,
            max_seq_len: int | None = None, revision: str | None = None) -> Transformer:
    """A headwise model with the weights of the local HF checkpoint directory ``path``.

    Args:
        path: directory with ``config.json`` and ``model.safetensors`` (or its sharded index,
            or ``pytorch_model.bin``, read with ``weights_only=True``), or a model id
            (``gpt2``, ``org/name``) found in the local HF cache (``hub_cache.resolve_model``).
        strict: reject unknown HF keys (task heads we do not model) instead of ignoring them.
        dtype: parameter dtype (float32 for exact parity).
        max_seq_len: lower the position limit of a RoPE model (smaller rotary tables).
        revision: with a model id, the branch, tag or commit in the cache (default ``main``).

    Returns:
        The model in eval mode; ``model.tokenizer`` is the checkpoint's
        (``load_model_tokenizer``) when it has a ``tokenizer.json``, else ``None``;
        ``model.mlm_head`` the checkpoint's masked-LM head when it has one
        (``headwise.interop.mlm_head``).

    Raises:
        CheckpointError: see ``hf_converter``, ``read_state_dict``, ``convert_state_dict`` and
            ``resolve_model`` (an id not in the cache names where it looked); an unreadable
            tokenizer.
    """
    path = resolve_model(path, revision, field="path", revision_field="revision")
    converter, config = hf_converter(path)
    if max_seq_len is not None:
        if config.positional == "learned":
            raise CheckpointError(f"max_seq_len: got {max_seq_len}, but learned positions fix "
                                  f"it at {config.max_seq_len}; leave it unset")
        if max_seq_len > config.max_seq_len:  # past a sliding window HF's numbers differ
            raise CheckpointError(f"max_seq_len: got {max_seq_len}, expected at most the "
                                  f"checkpoint's {config.max_seq_len} (it only lowers the limit)")
        config = config.replace(max_seq_len=max_seq_len)
    hf_state = read_state_dict(path)
    state = convert_state_dict(converter, config, hf_state, source=str(path), strict=strict,
                               dtype=dtype)
    model = build_model(config, seed=0).to(dtype)
    model.load_state_dict(state, strict=True)
    model.mlm_head = read_mlm_head(converter, config, _strip(converter, hf_state, str(path)),
                                   str(path), dtype)
    model.setup()  # the head's hook point joins the model's map
    attach_tokenizer(model, Path(path))
    return model.eval()


def convert(hf_dir: str | Path, out_dir: str | Path, *, strict: bool = True,
            revision: str | None = None, overwrite: bool = False) -> Path:
    """Convert an HF checkpoint directory (or a cached model id, see ``load_hf``) to headwise's
    format in ``out_dir``.

    Writes ``config.json`` (``ModelConfig.to_dict``) and ``model.safetensors`` atomically
    (``write_bytes_atomic``: temporary file, fsync, ``os.replace``), and copies the tokenizer
    files that exist (``read_tokenizer_files``: never what a link outside the checkpoint points
    to). ``out_dir`` follows the output rule (``headwise.atomic.check_output_dir``): never the
    source, a run or a checkpoint; a model directory only with ``overwrite``, which first
    deletes its model files (``HF_FILES``).

    Returns:
        ``out_dir`` as a Path.

    Raises:
        ConfigError: ``out_dir`` is refused by the output rule.
        CheckpointError: see ``load_hf``; a tokenizer file that is a link leaving the source.
    """
    hf_dir = resolve_model(hf_dir, revision, field="hf_dir", revision_field="revision")
    out = Path(out_dir)
    check_output_dir(out, "out", overwrite=overwrite, replaces=(MODEL,), sources=[Path(hf_dir)])
    check_empty_dir(out, "out", overwrite)
    refuse_directories(out, HF_FILES)
    copies = read_tokenizer_files(Path(hf_dir))
    model = load_hf(hf_dir, strict=strict)
    if overwrite:
        remove_entries(out, HF_FILES, keep=(SAFETENSORS, "config.json", *copies))
    out.mkdir(parents=True, exist_ok=True)
    state = {k: v.detach().contiguous() for k, v in model.state_dict().items()}
    if model.config.tie_embeddings:
        del state["unembed.weight"]  # safetensors refuses shared tensors; rebuilt on load
    save_tensors(state, out / SAFETENSORS, {"format": "pt"})
    for name, data in copies.items():
        write_bytes_atomic(out / name, data)
    # config.json last: a directory interrupted mid-conversion does not look loadable.
    text = json.dumps(model.config.to_dict(), indent=2) + "\n"
    write_bytes_atomic(out / "config.json", text.encode("utf-8"))
    return out


def read_tokenizer_files(directory: Path, names: tuple[str, ...] = TOKENIZER_FILES,
                         option: str = "tokenizer") -> dict[str, bytes]:
    """The bytes of each tokenizer file among ``names`` in ``directory``, to copy elsewhere.

    A file may be a link only when it resolves inside ``directory`` (or, for a snapshot of the
    HF cache, inside that model's cache folder, where snapshots link to ``blobs/``): a link to a
    file elsewhere would copy that file's contents into a directory meant for sharing.

    Raises:
        CheckpointError: a link leaving the directory, a non-regular file, or a file larger than
            ``MAX_TOKENIZER_FILE_BYTES`` (naming it).
    """
    root = directory.parent.parent if directory.parent.name == "snapshots" else directory
    root = root.resolve()
    out = {}
    for name in names:
        file = directory / name
        if not os.path.lexists(file):
            continue
        real = file.resolve()
        if file.is_symlink() and not real.is_relative_to(root):
            raise CheckpointError(f"{option}: {file} is a link to {real}, outside {root}; "
                                  "expected the checkpoint's own file (headwise does not copy "
                                  "what links elsewhere point to)")
        out[name] = read_bounded(real, MAX_TOKENIZER_FILE_BYTES, option, CheckpointError)
    return out


def load_converted(out_dir: str | Path) -> Transformer:
    """Reload a model written by ``convert`` (eval mode).

    Raises:
        CheckpointError: missing/invalid files, missing or unexpected keys, wrong shapes.
    """
    d = Path(out_dir)
    try:
        config = ModelConfig.from_dict(read_json(d / "config.json"), path="config.json")
    except ConfigError as e:
        raise CheckpointError(f"{d}: {e}") from None
    state = read_safetensors(d / SAFETENSORS)
    model = build_model(config, seed=0)
    if any(k.startswith(MLM_PREFIX) for k in state):  # converted from a checkpoint with one
        model.mlm_head = build_mlm_head(config, seed=0, added=False)
        model.setup()
    expected = model.state_dict()
    if config.tie_embeddings:
        expected.pop("unembed.weight")
    for key, value in expected.items():
        if key not in state:
            raise CheckpointError(f"{d / SAFETENSORS}: missing key {key!r}")
        if state[key].shape != value.shape:
            raise CheckpointError(f"{d / SAFETENSORS}: key {key!r}: got shape "
                                  f"{tuple(state[key].shape)}, expected {tuple(value.shape)}")
        check_finite(state[key], d / SAFETENSORS, key)
    extra = sorted(set(state) - set(expected))
    if extra:
        raise CheckpointError(f"{d / SAFETENSORS}: unexpected keys {extra[:5]}")
    model.load_state_dict(state, strict=False)
    attach_tokenizer(model, d)
    return model.eval()


def attach_tokenizer(model: Transformer, directory: Path) -> None:
    """Set ``model.tokenizer`` from ``directory``'s ``tokenizer.json``, when it has one
    (``load_model_tokenizer``)."""
    if (directory / "tokenizer.json").is_file():
        model.tokenizer = load_model_tokenizer(directory)


def _strip(converter: Converter, hf_state: dict[str, Tensor], source: str) -> dict[str, Tensor]:
    out: dict[str, Tensor] = {}
    for key, value in hf_state.items():
        new = key
        for prefix in converter.prefixes:
            if new.startswith(prefix):
                new = new[len(prefix):]
                break
        if converter.rename is not None:
            new = converter.rename(new)
        if new in out:
            raise CheckpointError(f"{source}: key {key!r} duplicates {new!r} after removing "
                                  f"the prefixes {list(converter.prefixes)}")
        out[new] = value
    return out


def load_pooler(path: str | Path) -> BertPooler | None:
    """BERT's pooler from an HF BERT directory, or ``None`` when the checkpoint has none.

    Raises:
        CheckpointError: not a BERT checkpoint, only half the pooler present, or a wrong shape.
    """
    converter, config = hf_converter(path)
    if "bert" not in converter.model_type:
        raise CheckpointError(f"{path}: model_type {converter.model_type[0]!r} has no pooler, "
                              "expected a BERT checkpoint")
    hf = _strip(converter, read_state_dict(path), str(path))
    present = [k for k in POOLER_KEYS if k in hf]
    if not present:
        return None
    pooler = BertPooler(config.d_model)
    expected = {POOLER_KEYS[0]: (config.d_model, config.d_model),
                POOLER_KEYS[1]: (config.d_model,)}
    for key, shape in expected.items():
        if key not in hf:
            raise CheckpointError(f"{path}: missing key {key!r} (the pooler is incomplete)")
        if tuple(hf[key].shape) != shape:
            raise CheckpointError(f"{path}: key {key!r}: got shape {tuple(hf[key].shape)}, "
                                  f"expected {shape}")
    for key in POOLER_KEYS:
        check_finite(hf[key].float(), path, key, " (as torch.float32)")
    pooler.dense.load_state_dict({"weight": hf[POOLER_KEYS[0]].float(),
                                  "bias": hf[POOLER_KEYS[1]].float()})
    return pooler.eval()
