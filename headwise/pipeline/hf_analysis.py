"""Role scores of every head of a local HF checkpoint (the engine behind ``analyze --hf``),
and its report (``analyze --hf --html``): the role heatmap and table and an attention viewer.

Text is streamed: lines are tokenised ``LINES_PER_READ`` at a time and scored in chunks of
lines of like length whose captured patterns (layers x heads x sequences x T x T) stay under
``CHUNK_ELEMENTS``, each forwarded once and dropped
(``headwise.analysis.roles.role_scores_stream``), so memory holds one chunk whatever the
corpus; ``max_tokens`` stops after that many tokens, and ``progress`` hears of every chunk.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import torch

from headwise.interop.hub_cache import resolve_model
from headwise.interop.load import load_hf
from headwise.interop.tokenizer import encode_batch, load_tokenizer

COPYING_MAX_VOCAB = 4096
LINES_PER_READ = 256
CHUNK_ELEMENTS = 1 << 26  # pattern elements captured per chunk (256 MiB in float32)
MAX_PADDED = 1.25  # a chunk's positions (padding included) per real token, at most
# progress(characters done, characters in all, tokens done)
Progress = Callable[[int, int, int], None]


def analyze_hf(path: str | Path, text: str | Sequence[str] | None = None,
               roles: Sequence[str] | None = None, n_probe: int = 16,
               probe_half_len: int = 24, seed: int = 0,
               revision: str | None = None, device: str = "cpu",
               max_tokens: int | None = None,
               progress: Progress | None = None) -> list[dict[str, Any]]:
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
        max_tokens: with ``text``, score at most this many tokens (the last sequence cut).
        progress: with ``text``, called after each chunk (see ``Progress``).

    Returns:
        One record per head, ``{"layer", "head", <role>: score | None}`` in layer-major order
        (``RoleTable.from_records`` turns it back into a table for printing).

    Raises:
        CheckpointError: see ``load_hf`` / ``load_tokenizer``.
        ValueError: text with no non-empty line.
    """
    return _scored(path, text, roles, n_probe, probe_half_len, seed, revision,
                   device, max_tokens, progress)[3].to_records()


def hf_report(path: str | Path, text: str | Sequence[str] | None = None, *,
              roles: Sequence[str] | None = None, heads: str | None = None,
              title: str = "headwise analysis", data: str = "", revision: str | None = None,
              device: str = "cpu", max_tokens: int | None = None,
              progress: Progress | None = None) -> dict[str, Any]:
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

    path, model, tokens, table, mask = _scored(path, text, roles, 16, 24, 0, revision, device,
                                               max_tokens, progress)
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
            device: str, max_tokens: int | None = None, progress: Progress | None = None
            ) -> tuple[Path, Any, torch.Tensor, Any, torch.Tensor | None]:
    """``(directory, model, tokens (B, T), RoleTable, attention_mask (B, T) | None)``; with
    text, ``tokens`` and ``attention_mask`` hold its first sequence only."""
    from headwise.analysis.probe_inputs import induction_probe
    from headwise.analysis.roles import ROLES, role_scores, role_scores_stream
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
        tokens = induction_probe(c.vocab_size, n_probe, half, generator=gen).to(dev)
        return Path(path), model, tokens, role_scores(model, tokens, None, roles=roles), None
    lines = [t.strip() for t in (text.splitlines() if isinstance(text, str) else text)]
    lines = [t for t in lines if t]
    if not lines:
        raise ValueError("text: got no non-empty line, expected at least one sentence")
    first: list[tuple[torch.Tensor, torch.Tensor]] = []

    def kept(chunks: Iterator[tuple[torch.Tensor, torch.Tensor, torch.Tensor]]
             ) -> Iterator[tuple[torch.Tensor, torch.Tensor | None, torch.Tensor]]:
        for tokens, mask, index in chunks:
            if index.min() == 0:  # the text's first line (shown by the attention viewer)
                row = int(index.argmin())
                first.append((tokens[row:row + 1], mask[row:row + 1]))
            yield tokens.to(dev), mask.to(dev), index

    per_seq = c.n_layers * c.n_heads
    chunks = text_chunks(load_tokenizer(path), lines, c.max_seq_len, per_seq, max_tokens,
                         progress)
    table = role_scores_stream(model, kept(chunks), roles=roles)
    tokens, mask = first[0]
    return Path(path), model, tokens.to(dev), table, mask.to(dev)


def text_chunks(tokenizer: Any, lines: Sequence[str], max_len: int, per_seq: int,
                max_tokens: int | None = None, progress: Progress | None = None
                ) -> Iterator[tuple[torch.Tensor, torch.Tensor, torch.Tensor]]:
    """``(tokens (b, T), attention_mask (b, T), index (b,))`` chunks of ``lines``: each line one
    sequence (cut to ``max_len``; ``index``: its line's position in ``lines``), at most
    ``max_tokens`` tokens in all (the first ones, in reading order).

    Lines are read ``LINES_PER_READ`` at a time and, within a read, grouped by length: each
    chunk is padded to its own longest, and a forward and the role sums pay for every padded
    position (the sums for every padded pair of positions), so lines of like length share a
    chunk: its ``b * T`` positions are at most ``MAX_PADDED`` times its tokens, and the patterns
    it captures, ``b * T * T * per_seq``, at most ``CHUNK_ELEMENTS`` (one sequence at least).
    """
    total = sum(len(line) for line in lines)
    chars = done = 0
    for start in range(0, len(lines), LINES_PER_READ):
        part = lines[start:start + LINES_PER_READ]
        tokens, mask = encode_batch(tokenizer, part, max_len=max_len)
        index = torch.arange(start, start + len(part))
        lengths = mask.sum(1)
        last = max_tokens is not None and done + int(lengths.sum()) >= max_tokens
        if max_tokens is not None and last:  # the first max_tokens tokens, in reading order
            before = done + lengths.cumsum(0) - lengths  # (b,) tokens read before each line
            mask = mask * ((mask.cumsum(1) + before[:, None]) <= max_tokens)
            rows = (mask.sum(1) > 0).nonzero()[:, 0]
            tokens, mask, index = tokens[rows], mask[rows], index[rows]
            lengths = mask.sum(1)
        order = torch.argsort(lengths, stable=True).tolist()
        i = 0
        while i < len(order):
            j, T, real = i, 0, 0
            while j < len(order):
                n = int(lengths[order[j]])  # the longest yet: lengths ascend
                if j > i and ((j - i + 1) * n ** 2 * per_seq > CHUNK_ELEMENTS
                              or (j - i + 1) * n > MAX_PADDED * (real + n)):
                    break
                T, real, j = n, real + n, j + 1
            sel = torch.tensor(order[i:j])
            tok, msk = tokens[sel, :T], mask[sel, :T]
            done += int(msk.sum())
            chars += sum(len(lines[int(k)]) for k in index[sel])
            if progress is not None:
                progress(total if last and j == len(order) else chars, total, done)
            yield tok, msk, index[sel]
            i = j
        if last:
            return
