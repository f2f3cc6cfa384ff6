"""``headwise analyze RUN`` or ``headwise analyze --hf DIR|ID``: what every head does."""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from headwise.atomic import check_output_file
from headwise.cli.options import (
    add_device_argument,
    add_format_argument,
    add_hf_arguments,
    add_subcommand,
)
from headwise.cli.output import note, print_tables, write_file
from headwise.errors import SpecError
from headwise.render.tables import TextTable

if TYPE_CHECKING:
    from headwise.forecast.roles import Forecaster

MAX_TEXT_BYTES = 64 << 20


def register(subparsers: Any) -> None:
    """Add the ``analyze`` subcommand."""
    p = add_subcommand(
        subparsers, "analyze", run, help="role scores, ablation importance and gates of every head",
        description="For a run: role scores of every head on the held-out data, the accuracy "
                    "drop when each head is ablated on each task, and the task gates. For a "
                    "HuggingFace checkpoint (--hf DIR, or a model id in the local HF cache): "
                    "role scores of every head on text "
                    "(--text FILE, one sequence per line, tokenised with DIR/tokenizer.json and "
                    "cut to the model's max_seq_len) or on repeated random tokens.")
    p.add_argument("run", nargs="?", help="a run directory (or use --hf)")
    add_hf_arguments(p, required=False)
    p.add_argument("--text", metavar="FILE", help="with --hf: text to score on (one sequence "
                                                  "per non-empty line)")
    p.add_argument("--max-tokens", type=int, metavar="N",
                   help="with --text: score at most the first N tokens (the text is read in "
                        "memory-capped chunks with a progress line each on stderr, whatever "
                        "its length)")
    p.add_argument("--forecast", action="store_true",
                   help="for a run with checkpoints: each head's final role as the packaged "
                        "forecaster predicts it from the first 20%% of checkpoints (with "
                        "confidence and commitment step), the clauses it forecasts to fail, "
                        "and the forecaster's accuracy measured on runs it was not fit on "
                        "(by the benchmark, or by fit-forecaster for --forecaster FILE)")
    p.add_argument("--forecaster", metavar="FILE",
                   help="with --forecast: use this forecaster (JSON from `headwise "
                        "fit-forecaster`) instead of the packaged one")
    p.add_argument("--json", metavar="PATH", help="write the results as JSON (one record per "
                                                  "head under 'roles')")
    p.add_argument("--html", metavar="PATH",
                   help="with --hf: also write a self-contained HTML report (role scores "
                        "heatmap and table, and an attention viewer of --heads on the first "
                        "sequence); a run's report is `headwise report RUN`")
    p.add_argument("--heads", metavar="SELECTOR",
                   help="with --html: the heads the attention viewer shows (default every "
                        "head, at most 96)")
    add_format_argument(p)
    add_device_argument(p, "cpu", "cpu")


def run(args: argparse.Namespace) -> int:
    """Analyse a run or a HuggingFace checkpoint and print the tables."""
    if (args.run is None) == (args.hf is None):
        raise SpecError("analyze: expected either a run directory or --hf DIR (exactly one)")
    if args.text and not args.hf:
        raise SpecError("--text: only used with --hf")
    if args.max_tokens is not None and not args.text:
        raise SpecError("--max-tokens: only used with --hf and --text")
    if args.max_tokens is not None and args.max_tokens < 1:
        raise SpecError(f"--max-tokens: got {args.max_tokens}, expected an integer >= 1")
    if args.revision and not args.hf:
        raise SpecError("--revision: only used with --hf")
    check_output_file(args.json, "--json")
    if args.html and not args.hf:
        raise SpecError("--html: only used with --hf (a run's report: headwise report RUN)")
    if args.heads and not args.html:
        raise SpecError("--heads: only used with --html")
    check_output_file(args.html, "--html")
    if args.forecast and not args.run:
        raise SpecError("--forecast: only used with a run directory")
    if args.forecaster and not args.forecast:
        raise SpecError("--forecaster: only used with --forecast")
    forecaster = None
    if args.forecast:
        from headwise.pipeline.run import read_forecaster

        forecaster = read_forecaster(args.forecaster)
    tables: list[TextTable] = []
    notes: list[str] = []
    result = (_run(args.run, args.device, tables, notes, forecaster) if args.run
              else _hf(args.hf, args.text, args.revision, args.device, tables, args.html,
                       args.heads, args.max_tokens))
    print_tables([spreadsheet_safe(t) for t in tables] if args.format == "csv" else tables,
                 args.format)
    for line in notes:
        note(args.format, line)
    if args.json:
        write_file(args.json, json.dumps(result, indent=1), "--json")
        note(args.format, f"written: {args.json}")
    if args.html:
        note(args.format, f"written: {args.html}")
    return 0


def _run(run_dir: str, device: str, tables: list[TextTable], notes: list[str],
         forecaster: Forecaster | None = None) -> dict[str, Any]:
    """Analyse a run: its tables added to ``tables``, sentences to ``notes``."""
    from headwise.pipeline.finished import load_compiled
    from headwise.pipeline.run_analysis import analyse_run

    compiled = load_compiled(run_dir, device=device)
    analysis = analyse_run(compiled)
    tables.append(analysis.roles.to_text_table("role scores (held-out data; induction on "
                                               "repeated random halves)"))
    tables.append(analysis.importance.to_text_table("accuracy"))
    if analysis.gates is not None:
        g = analysis.gates
        tables.append(TextTable("task gates (1 = open)",
                                ("head", *g.task_names),
                                tuple((str(h), *(f"{float(v):.2f}" for v in g.values[:, i]))
                                      for i, h in enumerate(g.heads)),
                                right=tuple(range(1, len(g.task_names) + 1))))
    result = {"run": run_dir, **analysis.to_dict()}
    if forecaster is not None:
        result["forecast"] = _forecast(run_dir, compiled, forecaster, tables, notes)
    return result


def _forecast(run_dir: str, compiled: Any, forecaster: Forecaster, tables: list[TextTable],
              notes: list[str]) -> dict[str, Any]:
    """The forecast from the run's first 20% of checkpoints (its table added to ``tables``,
    its sentences to ``notes``)."""
    from headwise.contract.forecast import forecast_summary
    from headwise.forecast.role_scores import load_role_score_forecaster, measured_text_scores
    from headwise.forecast.roles import measured_text
    from headwise.pipeline.run_report import run_trajectory

    traj = run_trajectory(Path(run_dir), compiled)
    if traj is None:
        raise SpecError(f"--forecast: {run_dir} has no checkpoints; expected a run trained "
                        "with train.checkpoint_every >= 1")
    spec = compiled.spec
    enforced = (Path(run_dir) / "enforcement.json").is_file()
    summary = forecast_summary(traj, forecaster, 0.2, None,
                               spec.contract if spec.contract else None,
                               load_role_score_forecaster(),
                               {"enforced": enforced, "context": compiled.spec.forecast_context})
    tables.append(TextTable(
        f"forecast (forecaster v{summary['forecaster_version']}) from steps "
        f"{summary['from_steps']}", ("head", "forecast", "confidence", "committed at",
                                     "final score, 90% interval", "final role"),
        tuple((h["head"], h["role"], f"{h['confidence']:.0%}",
               "-" if h["committed_at"] is None else str(h["committed_at"]),
               h.get("score_forecast", {}).get("text", "-"), h["final_role"])
              for h in summary["heads"])))
    for c in summary.get("clauses", []):
        heads = ", ".join(f"{h['head']} forecast {h['role']}" for h in c["heads"])
        verdict = ("not forecast (the forecaster predicts each head's top role on the "
                   "default probes; this clause asks something else)"
                   if c["verdict"] == "not forecast" else f"forecast {c['verdict']}")
        notes.append(f"{c['clause']} {c['description']}: {verdict}"
                     + (f" ({heads})" if heads and c["verdict"] == "fail" else ""))
    notes.append(measured_text(summary["measured"]))
    if "score_forecaster_measured" in summary:
        notes.append(measured_text_scores(summary["score_forecaster_measured"]))
    first = summary["heads"][0] if summary["heads"] else {}
    outside = first.get("score_forecast", {}).get("outside", [])
    if outside:
        notes.append("score intervals doubled, this run is outside the runs the score "
                     "forecaster was fit on: " + "; ".join(outside))
    return summary


def _text_progress() -> Callable[[int, int, int], None]:
    """One plain line on stderr per chunk of text scored: share read, tokens, time left."""
    import sys
    import time

    start = time.perf_counter()

    def show(done: int, total: int, tokens: int) -> None:
        elapsed = time.perf_counter() - start
        left = elapsed / done * (total - done) if done else 0.0
        print(f"analyze: {done / max(total, 1):.0%} of the text read, {tokens} tokens scored, "
              f"about {left:.0f} s left", file=sys.stderr, flush=True)
    return show


def _hf(name: str, text: str | None, revision: str | None, device: str,
        tables: list[TextTable], html: str | None, heads: str | None,
        max_tokens: int | None = None) -> dict[str, Any]:
    from headwise.analysis.role_table import RoleTable
    from headwise.data.corpus import decode_text
    from headwise.interop.hub_cache import resolve_model
    from headwise.jsonfile import read_bounded
    from headwise.pipeline.hf_analysis import analyze_hf, hf_report
    from headwise.report.build import render_html

    directory = str(resolve_model(name, revision, field="--hf"))
    content = None
    source = "16 sequences of random tokens repeated once"
    if text is not None:
        path = Path(text)
        data = read_bounded(path, MAX_TEXT_BYTES, "--text", SpecError)  # a few thousand lines do
        content = decode_text(data, f"--text: {path}", SpecError)
        lines = [line for line in content.splitlines() if line.strip()]
        if not lines:
            raise SpecError(f"--text: {path} has no non-empty line")
        source = f"{len(lines)} lines of {path}"
        if max_tokens is not None:
            source = f"the first {max_tokens} tokens of {source}"
        _check_vocabularies(directory)
    progress = _text_progress() if text is not None else None
    if html:
        report = hf_report(directory, content, heads=heads, device=device,
                           title=f"headwise analysis: {name}", data=source,
                           max_tokens=max_tokens, progress=progress)
        records = report["roles"]["records"]
        write_file(html, render_html(report), "--html")
    else:
        records = analyze_hf(directory, content, device=device, max_tokens=max_tokens,
                             progress=progress)
    tables.append(RoleTable.from_records(records).to_text_table(
        f"role scores of {name} on {source}"))
    return {"model": name, "path": directory, "data": source, "roles": records}


def _check_vocabularies(directory: str) -> None:
    """Refuse a tokenizer whose ids go beyond the model's vocabulary (before any scoring).

    Raises:
        SpecError: naming both sizes.
    """
    from headwise.interop import hf_converter, load_tokenizer

    vocab = hf_converter(directory)[1].vocab_size
    ids = load_tokenizer(directory).get_vocab_size(with_added_tokens=True)
    if ids > vocab:
        raise SpecError(f"--text: {Path(directory) / 'tokenizer.json'} has {ids} token ids, "
                        f"beyond the model's vocabulary of {vocab}; expected the model's own "
                        "tokenizer")


FORMULA_STARTS = ("=", "+", "-", "@", "\t", "\r")  # what spreadsheets run as a formula


def spreadsheet_safe(table: TextTable) -> TextTable:
    """``table`` with every cell a spreadsheet opens as data: a number without a leading
    ``+``, any other cell starting with ``= + - @`` (or a tab or carriage return) behind a
    ``'``, so a task named ``=HYPERLINK(...)`` is shown, never run."""
    def cell(text: str) -> str:
        try:
            number = float(text)
        except ValueError:
            number = math.nan
        if math.isfinite(number):
            return text.removeprefix("+")
        return f"'{text}" if text.startswith(FORMULA_STARTS) else text

    return dataclasses.replace(table, columns=tuple(cell(c) for c in table.columns),
                               rows=tuple(tuple(cell(c) for c in r) for r in table.rows))
