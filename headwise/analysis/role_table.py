"""RoleTable: role scores of heads (heads x roles), with lookup, top role, JSON and rich views."""

from __future__ import annotations

import io
import math
from collections.abc import Iterable, Sequence
from typing import Any

import torch
from rich.console import Console
from rich.table import Table
from torch import Tensor

from headwise.heads import Head
from headwise.render.html import esc, fmt
from headwise.render.tables import TextTable

# Roles that describe *where* a head attends; ``top_role`` picks among these.
TOP_ROLE_CANDIDATES = ("previous_token", "induction", "duplicate_token", "first_token", "self",
                       "next_token")


def _head(head: Head | str) -> Head:
    if isinstance(head, Head):
        return head
    text = head.strip().upper()
    try:
        layer, h = text.split(".")
        return Head(int(layer.lstrip("L")), int(h.lstrip("H")))
    except ValueError:
        raise ValueError(f"head: got {head!r}, expected a single head like 'L1.H2'") from None


# Tables and reports name a head's top role only when its score reaches this; below it a head
# shows "none" rather than the largest of several near-zero scores.
SHOWN_MIN_SCORE = 0.25


class RoleTable:
    """Scores of ``heads`` (rows) on ``roles`` (columns); NaN where a role is undefined on the data.

    Args:
        heads: the scored heads, in row order.
        roles: role names, in column order.
        values: (n_heads, n_roles) scores.
        info: how the scores were obtained (probe sampling, window, period, ...), JSON-ready.
        stderr: (n_heads, n_roles) standard errors of the scores over groups of probe
            sequences (``role_scores``), NaN where unknown; ``None``: all unknown.
        skew: (n_heads, n_roles) skewnesses of the probe sequences' linearised values
            (``ratio_skewness``), which a score's bound corrects for; NaN where unknown;
            ``None``: all unknown.
    """

    def __init__(self, heads: Sequence[Head], roles: Sequence[str], values: Tensor,
                 info: dict[str, Any] | None = None, stderr: Tensor | None = None,
                 skew: Tensor | None = None) -> None:
        if values.shape != (len(heads), len(roles)):
            raise ValueError(f"values: got shape {tuple(values.shape)}, expected "
                             f"({len(heads)}, {len(roles)}) for heads x roles")
        for name, extra in (("stderr", stderr), ("skew", skew)):
            if extra is not None and extra.shape != values.shape:
                raise ValueError(f"{name}: got shape {tuple(extra.shape)}, expected "
                                 f"{tuple(values.shape)} like values")
        self.heads = list(heads)
        self.roles = list(roles)
        self.values = values.detach().double().cpu()
        self.stderr, self.skew = (torch.full_like(self.values, math.nan) if x is None
                                  else x.detach().double().cpu() for x in (stderr, skew))
        self.info = dict(info or {})
        self._row = {h: i for i, h in enumerate(self.heads)}
        self._col = {r: j for j, r in enumerate(self.roles)}

    def get(self, head: Head | str, role: str) -> float:
        """One score.

        Raises:
            KeyError: the head or role is not in the table (the message lists what is).
        """
        h = _head(head)
        if h not in self._row:
            raise KeyError(f"head {h} not scored; scored heads: {[str(x) for x in self.heads]}")
        if role not in self._col:
            raise KeyError(f"role {role!r} not scored; roles: {self.roles}")
        return float(self.values[self._row[h], self._col[role]])

    def error(self, head: Head | str, role: str) -> float:
        """One score's standard error (NaN where unknown); ``KeyError`` as ``get``."""
        self.get(head, role)
        return float(self.stderr[self._row[_head(head)], self._col[role]])

    def skewness(self, head: Head | str, role: str) -> float:
        """One score's skewness (NaN where unknown); ``KeyError`` as ``get``."""
        self.get(head, role)
        return float(self.skew[self._row[_head(head)], self._col[role]])

    def column(self, role: str) -> dict[Head, float]:
        """``{head: score}`` for one role."""
        return {h: self.get(h, role) for h in self.heads}

    def top_role(self, head: Head | str, min_score: float = 0.0,
                 candidates: Iterable[str] = TOP_ROLE_CANDIDATES) -> str:
        """The candidate role with the highest score, or ``"none"`` if no score reaches
        ``min_score`` (NaN scores never win)."""
        best, best_role = -math.inf, "none"
        for role in candidates:
            if role not in self._col:
                continue
            v = self.get(head, role)
            if not math.isnan(v) and v > best:
                best, best_role = v, role
        return best_role if best >= min_score else "none"

    def to_records(self) -> list[dict[str, Any]]:
        """``[{"layer", "head", role: value, ...}]``; NaN becomes ``None`` (valid JSON)."""
        out = []
        for i, h in enumerate(self.heads):
            rec: dict[str, Any] = {"layer": h.layer, "head": h.head}
            for j, r in enumerate(self.roles):
                v = float(self.values[i, j])
                rec[r] = None if math.isnan(v) else v
            out.append(rec)
        return out

    @classmethod
    def from_records(cls, records: Sequence[dict[str, Any]],
                     info: dict[str, Any] | None = None) -> RoleTable:
        """Inverse of ``to_records`` (``None`` back to NaN)."""
        heads = [Head(int(r["layer"]), int(r["head"])) for r in records]
        roles = [k for k in (records[0] if records else {}) if k not in ("layer", "head")]
        vals = torch.tensor([[math.nan if r[k] is None else float(r[k]) for k in roles]
                             for r in records], dtype=torch.float64).reshape(len(heads),
                                                                             len(roles))
        return cls(heads, roles, vals, info)

    def to_text_table(self, title: str = "role scores") -> TextTable:
        """One row per head, one column per role (scores to 2 decimals), plus the top role."""
        rows = []
        for i, h in enumerate(self.heads):
            cells = []
            for j in range(len(self.roles)):
                v = float(self.values[i, j])
                cells.append("-" if math.isnan(v) else f"{v:.2f}")
            rows.append((str(h), *cells, self.top_role(h, SHOWN_MIN_SCORE)))
        return TextTable(title, ("head", *self.roles, "top role"), tuple(rows),
                         right=tuple(range(1, len(self.roles) + 1)))

    def to_rich_table(self, title: str = "role scores") -> Table:
        """``to_text_table`` as one rich Table (every column; the CLI splits wide ones)."""
        return self.to_text_table(title).rich_tables()[0]

    def __str__(self) -> str:
        console = Console(width=200, record=True, file=io.StringIO())
        console.print(self.to_rich_table())
        return console.export_text()

    def __repr__(self) -> str:
        return f"RoleTable({len(self.heads)} heads x {self.roles})"

    def _repr_html_(self) -> str:
        """Jupyter rendering: ``role_table_html``."""
        return role_table_html(self)


def role_table_html(roles: RoleTable, min_score: float | None = None) -> str:
    """A RoleTable as an HTML table: scores shaded white (0) to blue (1), top role last.

    Args:
        roles: the table.
        min_score: a head's top role is shown when it scores at least this (default the
            tables' ``SHOWN_MIN_SCORE``; below it: ``none``).
    """
    shown = SHOWN_MIN_SCORE if min_score is None else min_score
    head = "".join(f"<th>{esc(r)}</th>" for r in roles.roles)
    rows = []
    for i, h in enumerate(roles.heads):
        cells = []
        for v in roles.values[i].tolist():
            alpha = 0.0 if math.isnan(v) else max(0.0, min(1.0, v))
            cells.append(f'<td style="background:rgba(37,99,235,{alpha:.2f});'
                         f'text-align:right">{esc(fmt(None if math.isnan(v) else v))}</td>')
        rows.append(f'<tr><th style="text-align:left">{esc(h)}</th>{"".join(cells)}'
                    f"<td>{esc(roles.top_role(h, shown))}</td></tr>")
    return (f'<table class="hw-roles"><tr><th>head</th>{head}<th>top role</th></tr>'
            f"{''.join(rows)}</table>")
