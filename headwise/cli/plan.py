"""``headwise plan SPEC``: each clause's kind, measurement and lever, before any training."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

from rich.table import Table

from headwise.cli.options import add_override_arguments, add_subcommand
from headwise.cli.output import console

if TYPE_CHECKING:
    from headwise.contract.lever import ClauseLever
    from headwise.pipeline.compile import Compiled
    from headwise.runspec import Spec


def register(sub: argparse._SubParsersAction) -> None:
    p = add_subcommand(
        sub, "plan", run, help="show how --enforce would act on each contract clause",
        description="Compile a spec (no training) and print, per contract clause, its kind, "
                    "what it is measured on, the lever --enforce drives and its starting "
                    "weight. Exit code 0: every clause has a lever; 1: some have none; 2: bad "
                    "input, or a clause the spec's masks or gates make impossible.")
    p.add_argument("spec", help="the YAML spec (reference: docs/spec.md)")
    add_override_arguments(p)
    p.add_argument("--pilot", type=int, default=None, metavar="N",
                   help="also train N plain steps in memory (1 <= N <= 10^9; at most the "
                        "spec's train.steps are trained) and show which clauses and task "
                        "floors move (measured on the enforcement set)")


def run(args: argparse.Namespace) -> int:
    import headwise.validate as check
    from headwise.contract import plan
    from headwise.pipeline import compile_spec
    from headwise.pipeline.heldout import enforcement_data, probe_sampler
    from headwise.pipeline.run import MAX_STEPS
    from headwise.runspec import SpecError
    from headwise.runspec.overrides import load_spec_with, overrides_of

    if args.pilot is not None:  # before the spec is compiled, and named as given
        check.integer(args.pilot, "--pilot", 1, MAX_STEPS)
    spec = load_spec_with(args.spec, overrides_of(args.set, args.seed))
    if not spec.contract:
        raise SpecError("contract: missing; expected a list of clauses to plan for")
    compiled = compile_spec(spec)
    contract = spec.contract
    levers = plan(compiled.model, contract, compiled.structure,
                  probes=probe_sampler(spec, compiled.data),
                  config=spec.enforce, data=enforcement_data(compiled)).levers
    every = spec.enforce.cadence(spec.train.steps, spec.train.eval_every)
    table = Table(title=f"enforcement plan: {args.spec}",
                  caption=f"under --enforce the contract is measured on the enforcement set "
                          f"({spec.data.eval_examples} examples) every {every} steps of "
                          f"{spec.train.steps} (enforce.every); {_retries(spec)}; the "
                          f"verdict on the verification set ({_verify_size(spec)})")
    for col in ("#", "clause", "kind", "bound", "measured on", "lever", "start weight"):
        table.add_column(col)
    for c in contract:
        lever = levers[c.index]
        table.add_row(str(c.index), c.label, c.kind, c.threshold_text(),
                      c.measured_on(), "(no lever)" if lever is None else lever.description,
                      "-" if lever is None else _start_weight(lever))
    out = console()
    out.print(table)
    out.print(_circuits_table(compiled))
    if args.pilot is not None:
        out.print(_pilot_table(load_spec_with(args.spec, overrides_of(args.set, args.seed)),
                               args.pilot))
    unmoved = [c.path for c in contract if levers[c.index] is None]
    if unmoved:
        out.print(f"{len(unmoved)} clause{'s' if len(unmoved) != 1 else ''} without a lever: "
                  f"{', '.join(unmoved)} (train --enforce refuses them unless "
                  "--allow-unenforced)")
    return 1 if unmoved else 0


def _start_weight(lever: ClauseLever) -> str:
    """The lever's weight at step 0 and how its multiplier moves it."""
    if lever.cap is not None and lever.start >= lever.cap:
        return f"{lever.start:g}, fixed"
    cap = "" if lever.cap is None else f", cap {lever.cap:g}"
    return f"{lever.start:g} (multiplier x scale {lever.scale:g}{cap})"


def _retries(spec: Spec) -> str:
    """What a run not certified on the enforcement set does next (``enforce.retries``)."""
    n = spec.enforce.retries
    if not n:
        return "one attempt (enforce.retries: 0)"
    times = "once" if n == 1 else f"up to {n} times, each at half the last rate"
    return ("not certified there at the end, it trains again from its initial weights at half "
            f"train.lr, {times} (enforce.retries), and keeps the attempt that went furthest "
            "there")


def _verify_size(spec: Spec) -> str:
    """The verification set's size (what an enforced run may grow it to,
    ``headwise.contract.evidence``), and the size at which a model meeting every clause at its
    best would be certified whole (``Contract.verification_examples``)."""
    from headwise.contract.evidence import GROWTH

    need = spec.contract.verification_examples(spec.data.weights)
    size = f"{spec.data.verify_examples} examples"
    if not spec.data.verify_given:
        size += (f" (up to {GROWTH * spec.data.verify_examples} where the kept model's "
                 "margins on the enforcement set ask for more)")
    if not need:
        return size
    return (f"{size}; a model meeting every clause at its best is certified family-wise from "
            f"{need}")


def _circuits_table(compiled: Compiled) -> Table:
    """Per task, the circuit a failing floor's assists would build: the one its generator
    declares, else the one proposed from its training examples
    (``headwise.data.circuit_proposals``), with the share of its targets it explains."""
    from headwise.data.circuit_proposals import MIN_KAPPA, MIN_SHARE, circuit_text
    from headwise.pipeline.compile import PROPOSAL_EXAMPLES

    table = Table(title="circuits for task floors that stop improving (assists)")
    for col in ("task", "circuit", "explains (chance)", "from"):
        table.add_column(col)
    shares, proposals = compiled.circuit_shares, compiled.proposals
    for name, task in compiled.data.tasks.items():
        if task.circuit:
            table.add_row(name, circuit_text(task.circuit), "-",
                          f"declared by the {task.name} generator")
            continue
        ranked = shares.get(name)
        if not ranked:
            table.add_row(name, "none", "-", "no scored target in its training examples")
            continue
        best, chosen = ranked[0], proposals.get(name)
        sample = f"{best.targets} scored targets of {PROPOSAL_EXAMPLES} training examples"
        if chosen is not None:
            table.add_row(name, chosen.describe(), f"{chosen.share:.2f} ({chosen.chance:.2f})",
                          f"proposed from {sample}")
        elif best.clear:
            table.add_row(name, f"none: {best.describe()} needs {best.layers} layers, the "
                          f"model has {compiled.spec.n_layers}",
                          f"{best.share:.2f} ({best.chance:.2f})", sample)
        else:
            table.add_row(name, f"none: the best, {best.name}, explains no clear majority "
                          f"(needs >= {MIN_SHARE:g} and kappa >= {MIN_KAPPA:g})",
                          f"{best.share:.2f} ({best.chance:.2f})", sample)
    return table


def _not_learning(compiled: Compiled, index: int) -> str:
    """The pilot's note on a floor that does not move: the circuit ``--enforce`` would assist
    its task with once the floor stops improving (``_circuits_table``), if any."""
    from headwise.data.circuit_proposals import circuit_text

    task = compiled.spec.contract[index].task or ""
    proposal = compiled.proposals.get(task)
    declared = compiled.data.tasks[task].circuit if task in compiled.data.tasks else ()
    if proposal is not None:
        circuit = f"{proposal.describe()}, which explains {proposal.share:.2f} of its targets"
    elif declared:
        circuit = circuit_text(declared)
    else:
        return " (the task is not learning)"
    return f" (the task is not learning; --enforce assists it with {circuit})"


def _pilot_table(spec: object, steps: int) -> Table:
    """The pilot's table (``headwise.pipeline.pilot``), on a fresh compile of the spec."""
    from headwise.pipeline import compile_spec
    from headwise.pipeline.pilot import pilot
    from headwise.render.numbers import fixed

    compiled = compile_spec(spec)  # type: ignore[arg-type]
    rows = pilot(compiled, compiled.spec.contract, steps)
    table = Table(title=f"pilot: the first {steps} plain steps (enforcement set)")
    for col in ("#", "clause", "before", "after", "towards bound", "holds", "moves",
                "forecast at the end, plain: P(holds), value [90%]"):
        table.add_column(col)
    for r in rows:
        moved = ("yes" if r.towards > 0.01 else "away" if r.towards < -0.01 else "no")
        if r.floor and moved != "yes" and not r.holds:
            moved += _not_learning(compiled, r.index)
        f = r.forecast
        table.add_row(str(r.index), r.label, "-" if r.before is None else fixed(r.before),
                      "-" if r.after is None else fixed(r.after), fixed(r.towards, sign=True),
                      "yes" if r.holds else "no", moved,
                      "-" if f is None else f"{f.probability:.2f}, {f.value_text()}"
                      + (" (outside the fitted range)" if f.outside else ""))
    return table
