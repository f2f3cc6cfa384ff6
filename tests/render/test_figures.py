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


def test_a_diverging_scale_keeps_negligible_effects_pale() -> None:
    """A +-0.001 drop (printed 0.00) must not fill the scale: with a floor of 0.05 it sits at
    2% of the half-width; without one the largest value sets the scale; None and NaN skip."""
    from headwise.render.figures import symmetric_limit

    tiny = [[0.001, -0.0004], [None, float("nan")]]
    assert symmetric_limit(tiny, floor=0.05) == 0.05
    assert symmetric_limit(tiny) == 0.001
    assert symmetric_limit([[0.3, -0.7]], floor=0.05) == 0.7
    assert symmetric_limit([[None]]) == 1.0
