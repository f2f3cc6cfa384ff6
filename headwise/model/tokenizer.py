"""A model's tokenizer: text to token ids and back, as TransformerLens's ``to_tokens`` and
``to_str_tokens``.

``ModelTokenizer`` is a fast tokenizer (``tokenizer.json``, the ``tokenizers`` package) with the
special tokens those two methods need. ``Transformer.tokenizer`` holds one when the model came
with it (``headwise.interop.load_hf`` from a directory with ``tokenizer.json``;
``headwise.load_run`` of a run with a tokenizer); ``model.to_tokens`` / ``model.to_str_tokens``
call the functions here. Semantics follow TransformerLens's ``HookedTransformer``:

- ``prepend_bos``: ``True`` makes every sequence start with the BOS token (added when the
  tokenizer does not add it itself), ``False`` makes none start with it (removed when the
  tokenizer adds it); the default is ``ModelTokenizer.prepend_bos``, ``True`` whenever the
  tokenizer has a BOS token (TransformerLens's ``default_prepend_bos``). A tokenizer without one
  (BERT's: ``[CLS]`` is not a BOS token) encodes as it does by itself.
- Everything else is the tokenizer's own encoding with its special tokens, as
  ``transformers``' ``tokenizer(texts)``; the padding and truncation stored in
  ``tokenizer.json`` are ignored: a batch is padded to its longest sequence on
  ``padding_side`` with the pad token, and truncated (with ``max_len``) as ``transformers``
  truncates, keeping the special tokens.
- ``to_str_tokens`` decodes each id on its own, special tokens kept, as TransformerLens does
  (``batch_decode([[id] for id in ids], clean_up_tokenization_spaces=False)``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

import torch
from tokenizers import Tokenizer
from torch import Tensor

from headwise.errors import ConfigError, field_error

PADDING_SIDES = ("right", "left")


@dataclass(frozen=True)
class ModelTokenizer:
    """A fast tokenizer and its special tokens.

    Attributes:
        backend: the ``tokenizers.Tokenizer`` (left unchanged: encoding uses a copy without
            its stored padding and truncation).
        bos_token: the beginning-of-sequence token, or ``None``.
        pad_token: the padding token, or ``None`` (then only equal-length batches encode).
        padding_side: ``"right"`` or ``"left"``: where shorter sequences of a batch are padded.
        prepend_bos: ``to_tokens``' default (``None``: ``True`` when there is a BOS token).
        eos_token: the end-of-sequence token, or ``None`` (``generate`` stops at it).

    Raises:
        ConfigError: a special token the vocabulary lacks, a bad ``padding_side``, or
            ``prepend_bos`` without a BOS token.
    """

    backend: Tokenizer = field(repr=False)
    bos_token: str | None = None
    pad_token: str | None = None
    padding_side: str = "right"
    prepend_bos: bool | None = None
    eos_token: str | None = None

    def __post_init__(self) -> None:
        if self.padding_side not in PADDING_SIDES:
            raise field_error("padding_side", self.padding_side, "'right' or 'left'")
        for name in ("bos_token", "pad_token", "eos_token"):
            token = getattr(self, name)
            if token is not None and self.backend.token_to_id(token) is None:
                raise field_error(name, token, "a token of the tokenizer's vocabulary")
        if self.prepend_bos is None:
            object.__setattr__(self, "prepend_bos", self.bos_token is not None)
        elif self.prepend_bos and self.bos_token is None:
            raise field_error("prepend_bos", True, "False: the tokenizer has no BOS token")

    @cached_property
    def _plain(self) -> Tokenizer:
        """A copy of ``backend`` without stored padding or truncation (set per call)."""
        clone = Tokenizer.from_str(self.backend.to_str())
        clone.no_padding()
        clone.no_truncation()
        return clone

    @cached_property
    def _adds_bos(self) -> bool:
        """Whether the tokenizer starts every sequence with the BOS token by itself."""
        bos = self._id(self.bos_token)
        return bos is not None and self._plain.encode("").ids[:1] == [bos]

    def _id(self, token: str | None) -> int | None:
        return None if token is None else self.backend.token_to_id(token)

    def token_id(self, token: str | None) -> int | None:
        """The id of ``token`` (``None`` for no token)."""
        return self._id(token)

    def to_tokens(self, input: str | Sequence[str], *, prepend_bos: bool | None = None,
                  padding_side: str | None = None, max_len: int | None = None
                  ) -> tuple[Tensor, Tensor]:
        """``to_tokens(self, ...)``: token ids (B, T) and the attention mask (B, T)."""
        return to_tokens(self, input, prepend_bos=prepend_bos, padding_side=padding_side,
                         max_len=max_len)

    def str_tokens(self, ids: Sequence[int]) -> list[str]:
        """``to_str_tokens(self, ids)``: each id decoded on its own."""
        return to_str_tokens(self, ids)

    def decode(self, ids: Sequence[int]) -> str:
        """The text of ``ids``, special tokens kept (``tokenizer.decode`` in TransformerLens's
        ``generate``)."""
        return str(self.backend.decode([int(i) for i in ids], skip_special_tokens=False))


def to_tokens(tokenizer: ModelTokenizer, input: str | Sequence[str], *,
              prepend_bos: bool | None = None, padding_side: str | None = None,
              max_len: int | None = None) -> tuple[Tensor, Tensor]:
    """Token ids of a string or a batch of strings, padded to the longest.

    Args:
        tokenizer: the model's tokenizer.
        input: one string (a batch of one) or a list of strings.
        prepend_bos: ``True``: start each sequence with the BOS token; ``False``: never;
            ``None``: ``tokenizer.prepend_bos``.
        padding_side: ``"right"`` or ``"left"``; ``None``: ``tokenizer.padding_side``.
        max_len: keep at most this many ids per sequence, the tokenizer's special tokens
            included (``transformers``' ``truncation=True, max_length=max_len``); ``None``: no
            truncation.

    Returns:
        ``tokens`` (B, T) long and ``attention_mask`` (B, T) long, 1 at real tokens.

    Raises:
        ConfigError: an empty or non-string input, ``prepend_bos`` without a BOS token, a bad
            ``padding_side``, a batch to pad without a pad token, or ``max_len`` too small for
            the special tokens.
    """
    texts = [input] if isinstance(input, str) else input
    if not isinstance(texts, (list, tuple)) or not texts or not all(
            isinstance(t, str) for t in texts):
        raise field_error("input", input, "a string or a non-empty list of strings")
    bos = bool(tokenizer.prepend_bos if prepend_bos is None else prepend_bos)
    if bos and tokenizer.bos_token is None:
        raise field_error("prepend_bos", True, "False: the tokenizer has no BOS token")
    side = tokenizer.padding_side if padding_side is None else padding_side
    if side not in PADDING_SIDES:
        raise field_error("padding_side", side, "'right' or 'left'")
    insert, remove = bos and not tokenizer._adds_bos, not bos and tokenizer._adds_bos
    ids = _encode(tokenizer._plain, list(texts), None if max_len is None else max_len - insert)
    bos_id = tokenizer._id(tokenizer.bos_token)
    if insert and bos_id is not None:
        ids = [[bos_id, *seq] for seq in ids]
    elif remove:
        ids = [seq[1:] for seq in ids]
    T = max(len(seq) for seq in ids)
    pad_id = tokenizer._id(tokenizer.pad_token)
    if pad_id is None and any(len(seq) != T for seq in ids):
        raise ConfigError("pad_token: the tokenizer has none, so a batch of different lengths "
                          "cannot be padded; expected a tokenizer with a pad token (or "
                          "strings of equal length in tokens)")
    return pad_rows(ids, pad_id or 0, side)


def pad_rows(ids: Sequence[Sequence[int]], pad_id: int, side: str) -> tuple[Tensor, Tensor]:
    """``(tokens, attention_mask)`` (B, T) long of id rows padded with ``pad_id`` on ``side``
    (``right`` or ``left``) to the longest row."""
    T = max(len(seq) for seq in ids)
    tokens = torch.full((len(ids), T), pad_id, dtype=torch.long)
    mask = torch.zeros(len(ids), T, dtype=torch.long)
    for row, seq in enumerate(ids):
        cols = slice(0, len(seq)) if side == "right" else slice(T - len(seq), T)
        tokens[row, cols] = torch.tensor(list(seq), dtype=torch.long)
        mask[row, cols] = 1
    return tokens, mask


def _encode(plain: Tokenizer, texts: list[str], max_len: int | None) -> list[list[int]]:
    if max_len is None:
        plain.no_truncation()
    else:
        plain.enable_truncation(max_len)
    try:
        return [enc.ids for enc in plain.encode_batch(texts)]
    except Exception as e:  # the tokenizers library raises its own exception type
        raise field_error("max_len", max_len, f"room for the special tokens ({str(e)[:120]})"
                          ) from None
    finally:
        plain.no_truncation()


def to_str_tokens(tokenizer: ModelTokenizer, ids: Sequence[int]) -> list[str]:
    """Each id decoded on its own, special tokens kept (TransformerLens's ``to_str_tokens``)."""
    return list(tokenizer.backend.decode_batch([[int(i)] for i in ids],
                                               skip_special_tokens=False))


def str_tokens_of(tokenizer: ModelTokenizer, input: Any, prepend_bos: bool | None = None,
                  max_len: int | None = None) -> list[str] | list[Any]:
    """``to_str_tokens`` of a string (encoded first), a 1-D or (1, T) tensor or array of ids,
    or a list of those (one list per element).

    Raises:
        ConfigError: another input type, or ids of more than one sequence.
    """
    if isinstance(input, str):
        tokens, _ = tokenizer.to_tokens(input, prepend_bos=prepend_bos, max_len=max_len)
        return tokenizer.str_tokens(tokens[0].tolist())
    if isinstance(input, (list, tuple)):
        return [str_tokens_of(tokenizer, x, prepend_bos, max_len) for x in input]
    if isinstance(input, Tensor) or hasattr(input, "__array__"):
        ids = torch.as_tensor(input).squeeze()
        if ids.dim() > 1 or ids.is_floating_point():
            raise field_error("input", f"ids of shape {tuple(ids.shape)} ({ids.dtype})",
                              "one sequence of integer ids: shape (T,) or (1, T)")
        return tokenizer.str_tokens(ids.reshape(-1).tolist())
    raise field_error("input", input, "a string, ids of one sequence, or a list of those")
