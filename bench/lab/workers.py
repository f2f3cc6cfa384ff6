"""Worker processes: a benchmark module run again in a fresh process, one torch thread.

Benchmarks that need nothing shared between runs (a training run, a peak-memory reading) start
their own module with a worker flag. The command names the module, not its file
(``python -m bench.contract_suite --worker ...``) and runs from the repository root, so the
worker imports ``bench.lab`` exactly as the benchmark did.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]  # the repository root
BENCH = ROOT / "bench"
ONE_THREAD = {"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}


def module_command(module: str, *args: object, python: str | None = None) -> list[str]:
    """``python -m module args...`` (``python``: this interpreter unless named)."""
    return [python or sys.executable, "-m", module, *map(str, args)]


def run(cmd: list[str], env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """Run ``cmd`` from the repository root, output captured, ``env`` over this process's."""
    return subprocess.run(cmd, capture_output=True, text=True, check=False, cwd=ROOT,
                          env={**os.environ, **(env or {})})


def run_worker(cmd: list[str], label: str) -> dict[str, Any]:
    """Run one worker process on one torch thread; its last stdout line is its JSON result.

    Raises:
        RuntimeError: the worker failed (the tail of its stderr, named by ``label``).
    """
    proc = run(cmd, ONE_THREAD)
    if proc.returncode != 0:
        raise RuntimeError(f"{label} failed:\n{proc.stderr[-3000:]}")
    result: dict[str, Any] = json.loads(proc.stdout.strip().splitlines()[-1])
    return result
