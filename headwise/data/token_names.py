"""Token names: the one spelling of token ids in ``explain``, the attention viewers and reports.

Three vocabularies, three spellings:

- **synthetic tasks** (``headwise.data.batch``'s layout): ``<pad>``, ``<bos>``, ``<sep>``,
  ``<q>``, a task marker as ``<task>`` (the task's name), symbol ``i`` (id ``CONTENT + i``) as
  ``s{i}``;
- **bytes** (text tasks without a tokenizer): ``headwise.model.byte_tokenizer.byte_name``, the
  spelling of ``ByteTokenizer.to_str_tokens``: the character for printable ASCII, ``␣`` for the
  space, ``\\n`` / ``\\t`` / ``\\r``, else ``\\x1b``-style escapes;
- **a tokenizer** (text tasks with one, pretrained checkpoints): the tokenizer's own string for
  the id (``id_to_token``: ``[CLS]``, ``##ing``, ``Ġthe``), ``<id 123>`` for an id it lacks.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

from torch import Tensor

from headwise.data.batch import BOS, CONTENT, PAD, QUERY, SEP
from headwise.model.byte_tokenizer import byte_name

if TYPE_CHECKING:
    from tokenizers import Tokenizer

SYNTHETIC_NAMES = {PAD: "<pad>", BOS: "<bos>", SEP: "<sep>", QUERY: "<q>"}


def token_names(ids: Tensor | Sequence[int], *, tokenizer: Tokenizer | None = None,
                byte_level: bool = False, markers: Mapping[int, str] | None = None
                ) -> list[str]:
    """One name per token id, spelled for its vocabulary (see the module docstring).

    Args:
        ids: (T,) token ids.
        tokenizer: the vocabulary's tokenizer (takes precedence).
        byte_level: ids are bytes (vocabulary 256).
        markers: synthetic vocabulary only: task marker id -> task name.

    Returns:
        T strings.
    """
    values = ids.tolist() if isinstance(ids, Tensor) else [int(i) for i in ids]
    if tokenizer is not None:
        return [_tokenizer_name(tokenizer, i) for i in values]
    if byte_level:
        return [byte_name(i) for i in values]
    names = dict(markers or {})
    return [SYNTHETIC_NAMES.get(i) or (f"<{names[i]}>" if i in names else f"s{i - CONTENT}")
            for i in values]


def _tokenizer_name(tokenizer: Tokenizer, i: int) -> str:
    name = tokenizer.id_to_token(i)
    return f"<id {i}>" if name is None else name
