"""Atomic file writes: the one way headwise writes a file (``write_bytes_atomic``).

A file is written to a temporary sibling, flushed and fsynced, then moved over the target with
``os.replace`` and the directory entry fsynced: after a crash or a full disk either the whole new
file is in place or the old one is untouched. It sits in the foundation layer so that every
package (control's LoRA files, training's checkpoints, interop's exports, pipeline's run files)
writes through it; ``headwise.training.safetensors_io`` re-exports it.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import BinaryIO

from headwise.errors import StorageError


def fsync_dir(path: Path) -> None:
    """Flush a directory entry (after creating or renaming files in it)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_bytes_atomic(path: Path, data: bytes) -> None:
    """Write ``data`` to ``path`` through a temporary file, fsync and ``os.replace``.

    Either the whole new file is in place afterwards or the old one is untouched.

    Raises:
        StorageError: the file cannot be written (disk full, permissions), naming ``path``;
            the temporary file is removed.
    """
    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    try:
        with open(tmp, "wb") as f:
            _write_all(f, data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
        fsync_dir(path.parent)
    except OSError as e:
        tmp.unlink(missing_ok=True)
        raise StorageError(f"{path}: cannot write ({e.strerror or e}); files written "
                           "before are intact") from None


def _write_all(f: BinaryIO, data: bytes) -> None:
    """``f.write(data)`` (one place for tests to simulate a full disk)."""
    f.write(data)
