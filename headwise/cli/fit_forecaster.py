"""``headwise fit-forecaster RUN RUN... --out FILE``: a role forecaster fit on your own runs."""

from __future__ import annotations

import argparse
import re
from pathlib import Path
from typing import Any

from headwise.atomic import check_output_file
from headwise.cli.options import add_subcommand
from headwise.cli.output import console, write_file
from headwise.errors import SpecError


def register(subparsers: Any) -> None:
    """Add the ``fit-forecaster`` subcommand."""
    p = add_subcommand(
        subparsers, "fit-forecaster", run,
        help="fit the role forecaster on your own finished runs",
        description="Fit the role forecaster (the packaged one's model and features) on "
                    "finished runs with checkpoints, e.g. other seeds of one spec, and write "
                    "it as JSON for `analyze RUN --forecast --forecaster FILE` and `train "
                    "--forecast-every N --forecaster FILE`. Each run is also forecast from its "
                    "first 20% of checkpoints by a fit on the other runs; that accuracy (and "
                    "the linear baseline's) is stored in the file and quoted wherever it is "
                    "used.")
    p.add_argument("runs", nargs="+", metavar="RUN",
                   help="at least two run directories trained with train.checkpoint_every")
    p.add_argument("--out", required=True, metavar="FILE", help="the forecaster JSON to write")
    p.add_argument("--overwrite", action="store_true",
                   help="replace an existing --out file instead of refusing")


def run(args: argparse.Namespace) -> int:
    """Fit on the runs' trajectories, write the file, print what it measured."""
    from headwise.forecast.roles import fit_forecaster, measured_text
    from headwise.pipeline.finished import load_compiled
    from headwise.pipeline.run_report import run_trajectory

    check_output_file(args.out, "--out")
    if Path(args.out).exists() and not args.overwrite:
        raise SpecError(f"--out: {args.out} exists; pass --overwrite to replace it")
    if len(args.runs) < 2:
        raise SpecError(f"RUN: got {len(args.runs)} run, expected at least 2 (each is "
                        "measured by a forecaster fit on the others)")
    resolved = [Path(r).resolve() for r in args.runs]
    for i, r in enumerate(resolved):
        if r in resolved[:i]:
            raise SpecError(f"RUN: {args.runs[i]} is given twice; expected distinct runs (a "
                            "run measured by a fit on itself would grade its training data)")
    trajectories = []
    for run_dir in args.runs:
        traj = run_trajectory(Path(run_dir), load_compiled(run_dir))
        if traj is None:
            raise SpecError(f"RUN: {run_dir} has no checkpoints; expected a run trained with "
                            "train.checkpoint_every >= 1")
        trajectories.append(traj)
    try:
        forecaster = fit_forecaster(trajectories)
    except ValueError as e:  # "runs[k]: why" names the k-th RUN
        m = re.fullmatch(r"runs\[(\d+)\]: (.*)", str(e), re.DOTALL)
        raise SpecError(f"RUN: {args.runs[int(m[1])]}: {m[2]}" if m else f"RUN: {e}") from None
    if Path(args.out).exists() and not args.overwrite:  # again: fitting takes a while
        raise SpecError(f"--out: {args.out} exists; pass --overwrite to replace it")
    write_file(args.out, forecaster.to_json(), "--out")
    out = console()
    out.print(measured_text(forecaster.measured), markup=False)
    out.print(f"written: {args.out}")
    return 0
