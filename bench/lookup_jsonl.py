"""A lookup task in the user's own JSONL notation, trained plain and with ``--enforce``.

Each row is ``{"prompt": "j8 e0 d4 k2 ?j", "completion": "8"}``: ``--pairs`` letter-digit pairs
(distinct letters, digits drawn uniformly), then ``?`` and one of the letters; the completion
is that letter's digit. Read byte by byte (no tokenizer) by the ``pairs`` task, the only scored
target is the digit, predicted at the queried letter. No generator declares a circuit for such a
file: under ``--enforce`` the floor's assists are the circuit proposed from the training rows
(``headwise.data.circuit_proposals``: the digit follows the letter's earlier occurrence, so
induction explains every target).

``--out DIR`` receives ``lookup.jsonl`` and ``lookup.yaml``: a 3-layer, 4-head byte-level model,
1500 steps, and one clause, ``{task: lookup, metric: accuracy, at_least: 0.9}``, with the
enforcement settings at their defaults. With ``--run`` the spec is trained plain and with
``--enforce``, each in its own process on one thread (``bench.lab.suite.run_one``), and one
markdown row per run is printed: verification-set accuracy, the clause's verdict, steps
trained and kept, the step the assists switched on, wall time.

    python -m bench.lookup_jsonl [--out bench/.cache/lookup] [--rows 20000] [--pairs 4]
        [--seed 0] [--run] [--train-seed 0]
"""

from __future__ import annotations

import argparse
import json
import random
from pathlib import Path
from typing import Any

from bench.lab.workers import BENCH, module_command, run_worker
from headwise.atomic import write_bytes_atomic

LETTERS = "abcdefghijklmnopqrstuvwxyz"
DIGITS = "0123456789"


def rows(n: int, pairs: int, seed: int) -> list[dict[str, str]]:
    """``n`` lookup rows: ``pairs`` letter-digit pairs with distinct letters, then ``?`` and a
    queried letter; the completion is its digit."""
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        letters = rng.sample(LETTERS, pairs)
        digits = [rng.choice(DIGITS) for _ in range(pairs)]
        q = rng.randrange(pairs)
        prompt = " ".join(a + d for a, d in zip(letters, digits, strict=True)) + " ?" + letters[q]
        out.append({"prompt": prompt, "completion": digits[q]})
    return out


def spec_text(pairs: int, train_seed: int) -> str:
    """The spec: byte-level ``pairs`` task on ``lookup.jsonl``, 3 layers, one task floor."""
    seq_len = 3 * pairs + 2  # prompt bytes (3 per pair, less a space, plus "?" and the letter)
    return f"""\
# A lookup in the user's own JSONL notation (bench/lookup_jsonl.py wrote this file):
# {pairs} letter-digit pairs, then "?" and a letter; the completion is its digit. Byte-level,
# no tokenizer. The contract asks only that the lookup works.
name: lookup_jsonl
description: A 3-layer byte-level model answers a lookup read from a JSONL file.
model: {{n_layers: 3, n_heads: 4, d_model: 64, vocab_size: 256, max_seq_len: {seq_len + 2}}}
data:
  tasks:
    lookup: {{task: pairs, path: lookup.jsonl, seq_len: {seq_len}}}
  eval_examples: 256
train: {{steps: 1500, batch_size: 64, lr: 3.0e-3, eval_every: 25, seed: {train_seed}}}
contract:
  - {{name: "lookup answered", task: lookup, metric: accuracy, at_least: 0.9}}
"""


def write(out: Path, n: int, pairs: int, seed: int, train_seed: int) -> Path:
    """Write ``lookup.jsonl`` and ``lookup.yaml`` into ``out``; returns the spec's path."""
    out.mkdir(parents=True, exist_ok=True)
    lines = "".join(json.dumps(r) + "\n" for r in rows(n, pairs, seed))
    write_bytes_atomic(out / "lookup.jsonl", lines.encode())
    spec = out / "lookup.yaml"
    write_bytes_atomic(spec, spec_text(pairs, train_seed).encode())
    return spec


def work(spec: str, enforce: str, out: str) -> None:
    """A worker: train ``spec`` once and print its record (``bench.lab.suite.run_one``) with the
    step the floor's assists switched on."""
    from bench.lab.suite import run_one

    record = run_one(Path(spec), enforce == "1", Path(out))
    enforcement = json.loads((Path(out) / "enforcement.json").read_text()) \
        if enforce == "1" else {}
    record["assists_from"] = enforcement.get("assists_from", {})
    print(json.dumps(record))


def row(label: str, r: dict[str, Any]) -> str:
    """One markdown row of a run's record."""
    clause = r["clauses"][0]
    assisted = ", ".join(str(s) for s in r.get("assists_from", {}).values()) or "-"
    return (f"| {label} | {r['tasks']['lookup']['accuracy']:.3f} | {clause['measured']:.3f} "
            f"({clause['state']}) | {r['steps']} | {r['kept_step']} | "
            f"{assisted} | {r['wall_s']:.0f} |")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", type=Path, default=BENCH / ".cache" / "lookup")
    p.add_argument("--rows", type=int, default=20000)
    p.add_argument("--pairs", type=int, default=4)
    p.add_argument("--seed", type=int, default=0, help="seed of the rows")
    p.add_argument("--train-seed", type=int, default=0, help="the spec's train.seed")
    p.add_argument("--run", action="store_true", help="train plain and with --enforce")
    p.add_argument("--worker", nargs=3, metavar=("SPEC", "ENFORCE", "OUT"),
                   help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.worker:
        work(*args.worker)
        return
    spec = write(args.out, args.rows, args.pairs, args.seed, args.train_seed)
    print(f"wrote {spec} and {args.out / 'lookup.jsonl'}")
    if not args.run:
        return
    print("| run | accuracy (verification, 512 examples) | clause (verification set) | steps | "
          "kept step | assists from step | wall s |")
    print("|---|---:|---|---:|---:|---|---:|")
    for enforce in (False, True):
        out = args.out / ("enforced" if enforce else "plain")
        r = run_worker(module_command("bench.lookup_jsonl", "--worker", spec,
                                      int(enforce), out), f"lookup ({out.name})")
        print(row("--enforce" if enforce else "plain", r))


if __name__ == "__main__":
    main()
