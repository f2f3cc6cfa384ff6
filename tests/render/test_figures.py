"""Heatmaps label every row and column, on any size, without labels overlapping (measured on
matplotlib's own rendered text extents)."""

from __future__ import annotations

import matplotlib.pyplot as plt
import pytest

from headwise.render.figures import heatmap, heatmap_figure


@pytest.mark.parametrize("n_layers,n_heads", [(1, 4), (6, 12)])
def test_every_head_row_is_labelled_and_readable(n_layers: int, n_heads: int) -> None:
    heads = [f"L{l}.H{h}" for l in range(n_layers) for h in range(n_heads)]
    roles = ["previous_token", "previous_token_tl", "induction"]
    fig = heatmap_figure([[0.5] * 3 for _ in heads], "roles", roles, heads)
    try:
        fig.canvas.draw()
        ax = fig.axes[0]
        ys = ax.get_yticklabels()
        assert [t.get_text() for t in ys] == heads  # L3.H4, not 0, 10, 20
        assert [t.get_text() for t in ax.get_xticklabels()] == roles
        boxes = [t.get_window_extent() for t in ys]
        assert all(a.y0 >= b.y1 or b.y0 >= a.y1 for a, b in zip(boxes, boxes[1:], strict=False))
        assert min(t.get_fontsize() for t in ys) >= 6
    finally:
        plt.close(fig)
    assert heatmap([[0.5]], "one", ["r"], ["L0.H0"]).startswith(b"\x89PNG")
