"""``headwise circuit RUN --task T``: the smallest circuit that keeps a task, as clauses."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

import headwise.validate as check
from headwise.atomic import check_output_file
from headwise.cli.options import add_device_argument, add_run_argument, add_subcommand
from headwise.cli.output import console
from headwise.errors import SpecError

# Exact path patching of every edge, for the agreement line, up to this many edges (one forward
# each); beyond it the top-ranked ones are patched.
EXACT_EDGES = 400


def register(subparsers: Any) -> None:
    """Add the ``circuit`` subcommand."""
    p = add_subcommand(
        subparsers, "circuit", run, help="find the smallest circuit of edges that keeps a task",
        description="Rank every edge (sender -> receiver: embeddings, heads and MLPs into "
                    "heads' q/k/v, MLPs and the logits) by edge attribution on the task's "
                    "verification examples, grow the smallest circuit whose faithfulness (every "
                    "edge outside it ablated) keeps at least --faithfulness of the task metric, "
                    "and print it with its faithfulness, each edge's exact drop, the "
                    "attribution's agreement with exact path patching, and contract clauses to "
                    "paste into the spec.")
    add_run_argument(p)
    p.add_argument("--task", required=True, help="the task (a name in the run's spec)")
    p.add_argument("--faithfulness", type=float, default=0.9, metavar="F",
                   help="the share of the task metric the circuit keeps, in (0, 1] (default "
                        "0.9): (circuit - empty) / (model - empty)")
    p.add_argument("--metric", choices=("accuracy", "loss", "exact"), default="accuracy",
                   help="the task metric faithfulness keeps (default accuracy); edges are "
                        "ranked on the loss")
    p.add_argument("--mode", choices=("mean", "zero"), default="mean",
                   help="what an ablated edge carries instead: the sender's mean output per "
                        "position over the examples (default), or zero")
    p.add_argument("--method", choices=("eap", "eap-ig"), default="eap",
                   help="edge attribution: eap (one forward+backward, default) or eap-ig")
    p.add_argument("--steps", type=int, default=5, metavar="N",
                   help="EAP-IG interpolation steps, one forward+backward each: 1 to 1000 "
                        "(default 5)")
    p.add_argument("--clauses", metavar="PATH", help="also write the clauses (YAML) here")
    p.add_argument("--figure", metavar="PATH", help="write the circuit's figure (PNG) here")
    p.add_argument("--json", metavar="PATH", help="write every edge's attribution, the "
                                                  "circuit and its measures (JSON) here")
    add_device_argument(p, "cpu", "cpu")


def run(args: argparse.Namespace) -> int:
    """Discover, print, write; exit 0 (2 on bad input)."""
    import yaml

    from headwise.analysis.circuit import discover_circuit
    from headwise.analysis.edges import MAX_IG_STEPS, agreement
    from headwise.analysis.paths import PathPatcher, exact_effects
    from headwise.cli.output import write_file
    from headwise.pipeline.finished import load_compiled
    from headwise.pipeline.heldout import verification_data

    if not 0 < args.faithfulness <= 1:
        raise SpecError(f"--faithfulness: got {args.faithfulness}, expected a number in (0, 1]")
    check.integer(args.steps, "--steps", 1, MAX_IG_STEPS)
    outputs = {o: check_output_file(getattr(args, o), f"--{o}")
             for o in ("clauses", "figure", "json")}
    compiled = load_compiled(args.run, device=args.device)
    tasks = verification_data(compiled).tasks
    if args.task not in tasks:
        raise SpecError(f"--task: got {args.task!r}, expected one of {sorted(tasks)}")
    batch, model = tasks[args.task], compiled.model
    try:
        found = discover_circuit(model, batch, faithfulness_at_least=args.faithfulness,
                                 metric=args.metric, method=args.method, steps=args.steps,
                                 mode=args.mode)
    except ValueError as error:
        raise SpecError(f"--task: {error}") from None
    ranked = found.scores.ranked()
    patcher = PathPatcher(model, batch, mode=args.mode)
    exact = exact_effects(patcher, ranked[:EXACT_EDGES], "loss")
    agree = agreement(found.scores, exact, max(1, min(len(found.edges), len(exact))))
    out, f = console(), found.faithfulness
    out.print(f"task {args.task}: {len(found.edges)} of {len(ranked)} edges keep {f.kept:.3f} of "
              f"{args.metric} ({args.mode} ablation): model {f.full:.4f}, circuit "
              f"{f.circuit:.4f}, no edge {f.empty:.4f}", markup=False)
    for edge in found.edges:
        out.print(f"  {str(edge):<28} attribution {found.scores.score(edge):+.4f}  drop alone "
                  f"{found.drops[edge]:+.4f}", markup=False)
    scope = "every edge" if len(exact) == len(ranked) else f"the top {len(exact)} edges"
    out.print(f"{args.method} vs exact path patching (loss, {scope}): Spearman "
              f"{agree.spearman:.3f}, top-{agree.k} overlap {agree.top_k:.2f}; "
              f"{found.scores.passes} forward+backward pass(es), {found.evaluations} ablated "
              "runs", markup=False)
    first, *path_clauses = found.clauses(args.task)  # the circuit in block style, paths one a line
    text = yaml.safe_dump([first], sort_keys=False) + "".join(
        yaml.safe_dump([c], sort_keys=False, default_flow_style=None, width=200)
        for c in path_clauses)
    out.print("clauses:\n" + text, markup=False)
    if outputs["clauses"]:
        write_file(args.clauses, text, "--clauses")
    if outputs["figure"]:
        _figure(args, found, compiled)
    if outputs["json"]:
        record = {"task": args.task, "metric": args.metric, "mode": args.mode,
                  "method": args.method, "faithfulness": {"full": f.full, "circuit": f.circuit,
                                                          "empty": f.empty, "kept": f.kept},
                  "circuit": [str(e) for e in found.edges],
                  "agreement": {"edges": agree.n_edges, "spearman": agree.spearman,
                                "k": agree.k, "top_k": agree.top_k},
                  "edges": found.scores.to_records()}
        write_file(args.json, json.dumps(record, indent=1) + "\n", "--json")
    return 0


def _figure(args: argparse.Namespace, found: Any, compiled: Any) -> None:
    from headwise.atomic import write_bytes_atomic
    from headwise.report.circuit_figure import circuit_figure

    cfg = compiled.model.config
    png = circuit_figure(found.drops, cfg.n_layers, cfg.n_heads,
                         f"{args.task}: {len(found.edges)} edges, kept "
                         f"{found.faithfulness.kept:.2f}", has_mlp=not cfg.attn_only)
    try:
        write_bytes_atomic(Path(args.figure), png)
    except OSError as e:
        raise SpecError(f"--figure: cannot write {args.figure} ({e.strerror or e})") from None
