"""``headwise plan SPEC``: each clause's kind, measurement and lever, before any training."""

from __future__ import annotations

import argparse

from rich.table import Table

from headwise.cli.options import add_subcommand
from headwise.cli.output import console


def register(sub: argparse._SubParsersAction) -> None:
    p = add_subcommand(
        sub, "plan", run, help="show how --enforce would act on each contract clause",
        description="Compile a spec (no training) and print, per contract clause, its kind, "
                    "what it is measured on, the lever --enforce drives and its starting "
                    "weight. Exit code 0: every clause has a lever; 1: some have none; 2: bad "
                    "input, or a clause the spec's masks or gates make impossible.")
    p.add_argument("spec", help="the YAML spec (reference: docs/spec.md)")


def run(args: argparse.Namespace) -> int:
    from headwise.contract import plan
    from headwise.pipeline import compile_spec
    from headwise.pipeline.heldout import enforcement_data, probe_sampler
    from headwise.runspec import SpecError, load_spec

    spec = load_spec(args.spec)
    if not spec.contract:
        raise SpecError("contract: missing; expected a list of clauses to plan for")
    compiled = compile_spec(spec)
    contract = spec.contract
    levers = plan(compiled, contract, probe_sampler(spec), spec.enforce,
                  enforcement_data(compiled))
    table = Table(title=f"enforcement plan: {args.spec}")
    for col in ("#", "clause", "kind", "bound", "measured on", "lever", "start weight"):
        table.add_column(col)
    for c in contract:
        lever = levers[c.index]
        table.add_row(str(c.index), c.label, c.kind, c.threshold_text(),
                      c.measured_on(), "(no lever)" if lever is None else lever.description,
                      "-" if lever is None else "0 (multiplier x scale "
                      f"{lever.scale:g}{'' if lever.cap is None else f', cap {lever.cap:g}'})")
    out = console()
    out.print(table)
    unmoved = [c.path for c in contract if levers[c.index] is None]
    if unmoved:
        out.print(f"{len(unmoved)} clause{'s' if len(unmoved) != 1 else ''} without a lever: "
                  f"{', '.join(unmoved)} (train --enforce refuses them unless "
                  "--allow-unenforced)")
    return 1 if unmoved else 0
