"""The ``headwise`` command line: one module per subcommand, each with ``register(subparsers)``.

Exit codes: 0 success, 1 contract failed (or training diverged), 2 bad input (a
``HeadwiseError`` or a usage error; one clear message, never a traceback), 130 interrupted
(Ctrl-C or SIGTERM; ``train`` saves a checkpoint first and says how to resume). Under
``torchrun`` every rank exits with the same code and only rank 0 prints a refusal.
"""

from __future__ import annotations

import argparse
import errno
import importlib
import os
import signal
import sys
from collections.abc import Sequence
from typing import NoReturn

from headwise.atomic import MAX_NAME_BYTES
from headwise.errors import HeadwiseError, TrainingDiverged
from headwise.training.interrupt import Interrupted

# Subcommand modules under headwise.cli; each defines register(subparsers) which adds its
# parser and sets ``func(args) -> int`` as the default. A module that does not exist yet is
# skipped, so subcommands land independently.
COMMANDS = ("demo", "train", "plan", "verify", "analyze", "report", "explain", "generate",
            "circuit", "convert", "export", "fit_forecaster")


class _Parser(argparse.ArgumentParser):
    """ArgumentParser whose usage errors are one line (and exit 2), like every other error."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message} (see --help)\n")


def build_parser() -> argparse.ArgumentParser:
    """The top-level parser with every available subcommand."""
    from headwise import __version__  # the public facade, one layer below the CLI

    parser = _Parser(
        prog="headwise",
        description="Train, coordinate and verify the individual heads of Transformers.",
    )
    parser.add_argument("--version", action="version", version=f"headwise {__version__}")
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


def _refuse(line: str) -> int:
    """Print ``line`` and return exit code 2; under ``torchrun`` every rank refusing leaves
    together (``finish_together``) and only rank 0 prints, unless rank 0 did not refuse."""
    from headwise.training.distributed import REFUSAL_PATIENCE, finish_together

    main_rank = os.environ.get("RANK", "0") == "0"
    if main_rank:
        print(line, file=sys.stderr)
    if finish_together(2, REFUSAL_PATIENCE) is None and not main_rank:
        print(line, file=sys.stderr)  # rank 0 went on: this rank says why it stopped
    return 2


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
    previous = _sigterm_as_interrupt()
    try:
        return int(args.func(args))
    except HeadwiseError as e:  # under torchrun every rank refuses; rank 0 says why
        return _refuse(f"headwise {args.command}: error: {_one_line(e)}")
    except TrainingDiverged as e:
        print(f"headwise {args.command}: error: {_one_line(e)}", file=sys.stderr)
        return 1
    except Interrupted as e:  # training saved a checkpoint first (train prints its own line)
        print(f"headwise {args.command}: interrupted at step {e.step}"
              + (f" (checkpoint: {e.checkpoint})" if e.checkpoint else ""), file=sys.stderr)
        return 130
    except KeyboardInterrupt:
        print(f"headwise {args.command}: interrupted", file=sys.stderr)
        return 130
    except OSError as e:  # a writer without its own message: still one line naming the file
        if e.errno == errno.ENAMETOOLONG:  # any path given, read or written
            path = " ".join(str(e.filename or "a path").split())[:600]
            return _refuse(f"headwise {args.command}: error: {path}: a path or name longer "
                           f"than this system allows; expected names of at most "
                           f"{MAX_NAME_BYTES} bytes")
        if e.errno not in (errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EACCES):
            raise
        print(f"headwise {args.command}: error: {e.filename or 'a file'}: cannot write "
              f"({e.strerror})", file=sys.stderr)
        return 2
    finally:
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)


def _one_line(error: BaseException) -> str:
    """The error's message on one line, at most ~600 characters."""
    text = " ".join(str(error).split())
    return text if len(text) <= 600 else text[:597] + "..."


def _sigterm_as_interrupt() -> signal.Handlers | None:
    """Make SIGTERM raise ``KeyboardInterrupt`` like Ctrl-C; return the previous handler."""

    def interrupt(signum: int, frame: object) -> None:
        raise KeyboardInterrupt

    try:
        return signal.signal(signal.SIGTERM, interrupt)  # type: ignore[return-value]
    except ValueError:  # not the main thread (e.g. main() called from a test's thread)
        return None


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
