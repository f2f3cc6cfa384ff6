"""``headwise explain RUN --head L0.H2 --input ...``: one head's computation, step by step."""

from __future__ import annotations

import argparse
import re
from pathlib import Path
from typing import Any

import torch

from headwise.atomic import check_output_file
from headwise.cli.options import add_device_argument, add_run_argument, add_subcommand
from headwise.cli.output import console, write_file
from headwise.errors import SpecError

_IDS = re.compile(r"^\s*\d+(\s*[,\s]\s*\d+)*\s*$")


def register(subparsers: Any) -> None:
    """Add the ``explain`` subcommand."""
    p = add_subcommand(
        subparsers, "explain", run, help="walk through one head's computation on one input",
        description="Print Q, K, V, the scaled and masked scores, the pattern, z and the "
                    "head's contribution to the residual stream for one input, each recomputed "
                    "and cross-checked against the model's hook values.")
    add_run_argument(p)
    p.add_argument("--head", required=True, help="the head, e.g. L0.H2")
    p.add_argument("--input", required=True,
                   help="a task name of the run's spec (its first held-out example), token "
                        "ids ('1 5 9 2' or '1,5,9,2'), or text for byte-level models")
    p.add_argument("--task", help="task whose gates apply (default: the input's task, else the "
                                  "first task)")
    p.add_argument("--html", metavar="PATH", help="also write an HTML page with heatmaps")
    add_device_argument(p, "cpu", "cpu")


def run(args: argparse.Namespace) -> int:
    """Load the run, build the input, print the walkthrough (exit 1 if a cross-check fails)."""
    from headwise.analysis.explain import explain_head
    from headwise.pipeline.finished import load_compiled
    from headwise.pipeline.run_tokens import spec_token_names
    from headwise.render.html import page
    from headwise.training.device import model_device

    check_output_file(args.html, "--html")
    compiled = load_compiled(args.run, device=args.device)
    device = model_device(compiled.model)
    config = compiled.spec.model.config
    names = compiled.task_names
    head = _head(args.head, config.n_layers, config.n_heads)
    tokens, task = _input(args.input, compiled)
    if args.task is not None:
        if args.task not in names:
            raise SpecError(f"--task: got {args.task!r}, expected one of {list(names)}")
        task = names.index(args.task)
    walk = explain_head(compiled.model, tokens.to(device), head,
                        labels=spec_token_names(compiled.spec, Path(args.run))(tokens),
                        task_ids=torch.tensor([task], device=device))
    out = console()
    out.print(f"task: {names[task]}")
    out.print(walk.to_text(max_positions=24), markup=False)
    if args.html:
        write_file(args.html, page(f"headwise explain {head}",
                                   [("walkthrough", "Walkthrough", walk.to_html())]), "--html")
        out.print(f"written: {args.html}")
    return 0 if walk.ok else 1


def _head(text: str, n_layers: int, n_heads: int) -> Any:
    from headwise.errors import HeadwiseError
    from headwise.heads import Head

    try:
        return Head.parse(text, n_layers, n_heads)
    except HeadwiseError as e:
        raise SpecError(f"--head: {e}") from None


def _input(text: str, compiled: Any) -> tuple[torch.Tensor, int]:
    """(tokens (T,), task id) from a task name, token ids or byte-level text."""
    names = compiled.task_names
    config = compiled.spec.model.config
    if text in names:
        task = names.index(text)
        batch = compiled.eval_batch
        row = int((batch.task_ids == task).nonzero()[0])
        mask = batch.attention_mask
        length = int(mask[row].sum()) if mask is not None else batch.tokens.shape[1]
        return batch.tokens[row, :length], task
    if _IDS.match(text):
        ids = [int(t) for t in re.split(r"[,\s]+", text.strip())]
        bad = [i for i in ids if i >= config.vocab_size]
        if bad:
            raise SpecError(f"--input: token id {bad[0]} out of range; the model's vocabulary "
                            f"is 0-{config.vocab_size - 1}")
    elif config.vocab_size >= 256:
        ids = list(text.encode("utf-8"))
    else:
        raise SpecError(f"--input: got {text!r}, expected a task name ({', '.join(names)}) or "
                        f"token ids like '1 5 9 2' (the model has no text vocabulary)")
    if not 1 <= len(ids) <= config.max_seq_len:
        raise SpecError(f"--input: got {len(ids)} tokens, expected 1-{config.max_seq_len} "
                        "(the model's max_seq_len)")
    return torch.tensor(ids, dtype=torch.long), 0

