"""The multiplier update by ``cooper-optim`` against headwise's own dual ascent.

Every suite spec is trained with ``--enforce`` once per dual update, each run in its own
subprocess with one torch thread, same seeds and budget. The primal side is the same in every
run (the trainer minimises the task loss plus ``sum_c weight_c x lever_c``, the proxy-Lagrangian
of Cotter et al. 2019: the lever loss is the differentiable surrogate); only the multiplier
update at evaluation points differs, driven by the *measured* violation (cooper's
``ConstraintState(violation, strict_violation)``: the dual Lagrangian uses the strict one):

- ``own``: the default ``ProjectedAscent``, ``lambda <- clip(lambda + eta v, 0, lambda_max)``
  in Python floats;
- ``cooper-sgd``: a cooper ``ConstrainedMinimizationProblem`` with one inequality
  ``Constraint`` (``Lagrangian`` formulation, ``DenseMultiplier``) per levered clause, the dual
  Lagrangian's gradient and ``torch.optim.SGD(lr=eta, maximize=True)``, then cooper's
  projection (``post_step_``) -- the same algorithm through the library;
- ``cooper-nupi``: the same with cooper's ``nuPI`` controller (Sohrabi et al. 2024) as the dual
  optimiser (``Ki=1``, ``Kp=KP``: ``lambda += eta (v_t + Kp (v_t - v_{t-1}))``), what the
  library adds over plain ascent.

The floor rule (the multipliers of levers that degrade a task whose floor fails halved) and the
cap ``lambda_max`` are applied around cooper's step in both cooper variants, each a
``DualUpdate`` set as ``EnforceConfig.dual``. Needs the ``bench`` extra:
``pip install -c constraints.txt -e ".[bench]"`` (cooper-optim; the torch pin holds).

    python -m bench.cooper_duals [--duals own cooper-sgd cooper-nupi] [--only NAME ...]
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path
from typing import Any

from bench.lab.suite import SUITE, spawn_enforced, work_enforced

DUALS = ("own", "cooper-sgd", "cooper-nupi")
KP = 1.0


def cooper_dual(dual: str) -> Any:
    """A ``DualUpdate`` whose step is cooper's (the floor rule and the cap around it)."""
    import cooper
    import torch

    class _ContractCMP(cooper.ConstrainedMinimizationProblem):
        def __init__(self, keys: list[int]) -> None:
            super().__init__()
            for key in keys:
                setattr(self, f"clause{key}", cooper.Constraint(
                    constraint_type=cooper.ConstraintType.INEQUALITY,
                    formulation_type=cooper.formulations.Lagrangian,
                    multiplier=cooper.multipliers.DenseMultiplier(num_constraints=1)))

        def compute_cmp_state(self, violations: dict[int, float]) -> cooper.CMPState:
            return cooper.CMPState(loss=torch.zeros(()), observed_constraints={
                getattr(self, f"clause{k}"): cooper.ConstraintState(
                    violation=torch.tensor([v]), strict_violation=torch.tensor([v]))
                for k, v in violations.items()})

    class CooperDual:
        keeps_held_model = True

        def __init__(self) -> None:
            self._cmp: Any = None
            self._opt: Any = None

        def update(self, lambdas: dict[int, float], violations: Any, ctx: Any) -> None:
            if self._cmp is None:
                self._cmp = _ContractCMP(sorted(violations))
                params = list(self._cmp.dual_parameters())
                self._opt = (torch.optim.SGD(params, lr=ctx.eta, maximize=True)
                             if dual == "cooper-sgd" else
                             cooper.optim.nuPI(params, lr=ctx.eta, Kp=KP, Ki=1.0,
                                               maximize=True))
            named = {k: getattr(self._cmp, f"clause{k}").multiplier for k in violations}
            with torch.no_grad():
                for index, mult in named.items():
                    lever = ctx.levers.get(index)
                    if lever is not None and lever.perturbs & ctx.failing:
                        mult.weight.mul_(0.5)  # the floor rule, as in ``own``
            self._opt.zero_grad()
            self._cmp.compute_cmp_state(dict(violations)).compute_dual_lagrangian().backward()
            self._opt.step()
            with torch.no_grad():
                for index, mult in named.items():
                    mult.post_step_()  # cooper's projection onto lambda >= 0
                    mult.weight.clamp_(max=ctx.lambda_max)
                    lambdas[index] = float(mult.weight[0])

    return CooperDual()


def config(dual: str) -> Any:
    """The ``EnforceConfig`` of dual update ``dual`` (``None``: the library's own)."""
    from headwise.contract import EnforceConfig

    return None if dual == "own" else EnforceConfig(dual=cooper_dual(dual))


def _gap(rows: list[dict[str, Any]], dual: str) -> float:
    """Largest |final multiplier - own's| over the suite's clauses (specs with both runs)."""
    own = {r["spec"]: r["multipliers"] or {} for r in rows if r["dual"] == "own"}
    gaps = [abs(v - own[r["spec"]][k]) for r in rows if r["dual"] == dual and r["spec"] in own
            for k, v in (r["multipliers"] or {}).items()
            if v is not None and own[r["spec"]].get(k) is not None]
    return max(gaps, default=float("nan"))


def summarise(rows: list[dict[str, Any]], duals: list[str]) -> list[str]:
    lines = ["| dual update | clauses held | contracts held | steps (sum) | wall s (sum) "
             "| in the Enforcer, s (sum) | max final multiplier gap to own |",
             "|---|---|---|---|---|---|---|"]
    for dual in duals:
        mine = [r for r in rows if r["dual"] == dual]
        held = sum(r["held"] for r in mine)
        total = sum(r["n_clauses"] for r in mine)
        whole = sum(r["held"] == r["n_clauses"] for r in mine)
        lines.append(f"| {dual} | {held}/{total} | {whole}/{len(mine)} | "
                     f"{sum(r['steps'] for r in mine)} | {sum(r['wall_s'] for r in mine):.1f} | "
                     f"{sum(r['verify_s'] for r in mine):.1f} | {_gap(rows, dual):.2g} |")
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--duals", nargs="+", default=list(DUALS), choices=DUALS)
    parser.add_argument("--only", nargs="+", default=None)
    parser.add_argument("--json", type=Path, default=None)
    parser.add_argument("--worker", nargs=3, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        return work_enforced(args.worker, config)
    specs = [s for s in sorted(SUITE.glob("*.yaml")) if not args.only or s.stem in args.only]
    rows = []
    lines = ["| spec | dual update | clauses held | steps (of) | wall s |", "|---|---|---|---|---|"]
    with tempfile.TemporaryDirectory() as tmp:
        for spec in specs:
            for dual in args.duals:  # interleaved
                res = {"dual": dual, **spawn_enforced(__spec__.name, spec, dual, Path(tmp))}
                rows.append(res)
                lines.append(f"| {spec.stem} | {dual} | {res['held']}/{res['n_clauses']} | "
                             f"{res['steps']} ({res['max_steps']}) | {res['wall_s']:.1f} |")
                print(lines[-1], file=sys.stderr, flush=True)
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1))
    print("\n".join(lines + [""] + summarise(rows, args.duals)))


if __name__ == "__main__":
    main()
