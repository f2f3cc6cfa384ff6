"""``headwise verify SPEC --run RUN``: check a trained run against a spec's contract."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from headwise.cli.options import add_device_argument, add_require_argument, add_subcommand
from headwise.cli.output import console


def register(subparsers: Any) -> None:
    """Add the ``verify`` subcommand."""
    p = add_subcommand(
        subparsers, "verify", run, help="verify a trained run against a spec's contract",
        description="Rebuild the run's model with the spec's levers, load its weights, measure "
                    "every contract clause on held-out data and write RUN/contract.json (for a "
                    "spec other than the run's own: RUN/contract.<hash>.json beside it). "
                    "Each clause gets a one-sided confidence bound at contract.confidence and "
                    "is certified, holds, or fails. "
                    "Exit code 0: the contract holds; 1: it does not; 2: bad input.")
    p.add_argument("spec", help="the YAML spec whose contract to check")
    p.add_argument("--run", required=True, metavar="RUN", help="the run directory")
    p.add_argument("--fresh", type=int, default=None, metavar="SEED",
                   help="verify on a new verification set drawn from SEED (an integer in "
                        "[0, 2^63) away from the run's own seeds; built-in generators and "
                        "probes drawn anew), written beside the run's verdict as "
                        "RUN/contract.fresh-SEED.json; the report shows it")
    p.add_argument("--data", action="append", default=[], metavar="TASK=FILE",
                   help="verify with FILE read whole as TASK's verification examples (new rows "
                        "for a task read from a file; repeatable, once per task), written "
                        "beside the run's verdict as RUN/contract.data-HASH.json; the report "
                        "shows it")
    add_require_argument(p)
    add_device_argument(p, "cpu", "cpu")


def run(args: argparse.Namespace) -> int:
    """Verify and print one row per clause."""
    from headwise.contract import did_not_learn
    from headwise.pipeline.finished import verify_run
    from headwise.pipeline.reverify import reverify_run

    out = console()
    notes: list[str] = []
    if args.fresh is None and not args.data:
        verdict, written = verify_run(Path(args.spec), args.run, args.device)
    else:
        verdict, written, notes = reverify_run(Path(args.spec), args.run, args.fresh,
                                               [_task_file(x) for x in args.data], args.device)
    out.print(verdict.to_rich_table())
    for line in [*did_not_learn(verdict.results).values(), *verdict.evidence(), *notes]:
        out.print(line, markup=False)
    if args.fresh is not None or args.data:
        out.print(f"note: verified on new data ({written.name}); the run's own contract.json "
                  "is unchanged (`headwise report RUN` shows both)", markup=False)
    elif written.name != "contract.json":
        out.print(f"note: {args.spec} differs from the run's own spec "
                  f"({Path(args.run) / 'spec.yaml'}); this verdict is written beside the run's "
                  f"contract.json, which is unchanged", markup=False)
    out.print(f"written: {written}", markup=False)
    return verdict.exit_for(args.require)


def _task_file(text: str) -> tuple[str, Path]:
    """``TASK=FILE`` of ``--data``.

    Raises:
        SpecError: no ``=``, or an empty side.
    """
    from headwise.errors import SpecError

    task, sep, file = text.partition("=")
    if not (sep and task and file):
        raise SpecError(f"--data: got {text!r}, expected TASK=FILE")
    return task, Path(file)
