"""TextTable: split into column groups that fit, never cut; Markdown, CSV and JSON whole
(parsed back with the standard library's csv and json)."""

from __future__ import annotations

import csv
import io
import json

import pytest
from rich.console import Console

from headwise.render.tables import TextTable

TABLE = TextTable("t", ("head", "previous_token", "previous_token_tl", "a|b", "top role"),
                  (("L0.H0", "0.50", "0.25", 'x "y"', "previous_token"),
                   ("L11.H11", "1.00", "-", "z", "none")), right=(1, 2))


def _render(table: TextTable, width: int) -> str:
    console = Console(width=width, file=io.StringIO(), record=True)
    for part in table.rich_tables(width):
        console.print(part)
    return console.export_text()


@pytest.mark.parametrize("width", [200, 60, 40])
def test_terminal_groups_fit_and_keep_every_name_whole(width: int) -> None:
    out = _render(TABLE, width)
    assert "…" not in out and max(len(line) for line in out.splitlines()) <= width
    headers = [[c.strip() for c in line.strip("┃").split("┃")] for line in out.splitlines()
               if line.startswith("┃")]
    assert all(h[0] == "head" for h in headers)  # the key column in every group
    assert [c for h in headers for c in h[1:]] == list(TABLE.columns[1:])
    assert (len(headers) == 1) == (width == 200)
    assert TABLE.column_groups(None) == [[0, 1, 2, 3, 4]]


def test_markdown_csv_and_json_hold_the_whole_table() -> None:
    rows = list(csv.reader(io.StringIO(TABLE.to_csv())))
    assert rows == [list(TABLE.columns), *map(list, TABLE.rows)]
    md = TABLE.to_markdown().splitlines()
    assert md[0] == "**t**"
    assert md[2] == "| head | previous_token | previous_token_tl | a\\|b | top role |"
    assert md[3] == "| --- | ---: | ---: | --- | --- |" and len(md) == 6
    data = json.loads(json.dumps(TABLE.to_dict()))
    assert data["rows"][1] == dict(zip(TABLE.columns, TABLE.rows[1], strict=True))


def test_bad_rows_are_refused() -> None:
    with pytest.raises(ValueError, match=r"rows\[1\]: got 1 cells, expected 2"):
        TextTable("t", ("a", "b"), (("1", "2"), ("3",)))
