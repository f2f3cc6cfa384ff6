"""Reading a large ``pairs`` file: wall time, CPU time and peak memory of building the task,
this checkout against another (e.g. the commit before), side by side.

Each repetition builds ``PairsTask`` on the same file once per checkout, in turn, each in its
own process with one thread (``OMP_NUM_THREADS=1``); a process's CPU seconds and peak resident
memory come from ``os.wait4`` (its own ``ru_utime + ru_stime`` and ``ru_maxrss``). The file:
``--rows`` lines of ``{"prompt": ..., "completion": ...}`` (about 36 bytes each, 2.8M rows
make 112 MB), written once to ``bench/.cache/rows_<rows>.jsonl``. The worker builds the task
(the ``train`` split), draws one batch of 64 rows and prints what it read and its peak memory
after importing torch and headwise, before reading (the rest of the peak is the task's).

    OMP_NUM_THREADS=1 .venv/bin/python -m bench.bench_rows --base /path/to/old \\
        [--rows 2800000] [--seq-len 16] [--reps 3] [--limit 600]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
WORKER = """
import sys, torch
from headwise.data import PairsTask
imported = next(int(l.split()[1]) for l in open("/proc/self/status") if l.startswith("VmHWM"))
task = PairsTask(path=sys.argv[1], prompt="prompt", completion="completion",
                 seq_len=int(sys.argv[2]))
batch = task.sample(64, torch.Generator().manual_seed(0))
print(f"rows {task.n_rows}, sums {int(batch.tokens.sum())} {int(batch.targets.sum())}, "
      f"peak after imports {imported // 1024} MiB")
"""


def data_file(rows: int) -> Path:
    """``rows`` prompt/completion lines (written once), e.g. ``{"prompt": "17+4=", ...}``."""
    out = ROOT / "bench" / ".cache" / f"rows_{rows}.jsonl"
    if not out.is_file():
        out.parent.mkdir(parents=True, exist_ok=True)
        with open(out, "w", encoding="utf-8") as f:
            for i in range(rows):
                a, b = i % 97, i % 13
                f.write(f'{{"prompt": "{a}+{b}=", "completion": "{a + b}"}}\n')
    return out


def run_worker(checkout: Path, path: Path, seq_len: int, limit: float
               ) -> tuple[float, float, float, str]:
    """Wall seconds, CPU seconds and peak resident MiB of one worker, and its output."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(checkout)}
    with tempfile.TemporaryFile("w+") as log:
        t0 = time.perf_counter()
        proc = subprocess.Popen([sys.executable, "-c", WORKER, str(path), str(seq_len)],
                                env=env, stdout=log, stderr=subprocess.STDOUT, text=True,
                                cwd=checkout)
        timer = threading.Timer(limit, proc.kill)  # a worker past the limit is killed
        timer.start()
        _, status, usage = os.wait4(proc.pid, 0)  # this child's own CPU time and peak memory
        timer.cancel()
        wall = time.perf_counter() - t0
        log.seek(0)
        output = log.read().strip()
    code = os.waitstatus_to_exitcode(status)
    if code != 0:
        output = f"exit {code} after {wall:.0f} s: {output[-300:]}"
    return wall, usage.ru_utime + usage.ru_stime, usage.ru_maxrss / 1024, output


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--base", type=Path, required=True, help="the other checkout")
    ap.add_argument("--rows", type=int, default=2_800_000)
    ap.add_argument("--seq-len", type=int, default=16)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--limit", type=float, default=600.0, help="seconds before a worker is killed")
    args = ap.parse_args()
    path = data_file(args.rows)
    print(f"file: {path} ({path.stat().st_size / 1e6:.1f} MB, {args.rows} rows)")
    systems = {"this": ROOT, "base": args.base.resolve()}
    figures: dict[str, list[tuple[float, float, float]]] = {s: [] for s in systems}
    for rep in range(args.reps):
        for name, checkout in systems.items():
            wall, cpu, mib, out = run_worker(checkout, path, args.seq_len, args.limit)
            figures[name].append((wall, cpu, mib))
            print(f"rep {rep} {name:5s} wall {wall:6.1f} s  cpu {cpu:6.1f} s  peak {mib:7.0f} "
                  f"MiB  -> {out}", flush=True)
    print("\nsystem | wall (median s) | cpu (median s) | peak RSS (median MiB)")
    for name, rows in figures.items():
        print(f"{name:6s} | {statistics.median(r[0] for r in rows):6.1f} | "
              f"{statistics.median(r[1] for r in rows):6.1f} | "
              f"{statistics.median(r[2] for r in rows):7.0f}")


if __name__ == "__main__":
    main()
