"""Contract enforcement: a ``train()`` callback that raises the lever behind each failing clause.

At every evaluation point the contract is verified on the held-out data. For each failing
clause that has a lever, the lever's weight is raised on a bounded schedule: a lever at weight 0
(one added for enforcement) starts at ``start_weight``; otherwise it is multiplied by ``factor``
per failing evaluation, never beyond ``max_factor`` times its first non-zero weight. Training
continues until the contract holds (then it stops, if enforcement had to act) or the step budget
ends. The levers:

- a score clause with a lower bound (``{head: L0.H1, score: previous_token, at_least: 0.9}``):
  the pattern objectives with that role's target on the clause's heads; ``prepare_levers`` adds
  a ``ce`` objective at weight 0 on every such head that lacks one (``ROLE_TARGETS``), unless a
  structural mask already fixes the head's pattern;
- ablation and exclusivity clauses: the L0 penalty of learned gates (sparser gates make heads
  specialise), when the spec has learned gates.

Clauses without a lever (an upper bound on a score, a masked head, ablation clauses with fixed
gates, task clauses) are reported as such. The history lives in
``TrainState.extra["enforce"]``, so it is saved in checkpoints and survives ``--resume``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from headwise.analysis.contract import Clause, Contract
from headwise.analysis.verify import ContractResult, VerifyData, verify
from headwise.heads import HeadSet
from headwise.pipeline.compile import Compiled
from headwise.train import TrainState

# Role score -> pattern-objective target that pushes a head towards that role.
ROLE_TARGETS = {
    "previous_token": "previous_token",
    "previous_token_tl": "previous_token",
    "induction": "induction",
    "induction_tl": "induction",
    "first_token": "first_token",
    "self": "self",
}


def prepare_levers(compiled: Compiled, contract: Contract) -> dict[int, list[Any]]:
    """The lever objectives of each clause, adding zero-weight objectives where none exists.

    Call before ``train()`` (its objective list is fixed when training starts).

    Returns:
        clause index -> objectives whose weight enforcement may raise.
    """
    masked = {h for r in compiled.spec.heads if r.mask is not None for h in r.heads}
    out: dict[int, list[Any]] = {}
    for clause in contract:
        if clause.kind == "score":
            target = ROLE_TARGETS.get(clause.score or "")
            if target is None or clause.at_least is None:
                continue
            levers: list[Any] = []
            missing = []
            for head in clause.target_heads:
                if head in masked:
                    continue
                found = [o for o in compiled.levers.get(head, []) if o.target == target]
                levers.extend(o for o in found if o not in levers)
                if not found:
                    missing.append(head)
            if missing:
                heads = HeadSet(missing, contract.n_layers, contract.n_heads)
                levers.append(compiled.add_objective(heads, target, weight=0.0))
            if levers:
                out[clause.index] = levers
        elif clause.kind in ("ablation", "exclusive") and compiled.gates is not None and hasattr(
                compiled.gates, "l0_penalty"):
            penalty = [o for o in compiled.objectives if o.name == "l0"]
            if penalty:
                out[clause.index] = penalty
    return out


@dataclass
class Enforcer:
    """The callback (see module docstring).

    Args:
        contract: the contract to hold.
        data: what it is verified on.
        levers: from ``prepare_levers``.
        factor: multiplier per failing evaluation.
        max_factor: cap on a lever's weight relative to its first non-zero weight.
        start_weight: the weight a zero-weight lever starts at.
    """

    contract: Contract
    data: VerifyData
    levers: dict[int, list[Any]]
    factor: float = 2.0
    max_factor: float = 64.0
    start_weight: float = 1.0
    last_result: ContractResult | None = field(default=None, repr=False)

    def __call__(self, state: TrainState) -> None:
        record = state.extra.setdefault("enforce", {"history": [], "clauses": {},
                                                    "base_weights": {}})
        result = verify(state.model, self.contract, self.data)
        self.last_result = result
        failed = [r.clause for r in result.results if not r.passed]
        raised: dict[str, float] = {}
        for clause in failed:
            entry = record["clauses"].setdefault(str(clause.index), _entry(clause, state.step))
            entry["failed_evals"] += 1
            levers = self.levers.get(clause.index, []) if self._raisable(clause, result) else []
            if not levers:
                continue
            entry["lever"] = [o.name for o in levers]
            for obj in levers:
                if obj.name not in raised:
                    raised[obj.name] = self._raise(obj, record["base_weights"])
            entry["raises"] += 1
            entry["first_raised_at"] = entry["first_raised_at"] or state.step
            entry["weights"] = {o.name: o.weight for o in levers}
        for key, entry in record["clauses"].items():
            if int(key) not in {c.index for c in failed} and entry["held_at"] is None:
                entry["held_at"] = state.step
            elif int(key) in {c.index for c in failed}:
                entry["held_at"] = None
        record["history"].append({"step": state.step, "passed": result.passed,
                                  "failed": [c.index for c in failed], "raised": raised})
        acted = any(e["raises"] for e in record["clauses"].values())
        if result.passed and acted:
            record["held_at"] = state.step
            state.stop = True

    def _raisable(self, clause: Clause, result: ContractResult) -> bool:
        """A score clause's objective only helps when the score is too low."""
        if clause.kind != "score":
            return True
        measured = result.results[clause.index].measured
        return measured is None or clause.at_least is None or measured < clause.at_least

    def _raise(self, obj: Any, base: dict[str, float]) -> float:
        if obj.weight <= 0:
            obj.weight = self.start_weight
        else:
            base.setdefault(obj.name, float(obj.weight))
            obj.weight = min(obj.weight * self.factor, base[obj.name] * self.max_factor)
        base.setdefault(obj.name, float(obj.weight))
        return float(obj.weight)


def _entry(clause: Clause, step: int) -> dict[str, Any]:
    return {"index": clause.index, "description": clause.name or clause.describe(),
            "first_failed_at": step, "failed_evals": 0, "raises": 0, "first_raised_at": None,
            "held_at": None, "lever": None, "weights": {}}


def summary(extra: dict[str, Any], final: ContractResult, steps_done: int,
            initial_weights: dict[str, float]) -> dict[str, Any]:
    """What enforcement did, for ``enforcement.json`` and the report.

    Per clause that ever failed at an evaluation point: its lever(s), how many times they were
    raised, the weight factor (final / initial; from 0 for added levers), when it first failed,
    when it held, and whether it holds at the end. ``cost_steps``: steps from the first raise to
    the point the whole contract held (or to the end of training if it never did).
    """
    record = extra.get("enforce", {"history": [], "clauses": {}})
    holds = {r.clause.index: r.passed for r in final.results}
    clauses = []
    for entry in record["clauses"].values():
        weights = entry.get("weights", {})
        factors = {name: (w / initial_weights[name] if initial_weights.get(name) else None)
                   for name, w in weights.items()}
        clauses.append({**entry, "initial_weights": {n: initial_weights.get(n, 0.0)
                                                     for n in weights},
                        "factor": factors, "holds_at_end": holds.get(entry["index"])})
    first = [e["first_raised_at"] for e in record["clauses"].values() if e["first_raised_at"]]
    held_at = record.get("held_at")
    end = held_at if held_at is not None else steps_done
    return {"enforced": bool(first), "evaluations": len(record["history"]),
            "held_at_step": held_at, "cost_steps": (end - min(first)) if first else 0,
            "contract_holds": final.passed, "clauses": clauses,
            "history": record["history"]}
