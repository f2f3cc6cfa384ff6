"""Token names: the synthetic layout, bytes, and a tokenizer's own strings (against
transformers' tokenizer on the same vocabulary)."""

from __future__ import annotations

import torch

from headwise.data.token_names import token_names


def test_synthetic_layout_names_specials_markers_and_symbols() -> None:
    # headwise.data.batch: PAD 0, BOS 1, SEP 2, QUERY 3, symbol i = id 4 + i; markers by name
    ids = torch.tensor([1, 17, 5, 4, 2, 4, 5, 0, 3, 16])
    assert token_names(ids, markers={17: "copy", 16: "reverse"}) == [
        "<bos>", "<copy>", "s1", "s0", "<sep>", "s0", "s1", "<pad>", "<q>", "<reverse>"]
    assert token_names([1, 17]) == ["<bos>", "s13"]  # without markers: a symbol


def test_bytes_are_characters_or_visible_escapes() -> None:
    """The space and control bytes are visible, never blank: the byte tokenizer's spelling."""
    from headwise.model.byte_tokenizer import ByteTokenizer

    ids = list(b"Hi \n\t\r\x7f~\x00")
    want = ["H", "i", "\u2423", "\\n", "\\t", "\\r", "\\x7f", "~", "\\x00"]
    assert token_names(ids, byte_level=True) == want
    assert ByteTokenizer().str_tokens(ids) == want


def test_a_tokenizer_names_ids_as_transformers_does() -> None:
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {"[UNK]": 0, "[CLS]": 1, "the": 2, "##ing": 3, "Ġcat": 4}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    ids = [1, 2, 3, 4, 0]
    hf = PreTrainedTokenizerFast(tokenizer_object=tok)
    assert token_names(ids, tokenizer=tok) == hf.convert_ids_to_tokens(ids)
    assert token_names([2, 99], tokenizer=tok) == ["the", "<id 99>"]  # an id it lacks
