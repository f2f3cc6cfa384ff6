"""``headwise demo [--out DIR]``: the built-in run — train the bundled spec, verify, report."""

from __future__ import annotations

import argparse
import time
from importlib import resources
from pathlib import Path
from typing import Any

from headwise.cli.options import (
    add_device_argument,
    add_override_arguments,
    add_require_argument,
    add_run_options,
    add_subcommand,
)
from headwise.cli.output import console, print_outcome, set_threads, write_report_after

DEMO_SPEC = "demo.yaml"


def demo_spec_path() -> Path:
    """Path of the bundled demo spec (``headwise/examples/demo.yaml``, package data)."""
    return Path(str(resources.files("headwise") / "examples" / DEMO_SPEC))


def register(subparsers: Any) -> None:
    """Add the ``demo`` subcommand."""
    p = add_subcommand(
        subparsers, "demo", run,
        help="train the bundled demo spec, verify its contract, write the report",
        description="One layer, four heads, two tasks: a 1-layer Transformer learns copy and "
                    "reverse at once; one head gets its role from a mask, one from an "
                    "objective, and two are gated to one task each. The contract proves who "
                    "does what. About a minute on 2 CPU cores. Exit code 0: the contract "
                    "holds.")
    p.add_argument("--out", metavar="DIR", default="runs/demo",
                   help="run directory (default: runs/demo; an earlier demo run there is "
                        "replaced)")
    p.add_argument("--steps", type=int, default=None,
                   help="override train.steps (a shorter or longer run)")
    add_override_arguments(p)
    add_require_argument(p)
    add_run_options(p, 1, "1: the model is so small that more threads only add "
                    "synchronisation overhead")
    add_device_argument(p, None, "the spec's train.device, auto")


def run(args: argparse.Namespace) -> int:
    """Train the demo spec into ``--out`` and print what happened and where to look."""
    from headwise.pipeline.options import RunOptions
    from headwise.pipeline.run import train_run

    set_threads(args.threads)
    out = console()
    spec = demo_spec_path()
    source: str | Path = spec
    if args.steps is not None:
        source = _with_steps(spec.read_text(), args.steps)
    _check_out(Path(args.out))
    out.print(f"headwise demo: training {spec} -> {args.out}")
    start = time.perf_counter()
    outcome = train_run(source, Path(args.out), RunOptions(
        overwrite=True, progress=not args.quiet, device=args.device, seed=args.seed,
        overrides=None if args.set is None else tuple(args.set)))
    print_outcome(out, outcome)
    write_report_after(out, outcome)
    out.print(f"wall time {time.perf_counter() - start:.1f} s. Next: open "
              f"{outcome.run_dir / 'report.html'}; try `headwise explain {outcome.run_dir} "
              f"--head L0.H2 --input copy` or `headwise analyze {outcome.run_dir}`.")
    return 0 if outcome.contract is None else outcome.contract.exit_for(args.require)


def _check_out(out: Path) -> None:
    """Replace only an earlier demo run, never other work (the output rule, with ``--out``
    treated as ``--overwrite`` for an earlier demo run alone).

    Raises:
        ConfigError: ``out`` is a link or a file, or holds other work.
        SpecError: ``out`` holds a run of another spec.
    """
    import yaml

    from headwise.atomic import RUN, check_output_dir
    from headwise.errors import SpecError

    if check_output_dir(out, "--out", overwrite=True, replaces=(RUN,)) is None:
        return
    saved = out / "spec.yaml"
    try:
        name = (yaml.safe_load(saved.read_text()) or {}).get("name") if saved.is_file() else None
    except (yaml.YAMLError, AttributeError, OSError, UnicodeDecodeError, RecursionError):
        name = None
    if name != "demo":
        raise SpecError(f"--out: {out} holds a run of another spec ({saved}); expected an "
                        "empty directory or an earlier demo run")


def _with_steps(text: str, steps: int) -> str:
    """The demo spec with ``train.steps`` (and its evaluation points) changed."""
    import yaml

    from headwise.errors import SpecError

    if steps < 1:
        raise SpecError(f"--steps: got {steps}, expected an integer >= 1")
    data = yaml.safe_load(text)
    train = data.setdefault("train", {})
    train["steps"] = steps
    train["warmup_steps"] = min(train.get("warmup_steps", 0), steps)
    train["eval_every"] = min(train.get("eval_every", steps), steps)
    return yaml.safe_dump(data, sort_keys=False)
