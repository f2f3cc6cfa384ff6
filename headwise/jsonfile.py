"""Bounded reads: the one way headwise reads a file it was handed (bytes of bounded size), and a
JSON object from one.

A JSON file from a user or a downloaded checkpoint (an HF ``config.json``, an adapter config, a
forecaster) must be a regular file of bounded size holding one JSON object; anything else
(a directory, ``/dev/zero``, a 2 GB file, invalid UTF-8, 100000-deep nesting, a list) is
refused with one line naming the file, in the caller's error type.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

MAX_JSON_BYTES = 64 << 20  # configs and index files are kilobytes in practice


def read_bounded(path: Path, max_bytes: int, what: str,
                 error: Callable[[str], Exception] = ValueError) -> bytes:
    """The bytes of the regular file ``path``, refused (naming ``what`` and the file) when it is
    not one or holds more than ``max_bytes``: sizes are checked before anything is read."""
    if not path.is_file():
        raise error(f"{what}: {path} is not a regular file")
    size = path.stat().st_size
    if size > max_bytes:
        raise error(f"{what}: {path} has {size} bytes, expected at most {max_bytes}")
    return path.read_bytes()


def read_json_object(path: Path, error: Callable[[str], Exception] = ValueError,
                     max_bytes: int = MAX_JSON_BYTES) -> dict[str, Any]:
    """The JSON object in ``path``.

    Args:
        path: the file.
        error: builds the exception to raise from a message (an exception type, usually).
        max_bytes: the largest file accepted.

    Raises:
        error: ``path`` is missing or not a regular file, larger than ``max_bytes``, not
            UTF-8 JSON (or nested too deeply to parse), or not an object.
    """
    if not path.is_file():
        raise error(f"{path}: file not found" if not path.exists()
                    else f"{path}: not a regular file")
    size = path.stat().st_size
    if size > max_bytes:
        raise error(f"{path}: {size} bytes, expected a JSON file of at most {max_bytes} bytes")
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError, RecursionError) as e:
        # ValueError covers JSONDecodeError and integers over Python's 4300-digit limit
        raise error(f"{path}: not valid JSON ({str(e)[:200]})") from None
    if not isinstance(data, dict):
        raise error(f"{path}: got {type(data).__name__}, expected a JSON object")
    return data
