"""Score clauses: a role score of heads on a probe, bounded.

``{head: L0.H0, score: previous_token, at_least: 0.9, on: probe}``; ``any_of`` / ``all_of``
for several heads. Measured by ``role_scores`` on the probe (one pass per probe serves every
clause on it); the deciding head is the best (``any_of``) or the worst one. Lever: the role's
pattern objective for a lower bound on a target role (``any_of``: on the head chosen at the
first evaluation point), else a row-wise ``RoleBound``; a head whose structural mask fixes its
pattern has nothing to drive, and a bound its mask cannot reach is refused before training
(``reachable``: the role's mass on the keys the mask allows, computed exactly on the probe).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch
from torch import Tensor, nn

from headwise.analysis.role_table import RoleTable
from headwise.analysis.roles import ROLES, role_scores
from headwise.contract import fields
from headwise.contract.certify import grouped_bound
from headwise.contract.clause import Clause, decide, number_or_none
from headwise.contract.kind import ClauseKind, ParseContext
from headwise.contract.lever import ClauseLever, LeverKind, PlanContext, names
from headwise.contract.results import Bound, ClauseResult, VerifyData
from headwise.control.objectives import PatternObjective, RoleBound
from headwise.errors import SpecError
from headwise.heads import Head, HeadSet
from headwise.patterns import ROLE_NAMES, TARGET_ROLES, RoleTarget, role_target

# Role scores whose lever is another role's (TransformerLens variants measure the same role).
ROLE_OF_SCORE = {**{r: r for r in ROLE_NAMES}, "previous_token_tl": "previous_token",
                 "induction_tl": "induction", "duplicate_token_tl": "duplicate_token"}
UNIT = (0.0, 1.0)
_RANGE = {"copying_eig": (-1.0, 1.0)}  # every other score is in UNIT
SUBJECTS = ("head", "any_of", "all_of")
# Roles scored as attention mass on a support (``headwise.patterns``): their reachable range
# under a mask is exact.
MASS_ROLES = tuple(r for r in TARGET_ROLES if r != "uniform")


class ScoreKind(ClauseKind):
    name = "score"
    keys = frozenset({*SUBJECTS, "score", "on", "at_least", "at_most", "name"})

    def claims(self, raw: Mapping[str, Any]) -> bool:
        return "score" in raw

    def parse(self, path: str, index: int, raw: dict[str, Any], ctx: ParseContext) -> Clause:
        key, heads = fields.subject(path, raw, SUBJECTS, ctx.n_layers, ctx.n_heads)
        score = fields.choice(path, raw, "score", ROLES, "")
        on = raw.get("on")
        if on is not None and not isinstance(on, str):
            raise SpecError(f"{path}.on: got {on!r}, expected the name of a probe data "
                                   "set")
        lo, hi = fields.number(path, raw, "at_least"), fields.number(path, raw, "at_most")
        if lo is None and hi is None:
            raise SpecError(f"{path}: missing bound; expected 'at_least' and/or "
                                   "'at_most'")
        fields.ordered(path, "at_least", lo, "at_most", hi)
        low, high = _RANGE.get(score, UNIT)
        fields.in_range(path, {"at_least": lo, "at_most": hi}, low, high,
                        f"a number in [{low}, {high}] (the range of {score})")
        return Clause(index, self, key, heads, score=score, on=on, at_least=lo, at_most=hi,
                      name=fields.name(path, raw), source=dict(raw))

    def value_range(self, clause: Clause) -> tuple[float, float]:
        return _RANGE.get(clause.score or "", UNIT)

    def describe(self, clause: Clause) -> str:
        return f"{clause.subject()}: {clause.score} on {clause.on or '(default probe)'}"

    def measured_on(self, clause: Clause) -> str:
        return f"probe {clause.on or 'default'}"

    def bounded(self, clause: Clause) -> list[tuple[tuple[Any, ...], str]]:
        if clause.quantifier == "any_of":
            return []  # "some head" bounds constrain no particular head
        return [(("score", h, clause.score, clause.on), f"{h} {clause.score}")
                for h in clause.heads]

    def measure_all(self, model: nn.Module, clauses: Sequence[Clause],
                    data: VerifyData) -> dict[int, ClauseResult]:
        """One ``role_scores`` pass per probe over the union of its clauses' heads and roles."""
        by_probe: dict[str, list[Clause]] = {}
        for c in clauses:
            by_probe.setdefault(data.probe_name(c.on, c.path), []).append(c)
        out = {}
        for probe, on_it in by_probe.items():
            tokens, mask, kw = data.probe(probe, on_it[0].path)
            first = on_it[0].heads
            heads = HeadSet([h for c in on_it for h in c.heads], first.n_layers, first.n_heads)
            roles = sorted({c.score for c in on_it if c.score})
            with torch.no_grad():
                table = role_scores(model, tokens, mask, heads=heads, roles=roles, **kw)
            for c in on_it:
                out[c.index] = _result(c, table, probe)
        return out

    def measure(self, model: nn.Module, clause: Clause, data: VerifyData) -> ClauseResult:
        return self.measure_all(model, [clause], data)[clause.index]

    def check_possible(self, ctx: PlanContext, clause: Clause) -> None:
        role, masks = clause.score or "", ctx.masks
        masked = [h for h in clause.heads if h in masks]
        if ctx.data is None or role not in MASS_ROLES or not masked:
            return
        if clause.quantifier == "any_of" and len(masked) < len(clause.heads):
            return  # an unmasked head can reach any value
        tokens, mask, kw = ctx.data.probe(clause.on, clause.path)
        model: Any = ctx.model
        target = role_target(role, tokens, mask, causal=bool(model.config.causal))
        reach = {h: reachable(model, h, target, kw.get("task_ids")) for h in masked}
        lo, hi = clause.at_least, clause.at_most
        bad = [h for h, (low, high) in reach.items()
               if (lo is not None and high < lo) or (hi is not None and low > hi)]
        if bad and (clause.quantifier != "any_of" or len(bad) == len(clause.heads)):
            h = bad[0]
            low, high = reach[h]
            raise SpecError(
                f"{clause.path}: {clause.describe()} {clause.threshold_text()} cannot hold: "
                f"{h}'s structural mask {masks[h]} lets its {role} score range only over "
                f"[{low:.3f}, {high:.3f}] on probe {clause.on or 'default'}; expected a bound "
                "the mask allows (or another mask)")

    def bound(self, result: ClauseResult, model: nn.Module, data: VerifyData,
              confidence: float) -> Bound:
        return grouped_bound(result, data, confidence, on_task=False)

    def lever(self, ctx: PlanContext, clause: Clause) -> ClauseLever | None:
        heads = [h for h in clause.heads if h not in ctx.fixed]
        if not heads:  # a structural mask fixes every head's pattern: nothing to drive
            return ClauseLever(LeverKind.STRUCTURAL,
                               f"structural mask on {names(clause.heads)} (fixed)")
        role = ROLE_OF_SCORE.get(clause.score or "")
        if role is None:
            return None
        model, tag = ctx.model, f"[{clause.path}]"
        where = ctx.data_words(clause)
        if clause.at_least is not None and role in TARGET_ROLES:
            lever = ClauseLever(LeverKind.PATTERN, f"pattern objective ({role}, ce) on "
                                f"{names(heads)}{where}")
            for h in heads:
                name = f"enforce:{role}[{h}]{tag}"
                obj = ctx.add(ctx.on_probe(PatternObjective(model, ctx.heads(h), role,
                                                            kind="ce"), name, clause), name)
                lever.per_head[str(h)] = [obj]
                lever.objectives.append(obj)
            return lever
        margin = ctx.config.margin
        lo = None if clause.at_least is None else min(1.0, clause.at_least + margin)
        hi = None if clause.at_most is None else max(0.0, clause.at_most - margin)
        name = f"enforce:bound:{role}[{names(heads)}]{tag}"
        obj = ctx.add(ctx.on_probe(RoleBound(model, ctx.heads(heads), role, min=lo, max=hi),
                                   name, clause), name)
        bounds = " and ".join(x for x in (lo is not None and f">= {lo:g}" or "",
                                          hi is not None and f"<= {hi:g}" or "") if x)
        return ClauseLever(LeverKind.BOUND,
                           f"row-wise {role} bound {bounds} on {names(heads)}{where}", [obj])


def reachable(model: nn.Module, head: Head, target: RoleTarget,
              task_ids: Tensor | None) -> tuple[float, float]:
    """The lowest and highest ``target`` role score ``head`` can have under its structural
    mask, exactly: per defined row, the mass on the support is at most 1 if the mask allows a
    support key (else 0), and at least 1 if every allowed key is a support key (else 0)."""
    T = target.support.shape[-1]
    attn: Any = model.blocks[head.layer].attn  # type: ignore[index,union-attr]
    per_head = attn.head_mask(T, task_ids, target.support.device)  # (H|B,H, T, T)
    m = per_head[..., head.head, :, :]
    allowed = target.allowed & (m if m.dim() == 3 else m[None])  # (B, T, T)
    rows = target.rows
    high = (target.support & allowed).any(-1)
    low = allowed.any(-1) & ~(allowed & ~target.support).any(-1)
    n = rows.sum().clamp_min(1)
    return float((low & rows).sum() / n), float((high & rows).sum() / n)


def _result(c: Clause, table: RoleTable, probe: str) -> ClauseResult:
    values = {str(h): table.get(h, c.score or "") for h in c.heads}
    passed, head, value = decide(c, values)
    score = c.score or ""
    details: dict[str, Any] = {"probe": probe}
    if head is not None:  # the deciding head's sequences' skewness, which its bound corrects for
        details["skew"] = number_or_none(table.skewness(head, score))
    if c.quantifier == "all_of":  # every head is bounded on its own spread
        details["spread_per_head"] = {
            str(h): {"stderr": number_or_none(table.error(h, score)),
                     "skew": number_or_none(table.skewness(h, score))} for h in c.heads}
    return ClauseResult(c, passed, number_or_none(value), c.threshold_text(), head,
                        {h: number_or_none(v) for h, v in values.items()},
                        details=details,
                        stderr=None if head is None else number_or_none(
                            table.error(head, c.score or "")))


KIND = ScoreKind()
