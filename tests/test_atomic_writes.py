"""Every file writer goes through the one atomic write (``headwise.atomic.write_bytes_atomic``).

A simulated full disk (the write stops half-way with ENOSPC) must surface as a ``StorageError``
(or, for a file named by a CLI option, a ``SpecError``) from every writer, leave no temporary
file behind, and leave the files of the previous write byte for byte as they were. A writer
with its own ``open``/``save_file`` would write the file whole and raise nothing.
"""

from __future__ import annotations

import errno
from pathlib import Path
from typing import BinaryIO

import pytest
from lora_models import lora_model

from headwise import atomic
from headwise.cli.output import write_file
from headwise.config import ModelConfig
from headwise.control.lora import save_lora
from headwise.errors import SpecError, StorageError
from headwise.interop.hf_export import export_hf
from headwise.interop.load import convert
from headwise.interop.peft_export import export_peft
from headwise.model import build_model
from headwise.training.manifest import write_manifest
from headwise.training.safetensors_io import save_weights

CONFIG = ModelConfig(n_layers=1, n_heads=2, d_model=12, d_ff=20, vocab_size=17, max_seq_len=8,
                     activation="gelu_tanh")


@pytest.fixture
def full_disk(monkeypatch):
    """Turn on a disk that fills up half-way through every atomic write."""

    def enable() -> None:
        def half(f: BinaryIO, data: bytes) -> None:
            f.write(data[: len(data) // 2])
            raise OSError(errno.ENOSPC, "No space left on device")

        monkeypatch.setattr(atomic, "_write_all", half)

    return enable


def _files(d: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(d.iterdir()) if p.is_file()}


def _manifest(d: Path, seed: int) -> None:
    if seed == 0:
        (d / "a.txt").write_text("a")
    write_manifest(d, ["a.txt"])


def _convert(d: Path, seed: int) -> None:
    hf = d.parent / "hf"
    if seed == 0:
        export_hf(build_model(CONFIG, seed=0), hf)
    convert(hf, d, overwrite=True)


WRITERS = {
    "save_lora": lambda d, seed: save_lora(lora_model(CONFIG, seed), d, overwrite=True),
    "export_peft": lambda d, seed: export_peft(lora_model(CONFIG, seed), d, "gpt2", overwrite=True),
    "save_weights": lambda d, seed: save_weights(build_model(CONFIG, seed=seed),
                                                 d / "model.safetensors"),
    "write_manifest": _manifest,
    "convert": _convert,
}


@pytest.mark.parametrize("writer", list(WRITERS))
def test_a_full_disk_leaves_the_previous_files(tmp_path, full_disk, writer):
    d = tmp_path / "out"
    d.mkdir()
    WRITERS[writer](d, 0)
    before = _files(d)
    assert before
    full_disk()
    with pytest.raises(StorageError, match="cannot write"):
        WRITERS[writer](d, 1)
    assert _files(d) == before  # no temporary file left, nothing half-written


def test_export_hf_and_cli_output_files_write_atomically(tmp_path, full_disk):
    model = build_model(CONFIG, seed=0)
    full_disk()
    with pytest.raises(StorageError, match="cannot write"):
        export_hf(model, tmp_path / "hf")
    assert [p.name for p in (tmp_path / "hf").iterdir()] == []
    target = tmp_path / "table.json"
    target.write_text("old")
    with pytest.raises(SpecError, match="--json: cannot write"):
        write_file(str(target), "new", "--json")
    assert [p.name for p in tmp_path.iterdir() if p.is_file()] == ["table.json"]
    assert target.read_text() == "old"
