"""Parser set-up shared by the subcommands: the subparser itself and the options several take.

Each subcommand module's ``register`` builds its parser with ``add_subcommand`` and adds the
shared options from here, so that ``--device``, ``--hf``/``--revision``, ``--threads``,
``--quiet``, ``--seed``/``--set``, ``--require`` and a run directory read (and are
documented) the same in every command.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import Any

from headwise.training.device import DEVICE_CHOICES


def add_subcommand(subparsers: Any, name: str, run: Callable[[argparse.Namespace], int], *,
                   help: str, description: str) -> argparse.ArgumentParser:
    """Add the subcommand ``name`` whose ``func`` is ``run(args) -> exit code``."""
    parser: argparse.ArgumentParser = subparsers.add_parser(name, help=help,
                                                            description=description)
    parser.set_defaults(func=run)
    return parser


def add_run_argument(p: argparse.ArgumentParser) -> None:
    """Add the positional ``RUN``: a run directory."""
    p.add_argument("run", metavar="RUN",
                   help="a run directory written by `headwise train` / `headwise demo`")


def add_hf_arguments(p: argparse.ArgumentParser, required: bool) -> None:
    """Add ``--hf DIR|ID`` (a local HuggingFace model) and ``--revision REV``."""
    p.add_argument("--hf", required=required, metavar="DIR|ID",
                   help="a local HuggingFace model directory, or a model id in the local HF "
                        "cache (no network)")
    p.add_argument("--revision", metavar="REV",
                   help="with --hf ID: branch, tag or commit in the cache (default main)")


def add_run_options(p: argparse.ArgumentParser, threads: int | None, threads_text: str) -> None:
    """Add ``--threads N`` (torch's CPU threads) and ``--quiet`` (no progress bar)."""
    p.add_argument("--threads", type=int, default=threads,
                   help=f"CPU threads for torch (default: {threads_text})")
    p.add_argument("--quiet", action="store_true",
                   help="no progress (a bar on a terminal, else a plain line every 30 s and "
                        "per evaluation point)")


def add_require_argument(p: argparse.ArgumentParser) -> None:
    """Add ``--require holds|certified``: what exit code 0 asks of the contract."""
    p.add_argument("--require", choices=("holds", "certified"), default="holds",
                   help="exit 0 when every clause holds (default), or only when every clause "
                        "is certified at the contract's family-wise level "
                        "(contract.confidence, Holm's step-down)")


def add_override_arguments(p: argparse.ArgumentParser) -> None:
    """Add ``--seed N`` and repeatable ``--set path.to.key=value`` (spec overrides)."""
    p.add_argument("--seed", type=int, default=None, metavar="N",
                   help="train.seed for this run (the same as --set train.seed=N)")
    p.add_argument("--set", action="append", default=None, metavar="KEY=VALUE",
                   help="override one key of the spec, e.g. --set train.lr=3e-4 or --set "
                        "data.tasks.copy.length=6 (repeatable; the value is YAML; checked like "
                        "the file and recorded in the run's spec.yaml)")


def add_device_argument(p: argparse.ArgumentParser, default: str | None,
                        default_text: str) -> None:
    """Add ``--device auto|cpu|cuda|cuda:N`` (checked when the command places the model)."""
    p.add_argument("--device", default=default, metavar="DEVICE",
                   help=f"where the model runs: {DEVICE_CHOICES} (default: {default_text}; "
                        "auto picks CUDA when available)")


def add_format_argument(p: argparse.ArgumentParser) -> None:
    """Add ``--format table|json|csv|md`` (how the command prints its tables)."""
    from headwise.render.tables import FORMATS

    p.add_argument("--format", choices=FORMATS, default="table",
                   help="how to print the tables: table (the terminal; a table wider than it "
                        "is split into column groups, never cut), json, csv or md (Markdown); "
                        "default table")
