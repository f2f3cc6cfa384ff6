"""Matplotlib figures rendered to PNG bytes and data URIs (for self-contained HTML reports)."""

from __future__ import annotations

import base64
import io
import math
from collections.abc import Mapping, Sequence
from types import ModuleType
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from matplotlib.figure import Figure


def pyplot() -> ModuleType:
    """``matplotlib.pyplot`` on the Agg backend, imported when a figure is first drawn (a
    command that draws none, such as ``verify``, never pays for it)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def fig_png(fig: Figure) -> bytes:
    """PNG bytes of ``fig`` (then closed)."""
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=90, bbox_inches="tight")
    pyplot().close(fig)
    return buf.getvalue()


def data_uri(png: bytes) -> str:
    """``data:image/png;base64,...`` for embedding without external files."""
    return "data:image/png;base64," + base64.b64encode(png).decode("ascii")


def _clean(v: float | None) -> float:
    return float("nan") if v is None else float(v)


def symmetric_limit(matrix: Sequence[Sequence[float | None]], floor: float = 0.0) -> float:
    """The half-width of a diverging colour scale centred on 0: the largest ``|value|``, but
    at least ``floor``, so that effects too small to matter (a +-0.001 drop, printed ``0.00``)
    stay pale instead of filling the scale; 1 when there is nothing to scale."""
    values = [abs(float(v)) for row in matrix for v in row
              if v is not None and math.isfinite(float(v))]
    return max(max(values, default=0.0), floor) or 1.0


def heatmap(matrix: Sequence[Sequence[float | None]], title: str,
            xlabels: Sequence[str] | None = None, ylabels: Sequence[str] | None = None,
            cmap: str = "viridis", vmin: float | None = None, vmax: float | None = None,
            annotate: bool = False) -> bytes:
    """A labelled heatmap (rows = ylabels) as PNG bytes; ``None`` cells are blank (see
    ``heatmap_figure``)."""
    return fig_png(heatmap_figure(matrix, title, xlabels, ylabels, cmap, vmin, vmax, annotate))


def heatmap_figure(matrix: Sequence[Sequence[float | None]], title: str,
                   xlabels: Sequence[str] | None = None, ylabels: Sequence[str] | None = None,
                   cmap: str = "viridis", vmin: float | None = None,
                   vmax: float | None = None, annotate: bool = False) -> Figure:
    """The heatmap's matplotlib figure (the caller closes it, or ``fig_png`` does).

    Every row and column gets its label (``L3.H4``, not matplotlib's 0, 10, 20 ticks): the
    figure grows with the number of rows and columns, so labels never overlap. Cells are
    annotated with their values when asked and at most 400.
    """
    data = [[_clean(v) for v in row] for row in matrix]
    n_rows, n_cols = len(data), len(data[0]) if data else 0
    row_in, col_in = (0.35 if n_rows <= 32 else 0.16), (0.45 if n_cols <= 32 else 0.16)
    fig, ax = pyplot().subplots(figsize=(max(3.0, col_in * n_cols + 1.5),
                                    max(2.5, row_in * n_rows + 1)))
    im = ax.imshow(data, cmap=cmap, vmin=vmin, vmax=vmax, aspect="auto",
                   interpolation="nearest")
    fig.colorbar(im, ax=ax, fraction=0.046, pad=0.04)
    ax.set_title(title, fontsize=9)
    if xlabels is not None:
        ax.set_xticks(range(len(xlabels)), list(xlabels), rotation=60, ha="right",
                      fontsize=7 if n_cols <= 32 else 6)
    if ylabels is not None:
        ax.set_yticks(range(len(ylabels)), list(ylabels), fontsize=7 if n_rows <= 32 else 6)
    if annotate and n_rows * n_cols <= 400:
        for i, row in enumerate(data):
            for j, v in enumerate(row):
                if v == v:
                    text = f"{v:.2f}"
                    r, g, b, _ = im.cmap(im.norm(np.asarray(v)))  # readable on any cell
                    dark = 0.299 * r + 0.587 * g + 0.114 * b < 0.5
                    ax.text(j, i, "0.00" if text == "-0.00" else text, ha="center",
                            va="center", fontsize=6, color="white" if dark else "black")
    return fig


def side_by_side(left: Sequence[Sequence[float]], right: Sequence[Sequence[float]],
                 titles: tuple[str, str], suptitle: str) -> bytes:
    """Two (T, T) patterns next to each other on a shared [0, 1] scale."""
    fig, axes = pyplot().subplots(1, 2, figsize=(7, 3.4))
    for ax, m, t in zip(axes, (left, right), titles, strict=True):
        im = ax.imshow(m, cmap="Blues", vmin=0, vmax=1, interpolation="nearest")
        ax.set_title(t, fontsize=9)
        ax.set_xlabel("key", fontsize=8)
        ax.set_ylabel("query", fontsize=8)
    fig.colorbar(im, ax=list(axes), fraction=0.03)
    fig.suptitle(suptitle, fontsize=10)
    return fig_png(fig)


def lines(x: Sequence[float], series: Mapping[str, Sequence[float | None]], title: str,
          xlabel: str = "step", ylabel: str = "score",
          ylim: tuple[float, float] | None = (-0.02, 1.02)) -> bytes:
    """One line per series over ``x`` (``ylim=None``: fit the data)."""
    fig, ax = pyplot().subplots(figsize=(5, 2.8))
    for name, ys in series.items():
        ax.plot(list(x), [_clean(v) for v in ys], label=name, marker=".", markersize=3)
    ax.set_title(title, fontsize=9)
    ax.set_xlabel(xlabel, fontsize=8)
    ax.set_ylabel(ylabel, fontsize=8)
    if ylim is not None:
        ax.set_ylim(*ylim)
    ax.legend(fontsize=6, loc="best")
    return fig_png(fig)
