"""Which lever makes "H carries T" (``drop_at_least``) hold, measured on the suite.

Runs every suite spec that has a ``drop_at_least`` clause (ablation or exclusive) with
``--enforce`` once per candidate lever (``EnforceConfig.carrier_stages``), each run in its own
subprocess with one torch thread (``bench.lab.suite.spawn_enforced``), same seeds and budget:

- ``others``: the other heads of H's layers stochastically ablated on T's examples (H becomes
  *sufficient* for T);
- ``margin``: ``AblatedMargin``, a hinge on the H-ablated model's logits (T *needs* H);
- ``others+margin``: both;
- ``others>margin`` (the default): both, the hinge weighted ``max(0, lambda - p_max /
  ablation_scale)``: it starts only once the others' ablation probability has reached its cap.

An interchange-intervention lever (IIT, Geiger et al. 2022) was measured beside these and lost
(docs/benchmarks.md, with the commit whose code ran it); it does not ship.

Prints a markdown table: per spec and lever, the ``drop_at_least`` clause's measured drop and
verdict, clauses held, steps used, the tasks' held-out exact match, wall time.

    python -m bench.iit_vs_ablation [--levers others margin others+margin others>margin]
        [--json PATH]
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path
from typing import Any

from bench.lab.suite import STAGES, SUITE, spawn_enforced, work_enforced
from headwise.render.numbers import fixed

LEVERS = tuple(STAGES)


def carrier_specs() -> list[Path]:
    """Suite specs with a ``drop_at_least`` clause."""
    return [s for s in sorted(SUITE.glob("*.yaml")) if "drop_at_least" in s.read_text()]


def config(lever: str) -> Any:
    """The ``EnforceConfig`` of candidate ``lever``."""
    from headwise.contract import EnforceConfig

    return EnforceConfig(carrier_stages=STAGES[lever])


def row(res: dict[str, Any], lever: str) -> str:
    drops = [c for c in res["clauses"] if c["kind"] in ("ablation", "exclusive")
             and ">=" in c["threshold"]]
    drop = ", ".join(f"{fixed(c['measured'])} {'held' if c['passed'] else 'MISS'}"
                     for c in drops)
    exact = "; ".join(f"{t} {v['exact']:.3f}" for t, v in res["tasks"].items())
    return (f"| {res['spec']} | {lever} | {drop} | {res['held']}/{res['n_clauses']} | "
            f"{res['steps']} ({res['max_steps']}) | {exact} | {res['wall_s']:.1f} |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--levers", nargs="+", default=list(LEVERS), choices=LEVERS)
    parser.add_argument("--json", type=Path, default=None)
    parser.add_argument("--worker", nargs=3, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        return work_enforced(args.worker, config)
    lines = ["| spec | lever | drop clause measured | clauses held | steps (of) "
             "| task exact | wall s |", "|---|---|---|---|---|---|---|"]
    raw = []
    with tempfile.TemporaryDirectory() as tmp:
        for spec in carrier_specs():
            for lever in args.levers:  # interleaved: one spec's candidates back to back
                res = spawn_enforced(__spec__.name, spec, lever, Path(tmp))
                raw.append({"lever": lever, **res})
                lines.append(row(res, lever))
                print(lines[-1], file=sys.stderr, flush=True)
    if args.json:
        args.json.write_text(json.dumps(raw, indent=1))
    print("\n".join(lines))


if __name__ == "__main__":
    main()
