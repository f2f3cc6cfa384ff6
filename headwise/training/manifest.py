"""Integrity manifests: ``manifest.json`` lists the size and sha256 of every file of a checkpoint
or run.

A checkpoint directory's manifest covers ``model.safetensors``, ``trainer.safetensors`` and
``trainer.json``; a finished run's covers the files that define its model (``spec.yaml``,
``run.json``, ``config.json``, ``model.safetensors``) and every file a command reads or quotes
(``metrics.jsonl``, ``contract.json``, ``enforcement.json``, the reports, the results of
``verify`` with another spec): commands that write them later add them (``seal``); a report
may be deleted (it is rebuilt from the rest) but not edited. Every
command that reads a checkpoint or a run checks the files it lists first, so a flipped byte, a
truncated file or an edited ``trainer.json`` is refused (``CheckpointError`` naming the file)
instead of being used; a file's size is checked before it is hashed, so a swapped 100 GB file is
refused at once. A reader of a sealed file also refuses one the manifest does not list
(``check_sealed``). The manifest guards against corruption and accidental edits, not against a
deliberate forger who rewrites the manifest too.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

from headwise.atomic import write_bytes_atomic
from headwise.errors import CheckpointError
from headwise.jsonfile import read_json_object
from headwise.training.safetensors_io import sha256_file

MANIFEST = "manifest.json"
FORMAT = "headwise-manifest/1"
MAX_MANIFEST_BYTES = 1 << 20  # a few hundred bytes per listed file


@dataclass
class Listing:
    """A manifest's contents: ``name -> sha256``, ``name -> bytes`` (absent from manifests
    written before sizes were recorded) and the names that may be missing (regenerable
    outputs such as reports: deleting one forges nothing)."""

    sha256: dict[str, str]
    sizes: dict[str, int] = field(default_factory=dict)
    optional: set[str] = field(default_factory=set)

    def add(self, directory: Path, name: str) -> None:
        self.sha256[name] = sha256_file(directory / name)
        self.sizes[name] = (directory / name).stat().st_size

    def write(self, directory: Path) -> Path:
        data = {"format": FORMAT, "sha256": self.sha256, "bytes": self.sizes,
                "optional": sorted(self.optional)}
        write_bytes_atomic(directory / MANIFEST, json.dumps(data, indent=1).encode())
        return directory / MANIFEST


def write_manifest(directory: Path, names: Iterable[str]) -> Path:
    """Write ``directory/manifest.json`` with the size and sha256 of each named file
    (atomically)."""
    directory = Path(directory)
    listing = Listing({})
    for name in names:
        listing.add(directory, name)
    return listing.write(directory)


def seal(directory: Path, names: Iterable[str], optional: bool = False) -> None:
    """Add (or update) the named files in ``directory``'s manifest; the others stay as listed.

    Args:
        directory: a finished run.
        names: files in it.
        optional: the files may later be deleted (regenerable outputs such as reports); an
            edited one is still refused.

    Raises:
        CheckpointError: the manifest is missing or malformed (the run is not finished).
    """
    directory = Path(directory)
    listing = read_listing(directory)
    for name in names:
        listing.add(directory, name)
        (listing.optional.add if optional else listing.optional.discard)(name)
    listing.write(directory)


def read_listing(directory: Path) -> Listing:
    """``directory/manifest.json`` in full.

    Raises:
        CheckpointError: the manifest is missing, larger than ``MAX_MANIFEST_BYTES`` or
            malformed.
    """
    path = Path(directory) / MANIFEST
    if not path.is_file():
        raise CheckpointError(f"{path}: file not found; expected the integrity manifest that "
                              "headwise writes last (the directory is incomplete or not "
                              "written by headwise)")
    data = read_json_object(path, CheckpointError, MAX_MANIFEST_BYTES)
    files, sizes, optional = data.get("sha256"), data.get("bytes", {}), data.get("optional", [])
    if (data.get("format") != FORMAT or not isinstance(files, dict)
            or not all(isinstance(k, str) and "/" not in k and k not in ("", ".", "..")
                       and isinstance(v, str) for k, v in files.items())
            or not isinstance(sizes, dict)
            or not all(k in files and type(v) is int and v >= 0 for k, v in sizes.items())
            or not isinstance(optional, list) or not all(k in files for k in optional)):
        raise CheckpointError(f"{path}: expected a {FORMAT!r} object with a 'sha256' mapping "
                              "of file names to digests (and 'bytes' of their sizes)")
    return Listing(files, sizes, set(optional))


def verify_manifest(directory: Path, required: Iterable[str] = ()) -> dict[str, str]:
    """Check every file listed in ``directory/manifest.json`` against its size and sha256
    (an optional one only if present).

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
    listing = read_listing(directory)
    for name in required:
        if name not in listing.sha256:
            raise CheckpointError(f"{directory / MANIFEST}: does not list {name!r}; expected "
                                  "a manifest written by headwise")
    check_digests(directory, {n: d for n, d in listing.sha256.items()
                              if n not in listing.optional or (directory / n).exists()},
                  MANIFEST, listing.sizes)
    return listing.sha256


def check_sealed(directory: Path, names: Iterable[str]) -> None:
    """Refuse a file among ``names`` that is present in ``directory`` but not listed in its
    manifest (added or replaced after the run), or that differs from its listing.

    Raises:
        CheckpointError: naming the file.
    """
    directory = Path(directory)
    listing = read_listing(directory)
    names = [n for n in names if n in listing.sha256 or os.path.lexists(directory / n)]
    for name in names:
        if name not in listing.sha256:
            raise CheckpointError(f"{directory / name}: not listed in {MANIFEST}; expected a "
                                  "file written by headwise with the run (it was added or "
                                  "replaced afterwards)")
    check_digests(directory, {n: listing.sha256[n] for n in names}, MANIFEST, listing.sizes)


def check_digests(directory: Path, digests: dict[str, str], record: str,
                  sizes: dict[str, int] | None = None) -> None:
    """Refuse a listed file that is missing or whose size or sha256 differs from the record.

    Args:
        directory: where the files are.
        digests: ``file name -> sha256`` hex digest.
        record: the file the digests come from (named in the messages).
        sizes: ``file name -> bytes``, checked before hashing where given.

    Raises:
        CheckpointError: naming the file.
    """
    for name, digest in digests.items():
        file = directory / name
        if not file.is_file() or file.is_symlink():
            raise CheckpointError(f"{file}: file not found (listed in {record})"
                                  if not file.is_symlink() else
                                  f"{file}: is a symbolic link; expected the file listed in "
                                  f"{record} itself")
        size = (sizes or {}).get(name)
        if size is not None and file.stat().st_size != size:
            raise CheckpointError(f"{file}: contents do not match the sha256 recorded in "
                                  f"{record} (truncated or corrupt, or edited: "
                                  f"{file.stat().st_size} bytes, expected {size})")
        if sha256_file(file) != digest:
            raise CheckpointError(f"{file}: contents do not match the sha256 recorded in "
                                  f"{record} (truncated or corrupt, or edited)")
