"""Head addressing: ``Head(layer, head)``, ``HeadSet`` and the selector syntax ``L0-2.H1-3``.

Grammar (whitespace ignored, case-insensitive ``L``/``H``)::

    selector := item ("," item)*
    item     := layer_part "." head_part
    layer_part := "*" | "L" range ;  head_part := "*" | "H" range
    range    := N | N "-" M          (inclusive)

Examples: ``L1.H2``, ``L1.*``, ``*.H0``, ``L0-2.H1-3``, ``L0.H0,L1.H3``.
Under grouped-query attention query head ``h`` of a layer reads kv head
``h // (n_heads // n_kv_heads)``; selectors always name *query* heads (see ``kv_head``).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any

from headwise.errors import SelectorError, show

# ASCII digits only ("L٠.H١" is not a selector), at most 9 of them (no 10000-digit ints).
_ITEM = re.compile(
    r"^(\*|L([0-9]{1,9})(?:-([0-9]{1,9}))?)\.(\*|H([0-9]{1,9})(?:-([0-9]{1,9}))?)$", re.IGNORECASE)


@dataclass(frozen=True, order=True)
class Head:
    """One attention head, addressed by layer and query-head index."""

    layer: int
    head: int

    def __str__(self) -> str:
        return f"L{self.layer}.H{self.head}"

    @classmethod
    def parse(cls, text: str, n_layers: int, n_heads: int) -> Head:
        """Parse a single-head selector such as ``L1.H2``.

        Raises:
            SelectorError: malformed, out of range, or naming more than one head.
        """
        heads = HeadSet.parse(text, n_layers, n_heads)
        if len(heads) != 1:
            raise SelectorError(f"{text!r}: expected exactly one head, got {len(heads)}")
        return next(iter(heads))


class HeadSet:
    """An ordered, immutable set of heads of a model with a known shape.

    Args:
        heads: the heads; each is validated against ``n_layers`` x ``n_heads``.
        n_layers: layers in the model.
        n_heads: query heads per layer.
    """

    def __init__(self, heads: Iterable[Head], n_layers: int, n_heads: int) -> None:
        self.n_layers = n_layers
        self.n_heads = n_heads
        items = sorted(set(heads))
        for h in items:
            _check_range(str(h), h.layer, h.head, n_layers, n_heads)
        self._heads: tuple[Head, ...] = tuple(items)

    @classmethod
    def parse(cls, selector: str | Iterable[str | Head], n_layers: int, n_heads: int) -> HeadSet:
        """Parse a selector string, or a list of selectors and Heads.

        Raises:
            SelectorError: names the offending selector and the model's shape.
        """
        if isinstance(selector, str):
            parts: list[str | Head] = [p for p in selector.split(",")]
        else:
            parts = list(selector)
        out: list[Head] = []
        for part in parts:
            if isinstance(part, Head):
                out.append(part)
                continue
            if not isinstance(part, str):
                raise SelectorError(f"{part!r}: expected a selector string like 'L1.H2'"
                                    f" ({n_layers} layers x {n_heads} heads)")
            out.extend(_parse_item(part.replace(" ", ""), n_layers, n_heads))
        return cls(out, n_layers, n_heads)

    @classmethod
    def all(cls, n_layers: int, n_heads: int) -> HeadSet:
        """Every head of the model."""
        return cls((Head(l, h) for l in range(n_layers) for h in range(n_heads)),
                   n_layers, n_heads)

    def in_layer(self, layer: int) -> tuple[int, ...]:
        """Head indices of this set that lie in ``layer``, ascending."""
        return tuple(h.head for h in self._heads if h.layer == layer)

    @property
    def layers(self) -> tuple[int, ...]:
        """Layers that contain at least one head of the set."""
        return tuple(sorted({h.layer for h in self._heads}))

    def __iter__(self) -> Iterator[Head]:
        return iter(self._heads)

    def __len__(self) -> int:
        return len(self._heads)

    def __contains__(self, item: object) -> bool:
        return item in self._heads

    def __eq__(self, other: object) -> bool:
        return isinstance(other, HeadSet) and self._heads == other._heads

    def __hash__(self) -> int:
        return hash(self._heads)

    def __or__(self, other: HeadSet) -> HeadSet:
        return HeadSet((*self._heads, *other._heads), self.n_layers, self.n_heads)

    def __sub__(self, other: HeadSet) -> HeadSet:
        return HeadSet((h for h in self._heads if h not in other), self.n_layers, self.n_heads)

    def __str__(self) -> str:
        return ",".join(str(h) for h in self._heads)

    def __repr__(self) -> str:
        return f"HeadSet({str(self)!r})"


def select_heads(model: Any, heads: Any, what: str = "heads") -> HeadSet:
    """Resolve ``heads`` against ``model.config``: a selector string, ``Head``, ``HeadSet`` or a
    list of them; ``None`` means every head.

    Raises:
        SelectorError: malformed or out-of-range selector, or a HeadSet of another shape
            (the message names ``what``, the selector and the model's shape).
    """
    cfg = getattr(model, "config", None)
    if cfg is None or not hasattr(cfg, "n_heads"):
        raise SelectorError(f"{what}: model {type(model).__name__} has no headwise config")
    n_layers, n_heads = cfg.n_layers, cfg.n_heads
    if heads is None:
        return HeadSet.all(n_layers, n_heads)
    if isinstance(heads, HeadSet):
        if (heads.n_layers, heads.n_heads) != (n_layers, n_heads):
            raise SelectorError(
                f"{what}: HeadSet {heads} is for {heads.n_layers} layers x {heads.n_heads} heads,"
                f" the model has {n_layers} layers x {n_heads} heads")
        return heads
    if isinstance(heads, Head):
        return HeadSet([heads], n_layers, n_heads)
    if isinstance(heads, str) or isinstance(heads, Iterable):
        return HeadSet.parse(heads, n_layers, n_heads)
    raise SelectorError(f"{what}: got {heads!r}, expected a selector like 'L1.H2', a Head or a "
                        "HeadSet")


def is_selector(text: str) -> bool:
    """Whether ``text`` is written in the selector grammar (each comma-separated item matches);
    ranges are not checked against a model (``HeadSet.parse`` does that)."""
    return all(_ITEM.match(part.replace(" ", "")) for part in text.split(","))


def kv_head(head: int, n_heads: int, n_kv_heads: int) -> int:
    """The kv head that query head ``head`` reads under GQA (HF ``repeat_kv`` order)."""
    return head // (n_heads // n_kv_heads)


def _check_range(sel: str, layer: int, head: int, n_layers: int, n_heads: int) -> None:
    if not (0 <= layer < n_layers):
        raise SelectorError(
            f"{sel}: layer {layer} out of range; the model has layers 0-{n_layers - 1}"
            f" ({n_layers} layers x {n_heads} heads)"
        )
    if not (0 <= head < n_heads):
        raise SelectorError(
            f"{sel}: layer {layer} has heads 0-{n_heads - 1}; got head {head}"
            f" ({n_layers} layers x {n_heads} heads)"
        )


def _parse_item(item: str, n_layers: int, n_heads: int) -> list[Head]:
    m = _ITEM.match(item)
    if not m:
        raise SelectorError(
            f"{show(item, 80)}: malformed head selector; expected forms like 'L1.H2', 'L1.*', "
            f"'*.H0', 'L0-2.H1-3' ({n_layers} layers x {n_heads} heads)"
        )
    layers = _span(item, m.group(1), m.group(2), m.group(3), n_layers, "layer", n_layers, n_heads)
    heads = _span(item, m.group(4), m.group(5), m.group(6), n_heads, "head", n_layers, n_heads)
    return [Head(l, h) for l in layers for h in heads]


def _span(item: str, whole: str, lo: str | None, hi: str | None, size: int, what: str,
          n_layers: int, n_heads: int) -> range:
    if whole == "*":
        return range(size)
    start = int(lo)  # type: ignore[arg-type]
    stop = int(hi) if hi is not None else start
    if stop < start:
        raise SelectorError(f"{item!r}: empty {what} range {start}-{stop}"
                            f" ({n_layers} layers x {n_heads} heads)")
    limit = n_layers if what == "layer" else n_heads
    if stop >= limit:
        if what == "layer":
            raise SelectorError(
                f"{item}: layer {stop} out of range; the model has layers 0-{n_layers - 1}"
                f" ({n_layers} layers x {n_heads} heads)")
        raise SelectorError(
            f"{item}: layer has heads 0-{n_heads - 1}; got head {stop}"
            f" ({n_layers} layers x {n_heads} heads)")
    return range(start, stop + 1)
