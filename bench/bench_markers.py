"""Task markers: a copy/reverse/sort mixture on one 2-layer model, with and without markers.

Copy, reverse and sort share the input format ``[BOS, x, SEP, y]``; without task gates or a
marker the model cannot know at ``SEP`` which answer to write. This trains the same spec with
``data.task_tokens: off`` and ``on`` (seeds 0 and 1 by default, one torch thread) and prints a
markdown table of held-out accuracy and exact match per task.

    python bench/bench_markers.py [--steps 1500] [--seeds 0 1]
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import torch

SPEC = """
model: {{n_layers: 2, n_heads: 4, d_model: 64, vocab_size: 24, max_seq_len: 16}}
data:
  tasks:
    copy: {{length: 6}}
    reverse: {{length: 6}}
    sort: {{length: 6}}
  task_tokens: {markers}
  eval_examples: 768
train: {{steps: {steps}, batch_size: 64, lr: 3.0e-3, warmup_steps: 50, eval_every: 0,
         checkpoint_every: 0, seed: {seed}}}
"""


def run(markers: str, steps: int, seed: int, out: Path) -> dict[str, dict[str, float]]:
    from headwise.pipeline import compile_spec
    from headwise.runspec import load_spec
    from headwise.training import train
    from headwise.training.evaluate import evaluate

    spec = load_spec(SPEC.format(markers=f"'{markers}'", steps=steps, seed=seed))
    compiled = compile_spec(spec)
    train(compiled.model, compiled.data, spec.train, out_dir=None, progress=False)
    record = evaluate(compiled.model, compiled.eval_data, batch_size=256, n_batches=3,
                      seed=spec.data.eval_seed)
    return {t: {"accuracy": v["accuracy"], "exact": v["exact"]}
            for t, v in record["tasks"].items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=1500)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1])
    args = parser.parse_args()
    torch.set_num_threads(1)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for seed in args.seeds:
            for markers in ("off", "on"):
                start = time.perf_counter()
                res = run(markers, args.steps, seed, Path(tmp))
                rows.append((markers, seed, res, time.perf_counter() - start))
                print(markers, seed, res, flush=True)
    print("\n| task markers | seed | " + " | ".join(f"{t} acc / exact" for t in
                                                    ("copy", "reverse", "sort")) + " | wall s |")
    print("|---|---|---|---|---|---|")
    for markers, seed, res, wall in rows:
        cells = [f"{res[t]['accuracy']:.3f} / {res[t]['exact']:.3f}"
                 for t in ("copy", "reverse", "sort")]
        print(f"| {markers} | {seed} | " + " | ".join(cells) + f" | {wall:.0f} |")


if __name__ == "__main__":
    main()
