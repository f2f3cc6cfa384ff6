"""Role scores of attention heads (previous-token, induction, duplicate, sink, ...) on data.

The pattern roles (``previous_token``, ``next_token``, ``self``, ``first_token``,
``duplicate_token``, ``induction``, ``local``, ``uniform``, ``entropy``) are defined once, in
``headwise.patterns``: a role is a target pattern, and a head's score is the mean over the rows
where the role is defined of its attention mass on that target (a perfect head scores 1.0). The
pattern objectives pull towards the same targets. Scored here besides:

- ``copying``: attention mass on keys whose token the head's OV circuit ranks first
  (``headwise.analysis.ov``); ``copying_eig``: Elhage et al.'s eigenvalue ratio (weights only).
- ``*_tl``: TransformerLens ``head_detector`` "mul" scores, ``sum(A * D) / sum(A)`` per sequence
  then averaged; its denominator counts *every* row, so a perfect induction head on ``[r, r]``
  scores 0.5 and a perfect previous-token head ``(T - 1) / T``.
- ``target``: similarity ``1 - TV`` to any given target pattern (``target_similarity``).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn

from headwise.analysis.importance_matrix import STDERR_GROUPS, ratio_skewness, ratio_stderr
from headwise.analysis.ov import copying_eigen_ratios, ov_top1
from headwise.analysis.role_table import RoleTable
from headwise.heads import Head, HeadSet, select_heads
from headwise.model.eval_mode import in_eval_mode
from headwise.model.hook_point import Hook, HookContext
from headwise.model.inputs import check_tokens, gate_tasks
from headwise.patterns import (
    DEFAULT_WINDOW,
    ROLE_NAMES,
    allowed_keys,
    real_tokens,
    role_target,
    score_sums,
    target_similarity_sums,
)

ROLES = (*ROLE_NAMES, "copying", "previous_token_tl", "duplicate_token_tl", "induction_tl",
         "copying_eig")
PATTERN_ROLES = tuple(r for r in ROLES if r not in ("copying", "copying_eig"))
Target = Tensor | Callable[[Tensor], Tensor]
Sums = dict[str, tuple[Tensor, Tensor]]  # role -> (numerator (h,), denominator (h,))
# (``role_sums(per_row=True)``: (B, h) each, one row per sequence)


def scores_from_patterns(patterns: Tensor, tokens: Tensor, attention_mask: Tensor | None = None,
                         roles: Sequence[str] | None = None, causal: bool = True,
                         window: int = DEFAULT_WINDOW, copy_top1: Tensor | None = None,
                         target: Tensor | None = None) -> dict[str, Tensor]:
    """Role scores computed directly from attention patterns (no model needed).

    Args:
        patterns: (B, h, T, T) patterns of ``h`` heads (rows sum to 1 over allowed keys).
        tokens: (B, T) long tokens they were computed on.
        attention_mask: (B, T), 1 for real tokens; ``None``: all real.
        roles: which of ``PATTERN_ROLES`` (plus ``copying`` with ``copy_top1``, ``target`` with
            ``target``); default all pattern roles.
        causal: whether the model is causal (sets the allowed keys).
        window: half-width w of the ``local`` role.
        copy_top1: (h, V) bool, whether each head's OV circuit ranks token v first.
        target: (B|1, T, T) target pattern for the ``target`` similarity.

    Returns:
        ``{role: (h,) scores}``; NaN where the role is undefined on these tokens.
    """
    sums = role_sums(patterns, tokens, attention_mask, roles, causal, window, copy_top1, target)
    return {r: num / den for r, (num, den) in sums.items()}


def role_sums(patterns: Tensor, tokens: Tensor, attention_mask: Tensor | None = None,
              roles: Sequence[str] | None = None, causal: bool = True,
              window: int = DEFAULT_WINDOW, copy_top1: Tensor | None = None,
              target: Tensor | None = None, per_row: bool = False) -> Sums:
    """Numerators and denominators of ``scores_from_patterns`` (so batches can be pooled);
    ``per_row``: each sequence's own, (B, h) each (the units of a score's standard error and
    skewness)."""
    B, h, T, _ = patterns.shape
    if tokens.shape != (B, T):
        raise ValueError(f"tokens: got shape {tuple(tokens.shape)}, expected {(B, T)} to match "
                         f"patterns {tuple(patterns.shape)}")
    dev = patterns.device
    tokens = tokens.to(dev)
    mask = None if attention_mask is None else attention_mask.to(dev)
    data = _Data(patterns, tokens, mask, causal, window, copy_top1, target)
    out: Sums = {}
    for role in PATTERN_ROLES if roles is None else roles:
        sums = _SUMS.get(role)
        if sums is None:
            raise ValueError(f"roles: got {role!r}, expected one of {list(ROLES)} or 'target'")
        num, den = sums(data)  # (B, h) each
        out[role] = (num, den) if per_row else (num.sum(0), den.sum(0))
    return out


@dataclass(frozen=True)
class _Data:
    """What a role's sums are computed from (``role_sums``' arguments, on one device)."""

    patterns: Tensor  # (B, h, T, T)
    tokens: Tensor  # (B, T)
    mask: Tensor | None  # (B, T)
    causal: bool
    window: int
    copy_top1: Tensor | None  # (h, V)
    target: Tensor | None  # (T, T) | (B|1, T, T)

    @property
    def real(self) -> Tensor:
        return real_tokens(self.tokens, self.mask)  # (B, T)


def _pattern_role(role: str) -> Callable[[_Data], tuple[Tensor, Tensor]]:
    """Per-sequence sums of a role defined in ``headwise.patterns``: mass on its target."""
    def sums(d: _Data) -> tuple[Tensor, Tensor]:
        return score_sums(d.patterns, role_target(role, d.tokens, d.mask, d.causal, d.window),
                          per_row=True)
    return sums


def _tl(d: _Data, detection: Tensor) -> tuple[Tensor, Tensor]:
    """TransformerLens "mul": per sequence ``sum(A * D) / sum(A)``, each sequence counting 1.

    ``A`` is restricted to pairs of real tokens, causal or not (as TransformerLens does).
    """
    keep = allowed_keys(d.tokens, d.mask, causal=False)[:, None]  # (B, 1, T, T)
    a = d.patterns * keep.to(d.patterns.dtype)
    num = (a * detection[:, None].to(a.dtype)).sum((-1, -2)) / a.sum((-1, -2)).clamp_min(1e-12)
    return num, torch.ones_like(num)


def _tl_duplicate(tokens: Tensor) -> Tensor:
    """TransformerLens duplicate-token detection: same token, not the diagonal, lower triangle."""
    eq = tokens[:, :, None] == tokens[:, None, :]  # (B, T, T)
    eq = eq & ~torch.eye(tokens.shape[1], dtype=torch.bool, device=tokens.device)
    return eq.tril()


def _previous_token_tl(d: _Data) -> tuple[Tensor, Tensor]:
    B, T = d.tokens.shape
    pos = torch.arange(T, device=d.tokens.device)
    return _tl(d, (pos[None, :] == pos[:, None] - 1).expand(B, T, T))


def _induction_tl(d: _Data) -> tuple[Tensor, Tensor]:
    dup = _tl_duplicate(d.tokens)
    shifted = torch.zeros_like(dup)
    shifted[:, :, 1:] = dup[:, :, :-1]  # key j marks a duplicate at j - 1
    return _tl(d, shifted.tril())


def _copying(d: _Data) -> tuple[Tensor, Tensor]:
    """Attention mass on keys whose token the head's OV circuit ranks first, per real query."""
    if d.copy_top1 is None:
        raise ValueError("copy_top1: the copying role needs each head's OV top-1 table")
    real = d.real
    copies = d.copy_top1.to(d.patterns.device)[:, d.tokens].permute(1, 0, 2)  # (B, h, T) keys
    mass = (d.patterns * copies[:, :, None, :].to(d.patterns.dtype)).sum(-1)  # (B, h, T)
    num = (mass * real[:, None]).sum(2)  # (B, h)
    return num, real.sum(-1).to(num.dtype)[:, None].expand_as(num)


def _target(d: _Data) -> tuple[Tensor, Tensor]:
    """``1 - TV`` to a given target pattern (``headwise.patterns.target_similarity_sums``)."""
    if d.target is None:
        raise ValueError("target: the target role needs a target pattern")
    return target_similarity_sums(d.patterns, d.target, d.tokens, d.mask, d.causal,
                                  per_row=True)


# role -> its per-sequence (numerator, denominator) sums, (B, h) each; the pattern roles come
# from headwise.patterns.
_SUMS: dict[str, Callable[[_Data], tuple[Tensor, Tensor]]] = {
    **{role: _pattern_role(role) for role in ROLE_NAMES},
    "previous_token_tl": _previous_token_tl,
    "duplicate_token_tl": lambda d: _tl(d, _tl_duplicate(d.tokens)),
    "induction_tl": _induction_tl,
    "copying": _copying,
    "target": _target,
}


def _pattern_name(layer: int) -> str:
    return f"blocks.{layer}.attn.hook_pattern"


def _patterns(m: Any, tokens: Tensor, mask: Tensor | None, hs: HeadSet,
              kwargs: dict[str, Any]) -> dict[int, tuple[Tensor, tuple[int, ...]]]:
    """Per layer of ``hs``: its heads' patterns (B, h, T, T) and which heads they are.

    The forward stops after the last layer whose patterns it needs (``stop_at_layer``, through
    the model's own call: every block it runs completes, so a sharded model gathers and frees
    its weights as in any forward): the layers above it, the final norm and the output head (a
    30k-word masked-LM decoder at every position) are never run.
    """
    check_tokens(tokens, m.config.vocab_size, mask, kwargs.get("task_ids"), gate_tasks(m))
    got: dict[int, tuple[Tensor, tuple[int, ...]]] = {}
    last = hs.layers[-1]

    def keep(layer: int) -> Any:
        def fn(x: Tensor, ctx: HookContext) -> None:
            got[layer] = (x, ctx.heads if ctx.heads is not None else tuple(range(x.shape[1])))
        return fn

    hooks = [Hook(_pattern_name(l), keep(l), hs.in_layer(l), read_only=True) for l in hs.layers]
    with m.hooks(hooks):
        m(tokens, attention_mask=mask, stop_at_layer=last + 1, **kwargs)
    return got


_Score = tuple[float, float, float]  # (score, standard error, skewness)
ROWS_AT_ONCE = 16
"""Sequences whose role sums are computed together: the float64 copies of their patterns stay
in cache (64 at once took twice as long on a 2-core Xeon: docs/benchmarks.md)."""


def _scan(model: nn.Module, tokens: Tensor, attention_mask: Tensor | None, hs: HeadSet,
          roles: list[str], batch_size: int, window: int,
          target: Target | None,
          forward_kwargs: dict[str, Any]) -> dict[Head, dict[str, _Score]]:
    """``{head: {role: (score, standard error, skewness)}}``: each score pooled exactly over the
    probe; its standard error the ratio estimator's over ``STDERR_GROUPS`` contiguous groups of
    sequences (``ratio_stderr``; NaN with one group, and for ``copying_eig``), its skewness
    that of the sequences' own linearised values (``ratio_skewness``)."""
    pattern_roles = [r for r in roles if r != "copying_eig"]
    tables = ({h: ov_top1(model, h, tokens) for h in hs} if "copying" in pattern_roles else {})
    acc: dict[Head, dict[str, Tensor]] = {}  # (sequences, 2): each one's numerator, denominator
    n_seq = tokens.shape[0]
    n_groups = max(1, min(STDERR_GROUPS, n_seq))
    for start in range(0, n_seq, batch_size):
        tok = tokens[start:start + batch_size]
        mask = None if attention_mask is None else attention_mask[start:start + batch_size]
        tgt = target(tok) if callable(target) else target
        if isinstance(tgt, Tensor) and tgt.dim() == 3 and tgt.shape[0] == tokens.shape[0]:
            tgt = tgt[start:start + batch_size]
        kwargs = {k: (v[start:start + batch_size] if isinstance(v, Tensor) else v)
                  for k, v in forward_kwargs.items()}
        _add(model, tok, mask, kwargs, tgt, torch.arange(start, start + tok.shape[0]), n_seq,
             hs, pattern_roles, window, tables, acc)
    group_of = torch.arange(n_seq) * n_groups // n_seq  # contiguous groups of sequences
    return _finish(model, acc, hs, roles, group_of, n_groups)


def _add(model: nn.Module, tok: Tensor, mask: Tensor | None, kwargs: dict[str, Any],
         tgt: Any, units: Tensor, n_units: int, hs: HeadSet, pattern_roles: list[str],
         window: int, tables: dict[Head, Tensor], acc: dict[Head, dict[str, Tensor]]) -> None:
    """Add one batch's per-sequence role sums to ``acc``, row ``r`` into unit ``units[r]``."""
    m: Any = model  # nn.Module.__getattr__ hides the Transformer's attributes from mypy
    cfg = m.config
    with torch.no_grad():
        patterns = _patterns(m, tok, mask, hs, kwargs)
    for layer in hs.layers:
        pat, present = patterns[layer]
        wanted = hs.in_layer(layer)
        idx = [present.index(h) for h in wanted]
        copy = (torch.stack([tables[Head(layer, h)] for h in wanted]) if tables else None)
        for lo in range(0, tok.shape[0], ROWS_AT_ONCE):
            rows = slice(lo, lo + ROWS_AT_ONCE)
            part = tgt[rows] if isinstance(tgt, Tensor) and tgt.dim() == 3 \
                and tgt.shape[0] == tok.shape[0] else tgt
            sums = role_sums(pat[rows][:, idx].double(), tok[rows],
                             None if mask is None else mask[rows], pattern_roles, cfg.causal,
                             window, copy, part, per_row=True)
            at = units[rows].to(pat.device)
            for i, h in enumerate(wanted):
                slot = acc.setdefault(Head(layer, h), {})
                for r, (num, den) in sums.items():
                    table = slot.setdefault(r, num.new_zeros(n_units, 2))
                    table.index_add_(0, at, torch.stack([num[:, i], den[:, i]], 1))  # on device


def _finish(model: nn.Module, acc: dict[Head, dict[str, Tensor]], hs: HeadSet,
            roles: list[str], group_of: Tensor, n_groups: int) -> dict[Head, dict[str, _Score]]:
    """Each head's scores from its units' sums (``acc``): the standard error over the units
    pooled into ``n_groups`` groups (unit ``u`` into ``group_of[u]``), the skewness over the
    units themselves."""
    out: dict[Head, dict[str, _Score]] = {}
    eig = copying_eigen_ratios(model, hs) if "copying_eig" in roles else {}
    for head in hs:
        vals: dict[str, _Score] = {}
        for r, v in acc.get(head, {}).items():
            v = v.cpu()
            g = torch.zeros(n_groups, 2, dtype=v.dtype).index_add_(0, group_of, v)
            vals[r] = (float(v[:, 0].sum() / v[:, 1].sum()), ratio_stderr(g[:, 0], g[:, 1]),
                       ratio_skewness(v[:, 0], v[:, 1]))
        if head in eig:
            vals["copying_eig"] = (eig[head], math.nan, math.nan)
        out[head] = vals
    return out


def _table(hs: HeadSet, roles: list[str], scores: dict[Head, dict[str, _Score]],
           info: dict[str, Any]) -> RoleTable:
    values, stderr, skew = (torch.tensor([[scores[h][r][i] for r in roles] for h in hs],
                                         dtype=torch.float64).reshape(len(hs), len(roles))
                            for i in (0, 1, 2))
    return RoleTable(list(hs), roles, values, info, stderr, skew)


@in_eval_mode
def role_scores_stream(model: nn.Module, chunks: Iterable[tuple[Tensor, Tensor | None, Tensor]],
                       heads: Any = None, roles: Sequence[str] | None = None,
                       window: int = DEFAULT_WINDOW) -> RoleTable:
    """``role_scores`` over a stream of ``(tokens (b, T_i), attention_mask | None, index (b,))``
    chunks of any lengths, each forwarded once and dropped: memory holds one chunk, whatever
    the corpus. ``index``: each sequence's position in the corpus (the chunks may hold the
    sequences in any order, e.g. grouped by length).

    Scores are pooled exactly over every chunk (the same sums as ``role_scores`` on all the
    sequences, in another order); standard errors are over ``STDERR_GROUPS`` groups of
    sequences dealt by position (sequence ``k`` in group ``k mod STDERR_GROUPS``), so neither
    depends on the order of the chunks; skewnesses are those groups' (``ratio_skewness``).

    Raises:
        ValueError: unknown roles, or an empty stream.
    """
    hs = select_heads(model, heads)
    roles = _checked_roles(roles)
    pattern_roles = [r for r in roles if r != "copying_eig"]
    acc: dict[Head, dict[str, Tensor]] = {}
    seen = tokens_seen = 0
    length = 0
    for tokens, mask, index in chunks:
        tables = ({h: ov_top1(model, h, tokens) for h in hs} if "copying" in pattern_roles
                  else {})  # entries read are those of this chunk's tokens, as on the whole
        _add(model, tokens, mask, {}, None, index.cpu() % STDERR_GROUPS, STDERR_GROUPS, hs,
             pattern_roles, window, tables, acc)  # units: the groups themselves
        seen += tokens.shape[0]
        tokens_seen += int(mask.sum()) if mask is not None else tokens.numel()
        length = max(length, tokens.shape[1])
    if not seen:
        raise ValueError("chunks: got none, expected at least one sequence")
    return _table(hs, roles, _finish(model, acc, hs, roles, torch.arange(STDERR_GROUPS),
                                     STDERR_GROUPS),
                  {"n_sequences": seen, "seq_len": length, "tokens": tokens_seen,
                   "window": window})


def _checked_roles(roles: Sequence[str] | None) -> list[str]:
    out = list(ROLES if roles is None else roles)
    for r in out:
        if r not in ROLES:
            raise ValueError(f"roles: got {r!r}, expected names from {list(ROLES)}")
    return out


@in_eval_mode
def role_scores(model: nn.Module, tokens: Tensor, attention_mask: Tensor | None = None,
                heads: Any = None, roles: Sequence[str] | None = None, batch_size: int = 64,
                window: int = DEFAULT_WINDOW,
                **forward_kwargs: Any) -> RoleTable:
    """Score heads on ``tokens``; only the requested heads leave the fused attention path.

    Args:
        model: a headwise Transformer.
        tokens: (B, T) long probe tokens (e.g. ``induction_probe``).
        attention_mask: (B, T), 1 for real tokens.
        heads: selector / HeadSet; ``None`` for every head.
        roles: names from ``ROLES``; default all.
        batch_size: sequences per forward pass (scores are pooled exactly across batches).
        window: half-width of ``local``.
        forward_kwargs: extra model inputs (e.g. ``task_ids`` (B,)).

    Returns:
        RoleTable (heads x roles).

    Raises:
        ValueError / SelectorError: unknown roles, bad selectors, mis-shaped inputs.
    """
    hs = select_heads(model, heads)
    roles = _checked_roles(roles)
    scores = _scan(model, tokens, attention_mask, hs, roles, batch_size, window, None,
                   forward_kwargs)
    info = {"n_sequences": int(tokens.shape[0]), "seq_len": int(tokens.shape[1]),
            "window": window}
    return _table(hs, roles, scores, info)


@in_eval_mode
def target_similarity(model: nn.Module, tokens: Tensor, target: Target,
                      attention_mask: Tensor | None = None, heads: Any = None,
                      batch_size: int = 64, name: str = "target",
                      **forward_kwargs: Any) -> RoleTable:
    """Similarity of each head's pattern to ``target``: mean over rows of ``1 - TV`` distance.

    ``target`` is a (T, T) or (B, T, T) non-negative matrix (rows renormalised over allowed
    keys; rows with no mass are skipped) or a function ``tokens (b, T) -> (b, T, T)`` for
    data-dependent targets (e.g. syntactic parents). 1.0 means identical rows, 0.0 disjoint.

    Returns:
        RoleTable with one column ``name``.
    """
    hs = select_heads(model, heads)
    scores = _scan(model, tokens, attention_mask, hs, ["target"], batch_size, DEFAULT_WINDOW,
                   target, forward_kwargs)
    values = torch.tensor([[scores[h]["target"][0]] for h in hs], dtype=torch.float64)
    return RoleTable(list(hs), [name], values.reshape(len(hs), 1),
                     {"n_sequences": int(tokens.shape[0]), "measure": "1 - total variation"})
