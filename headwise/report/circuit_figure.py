"""A circuit drawn on the model's grid: layers (rows) x heads, edges weighted by their effect.

Nodes sit at (head, layer): the embeddings below layer 0, each layer's MLP to the right of its
heads, the logits above the last layer. A head's node is split into three inputs (q left, k
centre, v right) so that an edge shows which input it enters; under grouped-query attention a
k / v edge enters the first query head of its kv group. Line width is proportional to
``|weight|`` (the largest drawn at 4 pt), colour says the input (q, k, v, MLP, logits), and
nodes the circuit touches are filled.
"""

from __future__ import annotations

from collections.abc import Mapping

from headwise.hooks.graph import Edge, Node
from headwise.render.figures import fig_png, pyplot

_COLOURS = {"q": "tab:blue", "k": "tab:orange", "v": "tab:green", None: "tab:purple"}
_OFFSET = {"q": -0.22, "k": 0.0, "v": 0.22, None: 0.0}


def _place(node: Node, n_layers: int, n_heads: int) -> tuple[float, float]:
    if node.kind == "embed":
        return (n_heads - 1) / 2, -1.0
    if node.kind == "logits":
        return (n_heads - 1) / 2, float(n_layers)
    if node.kind == "mlp":
        return float(n_heads), float(node.layer)
    return float(node.head), float(node.layer)


def circuit_figure(edges: Mapping[Edge, float], n_layers: int, n_heads: int,
                   title: str = "circuit", has_mlp: bool = True) -> bytes:
    """PNG bytes of ``edges`` (edge -> weight, e.g. each edge's drop or attribution).

    Args:
        edges: the circuit's edges and their weights (signs are ignored for the width).
        n_layers, n_heads: the model's grid.
        title: the figure's title.
        has_mlp: draw each layer's MLP (``False`` for an attention-only model).
    """
    fig, ax = pyplot().subplots(figsize=(max(4.0, 0.8 * (n_heads + 2)),
                                         max(3.0, 0.9 * (n_layers + 2))))
    used = {n for e in edges for n in (e.sender, e.receiver)}
    top = max((abs(w) for w in edges.values()), default=0.0) or 1.0
    for layer in range(n_layers):
        for head in range(n_heads):
            node = Node("head", layer, head)
            ax.scatter([head], [layer], s=260, zorder=3, edgecolors="black",
                       c="gold" if node in used else "white")
        if has_mlp:
            ax.scatter([n_heads], [layer], s=260, marker="s", zorder=3, edgecolors="black",
                       c="gold" if Node("mlp", layer) in used else "white")
    for node in (Node("embed"), Node("logits")):
        x, y = _place(node, n_layers, n_heads)
        ax.scatter([x], [y], s=400, marker="D", zorder=3, edgecolors="black",
                   c="gold" if node in used else "white")
        ax.annotate(node.kind, (x, y), textcoords="offset points", xytext=(14, -4), fontsize=8)
    for edge, weight in sorted(edges.items(), key=lambda item: abs(item[1])):
        x0, y0 = _place(edge.sender, n_layers, n_heads)
        x1, y1 = _place(edge.receiver, n_layers, n_heads)
        x1 += _OFFSET[edge.via] if edge.receiver.kind == "head" else 0.0
        colour = _COLOURS[edge.via if edge.receiver.kind == "head" else None]
        ax.annotate("", (x1, y1 - 0.12), (x0, y0 + 0.12), zorder=2,
                    arrowprops={"arrowstyle": "-|>", "color": colour,
                                "lw": 0.5 + 3.5 * abs(weight) / top, "alpha": 0.85,
                                "connectionstyle": "arc3,rad=0.12"})
    for via, colour in _COLOURS.items():
        ax.plot([], [], color=colour, lw=2, label=f"via {via}" if via else "MLP / logits")
    ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=8, frameon=False)
    ax.set_xticks(list(range(n_heads + has_mlp)),
                  [f"H{h}" for h in range(n_heads)] + ["MLP"] * has_mlp)
    ax.set_yticks(range(n_layers), [f"L{l}" for l in range(n_layers)])
    ax.set_xlim(-0.8, n_heads - 1 + has_mlp + 0.8)
    ax.set_ylim(-1.6, n_layers + 0.6)
    ax.set_title(title)
    for side in ("top", "right"):
        ax.spines[side].set_visible(False)
    return fig_png(fig)
