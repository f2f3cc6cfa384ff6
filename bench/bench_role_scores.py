"""``role_scores`` of this checkout against another checkout's, side by side.

Run from the repository root::

    OMP_NUM_THREADS=1 .venv/bin/python -m bench.bench_role_scores --base /path/to/other [--reps 3]

The model is a 6-layer, 12-head decoder (d_model 192, vocabulary 512, built from its config,
seed 0): 72 heads, every role, on 256 random sequences of 64 tokens, 64 at a time. Each
repetition runs one process per checkout, in turn (this one, then the other), one thread each,
so load hits both alike; each process imports its checkout's headwise (``PYTHONPATH``), warms up
on 8 sequences and times one call. Printed: each checkout's seconds per repetition, their
medians, and the median of the per-repetition ratios (other / this).
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
WORKER = """
import os, time, torch
torch.set_num_threads(1)
import headwise as hw
assert hw.__file__.startswith(os.environ["BENCH_CHECKOUT"]), hw.__file__  # the right checkout
from headwise.analysis.roles import role_scores
m = hw.build_model(hw.ModelConfig(n_layers=6, n_heads=12, d_model=192, vocab_size=512,
                                  max_seq_len=64), seed=0)
tok = torch.randint(0, 512, (256, 64), generator=torch.Generator().manual_seed(0))
role_scores(m, tok[:8])
t0 = time.perf_counter()
role_scores(m, tok, batch_size=64)
print(time.perf_counter() - t0)
"""


def timed(checkout: Path) -> float:
    """One worker's seconds for ``role_scores`` with ``checkout``'s headwise."""
    env = {**os.environ, "PYTHONPATH": str(checkout), "OMP_NUM_THREADS": "1",
           "BENCH_CHECKOUT": str(checkout)}
    out = subprocess.run([sys.executable, "-P", "-c", WORKER], env=env, check=True,
                         capture_output=True, text=True, cwd=checkout)
    return float(out.stdout.strip().splitlines()[-1])


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--base", type=Path, required=True, help="the other checkout")
    p.add_argument("--reps", type=int, default=3)
    args = p.parse_args()
    ours, theirs = [], []
    for _ in range(args.reps):
        ours.append(timed(ROOT))
        theirs.append(timed(args.base.resolve()))
    ratios = [b / a for a, b in zip(ours, theirs, strict=True)]
    print(f"this checkout:  {', '.join(f'{x:.2f}' for x in ours)} s "
          f"(median {statistics.median(ours):.2f})")
    print(f"other checkout: {', '.join(f'{x:.2f}' for x in theirs)} s "
          f"(median {statistics.median(theirs):.2f})")
    print(f"other / this: median {statistics.median(ratios):.2f} "
          f"(min {min(ratios):.2f}, max {max(ratios):.2f})")


if __name__ == "__main__":
    main()
