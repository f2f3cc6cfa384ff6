"""Role scores of every head of a local HF checkpoint (the engine behind ``analyze --hf``)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from headwise.interop.hub_cache import resolve_model
from headwise.interop.load import load_hf
from headwise.interop.tokenizer import encode_batch, load_tokenizer

COPYING_MAX_VOCAB = 4096


def analyze_hf(path: str | Path, text: str | Sequence[str] | None = None,
               roles: Sequence[str] | None = None, n_probe: int = 16,
               probe_half_len: int = 24, seed: int = 0,
               revision: str | None = None, device: str = "cpu") -> list[dict[str, Any]]:
    """Load an HF checkpoint and score every head's roles.

    Args:
        path: local HF directory or cached model id (see ``load_hf``; the tokenizer is read
            only when ``text`` is given).
        text: text to score on: one string (split into non-empty lines, one sequence each) or a
            list of strings; each is tokenised with the checkpoint's ``tokenizer.json`` and
            truncated to the model's ``max_seq_len``. ``None``: ``n_probe`` repeated random
            token sequences ``[r, r]`` (``induction_probe``, halves of ``probe_half_len``).
        roles: role names (``headwise.analysis.roles.ROLES``); default all, except that
            ``copying`` (a V x V OV-circuit scan per head) is left out when the vocabulary has
            more than ``COPYING_MAX_VOCAB`` tokens; ask for it explicitly to get it anyway.
        n_probe, probe_half_len, seed: the random probe's size and seed.
        revision: with a model id, the cached branch, tag or commit (default ``main``).
        device: where the model runs (auto, cpu, cuda, cuda:N).

    Returns:
        One record per head, ``{"layer", "head", <role>: score | None}`` in layer-major order
        (``RoleTable.from_records`` turns it back into a table for printing).

    Raises:
        CheckpointError: see ``load_hf`` / ``load_tokenizer``.
        ValueError: text with no non-empty line.
    """
    from headwise.analysis.probe_inputs import induction_probe
    from headwise.analysis.roles import ROLES, role_scores
    from headwise.training.device import place

    path = resolve_model(path, revision, field="path", revision_field="revision")
    model = load_hf(path)
    dev = place(model, device, "--device")
    c = model.config
    if roles is None:
        roles = [r for r in ROLES if r != "copying" or c.vocab_size <= COPYING_MAX_VOCAB]
    if text is None:
        half = min(probe_half_len, c.max_seq_len // 2)
        gen = torch.Generator().manual_seed(seed)
        tokens = induction_probe(c.vocab_size, n_probe, half, generator=gen)
        mask = None
    else:
        lines = [t.strip() for t in (text.splitlines() if isinstance(text, str) else text)]
        lines = [t for t in lines if t]
        if not lines:
            raise ValueError("text: got no non-empty line, expected at least one sentence")
        tokens, mask = encode_batch(load_tokenizer(path), lines, max_len=c.max_seq_len)
    table = role_scores(model, tokens.to(dev), mask.to(dev) if mask is not None else None,
                        roles=roles)
    return table.to_records()
