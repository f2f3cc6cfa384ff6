"""Probe token sets for role scores: repeated random halves, periodic and random sequences.

Every generator takes an explicit ``torch.Generator`` so probes are reproducible, and records
how tokens were drawn (``probe_info``) because the sampling changes the scores: halves drawn
*with* replacement repeat tokens, which splits an induction head's attention between several
earlier matches and lowers every induction score. ``induction_probe`` therefore draws each half
without replacement whenever the vocabulary allows.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor


def _check(name: str, value: int, minimum: int) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or value < minimum:
        raise ValueError(f"{name}: got {value!r}, expected an integer >= {minimum}")


def _draw(vocab_size: int, n: int, length: int, generator: torch.Generator | None,
          distinct: bool, reserved: int) -> Tensor:
    """(n, length) tokens from ``[reserved, vocab_size)``, distinct per row when possible."""
    span = vocab_size - reserved
    if span < 1:
        raise ValueError(f"reserved: got {reserved}, expected fewer than vocab_size={vocab_size}")
    if distinct and span >= length:
        rows = [torch.randperm(span, generator=generator)[:length] for _ in range(n)]
        return torch.stack(rows) + reserved  # (n, length)
    return torch.randint(0, span, (n, length), generator=generator) + reserved


def induction_probe(vocab_size: int, n: int, half_len: int,
                    generator: torch.Generator | None = None, distinct: bool = True,
                    reserved: int = 0) -> Tensor:
    """Sequences ``[r, r]``: a random half of ``half_len`` tokens repeated once.

    On these, an induction head attends from query ``q`` in the second copy (``q >= P``,
    ``P = half_len``) to key ``q - P + 1``, the token after the first occurrence of ``tokens[q]``.

    Args:
        vocab_size: V; tokens are drawn from ``[reserved, V)``.
        n: number of sequences B.
        half_len: P, so sequences have length 2P.
        generator: random source (``None``: the global one).
        distinct: draw each half without replacement when ``V - reserved >= P`` (recommended).
        reserved: leading token ids never drawn (e.g. BOS or separators).

    Returns:
        (B, 2P) long tokens.

    Raises:
        ValueError: non-positive sizes, or ``reserved >= vocab_size``.
    """
    _check("vocab_size", vocab_size, 1)
    _check("n", n, 1)
    _check("half_len", half_len, 1)
    half = _draw(vocab_size, n, half_len, generator, distinct, reserved)
    return torch.cat([half, half], dim=1)


def periodic_probe(vocab_size: int, n: int, period: int, length: int,
                   generator: torch.Generator | None = None, distinct: bool = True,
                   reserved: int = 0) -> Tensor:
    """Sequences of ``length`` tokens repeating a random block of ``period`` tokens.

    Returns:
        (B, length) long tokens with ``tokens[:, t] == tokens[:, t - period]`` for t >= period.
    """
    _check("vocab_size", vocab_size, 1)
    _check("n", n, 1)
    _check("period", period, 1)
    _check("length", length, 1)
    block = _draw(vocab_size, n, period, generator, distinct, reserved)  # (B, P)
    reps = -(-length // period)
    return block.repeat(1, reps)[:, :length]


def random_tokens(vocab_size: int, n: int, length: int,
                  generator: torch.Generator | None = None, reserved: int = 0) -> Tensor:
    """Uniformly random tokens (with replacement) from ``[reserved, vocab_size)``: (B, length)."""
    _check("vocab_size", vocab_size, 1)
    _check("n", n, 1)
    _check("length", length, 1)
    return _draw(vocab_size, n, length, generator, False, reserved)


def probe_info(kind: str, vocab_size: int, n: int, length: int, distinct: bool,
               reserved: int = 0, **extra: Any) -> dict[str, Any]:
    """A JSON-ready record of how a probe was sampled (kept next to the scores it produced).

    ``distinct_effective`` says whether rows really are free of repeats (``distinct`` asked and
    the vocabulary was large enough).
    """
    block = extra.get("half_len", extra.get("period", length))
    return {"kind": kind, "vocab_size": vocab_size, "n": n, "length": length,
            "distinct": distinct, "distinct_effective": bool(distinct and
                                                             vocab_size - reserved >= block),
            "reserved": reserved, **extra}


def infer_period(tokens: Tensor, attention_mask: Tensor | None = None) -> Tensor:
    """Per row, the smallest ``P`` with ``tokens[t] == tokens[t - P]`` for every real t >= P.

    Only periods with ``2P <= n_real`` count (at least one full repeat). Rows with no such
    period get 0.

    Args:
        tokens: (B, T) long.
        attention_mask: (B, T), 1 for real tokens (a left- or right-padded prefix/suffix).

    Returns:
        (B,) long periods (0 = none).
    """
    B, T = tokens.shape
    out = torch.zeros(B, dtype=torch.long)
    padded = (torch.zeros(B, dtype=torch.bool) if attention_mask is None
              else ~attention_mask.bool().all(1))
    full = (~padded).nonzero().flatten()
    if len(full):  # unpadded rows: one vectorised comparison per candidate period
        tok = tokens[full]
        for p in range(T // 2, 0, -1):  # descending, so the smallest period is written last
            ok = (tok[:, p:] == tok[:, :-p]).all(1)
            out[full[ok]] = p
    for b in padded.nonzero().flatten().tolist():
        assert attention_mask is not None
        seq = tokens[b][attention_mask[b].bool()]
        for p in range(1, seq.numel() // 2 + 1):
            if torch.equal(seq[p:], seq[:-p]):
                out[b] = p
                break
    return out
