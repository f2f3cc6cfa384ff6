"""Integrity manifests: ``manifest.json`` lists the sha256 of every file of a checkpoint or run.

A checkpoint directory's manifest covers ``model.safetensors``, ``trainer.safetensors`` and
``trainer.json``; a finished run's covers the files that define its model (``spec.yaml``,
``run.json``, ``config.json``, ``model.safetensors``). Every command that reads a checkpoint or
a run checks the files it lists first, so a flipped byte, a truncated file or an edited
``trainer.json`` is refused (``CheckpointError`` naming the file) instead of being used.
The manifest guards against corruption and accidental edits, not against a deliberate forger
who rewrites the manifest too.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path

from headwise.atomic import write_bytes_atomic
from headwise.errors import CheckpointError
from headwise.training.safetensors_io import sha256_file

MANIFEST = "manifest.json"
FORMAT = "headwise-manifest/1"


def write_manifest(directory: Path, names: Iterable[str]) -> Path:
    """Write ``directory/manifest.json`` with the sha256 of each named file (atomically)."""
    directory = Path(directory)
    files = {name: sha256_file(directory / name) for name in names}
    path = directory / MANIFEST
    write_bytes_atomic(path, json.dumps({"format": FORMAT, "sha256": files},
                                        indent=1).encode())
    return path


def read_manifest(directory: Path) -> dict[str, str]:
    """``file name -> sha256`` from ``directory/manifest.json``.

    Raises:
        CheckpointError: the manifest is missing or malformed.
    """
    path = Path(directory) / MANIFEST
    if not path.is_file():
        raise CheckpointError(f"{path}: file not found; expected the integrity manifest that "
                              "headwise writes last (the directory is incomplete or not "
                              "written by headwise)")
    try:
        data = json.loads(path.read_bytes())
    except (json.JSONDecodeError, UnicodeDecodeError, OSError) as e:
        raise CheckpointError(f"{path}: not a readable manifest ({str(e)[:100]})") from None
    files = data.get("sha256") if isinstance(data, dict) else None
    if (not isinstance(data, dict) or data.get("format") != FORMAT or not isinstance(files, dict)
            or not all(isinstance(k, str) and "/" not in k and k not in ("", ".", "..")
                       and isinstance(v, str) for k, v in files.items())):
        raise CheckpointError(f"{path}: expected a {FORMAT!r} object with a 'sha256' mapping "
                              "of file names to digests")
    return files


def verify_manifest(directory: Path, required: Iterable[str] = ()) -> dict[str, str]:
    """Check every file listed in ``directory/manifest.json`` against its sha256.

    Args:
        directory: a checkpoint or run directory.
        required: names the manifest must list.

    Returns:
        The manifest's ``name -> sha256``.

    Raises:
        CheckpointError: the manifest is missing or malformed, a required file is not listed,
            or a listed file is missing or differs (naming the file).
    """
    directory = Path(directory)
    files = read_manifest(directory)
    for name in required:
        if name not in files:
            raise CheckpointError(f"{directory / MANIFEST}: does not list {name!r}; expected "
                                  "a manifest written by headwise")
    check_digests(directory, files, MANIFEST)
    return files


def check_digests(directory: Path, digests: dict[str, str], record: str) -> None:
    """Refuse a listed file that is missing or whose sha256 differs from the recorded one.

    Args:
        directory: where the files are.
        digests: ``file name -> sha256`` hex digest.
        record: the file the digests come from (named in the messages).

    Raises:
        CheckpointError: naming the file.
    """
    for name, digest in digests.items():
        file = directory / name
        if not file.is_file():
            raise CheckpointError(f"{file}: file not found (listed in {record})")
        if sha256_file(file) != digest:
            raise CheckpointError(f"{file}: contents do not match the sha256 recorded in "
                                  f"{record} (truncated or corrupt, or edited)")
