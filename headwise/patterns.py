"""Role target patterns: the one definition of what each head role means.

A *role* is a target attention pattern, a function of the tokens, the padding and causality.
Everything that names a role reads it from here: pattern objectives pull a head towards
``role_target(...).weights``; role scores, contract clauses, report similarities, ``explain``
and enforcement measure the head against the same target. So driving a role's objective to
zero drives its score to one on the same data (``tests/test_patterns.py`` checks every role).

Notation: ``A[b, q, k]`` is a head's attention from query ``q`` to key ``k``; *allowed* keys
are those the model's causal and padding masks permit (``allowed_keys``). For each role a
``RoleTarget`` holds

- ``support`` (B, T, T) bool: the keys the role attends to, a subset of the allowed keys;
- ``weights`` (B, T, T) float: the target distribution, uniform over ``support`` per row;
- ``rows`` (B, T) bool: the queries where the role is *defined*: a real query with at least two
  allowed keys (so that attending is a choice) and a non-empty support.

Roles (``q`` a query, ``k`` a key):

==================  ==========================================================================
``previous_token``  ``k = q - 1``
``next_token``      ``k = q + 1`` (bidirectional models only; undefined when causal)
``self``            ``k = q``
``first_token``     the first real position (rows other than that position itself)
``duplicate_token`` every earlier ``k`` holding the same token as ``q``
``induction``       ``k = j + 1`` for the latest ``j < q`` holding the same token as ``q``: the
                    token that followed the previous occurrence. On a sequence repeating with
                    period ``P`` this is ``k = q - P + 1`` (Olsson et al.'s stripe) whatever
                    the prefix (a BOS, a task marker) and however many repeats; per row, so a
                    batch may mix periods.
``local``           ``|q - k| < window`` (causal: self and the ``window - 1`` previous keys),
                    the keys the ``local(window)`` mask allows
``uniform``         every allowed key
``entropy``         no target: the score is the row's entropy over its allowed keys divided by
                    ``log(n_allowed)``, in [0, 1] (1 = uniform). ``EntropyBound`` uses the same
                    normalised unit.
==================  ==========================================================================

The **score** of a head for a role is the mean over defined rows of the attention mass on the
support (``uniform``: ``1 - TV(A[q], weights[q])``, the overlap with the uniform row; ``entropy``:
the normalised entropy). A perfect head scores 1.0.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

ROLE_NAMES = ("previous_token", "next_token", "self", "first_token", "duplicate_token",
              "induction", "local", "uniform", "entropy")
# Roles with a target pattern (a pattern objective can pull a head towards them).
TARGET_ROLES = tuple(r for r in ROLE_NAMES if r != "entropy")
DEFAULT_WINDOW = 3
EPS = 1e-12


def allowed_keys(tokens: Tensor, attention_mask: Tensor | None, causal: bool) -> Tensor:
    """(B, T, T) bool: keys the model's own causal and padding masks let each query read.

    Padding queries get no allowed key (nothing is measured or supervised there).
    """
    B, T = tokens.shape
    real = real_tokens(tokens, attention_mask)
    allowed = real[:, :, None] & real[:, None, :]  # (B, T, T)
    if causal:
        allowed = allowed & torch.ones(T, T, dtype=torch.bool, device=tokens.device).tril()
    return allowed


def real_tokens(tokens: Tensor, attention_mask: Tensor | None) -> Tensor:
    """(B, T) bool: True at real (non-padding) positions."""
    if attention_mask is None:
        return torch.ones_like(tokens, dtype=torch.bool)
    return attention_mask.to(tokens.device).bool()


@dataclass(frozen=True)
class RoleTarget:
    """A role's target on a batch: ``support``, ``weights`` (B, T, T) and defined ``rows`` (B, T).

    ``allowed`` is the (B, T, T) allowed-key mask it was built against.
    """

    role: str
    support: Tensor
    weights: Tensor
    rows: Tensor
    allowed: Tensor


def _index_support(idx: Tensor, allowed: Tensor) -> Tensor:
    """(B, T, T) bool one-hot rows from (B, T) key indices; out-of-range indices give no key."""
    T = allowed.shape[-1]
    ok = (idx >= 0) & (idx < T)
    onehot = torch.nn.functional.one_hot(idx.clamp(0, T - 1), T).bool() & ok[..., None]
    return onehot & allowed


def induction_keys(tokens: Tensor, real: Tensor) -> Tensor:
    """(B, T) long: ``j + 1`` for the latest ``j < q`` with ``tokens[j] == tokens[q]``, else -1."""
    T = tokens.shape[1]
    pos = torch.arange(T, device=tokens.device)
    same = (tokens[:, :, None] == tokens[:, None, :]) & (pos[None, :] < pos[:, None])
    same = same & real[:, None, :] & real[:, :, None]
    last = torch.where(same, pos, -1).amax(-1)  # (B, T)
    return torch.where(last >= 0, last + 1, -1)


def role_target(role: str, tokens: Tensor, attention_mask: Tensor | None = None,
                causal: bool = True, window: int = DEFAULT_WINDOW) -> RoleTarget:
    """The target of ``role`` on ``tokens`` (see the module docstring for each role).

    Args:
        role: one of ``TARGET_ROLES``, or ``"entropy"`` (support = allowed keys, for its rows).
        tokens: (B, T) long.
        attention_mask: (B, T), 1 for real tokens; ``None``: all real.
        causal: whether the model is causal.
        window: half-width of ``local``.

    Raises:
        ValueError: unknown role, or a negative window.
    """
    if role not in ROLE_NAMES:
        raise ValueError(f"role: got {role!r}, expected one of {list(ROLE_NAMES)}")
    if isinstance(window, bool) or not isinstance(window, int) or window < 1:
        raise ValueError(f"window: got {window!r}, expected an integer >= 1")
    B, T = tokens.shape
    dev = tokens.device
    real = real_tokens(tokens, attention_mask)
    allowed = allowed_keys(tokens, attention_mask, causal)
    pos = torch.arange(T, device=dev)
    qpos = pos.expand(B, T)
    busy = real & (allowed.sum(-1) >= 2)  # a choice exists
    if role in ("previous_token", "next_token", "self"):
        support = _index_support(qpos + {"previous_token": -1, "next_token": 1,
                                         "self": 0}[role], allowed)
    elif role == "first_token":
        first = real.to(torch.int8).argmax(1, keepdim=True)  # (B, 1)
        support = _index_support(first.expand(B, T), allowed)
        busy = busy & (qpos != first)
    elif role == "duplicate_token":
        support = (tokens[:, :, None] == tokens[:, None, :]) & (pos[None, :] < pos[:, None])
        support = support & allowed
    elif role == "induction":
        support = _index_support(induction_keys(tokens, real), allowed)
    elif role == "local":
        support = ((pos[:, None] - pos[None, :]).abs() < window) & allowed
    else:  # uniform, entropy
        support = allowed
    rows = busy & support.any(-1)
    weights = support.to(torch.float32)
    weights = weights / weights.sum(-1, keepdim=True).clamp_min(1.0)
    return RoleTarget(role, support, weights, rows, allowed)


# Roles whose target depends on positions only: a structural mask can impose them.
POSITION_ROLES = ("previous_token", "next_token", "self", "first_token", "local", "uniform")


def position_support(role: str, T: int, device: torch.device | str = "cpu",
                     window: int = DEFAULT_WINDOW) -> Tensor:
    """(T, T) bool: the keys a position-only role attends to, before causality is applied.

    The structural masks of ``headwise.control.masks`` are these supports (the model ANDs them
    with its own causal and padding masks), so a masked head plays its role exactly.

    Raises:
        ValueError: ``role`` depends on the tokens (not in ``POSITION_ROLES``).
    """
    if role not in POSITION_ROLES:
        raise ValueError(f"role: got {role!r}, expected a position-only role from "
                         f"{list(POSITION_ROLES)}")
    tokens = torch.zeros(1, T, dtype=torch.long, device=device)
    return role_target(role, tokens, None, causal=False, window=window).support[0]


def normalised_entropy(patterns: Tensor, allowed: Tensor) -> Tensor:
    """``H(A[q]) / log(n_allowed(q))`` per row: patterns (..., T, T), allowed (B, T, T) -> (..., T).

    Rows with fewer than two allowed keys give 0 (they are never a defined row).
    """
    # P log max(P, eps), not xlogy: its gradient stays finite at P = 0 (masked keys).
    ent = -(patterns * patterns.clamp_min(EPS).log()).sum(-1)  # (..., T)
    n = allowed.sum(-1).to(ent.dtype).clamp_min(2.0)  # (B, T)
    if patterns.dim() == 4:
        n = n[:, None]
    return ent / n.log()


def row_scores(patterns: Tensor, target: RoleTarget) -> Tensor:
    """Per-row score (B, h, T) of patterns (B, h, T, T) for ``target`` (undefined rows: 0).

    Mass on the support; ``uniform``: ``1 - TV`` with the target row; ``entropy``: normalised
    entropy.
    """
    if target.role == "entropy":
        value = normalised_entropy(patterns, target.allowed)
    elif target.role == "uniform":
        value = torch.minimum(patterns, target.weights[:, None].to(patterns.dtype)).sum(-1)
    else:
        value = (patterns * target.support[:, None].to(patterns.dtype)).sum(-1)
    return value * target.rows[:, None].to(value.dtype)


def score_sums(patterns: Tensor, target: RoleTarget,
               per_row: bool = False) -> tuple[Tensor, Tensor]:
    """Per head, the sum of row scores over defined rows and the number of such rows: (h,), (h,)
    (``per_row``: per sequence, (B, h) each).

    Pooling these over batches and dividing gives the role score; 0/0 (no defined row) is NaN.
    """
    num = row_scores(patterns, target).sum(2)  # (B, h)
    den = target.rows.sum(-1).to(num.dtype)[:, None].expand_as(num)
    return (num, den) if per_row else (num.sum(0), den.sum(0))


def similarity_sums(patterns: Tensor, weights: Tensor, allowed: Tensor,
                    real: Tensor, per_row: bool = False) -> tuple[Tensor, Tensor]:
    """``1 - TV(A[q], W[q])`` summed over rows, and the row count, for any target ``W``: (h,)
    each (``per_row``: per sequence, (B, h)).

    ``W`` (B|1, T, T) non-negative is renormalised over allowed keys; rows where it has no mass
    or where the head attends nowhere (a structural mask left no allowed key) are skipped.
    """
    t = weights.to(patterns.dtype).clamp_min(0) * allowed
    mass = t.sum(-1, keepdim=True)  # (B, T, 1)
    t = t / mass.clamp_min(EPS)
    rows = real & (mass[..., 0] > 0)  # (B, T)
    attends = patterns.sum(-1) > 0.5  # (B, h, T)
    valid = rows[:, None] & attends
    overlap = torch.minimum(patterns, t[:, None]).sum(-1)  # (B, h, T)
    num = (overlap * valid).sum(2)
    den = valid.sum(2).to(num.dtype)
    return (num, den) if per_row else (num.sum(0), den.sum(0))


def target_similarity_sums(patterns: Tensor, target: Tensor, tokens: Tensor,
                           attention_mask: Tensor | None, causal: bool,
                           per_row: bool = False) -> tuple[Tensor, Tensor]:
    """``similarity_sums`` (``1 - TV``) of patterns (B, h, T, T) against a (T, T) or
    (B|1, T, T) ``target``, over the keys the model allows on ``tokens`` (B, T) (``per_row``:
    per sequence).

    The one definition behind ``target_similarity`` and the report's expected-vs-observed.

    Raises:
        ValueError: ``target`` of another shape.
    """
    B, T = tokens.shape
    target = target.to(patterns.device)
    if target.dim() == 2:
        target = target[None]
    if target.shape[-2:] != (T, T) or target.shape[0] not in (1, B):
        raise ValueError(f"target: got shape {tuple(target.shape)}, expected (T, T) or "
                         f"(B, T, T) with T={T}, B={B}")
    return similarity_sums(patterns, target, allowed_keys(tokens, attention_mask, causal),
                           real_tokens(tokens, attention_mask), per_row)
