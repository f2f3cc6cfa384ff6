"""``headwise train SPEC [--out RUN] [--resume] [--enforce] [--no-report]``: train a spec, verify,
print the verdict, then write the report (with progress lines).

The flags that shape the training (``--enforce``, ``--enforce-budget``, ``--allow-unenforced``,
``--steps``, ``--seed``, ``--set``) default to ``None`` here, so that ``--resume`` can tell a flag
left out (the run's own value) from one given (checked against the run's); see
``headwise.pipeline.resume``.
"""

from __future__ import annotations

import argparse
import shlex
import sys
from pathlib import Path
from typing import Any

from rich.markup import escape

from headwise.cli.options import (
    add_device_argument,
    add_override_arguments,
    add_require_argument,
    add_run_options,
    add_subcommand,
)
from headwise.cli.output import console, print_outcome, set_threads, write_report_after


def register(subparsers: Any) -> None:
    """Add the ``train`` subcommand."""
    p = add_subcommand(
        subparsers, "train", run, help="train a spec, verify its contract and write the report",
        description="Train the model a YAML spec describes (levers, tasks, gates), verify its "
                    "contract on held-out data and write the run directory with report.html. "
                    "Exit code 0: the contract holds; 1: it does not; 2: bad input.")
    p.add_argument("spec", help="the YAML spec (reference: docs/spec.md)")
    p.add_argument("--out", metavar="RUN",
                   help="run directory (default: runs/<spec file name without .yaml>)")
    p.add_argument("--resume", action="store_true",
                   help="continue the same run from its latest checkpoint (exact resume) with "
                        "the flags it was started with; a flag given must equal the run's, "
                        "except a larger --steps, which extends the run; refuses when the run "
                        "has no checkpoint")
    p.add_argument("--enforce", action="store_true", default=None,
                   help="constrained training: every clause's lever is driven by a Lagrange "
                        "multiplier updated from its measured violation at each evaluation "
                        "point, until the contract holds (see `headwise plan SPEC`)")
    p.add_argument("--allow-unenforced", action="store_true", default=None,
                   help="with --enforce, accept clauses no lever can move (else exit 2)")
    p.add_argument("--enforce-budget", type=float, default=None, metavar="F",
                   help="with --enforce, allow up to F x train.steps (1 to 1.3; default 1) "
                        "per attempt (a run not certified trains again at half train.lr: "
                        "enforce.retries)")
    p.add_argument("--no-report", action="store_true",
                   help="print the verdict and stop: no report.html (write it later with "
                        "`headwise report RUN`)")
    p.add_argument("--overwrite", action="store_true",
                   help="replace an existing run in --out instead of refusing")
    p.add_argument("--steps", type=int, default=None, metavar="N",
                   help="train for N steps instead of the spec's train.steps (with --resume: "
                        "a larger N extends the run; the learning-rate schedule then spans N)")
    add_override_arguments(p)
    p.add_argument("--forecast-every", type=int, default=0, metavar="N",
                   help="every N steps (at evaluation points) forecast each head's final role "
                        "and warn about contract clauses forecast to fail (needs "
                        "train.eval_every)")
    p.add_argument("--forecaster", metavar="FILE",
                   help="with --forecast-every: warn from this forecaster (JSON from "
                        "`headwise fit-forecaster`) instead of the packaged one (the report "
                        "still quotes the packaged one)")
    add_require_argument(p)
    add_run_options(p, None, "torch's choice; 1 is fastest for tiny models")
    add_device_argument(p, None, "the spec's train.device, itself auto by default")


def default_out(spec_path: str) -> Path:
    """``runs/<file stem>`` for a spec file."""
    return Path("runs") / Path(spec_path).stem


def run(args: argparse.Namespace) -> int:
    """Train, verify and report; the exit code says whether the contract holds.

    Under ``torchrun --nproc_per_node=N`` every rank trains its shard (DDP inside ``train()``)
    and verifies; rank 0 writes the run directory and prints.
    """
    from headwise.pipeline.options import RunOptions
    from headwise.pipeline.run import train_run
    from headwise.pipeline.run_dir import is_main_process
    from headwise.training import list_checkpoints
    from headwise.training.distributed import finish_together
    from headwise.training.interrupt import Interrupted

    if args.threads is not None:
        set_threads(args.threads)
    out = Path(args.out) if args.out else default_out(args.spec)
    resume = resume_command(args, out)
    try:
        outcome = train_run(Path(args.spec), out, RunOptions(
            enforce=args.enforce, enforce_budget=args.enforce_budget,
            allow_unenforced=args.allow_unenforced, steps=args.steps,
            overrides=None if args.set is None else tuple(args.set), seed=args.seed,
            resume=args.resume, overwrite=args.overwrite, progress=not args.quiet,
            device=args.device, forecast_every=args.forecast_every, forecaster=args.forecaster,
            warn=lambda line: console().print(f"[yellow]warning:[/yellow] {escape(line)}",
                                              soft_wrap=True)))  # one line per warning
    except Interrupted as e:  # under torchrun every rank stops at the same step; one line
        if is_main_process():
            print(f"interrupted at step {e.step}; resume with: {resume}" if e.checkpoint
                  else "interrupted before the first checkpoint; start again with: "
                  f"{resume_command(args, out, again=True)}", file=sys.stderr)
        return 130
    except KeyboardInterrupt:
        if is_main_process():
            found = list_checkpoints(out)
            print(f"interrupted (last checkpoint: step {found[-1][0]}); resume with: {resume}"
                  if found else "interrupted before the first checkpoint; start again with: "
                  f"{resume_command(args, out, again=True)}", file=sys.stderr)
        return 130
    if is_main_process():  # under torchrun, rank 0 prints the verdict, then writes the report
        term = console()
        print_outcome(term, outcome, report=not args.no_report)
        if not args.no_report:
            write_report_after(term, outcome)
    code = 0 if outcome.contract is None else outcome.contract.exit_for(args.require)
    return finish_together(code) or code  # under torchrun: every rank after rank 0's report


def resume_command(args: argparse.Namespace, out: Path, again: bool = False) -> str:
    """The command that continues this run (``again``: that starts it again), as typed.

    Every option given is repeated (``--overwrite`` becomes ``--resume``), so the command works
    as printed; ``--resume`` alone would reuse the run's flags as well.
    """
    argv = ["headwise", "train", args.spec, "--out", str(out)]
    argv += [] if again else ["--resume"]
    argv += ["--enforce"] if args.enforce else []
    argv += ["--allow-unenforced"] if args.allow_unenforced else []
    for flag, value in (("--enforce-budget", args.enforce_budget), ("--steps", args.steps),
                        ("--seed", args.seed), ("--device", args.device),
                        ("--threads", args.threads), ("--forecaster", args.forecaster)):
        argv += [flag, str(value)] if value is not None else []  # str(float) round-trips
    argv += ["--forecast-every", str(args.forecast_every)] if args.forecast_every else []
    for item in args.set or ():
        argv += ["--set", item]
    argv += ["--quiet"] if args.quiet else []
    argv += ["--no-report"] if getattr(args, "no_report", False) else []
    return shlex.join(argv)
