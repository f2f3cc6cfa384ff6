"""Which circuit assist makes a task learn: held-out accuracy over steps, plain vs role objectives.

A 2-layer model is trained on one built-in task (default ``kv_retrieval`` at its documented
defaults: 4 pairs, 16 keys, 16 values) once per *arm* and seed, each arm either plain training
or pattern objectives (``headwise.control.objectives.PatternObjective``, cross-entropy) that
pull named heads towards named roles, e.g. a previous-token head in layer 0 below an induction
head in layer 1 (Olsson et al. 2022). Every ``--every`` steps the callback measures, on a
held-out set drawn from its own seed (never the training stream), the task's token accuracy
and the role scores (``headwise.analysis.roles.role_scores``) of every head; the figure per arm
is the first evaluation step at which accuracy reaches ``--target``, over the seeds.

An arm is ``plain`` or ``+``-joined ``HEAD=ROLE`` terms (``L0.H0=previous_token+L1.H0=induction``);
``--weights`` lists the objective weights each assisted arm is run at.

    python bench/kv_circuit.py [--task kv_retrieval] [--task-args '{}'] [--steps 1500]
        [--every 100] [--seeds 0 1 2] [--weights 1.0] [--arms plain L0.H0=previous_token ...]
        [--d-model 64] [--n-heads 4] [--attn-only] [--batch-size 64] [--lr 3e-3] [--json PATH]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path
from typing import Any

import torch

from headwise.analysis import role_scores
from headwise.atomic import write_bytes_atomic
from headwise.config import ModelConfig
from headwise.control import PatternObjective
from headwise.data import Mixture, Task, build_task
from headwise.model import build_model
from headwise.training import TrainConfig, TrainState, train

ROLES = ("previous_token", "induction", "duplicate_token")
DEFAULT_ARMS = ("plain", "L0.H0=previous_token+L1.H0=induction", "L0.H0=previous_token",
                "L1.H0=induction")
HELD_OUT_SEED = 987_654  # the held-out set's own generator: never the training stream's
HELD_OUT = 1024


def parse_arm(arm: str) -> list[tuple[str, str]]:
    """``"L0.H0=previous_token+L1.H0=induction"`` -> ``[("L0.H0", "previous_token"), ...]``."""
    if arm == "plain":
        return []
    terms = []
    for part in arm.split("+"):
        head, _, role = part.partition("=")
        if not role:
            raise SystemExit(f"--arms: got {part!r}, expected HEAD=ROLE (e.g. L0.H0=induction)")
        terms.append((head, role))
    return terms


def accuracy(model: torch.nn.Module, tokens: torch.Tensor, targets: torch.Tensor) -> float:
    """Token accuracy over scored positions (targets != -100) of one held-out batch."""
    with torch.no_grad():
        pred = model(tokens).argmax(-1)  # (B, T)
    scored = targets != -100
    return float((pred == targets)[scored].float().mean())


def run_one(task: Task, cfg: ModelConfig, arm: str, weight: float, seed: int,
            args: argparse.Namespace) -> dict[str, Any]:
    """Train one arm at one seed; the accuracy and role curves at every evaluation point."""
    model = build_model(cfg, seed=seed)
    data = Mixture({task.name: task})
    held = task.sample(HELD_OUT, torch.Generator().manual_seed(HELD_OUT_SEED))
    probe = held.tokens[:256]
    objectives = []
    for i, (head, role) in enumerate(parse_arm(arm)):
        obj = PatternObjective(model, head, role, kind="ce", weight=weight)
        obj.name = f"assist{i}:{role}[{head}]"
        objectives.append(obj)
    curve: list[dict[str, Any]] = []

    def measure(state: TrainState) -> None:
        m = state.model
        was = m.training
        m.eval()
        acc = accuracy(m, held.tokens, held.targets)
        table = role_scores(m, probe, roles=list(ROLES))
        m.train(was)
        best = {f"L{layer}.{role}": max(table.get(f"L{layer}.H{h}", role)
                                        for h in range(cfg.n_heads))
                for layer in range(cfg.n_layers) for role in ROLES}
        curve.append({"step": state.step, "accuracy": acc, "best": best})

    config = TrainConfig(steps=args.steps, batch_size=args.batch_size, lr=args.lr,
                         eval_every=args.every, eval_batches=1, seed=seed, device="cpu")
    start = time.process_time()
    train(model, data, config, objectives=objectives, callbacks=[measure], progress=False)
    cpu_s = time.process_time() - start
    hit = next((p["step"] for p in curve if p["accuracy"] >= args.target), None)
    return {"arm": arm, "weight": weight if objectives else None, "seed": seed, "curve": curve,
            "steps_to_target": hit, "final_accuracy": curve[-1]["accuracy"], "cpu_s": cpu_s}


def summary(rows: list[dict[str, Any]], args: argparse.Namespace) -> list[str]:
    """Markdown: per arm and weight, steps to the target per seed, final accuracy, roles."""
    out = [f"| arm | weight | steps to accuracy >= {args.target} (per seed) | final accuracy "
           "(per seed) | median accuracy at each eval point | best L0 previous_token / L1 "
           "induction / L1 duplicate_token at the end (median) |", "|---|---|---|---|---|---|"]
    keys = list(dict.fromkeys((r["arm"], r["weight"]) for r in rows))
    for arm, weight in keys:
        rs = [r for r in rows if (r["arm"], r["weight"]) == (arm, weight)]
        hits = ", ".join(str(r["steps_to_target"]) if r["steps_to_target"] else
                         f"> {args.steps}" for r in rs)
        finals = ", ".join(f"{r['final_accuracy']:.3f}" for r in rs)
        n = min(len(r["curve"]) for r in rs)
        med = " ".join(f"{statistics.median(r['curve'][i]['accuracy'] for r in rs):.2f}"
                       for i in range(n))
        ends = [r["curve"][-1]["best"] for r in rs]
        roles = " / ".join(f"{statistics.median(e[k] for e in ends):.2f}"
                           for k in ("L0.previous_token", "L1.induction", "L1.duplicate_token"))
        out.append(f"| {arm} | {'-' if weight is None else weight} | {hits} | {finals} | "
                   f"{med} | {roles} |")
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--task", default="kv_retrieval")
    p.add_argument("--task-args", default="{}", help="the task's arguments as JSON")
    p.add_argument("--steps", type=int, default=1500)
    p.add_argument("--every", type=int, default=100)
    p.add_argument("--target", type=float, default=0.9)
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    p.add_argument("--weights", type=float, nargs="+", default=[1.0])
    p.add_argument("--arms", nargs="+", default=list(DEFAULT_ARMS))
    p.add_argument("--n-layers", type=int, default=2)
    p.add_argument("--n-heads", type=int, default=4)
    p.add_argument("--d-model", type=int, default=64)
    p.add_argument("--vocab-size", type=int, default=36)
    p.add_argument("--attn-only", action="store_true")
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--json", type=Path, default=None)
    args = p.parse_args()
    torch.set_num_threads(1)
    task = build_task(args.task, {"vocab_size": args.vocab_size, **json.loads(args.task_args)})
    cfg = ModelConfig(n_layers=args.n_layers, n_heads=args.n_heads, d_model=args.d_model,
                      vocab_size=args.vocab_size, max_seq_len=task.seq_len,
                      attn_only=args.attn_only)
    rows = []
    for arm in args.arms:
        for weight in ([1.0] if arm == "plain" else args.weights):
            for seed in args.seeds:  # seeds innermost: one arm's runs side by side in time
                r = run_one(task, cfg, arm, weight, seed, args)
                rows.append(r)
                print(f"{arm} w={r['weight']} seed={seed}: steps to {args.target} "
                      f"{r['steps_to_target']}, final {r['final_accuracy']:.3f}, "
                      f"{r['cpu_s']:.0f} CPU s", flush=True)
                if args.json:
                    raw = {"args": {k: v for k, v in vars(args).items() if k != "json"},
                           "rows": rows}
                    write_bytes_atomic(args.json, json.dumps(raw, indent=1).encode())
    print("\n".join(summary(rows, args)))


if __name__ == "__main__":
    main()
