"""TextTable: a titled table of strings, printed whole in the terminal, Markdown, CSV or JSON.

In the terminal no cell or column name is ever cut: a table wider than the console is split
into column groups that each fit, every group repeating the key columns (the head), the way
pandas wraps a wide frame. Markdown, CSV and JSON hold the whole table as it is.
"""

from __future__ import annotations

import csv
import io
from dataclasses import dataclass
from typing import Any

from rich.table import Table

FORMATS = ("table", "json", "csv", "md")
_CELL_EXTRA = 3  # rich's default box: one space each side and one border per column


@dataclass(frozen=True)
class TextTable:
    """Rows of cells under column names.

    Args:
        title: the table's caption.
        columns: the column names (C,).
        rows: each a tuple of C strings.
        key_columns: how many leading columns identify a row (repeated in every group when
            the terminal view splits the columns).
        right: indices of the columns aligned right (numbers).

    Raises:
        ValueError: a row whose length is not C, or ``key_columns`` outside [0, C].
    """

    title: str
    columns: tuple[str, ...]
    rows: tuple[tuple[str, ...], ...]
    key_columns: int = 1
    right: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        bad = [i for i, r in enumerate(self.rows) if len(r) != len(self.columns)]
        if bad:
            raise ValueError(f"rows[{bad[0]}]: got {len(self.rows[bad[0]])} cells, expected "
                             f"{len(self.columns)} (one per column)")
        if not 0 <= self.key_columns <= len(self.columns):
            raise ValueError(f"key_columns: got {self.key_columns}, expected 0-"
                             f"{len(self.columns)}")

    def widths(self) -> list[int]:
        """Each column's width in characters: its longest name or cell."""
        return [max([len(name)] + [len(r[j]) for r in self.rows])
                for j, name in enumerate(self.columns)]

    def column_groups(self, width: int | None) -> list[list[int]]:
        """Column indices of each terminal table: the key columns, then as many of the others
        as fit in ``width`` characters (at least one each); ``None``: one group."""
        keys = list(range(self.key_columns))
        rest = list(range(self.key_columns, len(self.columns)))
        if width is None or not rest:
            return [keys + rest]
        w = [x + _CELL_EXTRA for x in self.widths()]
        base = 1 + sum(w[j] for j in keys)
        groups: list[list[int]] = []
        used = width  # forces a new group for the first column
        for j in rest:
            if used + w[j] > width:
                groups.append(list(keys))
                used = base
            groups[-1].append(j)
            used += w[j]
        return groups

    def rich_tables(self, width: int | None = None) -> list[Table]:
        """Rich tables that show every name and cell whole in ``width`` characters."""
        groups = self.column_groups(width)
        out = []
        for g, cols in enumerate(groups):
            part = f" ({g + 1}/{len(groups)})" if len(groups) > 1 else ""
            table = Table(title=self.title + part)
            for j in cols:
                table.add_column(self.columns[j], no_wrap=True,
                                 justify="right" if j in self.right else "left")
            for r in self.rows:
                table.add_row(*(r[j] for j in cols))
            out.append(table)
        return out

    def to_markdown(self) -> str:
        """A GitHub-flavoured Markdown table under a bold title (``|`` escaped)."""
        def line(cells: tuple[str, ...]) -> str:
            return "| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |"

        sep = tuple("---:" if j in self.right else "---" for j in range(len(self.columns)))
        body = [line(self.columns), "| " + " | ".join(sep) + " |"]
        body += [line(r) for r in self.rows]
        return f"**{self.title}**\n\n" + "\n".join(body) + "\n"

    def to_csv(self) -> str:
        """The column names, then the rows (RFC 4180 quoting)."""
        buf = io.StringIO()
        writer = csv.writer(buf, lineterminator="\n")
        writer.writerow(self.columns)
        writer.writerows(self.rows)
        return buf.getvalue()

    def to_dict(self) -> dict[str, Any]:
        """``{"title", "columns", "rows": [{column: cell}]}`` (JSON-ready)."""
        return {"title": self.title, "columns": list(self.columns),
                "rows": [dict(zip(self.columns, r, strict=True)) for r in self.rows]}
