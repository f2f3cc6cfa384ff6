"""The ``headwise`` command line: one module per subcommand, each with ``register(subparsers)``.

Exit codes: 0 success, 1 contract failed, 2 bad input (a ``HeadwiseError`` or a usage error;
one clear message, never a traceback).
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence
from typing import NoReturn

from headwise.errors import HeadwiseError

# Subcommand modules under headwise.cli; each defines register(subparsers) which adds its
# parser and sets ``func(args) -> int`` as the default. A module that does not exist yet is
# skipped, so subcommands land independently.
COMMANDS = ("demo", "train", "plan", "verify", "analyze", "report", "explain", "convert",
            "export")


class _Parser(argparse.ArgumentParser):
    """ArgumentParser whose usage errors are one line (and exit 2), like every other error."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message} (see --help)\n")


def build_parser() -> argparse.ArgumentParser:
    """The top-level parser with every available subcommand."""
    parser = _Parser(
        prog="headwise",
        description="Train, coordinate and verify the individual heads of Transformers.",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in COMMANDS:
        try:
            module = importlib.import_module(f"headwise.cli.{name}")
        except ModuleNotFoundError as e:
            if e.name != f"headwise.cli.{name}":
                raise
            continue
        module.register(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the console script; returns the exit code."""
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as e:  # argparse: --help exits 0, usage errors exit 2
        return int(e.code or 0)
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    try:
        return int(args.func(args))
    except HeadwiseError as e:
        print(f"headwise {args.command}: error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
