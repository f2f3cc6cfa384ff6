"""The computational graph of paths: nodes (embeddings, heads, MLPs, logits) and edges between them.

An **edge** is ``sender -> receiver``: the sender writes into the residual stream (the
embeddings, one head's output, one MLP's output) and the receiver reads it (one head's query,
key or value input, one MLP's input, or the logits). Text forms::

    embed -> L0.H1 via v        L0.H1 -> L1.H2 via k        L0.MLP -> L1.MLP
    L1.H2 -> logits             embed -> logits

A sender must sit below its receiver: a head of layer ``l`` reaches heads of layers ``> l``,
the MLP of its own layer and every later one, and the logits; an MLP of layer ``l`` reaches
layers ``> l`` and the logits. Under grouped-query attention a key or value receiver is the
input of a *kv head*, which every query head of its group reads: ``L1.H2 via k`` and
``L1.H3 via k`` name the same edge when query heads 2 and 3 share kv head 1, and
``all_edges`` names it by the group's first query head.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Literal

from torch import nn

from headwise.errors import SpecError
from headwise.heads import Head
from headwise.model.block import PostNormBlock

NodeKind = Literal["embed", "head", "mlp", "logits"]
VIAS = ("q", "k", "v")
_ORDER = {"embed": 0, "head": 1, "mlp": 2, "logits": 3}
_MLP = re.compile(r"^L([0-9]{1,9})\.MLP$", re.IGNORECASE)


@dataclass(frozen=True)
class Node:
    """One end of an edge: ``kind`` with its ``layer`` and ``head`` (-1 where they do not apply)."""

    kind: NodeKind
    layer: int = -1
    head: int = -1

    def __str__(self) -> str:
        if self.kind == "head":
            return str(Head(self.layer, self.head))
        return f"L{self.layer}.MLP" if self.kind == "mlp" else self.kind

    def sort_key(self) -> tuple[int, int, int]:
        """Forward order: embeddings, then layer by layer heads before the MLP, then logits."""
        layer = -1 if self.kind == "embed" else (1 << 30 if self.kind == "logits" else self.layer)
        return (layer, _ORDER[self.kind], self.head)


EMBED, LOGITS = Node("embed"), Node("logits")


@dataclass(frozen=True)
class Edge:
    """``sender -> receiver``; ``via``: ``q``, ``k`` or ``v`` for a head receiver, else ``None``."""

    sender: Node
    receiver: Node
    via: str | None = None

    def __str__(self) -> str:
        via = f" via {self.via}" if self.via else ""
        return f"{self.sender} -> {self.receiver}{via}"

    def sort_key(self) -> tuple[Any, ...]:
        return (self.receiver.sort_key(), VIAS.index(self.via) if self.via else 0,
                self.sender.sort_key())


@dataclass(frozen=True)
class Shape:
    """What the graph of a model depends on: its sizes, MLPs and norm order."""

    n_layers: int
    n_heads: int
    n_kv_heads: int
    has_mlp: bool
    post_norm: bool

    @property
    def group(self) -> int:
        """Query heads per kv head."""
        return self.n_heads // self.n_kv_heads


def model_shape(model: nn.Module) -> Shape:
    """The ``Shape`` of a headwise Transformer."""
    m: Any = model
    cfg = m.config
    return Shape(cfg.n_layers, cfg.n_heads, cfg.n_kv_heads, not cfg.attn_only,
                 isinstance(m.blocks[0], PostNormBlock))


def parse_node(text: str, shape: Shape, what: str = "node") -> Node:
    """``embed``, ``logits``, ``L1.MLP`` or a head ``L1.H2``.

    Raises:
        SpecError: naming ``what``, the text and what was expected.
    """
    t = text.strip()
    if t.lower() in ("embed", "logits"):
        return Node(t.lower())  # type: ignore[arg-type]
    match = _MLP.match(t)
    if match:
        layer = int(match.group(1))
        if not shape.has_mlp or layer >= shape.n_layers:
            raise SpecError(f"{what}: got {t!r}, expected an MLP of layers 0-{shape.n_layers - 1}"
                            + (" (the model is attention-only)" if not shape.has_mlp else ""))
        return Node("mlp", layer)
    try:
        head = Head.parse(t, shape.n_layers, shape.n_heads)
    except Exception:
        raise SpecError(f"{what}: got {t!r}, expected embed, logits, a head like L1.H2 or an "
                        f"MLP like L0.MLP ({shape.n_layers} layers x {shape.n_heads} heads)"
                        ) from None
    return Node("head", head.layer, head.head)


def make_edge(sender: Node, receiver: Node, via: str | None, shape: Shape,
              what: str = "edge") -> Edge:
    """A checked edge; a k/v receiver is named by its kv group's first query head.

    Raises:
        SpecError: a sender not below its receiver, a missing or extra ``via``.
    """
    label = f"{sender} -> {receiver}"
    if sender.kind not in ("embed", "head", "mlp"):
        raise SpecError(f"{what}: {label}: the sender must be embed, a head or an MLP")
    if receiver.kind not in ("head", "mlp", "logits"):
        raise SpecError(f"{what}: {label}: the receiver must be a head, an MLP or logits")
    if receiver.kind == "head":
        if via not in VIAS:
            raise SpecError(f"{what}: {label}: got via {via!r}, expected q, k or v for a head "
                            "receiver")
    elif via is not None:
        raise SpecError(f"{what}: {label}: got via {via!r}; only a head receiver has one")
    if not _below(sender, receiver):
        raise SpecError(f"{what}: {label}: the sender must be below the receiver (a head "
                        "reaches later layers and its own layer's MLP)")
    if receiver.kind == "head" and via in ("k", "v"):
        receiver = Node("head", receiver.layer, receiver.head - receiver.head % shape.group)
    return Edge(sender, receiver, via)


def parse_edge(text: str, shape: Shape, via: str | None = None, what: str = "edge") -> Edge:
    """Parse ``"L0.H1 -> L1.H2 via k"`` (or ``via`` given apart, as a clause's field).

    Raises:
        SpecError: naming ``what`` and what was expected.
    """
    body, _, tail = text.partition(" via ")
    if tail:
        if via is not None and via != tail.strip():
            raise SpecError(f"{what}: got via {tail.strip()!r} in {text!r} and {via!r} apart")
        via = tail.strip()
    ends = body.split("->")
    if len(ends) != 2:
        raise SpecError(f"{what}: got {text!r}, expected 'SENDER -> RECEIVER' such as "
                        "'L0.H1 -> L1.H2 via k'")
    return make_edge(parse_node(ends[0], shape, what), parse_node(ends[1], shape, what),
                     via, shape, what)


def _below(sender: Node, receiver: Node) -> bool:
    if sender.kind == "embed" or receiver.kind == "logits":
        return True
    if sender.kind == "head":
        return receiver.layer > sender.layer or (receiver.kind == "mlp"
                                                 and receiver.layer == sender.layer)
    return receiver.layer > sender.layer


def senders(shape: Shape) -> list[Node]:
    """Every sender in forward order."""
    out = [EMBED]
    for layer in range(shape.n_layers):
        out += [Node("head", layer, h) for h in range(shape.n_heads)]
        out += [Node("mlp", layer)] if shape.has_mlp else []
    return out


def receivers(shape: Shape) -> list[tuple[Node, str | None]]:
    """Every receiver input ``(node, via)`` in forward order (one per kv head for k and v)."""
    out: list[tuple[Node, str | None]] = []
    for layer in range(shape.n_layers):
        for via in VIAS:
            step = 1 if via == "q" else shape.group
            out += [(Node("head", layer, h), via) for h in range(0, shape.n_heads, step)]
        out += [(Node("mlp", layer), None)] if shape.has_mlp else []
    return out + [(LOGITS, None)]


def edges_into(receiver: Node, via: str | None, shape: Shape) -> list[Edge]:
    """Every edge into one receiver input (``via`` for a head; a k/v receiver named by its kv
    group's first query head), in forward order of the senders."""
    return [Edge(s, receiver, via) for s in senders(shape) if _below(s, receiver)]


def all_edges(model: nn.Module) -> list[Edge]:
    """Every edge of ``model``, ordered by receiver then sender."""
    shape = model_shape(model)
    return [Edge(s, r, via) for r, via in receivers(shape) for s in senders(shape)
            if _below(s, r)]
