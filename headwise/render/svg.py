"""Small multiples as one inline SVG: a grid of small line charts sharing axes and a legend.

One figure for every head's score trajectories: written as text (no plotting library, no
raster), so a report with hundreds of heads costs milliseconds here and scales in the browser.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

from headwise.render.html import esc

# A colour per series name, in order of first appearance (matplotlib's tab10).
PALETTE = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2",
           "#7f7f7f", "#bcbd22", "#17becf")
PANEL_W, PANEL_H, PAD, TITLE_H, COLUMNS = 150, 80, 8, 14, 6


def _path(xs: Sequence[float], ys: Sequence[float | None], x0: float, y0: float,
          x_span: tuple[float, float], y_span: tuple[float, float]) -> str:
    """SVG path data of one series in a panel at (x0, y0); a gap where a value is missing."""
    (xa, xb), (ya, yb) = x_span, y_span
    out, pen = [], "M"
    for x, y in zip(xs, ys, strict=True):
        if y is None or not math.isfinite(y):
            pen = "M"
            continue
        px = x0 + (x - xa) / ((xb - xa) or 1.0) * PANEL_W
        py = y0 + PANEL_H - (min(max(y, ya), yb) - ya) / ((yb - ya) or 1.0) * PANEL_H
        out.append(f"{pen}{px:.1f},{py:.1f}")
        pen = "L"
    return " ".join(out)


def small_multiples(x: Sequence[float],
                    panels: Sequence[tuple[str, Mapping[str, Sequence[float | None]]]],
                    title: str, y_span: tuple[float, float] = (0.0, 1.0)) -> str:
    """An ``<svg>`` grid: one panel per ``(label, {series: values over x})``, every panel on
    the same axes (``x`` from its first to its last value, ``y_span``), one legend."""
    names: list[str] = []
    for _, series in panels:
        names += [n for n in series if n not in names]
    colour = {n: PALETTE[i % len(PALETTE)] for i, n in enumerate(names)}
    cols = min(COLUMNS, max(1, len(panels)))
    rows = math.ceil(len(panels) / cols)
    cell_w, cell_h = PANEL_W + 2 * PAD, PANEL_H + TITLE_H + 2 * PAD
    legend_h = 18
    width, height = cols * cell_w, rows * cell_h + legend_h
    x_span = (float(x[0]), float(x[-1])) if len(x) else (0.0, 1.0)
    parts = [f'<svg width="{width}" height="{height}" '
             f'viewBox="0 0 {width} {height}" font-family="sans-serif" font-size="10" '
             f'role="img"><title>{esc(title)}</title>']
    for i, n in enumerate(names):  # the legend
        lx = PAD + i * 110
        parts.append(f'<line x1="{lx}" y1="9" x2="{lx + 14}" y2="9" stroke="{colour[n]}" '
                     f'stroke-width="2"/><text x="{lx + 18}" y="13">{esc(n)}</text>')
    for k, (label, series) in enumerate(panels):
        x0 = (k % cols) * cell_w + PAD
        y0 = legend_h + (k // cols) * cell_h + PAD + TITLE_H
        parts.append(f'<text x="{x0}" y="{y0 - 3}">{esc(label)}</text>'
                     f'<rect x="{x0}" y="{y0}" width="{PANEL_W}" height="{PANEL_H}" '
                     f'fill="none" stroke="#ccc"/>')
        for n, ys in series.items():
            d = _path(x, ys, x0, y0, x_span, y_span)
            if d:
                parts.append(f'<path d="{d}" fill="none" stroke="{colour[n]}" '
                             f'stroke-width="1.2"/>')
    parts.append("</svg>")
    return "".join(parts)
