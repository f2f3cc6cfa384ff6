"""Terminal output of runs: the contract table, the enforcement summary and where to look."""

from __future__ import annotations

import os
import shutil
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rich.console import Console
from rich.table import Table

from headwise.render.numbers import fixed

if TYPE_CHECKING:
    from headwise.pipeline.run import RunOutcome
    from headwise.render.tables import TextTable


def console() -> Console:
    """The console the CLI prints to: as wide as the terminal (``COLUMNS`` where set), 120
    columns when the output is not a terminal; tables wider split into column groups."""
    width = shutil.get_terminal_size((120, 40)).columns
    return Console(highlight=False, width=width)


def print_tables(tables: Sequence[TextTable], fmt: str) -> None:
    """Print ``tables`` in ``fmt`` (``--format``): ``table`` as rich tables split into column
    groups that fit the console; ``json`` one object ``{"tables": [...]}``; ``csv`` each table
    after a ``# title`` line, separated by a blank line; ``md`` Markdown tables."""
    import json
    import sys

    if fmt == "table":
        out = console()
        for t in tables:
            for part in t.rich_tables(out.width):
                out.print(part)
    elif fmt == "json":
        sys.stdout.write(json.dumps({"tables": [t.to_dict() for t in tables]}, indent=1) + "\n")
    elif fmt == "csv":
        sys.stdout.write("\n".join(f"# {t.title}\n{t.to_csv()}" for t in tables))
    else:
        sys.stdout.write("\n".join(t.to_markdown() for t in tables))


def note(fmt: str, text: str) -> None:
    """A line beside the tables: on stdout with ``--format table``, else on stderr (so the
    tables on stdout stay machine-readable)."""
    import sys

    if fmt == "table":
        console().print(text, markup=False)
    else:
        print(text, file=sys.stderr)


def max_threads() -> int:
    """The most CPU threads ``--threads`` accepts: 4 per CPU core."""
    return 4 * (os.cpu_count() or 1)


def set_threads(n: int) -> None:
    """Set torch's intra-op CPU threads.

    Raises:
        SpecError: ``n`` outside [1, ``max_threads()``].
    """
    import torch

    from headwise.errors import SpecError

    if not 1 <= n <= max_threads():
        raise SpecError(f"--threads: got {n}, expected an integer in [1, {max_threads()}] "
                        f"(this machine has {os.cpu_count()} CPU cores)")
    torch.set_num_threads(n)


def write_file(path: str, text: str, option: str) -> None:
    """Write a file named by a CLI option, atomically.

    Raises:
        SpecError: the file cannot be written (naming the option and the path).
    """
    from headwise.atomic import write_bytes_atomic
    from headwise.errors import SpecError

    try:
        write_bytes_atomic(Path(path), text.encode("utf-8"))
    except OSError as e:
        raise SpecError(f"{option}: cannot write {path} ({e.strerror or e})") from None


def task_line(metrics: dict[str, Any]) -> str:
    """``copy 1.000, reverse 0.998`` from an evaluation record's per-task accuracy."""
    tasks = metrics.get("tasks", {})
    return ", ".join(f"{name} {m.get('accuracy', float('nan')):.3f}"
                     for name, m in tasks.items())


def enforcement_table(summary: dict[str, Any]) -> Table:
    """One row per clause: its lever, multiplier, and when it failed and held on the
    enforcement set."""
    held, kept = summary.get("held_at_step"), summary.get("kept_step")
    kept_as = {"certified": "(certified on the enforcement set)",
               "past every guard": "(past every guard, not certified)",
               "held": "(held; no point past every guard)"}.get(
                   str(summary.get("kept_as")), "(held)")
    title = (f"enforcement: {summary['steps']} steps; contract first held on the enforcement "
             f"set at step {held}; model kept: step {kept} {kept_as}"
             if held is not None else
             f"enforcement: {summary['steps']} steps; the contract never held on the "
             "enforcement set")
    paced = summary.get("pace") or []
    if paced:
        title += "; learning rate x " + ", ".join(
            f"{p['pace']:g} from step {p['step']}" for p in paced)
    from headwise.report.sections import describe_attempts

    attempts = describe_attempts(summary)
    if attempts is not None:
        title = f"{attempts}. Of attempt {summary.get('attempt')}: {title}"
    table = Table(title=title)
    for col in ("#", "clause", "lever", "multiplier", "first failed", "held from"):
        table.add_column(col)
    for c in summary["clauses"]:
        lam = c.get("multiplier")
        table.add_row(str(c["index"]), c["description"], c.get("lever") or "(no lever)",
                      "-" if lam is None else f"{lam:.2f}",
                      "-" if c["first_failed_at"] is None else str(c["first_failed_at"]),
                      "-" if c["held_at"] is None else str(c["held_at"]))
    return table


def failing_lines(summary: dict[str, Any]) -> list[str]:
    """For each clause failing on the verification set: its best value during training, its
    lever's state and what would help."""
    out = []
    for c in summary["clauses"]:
        if c.get("holds_at_end") is False and "advice" in c:
            best = c.get("best_value")
            where = ("" if best is None else
                     f"best {fixed(best)} at step {c.get('best_step')} on the enforcement set; ")
            out.append(f"contract[{c['index']}] {c['description']} still fails: {where}"
                       f"{'lever saturated' if c.get('saturated') else 'lever not saturated'}"
                       f"; {c['advice']}")
    return out


def report_progress(out: Console) -> Callable[[str, int, int], None]:
    """A report's progress callback (``write_run_report(progress=...)``): one plain line per
    phase, ``report: PHASE (DONE/TOTAL done, about S s left)``, the estimate from the time the
    phases done so far took."""
    start = time.perf_counter()

    def show(phase: str, done: int, total: int) -> None:
        left = ""
        if done:
            elapsed = time.perf_counter() - start
            left = f", about {elapsed / done * (total - done):.0f} s left"
        out.print(f"report: {phase} ({done}/{total} done{left})", markup=False)
    return show


def write_report_after(out: Console, outcome: RunOutcome) -> None:
    """Write the run's report after its verdict was printed, saying where it is."""
    from headwise.pipeline.run_report import write_run_report

    paths = write_run_report(outcome.run_dir, outcome.compiled, outcome.contract,
                             outcome.enforcement, progress=report_progress(out))
    out.print(f"report: written {paths['html']}", markup=False)


def print_outcome(out: Console, outcome: RunOutcome, report: bool = True) -> None:
    """Summary after ``headwise train`` / ``headwise demo``: printed as soon as the verdict is
    measured, before the report (``report``: whether one follows)."""
    from headwise.contract import did_not_learn

    run = outcome.run_dir
    metrics = outcome.train.metrics
    out.print(f"trained {outcome.train.step} steps; eval-batch accuracy: {task_line(metrics)}")
    if outcome.enforcement is not None:
        out.print(enforcement_table(outcome.enforcement))
        kept = outcome.enforcement.get("kept_step")
        if kept is not None and kept != outcome.train.step:
            out.print(f"kept the model of step {kept} (the last evaluation point at which the "
                      "contract held on the enforcement set)")
    if outcome.contract is not None:
        out.print("the verdict, on the verification set (never read during training):")
        out.print(outcome.contract.to_rich_table())
        lines = (failing_lines(outcome.enforcement) if outcome.enforcement is not None
                 else list(did_not_learn(outcome.contract.results).values()))
        for line in lines:
            out.print(line, markup=False)
        for line in outcome.contract.evidence():
            out.print(line, markup=False)
        verdict = "HOLDS" if outcome.contract.passed else "FAILS"
        n = len(outcome.contract.results)
        out.print(f"contract {verdict}: {n} clause{'' if n == 1 else 's'}, "
                  f"{sum(not r.passed for r in outcome.contract.results)} failed, "
                  f"{sum(r.state == 'certified' for r in outcome.contract.results)} certified")
    where = (f"report: {run / 'report.html'}, " if report
             else f"no report; write it with `headwise report {run}`; ")
    out.print(f"run directory: {run}/  ({where}metrics: {run / 'metrics.jsonl'}, weights: "
              f"{run / 'model.safetensors'})")
