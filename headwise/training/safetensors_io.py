"""Safetensors I/O without pickle: atomic, fsynced writes; validated model-weight loading.

Files are written through ``write_bytes_atomic`` (defined in the foundation module
``headwise.atomic`` so that every layer can use it; import it from there).

Tied weights (``unembed.weight`` sharing ``embed.weight``) are stored once; the file's metadata
maps every alias to its stored name (``headwise.aliases``), so loading restores the tie.
Every read error (missing file, truncated or corrupt header) becomes a ``CheckpointError``
naming the file; a missing, unexpected or mis-shaped tensor names the key.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import torch
from safetensors import safe_open
from safetensors.torch import save
from torch import Tensor, nn

from headwise.atomic import write_bytes_atomic
from headwise.errors import CheckpointError
from headwise.memory import check_memory

__all__ = ["ALIASES_KEY", "canonical_header", "check_finite", "check_header", "load_tensors",
           "load_weights", "model_tensors", "save_tensors", "save_weights", "sha256_file"]

ALIASES_KEY = "headwise.aliases"
MAX_TENSORS = 65536  # per file; the largest sharded checkpoints hold a few thousand per shard
MAX_HEADER_BYTES = 16 << 20  # ~100 bytes per tensor; the format's own limit is 100 MB


def save_tensors(tensors: dict[str, Tensor], path: Path,
                 metadata: dict[str, str] | None = None) -> str:
    """Write tensors as safetensors atomically; returns the file's sha256 hex digest. The same
    tensors and metadata always give the same bytes (``canonical_header``)."""
    data = save({k: v.detach().cpu().contiguous() for k, v in tensors.items()},
                metadata=metadata)
    data = canonical_header(data)
    write_bytes_atomic(path, data)
    return hashlib.sha256(data).hexdigest()


def canonical_header(data: bytes) -> bytes:
    """``data`` (a safetensors file) with its JSON header's keys sorted, padded with spaces to
    a multiple of 8 bytes as the format's writer pads it. The writer emits the metadata in hash
    order, which differs from call to call, so two saves of the same weights would otherwise
    differ in their bytes (and sha256) while every tensor is identical."""
    n = int.from_bytes(data[:8], "little")
    header = json.dumps(json.loads(data[8:8 + n]), sort_keys=True, separators=(",", ":"))
    raw = header.encode() + b" " * (-len(header.encode()) % 8)
    return len(raw).to_bytes(8, "little") + raw + data[8 + n:]


def load_tensors(path: Path) -> tuple[dict[str, Tensor], dict[str, str]]:
    """Read every tensor and the metadata of a safetensors file (on CPU).

    Raises:
        CheckpointError: the file is missing, truncated, not valid safetensors, or holds more
            than ``MAX_TENSORS`` tensors (``check_header``).
    """
    path = Path(path)
    if not path.is_file():
        raise CheckpointError(f"{path}: file not found")
    check_header(path)
    try:
        with safe_open(str(path), framework="pt", device="cpu") as f:
            meta = dict(f.metadata() or {})
            return {k: f.get_tensor(k) for k in f.keys()}, meta
    except Exception as e:  # safetensors raises its own SafetensorError / OSError types
        raise CheckpointError(f"{path}: not a readable safetensors file ({e})") from None


def check_header(path: Path) -> None:
    """Refuse, from its header alone, a safetensors file with more than ``MAX_TENSORS``
    tensors or a header over ``MAX_HEADER_BYTES`` (both cost minutes to load, not seconds).

    Raises:
        CheckpointError: naming the file.
    """
    try:
        with open(path, "rb") as f:
            head = f.read(8)
            n = int.from_bytes(head, "little") if len(head) == 8 else -1
            header = json.loads(f.read(n)) if 0 < n <= MAX_HEADER_BYTES else None
    except (OSError, ValueError, RecursionError) as e:
        raise CheckpointError(f"{path}: not a readable safetensors file "
                              f"({str(e)[:100]})") from None
    if header is None:
        raise CheckpointError(f"{path}: not a readable safetensors file (header of {n} bytes, "
                              f"expected 1 to {MAX_HEADER_BYTES})")
    count = len(header) - ("__metadata__" in header) if isinstance(header, dict) else -1
    if not 0 <= count <= MAX_TENSORS:
        raise CheckpointError(f"{path}: {count} tensors in the header, expected at most "
                              f"{MAX_TENSORS} in one file (shard larger checkpoints)")
    _check_sizes(path, header, path.stat().st_size - 8 - n)


def _check_sizes(path: Path, header: dict[str, Any], data_bytes: int) -> None:
    """Refuse tensors whose data lies beyond the file, and tensors this process has no memory
    for, before any is allocated (the file may be sparse: its size costs no disk)."""
    total, largest, name = 0, -1, ""
    for key, entry in header.items():
        if key == "__metadata__":
            continue
        offsets = entry.get("data_offsets") if isinstance(entry, dict) else None
        if (not isinstance(offsets, list) or len(offsets) != 2
                or not all(type(x) is int for x in offsets)
                or not 0 <= offsets[0] <= offsets[1] <= data_bytes):
            raise CheckpointError(f"{path}: not a readable safetensors file (truncated or "
                                  f"corrupt: tensor {str(key)[:80]!r} has data offsets "
                                  f"{str(offsets)[:80]}, expected [begin, end] within the "
                                  f"file's {data_bytes} data bytes)")
        size = offsets[1] - offsets[0]
        total += size
        if size > largest:
            largest, name = size, str(key)
    if total:  # the reader maps the file and copies each tensor out of the mapping
        check_memory(f"{path}: tensors of {total} bytes (the largest {name[:80]!r}, "
                     f"{largest} bytes), mapped and copied", 2 * total)


def check_finite(tensor: Tensor, source: str | Path, key: str, cast: str = "") -> None:
    """Refuse a floating-point tensor holding NaN or infinite values (also what a cast to a
    narrower dtype, ``cast`` in the message, overflowed).

    Raises:
        CheckpointError: naming ``source`` and ``key`` and how many values are not finite.
    """
    if not tensor.is_floating_point() or tensor.device.type == "meta" or not tensor.numel():
        return
    bad = int((~torch.isfinite(tensor)).sum())
    if bad:
        raise CheckpointError(f"{source}: tensor {key!r}: {bad} of {tensor.numel()} values are "
                              f"NaN or infinite{cast}; expected finite weights")


def sha256_file(path: Path) -> str:
    """Hex sha256 of a file's bytes."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def model_tensors(model: nn.Module) -> tuple[dict[str, Tensor], dict[str, str]]:
    """The model's state as unique tensors, and ``alias -> stored name`` for shared ones."""
    tensors: dict[str, Tensor] = {}
    aliases: dict[str, str] = {}
    seen: dict[tuple[int, tuple[int, ...], tuple[int, ...]], str] = {}
    for name, t in model.state_dict().items():
        key = (t.untyped_storage().data_ptr() + t.storage_offset() * t.element_size(),
               tuple(t.shape), tuple(t.stride()))
        if t.numel() and key in seen:
            aliases[name] = seen[key]
        else:
            seen[key] = name
            tensors[name] = t
    return tensors, aliases


def save_weights(model: nn.Module, path: Path) -> str:
    """Save a model's weights (tied weights once) atomically; returns the sha256."""
    tensors, aliases = model_tensors(model)
    return save_tensors(tensors, path, {"format": "pt", ALIASES_KEY: json.dumps(aliases)})


def load_weights(model: nn.Module, path: Path) -> None:
    """Load weights saved by ``save_weights`` into ``model``, checking every key and shape.

    Raises:
        CheckpointError: an unreadable file, or a missing, unexpected or mis-shaped tensor
            (naming the file and the key).
    """
    tensors, meta = load_tensors(path)
    try:
        aliases = json.loads(meta.get(ALIASES_KEY, "{}"))
    except json.JSONDecodeError:
        raise CheckpointError(f"{path}: metadata {ALIASES_KEY!r} is not valid JSON") from None
    expected = model.state_dict()
    # An alias is only valid where the model itself ties the two tensors: an edited alias
    # (say q -> k) would otherwise load one weight in place of another without a word.
    ties = model_tensors(model)[1]
    if not isinstance(aliases, dict):
        raise CheckpointError(f"{path}: metadata {ALIASES_KEY!r} is not a JSON object")
    for alias, target in aliases.items():
        if not isinstance(target, str) or ties.get(alias) != target:
            raise CheckpointError(
                f"{path}: metadata {ALIASES_KEY!r} maps {str(alias)[:80]!r} to "
                f"{str(target)[:80]!r}, expected only the model's tied weights "
                f"{ties or '{}'}")
        if target not in tensors:
            raise CheckpointError(f"{path}: alias {alias!r} points to missing tensor {target!r}")
        tensors[alias] = tensors[target]
    for key, ref in expected.items():
        if key not in tensors:
            raise CheckpointError(f"{path}: missing tensor {key!r}")
        if tuple(tensors[key].shape) != tuple(ref.shape):
            raise CheckpointError(f"{path}: tensor {key!r} has shape "
                                  f"{tuple(tensors[key].shape)}, expected {tuple(ref.shape)}")
        if tensors[key].dtype != ref.dtype and (ref.is_floating_point()
                                                 != tensors[key].is_floating_point()):
            raise CheckpointError(f"{path}: tensor {key!r} has dtype {tensors[key].dtype}, "
                                  f"expected a floating-point tensor like the model's "
                                  f"{ref.dtype}" if ref.is_floating_point() else
                                  f"{path}: tensor {key!r} has dtype {tensors[key].dtype}, "
                                  f"expected {ref.dtype}")
    unexpected = sorted(set(tensors) - set(expected))
    if unexpected:
        raise CheckpointError(f"{path}: unexpected tensor {unexpected[0]!r} (not in the model)")
    for key in expected:
        check_finite(tensors[key].to(expected[key].dtype), path, key)
    with torch.no_grad():
        for key, ref in expected.items():
            ref.copy_(tensors[key])
