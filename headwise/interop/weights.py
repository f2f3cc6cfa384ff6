"""Read HF weight files safely: safetensors (single or sharded) or ``.bin`` with weights_only.

Pickled ``.bin`` files are read only with ``torch.load(weights_only=True)``, which refuses any
object other than tensors and plain containers, so a malicious pickle fails before anything it
names is called. Every failure is a ``CheckpointError`` naming the file (and key).
"""

from __future__ import annotations

import pickle
from pathlib import Path

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file
from torch import Tensor

from headwise.errors import CheckpointError
from headwise.jsonfile import read_json_object
from headwise.training.safetensors_io import check_header

SAFETENSORS = "model.safetensors"
SAFETENSORS_INDEX = "model.safetensors.index.json"
PICKLE = "pytorch_model.bin"
PICKLE_INDEX = "pytorch_model.bin.index.json"


def read_json(path: Path) -> dict:
    """A JSON object from ``path`` (``headwise.jsonfile.read_json_object``).

    Raises:
        CheckpointError: missing, unreadable, too large or not a JSON object.
    """
    return read_json_object(path, CheckpointError)


def read_state_dict(directory: str | Path) -> dict[str, Tensor]:
    """All tensors of an HF checkpoint directory, by HF key (prefixes untouched).

    Looks for, in order: ``model.safetensors``, its sharded index, ``pytorch_model.bin``, its
    sharded index.

    Raises:
        CheckpointError: no weight file, a truncated/corrupt file, a missing shard, a shard that
            lacks a key its index promises, or a pickle holding non-tensor objects.
    """
    d = Path(directory)
    if (d / SAFETENSORS).is_file():
        return read_safetensors(d / SAFETENSORS)
    if (d / SAFETENSORS_INDEX).is_file():
        return _read_sharded(d / SAFETENSORS_INDEX, read_safetensors)
    if (d / PICKLE).is_file():
        return read_pickle(d / PICKLE)
    if (d / PICKLE_INDEX).is_file():
        return _read_sharded(d / PICKLE_INDEX, read_pickle)
    raise CheckpointError(
        f"{d}: no weights found, expected one of {SAFETENSORS}, {SAFETENSORS_INDEX}, "
        f"{PICKLE}, {PICKLE_INDEX}"
    )


def read_safetensors(path: Path) -> dict[str, Tensor]:
    """Every tensor of a safetensors file (header bounds checked first, ``check_header``).

    Raises:
        CheckpointError: missing, truncated, corrupt, or too many tensors.
    """
    check_header(path)
    try:
        return load_file(str(path), device="cpu")
    except (SafetensorError, OSError, ValueError, RuntimeError) as e:
        raise CheckpointError(f"{path}: cannot read safetensors file, truncated or corrupt "
                              f"({e})") from None


def read_pickle(path: Path) -> dict[str, Tensor]:
    try:
        data = torch.load(path, weights_only=True, map_location="cpu")
    except pickle.UnpicklingError as e:
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise CheckpointError(
            f"{path}: refused to load: the pickle holds objects other than tensors, and "
            f"headwise reads .bin files only with torch.load(weights_only=True) ({first})"
        ) from None
    except (RuntimeError, EOFError, OSError, ValueError) as e:
        raise CheckpointError(f"{path}: cannot read, truncated or corrupt ({e})") from None
    if not isinstance(data, dict):
        raise CheckpointError(f"{path}: got {type(data).__name__}, expected a state dict")
    for key, value in data.items():
        if not isinstance(value, Tensor):
            raise CheckpointError(f"{path}: key {key!r} holds a {type(value).__name__}, "
                                  "expected a tensor")
    return data


def _read_sharded(index_path: Path, read: object) -> dict[str, Tensor]:
    index = read_json(index_path)
    weight_map = index.get("weight_map")
    if not isinstance(weight_map, dict) or not weight_map:
        raise CheckpointError(f"{index_path}: weight_map: missing or empty, expected a mapping "
                              "of key -> shard file")
    out: dict[str, Tensor] = {}
    for shard in sorted(set(weight_map.values())):
        shard_path = index_path.parent / str(shard)
        if Path(str(shard)).name != str(shard) or not shard_path.is_file():
            raise CheckpointError(f"{index_path}: shard {shard!r} not found in "
                                  f"{index_path.parent}")
        out.update(read(shard_path))  # type: ignore[operator]
    for key, shard in weight_map.items():
        if key not in out:
            raise CheckpointError(f"{index_path}: key {key!r} is missing from shard {shard!r}")
    return out
