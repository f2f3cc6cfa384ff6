"""``ByteTokenizer`` and ``byte_name`` against the bytes of the text, written out."""

from __future__ import annotations

import pytest

from headwise.errors import ConfigError
from headwise.model.byte_tokenizer import ByteTokenizer, byte_name


def test_every_byte_has_a_distinct_visible_name() -> None:
    names = [byte_name(i) for i in range(256)]
    assert len(set(names)) == 256
    assert all(name and not name.isspace() and name.isprintable() for name in names)
    assert [byte_name(i) for i in b"a Z~"] == ["a", "\u2423", "Z", "~"]
    assert [byte_name(i) for i in (0, 9, 10, 13, 27, 127, 200)] == [
        "\\x00", "\\t", "\\n", "\\r", "\\x1b", "\\x7f", "\\xc8"]


def test_to_tokens_pads_truncates_and_masks() -> None:
    tok = ByteTokenizer()
    text = ["é!", "abcd"]  # é is two bytes
    tokens, mask = tok.to_tokens(text, padding_side="left")
    assert tokens.tolist() == [[0, *"é!".encode()], list(b"abcd")]
    assert mask.tolist() == [[0, 1, 1, 1], [1, 1, 1, 1]]
    tokens, mask = tok.to_tokens(text, max_len=2)
    assert tokens.tolist() == [list("é".encode()), list(b"ab")] and mask.all()
    assert tok.decode(list("é!".encode())) == "é!"
    assert tok.decode([0xC3]) == "\ufffd"  # half a character: the replacement character


@pytest.mark.parametrize("input, kwargs, message", [
    ("", {"prepend_bos": True}, "prepend_bos: got True"),
    ([], {}, "input: got"),
    ("a", {"padding_side": "middle"}, "padding_side: got 'middle'"),
])
def test_bad_input_is_named(input, kwargs: dict, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        ByteTokenizer().to_tokens(input, **kwargs)
