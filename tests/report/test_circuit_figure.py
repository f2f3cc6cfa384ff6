"""The circuit figure: a PNG of any circuit on the model's grid, the empty one included."""

from __future__ import annotations

from headwise.hooks.graph import Shape, parse_edge
from headwise.report.circuit_figure import circuit_figure

PNG = b"\x89PNG\r\n\x1a\n"


def test_a_circuit_and_the_empty_one_draw() -> None:
    shape = Shape(n_layers=3, n_heads=4, n_kv_heads=2, has_mlp=True, post_norm=False)
    edges = {parse_edge(t, shape): w for t, w in [
        ("embed -> L0.H1 via v", 0.4), ("L0.H1 -> L2.H3 via k", -0.8),
        ("L0.MLP -> L1.MLP", 0.1), ("L2.H3 -> logits", 0.0)]}
    assert circuit_figure(edges, 3, 4, "a circuit").startswith(PNG)
    assert circuit_figure({}, 3, 4, has_mlp=False).startswith(PNG)
