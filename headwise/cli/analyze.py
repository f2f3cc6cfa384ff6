"""``headwise analyze RUN`` or ``headwise analyze --hf DIR``: what every head does."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

import torch

from headwise.errors import SpecError
from headwise.pipeline.output import console


def register(subparsers: Any) -> None:
    """Add the ``analyze`` subcommand."""
    p = subparsers.add_parser(
        "analyze", help="role scores, ablation importance and gates of every head",
        description="For a run: role scores of every head on the held-out data, the accuracy "
                    "drop when each head is ablated on each task, and the task gates. For a "
                    "HuggingFace checkpoint (--hf DIR): role scores of every head on text "
                    "(--text FILE, tokenised with DIR/tokenizer.json) or on repeated random "
                    "tokens.")
    p.add_argument("run", nargs="?", help="a run directory (or use --hf)")
    p.add_argument("--hf", metavar="DIR", help="a local HuggingFace model directory")
    p.add_argument("--text", metavar="FILE", help="with --hf: text to score on (one sequence "
                                                  "per non-empty line)")
    p.add_argument("--max-len", type=int, default=64, help="with --hf: tokens per sequence")
    p.add_argument("--json", metavar="PATH", help="write the results as JSON (one record per "
                                                  "head under 'roles')")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """Analyse a run or a HuggingFace checkpoint and print the tables."""
    if (args.run is None) == (args.hf is None):
        raise SpecError("analyze: expected either a run directory or --hf DIR (exactly one)")
    if args.text and not args.hf:
        raise SpecError("--text: only used with --hf")
    result = _run(args.run) if args.run else _hf(args.hf, args.text, args.max_len)
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=1))
        console().print(f"written: {args.json}")
    return 0


def _run(run_dir: str) -> dict[str, Any]:
    from headwise.pipeline.analyze import analyse_run
    from headwise.pipeline.run import load_run

    compiled = load_run(run_dir)
    analysis = analyse_run(compiled)
    out = console()
    out.print(analysis.roles.to_rich_table("role scores (held-out data; induction on repeated "
                                           "random halves)"))
    out.print(analysis.importance.to_rich_table("accuracy"))
    if analysis.gates is not None:
        out.print("task gates (1 = the head serves the task):")
        out.print(str(analysis.gates), markup=False)
    return {"run": run_dir, **analysis.to_dict()}


def _hf(directory: str, text: str | None, max_len: int) -> dict[str, Any]:
    from headwise.analysis.probes import induction_probe
    from headwise.analysis.roles import ROLES, role_scores
    from headwise.interop import encode_batch, load_hf, load_tokenizer

    model = load_hf(directory)
    config = model.config
    max_len = min(max_len, config.max_seq_len)
    if text is not None:
        path = Path(text)
        if not path.is_file():
            raise SpecError(f"--text: {path} is not a file")
        lines = [line for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
        if not lines:
            raise SpecError(f"--text: {path} has no non-empty line")
        tokens, mask = encode_batch(load_tokenizer(directory), lines, max_len=max_len)
        source = f"{len(lines)} lines of {path}"
    else:
        half = max(2, max_len // 2)
        tokens = induction_probe(config.vocab_size, 32, half, torch.Generator().manual_seed(0))
        mask = None
        source = f"32 sequences of {half} random tokens repeated once"
    roles = [r for r in ROLES if r not in ("copying",)]
    with torch.no_grad():
        table = role_scores(model, tokens, mask, roles=roles)
    console().print(table.to_rich_table(f"role scores of {directory} on {source}"))
    return {"model": directory, "data": source, "roles": table.to_records()}
