"""Role scores of every head of a local HF checkpoint (the engine behind ``analyze --hf``),
and its report (``analyze --hf --html``): the role heatmap and table and an attention viewer."""

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
    return _scored(path, text, roles, n_probe, probe_half_len, seed, revision,
                   device)[3].to_records()


def hf_report(path: str | Path, text: str | Sequence[str] | None = None, *,
              roles: Sequence[str] | None = None, heads: str | None = None,
              title: str = "headwise analysis", data: str = "", revision: str | None = None,
              device: str = "cpu") -> dict[str, Any]:
    """``analyze_hf``'s scores (``text``, ``roles``: as there) as a report dict
    (``headwise.report.build_report``): role scores, and the attention viewer of ``heads`` (a
    selector; default every head, at most ``MAX_VIEWER_HEADS``) on the first sequence, its
    tokens named by the checkpoint's tokenizer (``headwise.data.token_names``; ids without
    ``tokenizer.json``).

    Raises:
        SpecError: ``heads`` is not a selector of the model (naming ``--heads``).
        CheckpointError, ValueError: as ``analyze_hf``.
    """
    from headwise.data.token_names import token_names
    from headwise.errors import SelectorError, SpecError
    from headwise.heads import HeadSet, select_heads
    from headwise.report.build import build_report
    from headwise.report.viewer import MAX_TOKENS, MAX_VIEWER_HEADS, attention_viewer

    path, model, tokens, table, mask = _scored(path, text, roles, 16, 24, 0, revision, device)
    c = model.config
    try:
        chosen = select_heads(model, heads, "--heads")
    except SelectorError as e:
        raise SpecError(f"--heads: {e}") from None
    shown = HeadSet(sorted(chosen)[:MAX_VIEWER_HEADS], c.n_layers, c.n_heads)
    n = int(mask[0].sum()) if mask is not None else tokens.shape[1]
    first = tokens[0, :min(n, MAX_TOKENS)]
    tokenizer = load_tokenizer(path) if (Path(path) / "tokenizer.json").is_file() else None
    labels = (token_names(first, tokenizer=tokenizer) if tokenizer is not None
              else [str(i) for i in first.tolist()])
    viewer = attention_viewer(model, first, shown, labels=labels,
                              title="attention on the first sequence")
    note = ("Showing every head" if heads is None else f"Showing the heads {heads} (--heads)")
    if len(shown) < len(chosen):
        note += f" (the first {MAX_VIEWER_HEADS} of {len(chosen)}; choose with --heads)"
    return build_report(title=title, model_config=c, roles=table, attention=viewer,
                        attention_note=note + ".",
                        meta={"model": str(path), "data": data})


def _scored(path: str | Path, text: str | Sequence[str] | None, roles: Sequence[str] | None,
            n_probe: int, probe_half_len: int, seed: int, revision: str | None,
            device: str) -> tuple[Path, Any, torch.Tensor, Any, torch.Tensor | None]:
    """``(directory, model, tokens (B, T), RoleTable, attention_mask (B, T) | None)``."""
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
    tokens = tokens.to(dev)
    mask = mask.to(dev) if mask is not None else None
    return Path(path), model, tokens, role_scores(model, tokens, mask, roles=roles), mask
