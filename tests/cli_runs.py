"""What tests that drive runs through the CLI share: spec files, the in-process CLI, digests."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import pytest
import yaml
from safetensors.torch import load_file

from headwise.cli import main


def write_spec(spec: dict[str, Any], directory: Path, name: str = "spec.yaml",
               **train: Any) -> Path:
    """Write ``spec`` with ``train`` keys replaced as YAML to ``directory/name``; its path."""
    spec = json.loads(json.dumps(spec))  # a deep copy
    spec["train"].update(train)
    path = directory / name
    path.write_text(yaml.safe_dump(spec, sort_keys=False))
    return path


def cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    """Run ``headwise`` in this process: its exit code, stdout and stderr."""
    code = main([*argv])
    out, err = capsys.readouterr()
    return code, out, err


def digest(path: Path) -> str:
    """A digest of a weights file's tensors (safetensors' header order can vary by write)."""
    h = hashlib.sha256()
    for key, value in sorted(load_file(path).items()):
        h.update(key.encode())
        h.update(value.numpy().tobytes())
    return h.hexdigest()
