"""``headwise report RUN``: (re)write a run's report.json and self-contained report.html."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from headwise.cli.options import add_run_argument, add_subcommand
from headwise.cli.output import console, report_progress


def register(subparsers: Any) -> None:
    """Add the ``report`` subcommand."""
    p = add_subcommand(
        subparsers, "report", run, help="write a run's report.json and report.html",
        description="Analyse a finished run (contract verdicts, enforcement, an attention "
                    "viewer, role scores, ablation importance per task, score trajectories "
                    "over its checkpoints, training curves, expected vs observed patterns, "
                    "walkthroughs of gated heads) and write RUN/report.json and a "
                    "self-contained RUN/report.html.")
    add_run_argument(p)
    p.add_argument("--heads", metavar="SELECTOR",
                   help="the heads the attention viewer shows, e.g. 'L3.*' or 'L0.H1,L2.H0' "
                        "(default: the heads the contract and the spec's heads: section name, "
                        "else every head)")


def run(args: argparse.Namespace) -> int:
    """Write the report and say where it is."""
    from headwise.pipeline.resume import read_run_info
    from headwise.pipeline.run_report import report_existing_run

    out = console()
    paths = report_existing_run(args.run, heads=args.heads, progress=report_progress(out))
    step = read_run_info(Path(args.run)).get("step")  # sealed by the run's manifest
    of = f"the weights of step {step}" if step is not None else "the run's weights"
    out.print(f"report of {of}: written {paths['json']} and {paths['html']}")
    return 0
