"""Head addressing: selector grammar, errors naming selector and model shape, GQA kv mapping."""

from __future__ import annotations

import pytest
import torch

from headwise.errors import SelectorError
from headwise.heads import Head, HeadSet, is_selector, kv_head

L, H = 3, 4  # model shape used throughout: 3 layers x 4 heads


def heads_of(selector: object) -> list[tuple[int, int]]:
    return [(h.layer, h.head) for h in HeadSet.parse(selector, L, H)]  # type: ignore[arg-type]


@pytest.mark.parametrize("selector, expected", [
    ("L1.H2", [(1, 2)]),
    ("L1.*", [(1, 0), (1, 1), (1, 2), (1, 3)]),
    ("*.H0", [(0, 0), (1, 0), (2, 0)]),
    ("L0-2.H1-3", [(l, h) for l in range(3) for h in range(1, 4)]),
    ("L2.H3,L0.H0", [(0, 0), (2, 3)]),
    ("l1.h2", [(1, 2)]),
    (" L1.H2 , L0.H1 ", [(0, 1), (1, 2)]),
    ("L1.H2,L1.H2,L1.H1-2", [(1, 1), (1, 2)]),
    ("*.*", [(l, h) for l in range(3) for h in range(4)]),
    ("L1-1.H0-0", [(1, 0)]),
    (["L0.H1", "L2.*"], [(0, 1), (2, 0), (2, 1), (2, 2), (2, 3)]),
    (["L0.H1", Head(1, 3)], [(0, 1), (1, 3)]),
])
def test_selector_grammar(selector: object, expected: list[tuple[int, int]]) -> None:
    assert heads_of(selector) == expected


@pytest.mark.parametrize("selector", ["L3.H0", "L0.H4", "L0-3.H0", "L1.H2-9", "L9.*", "*.H4"])
def test_out_of_range_names_selector_and_shape(selector: str) -> None:
    with pytest.raises(SelectorError) as err:
        HeadSet.parse(selector, L, H)
    msg = str(err.value)
    assert selector in msg and "3 layers x 4 heads" in msg, msg


@pytest.mark.parametrize("selector", ["L1H2", "L1.", "foo", "", "L1.H-2", "L-1.H0", "H1.L2",
                                      "L1.H2.H3", "L1.H2;L0.H0", "L2-1.H0", "L0.H3-1"])
def test_malformed_names_selector_and_shape(selector: str) -> None:
    with pytest.raises(SelectorError) as err:
        HeadSet.parse(selector, L, H)
    msg = str(err.value)
    assert repr(selector.replace(" ", "")) in msg or selector in msg, msg
    assert "3 layers x 4 heads" in msg, msg


def test_non_string_part_is_rejected() -> None:
    with pytest.raises(SelectorError, match="3 layers x 4 heads"):
        HeadSet.parse(["L0.H0", 5], L, H)  # type: ignore[list-item]


def test_heads_validated_on_construction() -> None:
    with pytest.raises(SelectorError, match=r"L0\.H4.*3 layers x 4 heads"):
        HeadSet([Head(0, 4)], L, H)
    with pytest.raises(SelectorError, match=r"L-1\.H0"):
        HeadSet([Head(-1, 0)], L, H)


def test_head_parse_single() -> None:
    assert Head.parse("L2.H1", L, H) == Head(2, 1)
    assert str(Head(2, 1)) == "L2.H1"
    with pytest.raises(SelectorError, match="exactly one head"):
        Head.parse("L2.*", L, H)


def test_headset_operations() -> None:
    a = HeadSet.parse("L0.*", L, H)
    b = HeadSet.parse("*.H1", L, H)
    assert len(a | b) == 4 + 2
    assert list(a - b) == [Head(0, 0), Head(0, 2), Head(0, 3)]
    assert Head(0, 1) in a and Head(1, 0) not in a
    assert (a | b).layers == (0, 1, 2)
    assert (a | b).in_layer(2) == (1,)
    assert HeadSet.all(L, H) == HeadSet.parse("*.*", L, H)
    # str() is itself a selector that parses back to the same set
    s = HeadSet.parse("L0-1.H2-3,L2.H0", L, H)
    assert HeadSet.parse(str(s), L, H) == s
    assert hash(HeadSet.parse(str(s), L, H)) == hash(s)


@pytest.mark.parametrize("n_heads, n_kv", [(8, 8), (8, 4), (8, 2), (8, 1), (6, 3), (6, 2)])
def test_kv_head_matches_repeat_interleave(n_heads: int, n_kv: int) -> None:
    # HF's repeat_kv expands kv head g into n_heads // n_kv consecutive query heads.
    kv = torch.arange(n_kv)[:, None]  # one marker value per kv head
    expanded = torch.repeat_interleave(kv, n_heads // n_kv, dim=0)[:, 0]  # (n_heads,)
    assert [kv_head(h, n_heads, n_kv) for h in range(n_heads)] == expanded.tolist()


@pytest.mark.parametrize("text, expected", [
    ("L1.H2", True), ("l1.h2", True), ("*.*", True), (" L1.H2 , L0.* ", True),
    ("L2-1.H0", True),  # the grammar holds; the empty range is HeadSet.parse's error
    ("L99.H99", True),  # ranges are checked against a model, not here
    ("blocks.1.*", False), ("L1.H2,blocks.0.*", False), ("L1-.H2", False), ("L1.H", False),
    ("L1.H2.H3", False), ("", False), ("L1.H2;L0.H0", False),
])
def test_is_selector_is_the_grammar(text: str, expected: bool) -> None:
    """``is_selector`` accepts exactly what ``HeadSet.parse`` can read (given a large model)."""
    assert is_selector(text) is expected
    try:
        HeadSet.parse(text, 100, 100)
        parsed = True
    except SelectorError:
        parsed = False
    assert parsed is (expected and text != "L2-1.H0")
