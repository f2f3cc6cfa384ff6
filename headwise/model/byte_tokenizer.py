"""The tokenizer of byte-level models: text as its UTF-8 bytes, and the one spelling of a byte.

A byte-level model (``text`` and ``pairs`` tasks without a tokenizer) reads the bytes of its text
as ids, vocabulary 256, with no special tokens. ``ByteTokenizer`` gives such a model
``to_tokens`` / ``to_str_tokens`` / ``decode`` as a ``ModelTokenizer`` gives a model with a
tokenizer. ``byte_name`` is how a byte is shown everywhere (``to_str_tokens``, ``explain``, the
attention viewers, reports through ``headwise.data.token_names``): printable ASCII as itself,
the space as ``␣``, tab / newline / carriage return as ``\\t`` / ``\\n`` / ``\\r``, any other
byte as ``\\x1b``-style escapes, so that no byte shows as a blank or moves the text around.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from torch import Tensor

from headwise.errors import field_error
from headwise.model.tokenizer import ModelTokenizer, pad_rows

BYTE_VOCAB = 256
SPACE = "\u2423"  # ␣ OPEN BOX
_ESCAPES = {9: "\\t", 10: "\\n", 13: "\\r", 32: SPACE}


def byte_name(i: int) -> str:
    """How byte ``i`` is shown (see the module docstring)."""
    if i in _ESCAPES:
        return _ESCAPES[i]
    return chr(i) if 32 < i < 127 else f"\\x{i:02x}"


@dataclass(frozen=True)
class ByteTokenizer(ModelTokenizer):
    """UTF-8 bytes as token ids: a ``ModelTokenizer`` without a backend and without BOS, EOS
    or padding tokens (a batch is padded with id 0, which its attention mask marks)."""

    backend: Any = field(default=None, repr=False)

    def to_tokens(self, input: str | Sequence[str], *, prepend_bos: bool | None = None,
                  padding_side: str | None = None, max_len: int | None = None
                  ) -> tuple[Tensor, Tensor]:
        """Byte ids (B, T) and the attention mask (B, T) of a string or a list of strings.

        Raises:
            ConfigError: an empty or non-string input, ``prepend_bos=True`` (bytes have no
                BOS token), or a bad ``padding_side``.
        """
        texts = [input] if isinstance(input, str) else input
        if not isinstance(texts, (list, tuple)) or not texts or not all(
                isinstance(t, str) for t in texts):
            raise field_error("input", input, "a string or a non-empty list of strings")
        if prepend_bos:
            raise field_error("prepend_bos", True, "False: bytes have no BOS token")
        side = padding_side or self.padding_side
        if side not in ("right", "left"):
            raise field_error("padding_side", side, "'right' or 'left'")
        return pad_rows([list(t.encode())[:max_len] for t in texts], 0, side)

    def str_tokens(self, ids: Sequence[int]) -> list[str]:
        """Each byte as ``byte_name`` shows it."""
        return [byte_name(int(i)) for i in ids]

    def decode(self, ids: Sequence[int]) -> str:
        """The text of byte ids (a byte sequence that is not UTF-8 gets U+FFFD in its place)."""
        return bytes(int(i) for i in ids).decode("utf-8", errors="replace")

    def token_id(self, token: str | None) -> int | None:
        """Bytes have no special tokens: ``None``."""
        return None
