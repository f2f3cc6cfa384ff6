"""Tokenizers from a local HF directory (``tokenizer.json`` via the ``tokenizers`` package):
the fast tokenizer itself (``load_tokenizer``, ``encode_batch``) and the model's tokenizer with
its special tokens (``load_model_tokenizer``, what ``Transformer.tokenizer`` holds)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from tokenizers import Tokenizer
from torch import Tensor

from headwise.data.corpus import read_tokenizer
from headwise.errors import CheckpointError, ConfigError, show
from headwise.jsonfile import read_json_object
from headwise.model.tokenizer import ModelTokenizer

# Where transformers keeps the special tokens' names (the latter wins), and those read here.
SPECIAL_FILES = ("tokenizer_config.json", "special_tokens_map.json")
SPECIAL_TOKENS = ("bos_token", "eos_token", "pad_token")
MAX_SPECIAL_BYTES = 16 << 20  # tokenizer_config.json may hold every added token


def load_tokenizer(path: str | Path) -> Tokenizer:
    """The fast tokenizer stored as ``tokenizer.json`` in ``path`` (no network access).

    Padding and truncation settings saved in the file are kept; ``encode_batch`` overrides
    padding to the longest sequence.

    Raises:
        CheckpointError: ``tokenizer.json`` missing, unreadable, or beyond the bounds of
            ``headwise.data.corpus.read_tokenizer``.
    """
    file = Path(path) / "tokenizer.json"
    if not file.is_file():
        raise CheckpointError(f"{file}: file not found (headwise reads tokenizers only from "
                              "tokenizer.json)")
    return read_tokenizer(file, CheckpointError)


def encode_batch(tokenizer: Tokenizer, texts: Sequence[str], max_len: int | None = None,
                 pad_id: int | None = None) -> tuple[Tensor, Tensor]:
    """Tokenise ``texts`` and pad them on the right to the longest.

    Args:
        tokenizer: from ``load_tokenizer`` (its post-processor adds special tokens).
        texts: the strings.
        max_len: truncate each sequence to this many tokens (``None``: no truncation).
        pad_id: padding id; default the tokenizer's own padding id, else 0.

    Returns:
        ``tokens`` (B, T) long and ``attention_mask`` (B, T) long, 1 for real tokens.

    Raises:
        ValueError: an empty list of texts.
    """
    if not texts:
        raise ValueError("texts: got an empty list, expected at least one string")
    if pad_id is None:
        padding = tokenizer.padding
        pad_id = int(padding["pad_id"]) if padding else 0
    ids = [enc.ids for enc in _without_padding(tokenizer).encode_batch(list(texts))]
    if max_len is not None:
        ids = [seq[:max_len] for seq in ids]
    T = max(len(seq) for seq in ids)
    tokens = torch.full((len(ids), T), pad_id, dtype=torch.long)
    mask = torch.zeros(len(ids), T, dtype=torch.long)
    for row, seq in enumerate(ids):
        tokens[row, : len(seq)] = torch.tensor(seq, dtype=torch.long)
        mask[row, : len(seq)] = 1
    return tokens, mask


def _without_padding(tokenizer: Tokenizer) -> Tokenizer:
    clone = Tokenizer.from_str(tokenizer.to_str())
    clone.no_padding()
    clone.no_truncation()
    return clone


def load_model_tokenizer(path: str | Path) -> ModelTokenizer:
    """The ``ModelTokenizer`` of an HF directory (or of a ``tokenizer.json`` file): the fast
    tokenizer and the special tokens ``tokenizer_config.json`` and ``special_tokens_map.json``
    beside it name (the latter wins, as in ``transformers``).

    ``bos_token`` is the named BOS token; ``pad_token`` the named pad token, else the EOS token
    (TransformerLens's fallback), else the padding token stored in ``tokenizer.json``.

    Raises:
        CheckpointError: no ``tokenizer.json``, an unreadable file, or a special token that is
            not a string (naming the file and field) or not in the vocabulary.
    """
    path = Path(path)
    directory = path.parent if path.is_file() else path
    backend = load_tokenizer(directory) if not path.is_file() else read_tokenizer(
        path, CheckpointError)
    special: dict[str, str | None] = {}
    for name in SPECIAL_FILES:
        file = directory / name
        if file.is_file():
            data = read_json_object(file, CheckpointError, MAX_SPECIAL_BYTES)
            special.update({k: _token(data[k], file, k) for k in SPECIAL_TOKENS if k in data})
    stored = backend.padding["pad_token"] if backend.padding else None
    pad = special.get("pad_token") or special.get("eos_token") or stored
    try:
        return ModelTokenizer(backend, bos_token=special.get("bos_token"), pad_token=pad,
                              eos_token=special.get("eos_token"))
    except ConfigError as e:
        raise CheckpointError(f"{directory}: {e}") from None


def _token(value: Any, file: Path, key: str) -> str | None:
    """A special token as ``transformers`` stores it: a string, ``null``, or an added-token
    object with ``content``."""
    if isinstance(value, dict):
        value = value.get("content")
    if value is not None and not isinstance(value, str):
        raise CheckpointError(f"{file}: {key}: got {show(value, 80)}, expected a token string")
    return value
