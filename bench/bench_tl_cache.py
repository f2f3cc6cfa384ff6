"""headwise ``run_with_cache`` vs TransformerLens's, side by side, in two environments.

Run from the repository root::

    .venv/bin/python -m bench.bench_tl_cache                 # sets up the TL venv on first use
    .venv/bin/python -m bench.bench_tl_cache --rounds 5 --shapes 64x32,256x8,1024x2

TransformerLens is never a headwise dependency: on first use the script creates its own venv,
``bench/.cache/tlvenv3`` (git-ignored), and installs ``transformer_lens==3.9.0`` (the last release
with ``HookedTransformer``) and the same torch into it from the package registry, pinned by
``constraints.txt``. The model is ``bench_forward.py``'s GPT-2-shaped decoder (4 layers,
d_model 256, 8 heads; ``bench.lab.forward_models``); TL gets our weights (``tl_model``, which
asserts equal logits, max |diff| < 1e-4, before any timing).

Each round runs one process per system (ours, then TL), one thread each; a process times every
mode of every shape interleaved (each repetition runs each mode once, in turn), median of
``--reps`` after ``--warmup``, under ``torch.no_grad()``. Ratios are TL time / our time of the
same round, median over rounds (min-max in brackets). Modes:

- ``no_hooks``: ``model(tokens)``;
- ``all_patterns``: the 4 ``hook_pattern`` points (TL: ``names_filter`` ending in it);
- ``every_hook``: every hook point TL caches by default (TL: ``run_with_cache(tokens)``); ours:
  every point except ``attn.hook_result``, which TL computes only with ``use_attn_result=True``;
- ``names_filter``: the residual stream, names containing ``resid`` (12 points).

``--env NAME=VALUE`` sets a variable in both systems' workers, e.g. glibc's
``MALLOC_MMAP_THRESHOLD_`` and ``MALLOC_TRIM_THRESHOLD_``, which decide whether freed memory
goes back to the OS (and is faulted in again by the next call's captures).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from bench.lab.forward_models import SHAPE, build, tl_model
from bench.lab.timing import interleaved, medians
from bench.lab.workers import BENCH, ROOT, module_command, run

VENV = BENCH / ".cache" / "tlvenv3"
TL_PIN = "transformer_lens==3.9.0"
MODES = ("no_hooks", "all_patterns", "every_hook", "names_filter")


def ensure_env(venv: Path) -> Path:
    """The TL venv's python, creating the venv and installing TL into it when missing."""
    python = venv / "bin" / "python"
    probe = [str(python), "-c", "import transformer_lens"]
    if python.exists() and subprocess.run(probe, capture_output=True).returncode == 0:
        return python
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    subprocess.run([str(python), "-m", "pip", "install", "-q", "-c",
                    str(ROOT / "constraints.txt"), f"torch=={torch.__version__.split('+')[0]}",
                    TL_PIN], check=True)
    subprocess.run(probe, check=True)
    return python


def _modes(system: str, state: str) -> dict[str, Callable[[], object]]:
    saved = torch.load(state, weights_only=True)
    tokens = saved["tokens"]
    n = SHAPE["n_layers"]
    if system == "tl":
        tl = tl_model(state)  # asserts TL's logits equal ours
        return {
            "no_hooks": lambda: tl(tokens),
            "all_patterns": lambda: tl.run_with_cache(
                tokens, names_filter=lambda name: name.endswith("hook_pattern")),
            "every_hook": lambda: tl.run_with_cache(tokens),
            "names_filter": lambda: tl.run_with_cache(
                tokens, names_filter=lambda name: "resid" in name),
        }
    ours, _ = build()
    with torch.no_grad():
        diff = (ours(tokens) - saved["logits"]).abs().max().item()
    assert diff == 0.0, f"headwise model differs from the saved one: {diff}"
    patterns = [f"blocks.{l}.attn.hook_pattern" for l in range(n)]
    return {
        "no_hooks": lambda: ours(tokens),
        "all_patterns": lambda: ours.run_with_cache(tokens, patterns),
        "every_hook": lambda: ours.run_with_cache(
            tokens, lambda name: not name.endswith("hook_result")),
        "names_filter": lambda: ours.run_with_cache(tokens, lambda name: "resid" in name),
    }


def worker(system: str, states: list[str], reps: int, warmup: int, clock: str) -> None:
    """Print one JSON line: {shape: {mode: median seconds}} for ``system``."""
    torch.set_num_threads(1)
    out: dict[str, dict[str, float]] = {}
    for state in states:
        modes = _modes(system, state)
        with torch.no_grad():
            out[Path(state).stem] = medians(interleaved(modes, reps, warmup, clock))
    print(json.dumps(out))


def _run(python: str, system: str, states: list[str], reps: int, warmup: int,
         clock: str, extra_env: dict[str, str]) -> dict[str, dict[str, float]]:
    cmd = module_command(__spec__.name, "--worker", system, "--reps", reps, "--warmup", warmup,
                         "--clock", clock, *states, python=python)
    done = run(cmd, {"OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", **extra_env})
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def compare(tl_python: str, shapes: list[tuple[int, int]], rounds: int, reps: int,
            warmup: int, clock: str, extra_env: dict[str, str] | None = None) -> dict[str, Any]:
    """Alternate our process and TL's for ``rounds``; per shape and mode: medians, ratios."""
    ours, _ = build()
    with tempfile.TemporaryDirectory() as tmp:
        states = []
        for T, B in shapes:
            tokens = torch.randint(0, SHAPE["vocab_size"], (B, T),
                                   generator=torch.Generator().manual_seed(1))
            with torch.no_grad():
                logits = ours(tokens)
            path = os.path.join(tmp, f"{T}x{B}.pt")
            torch.save({"state": ours.state_dict(), "tokens": tokens, "logits": logits}, path)
            states.append(path)
        runs: dict[str, list[dict[str, dict[str, float]]]] = {"ours": [], "tl": []}
        for _ in range(rounds):
            runs["ours"].append(_run(sys.executable, "ours", states, reps, warmup, clock,
                                     extra_env or {}))
            runs["tl"].append(_run(tl_python, "tl", states, reps, warmup, clock,
                                   extra_env or {}))
    table: dict[str, Any] = {}
    for T, B in shapes:
        key = f"{T}x{B}"
        for mode in MODES:
            o = [r[key][mode] for r in runs["ours"]]
            t = [r[key][mode] for r in runs["tl"]]
            pairs = [b / a for a, b in zip(o, t, strict=True)]
            table[f"{key} {mode}"] = {"ours_s": statistics.median(o),
                                      "tl_s": statistics.median(t),
                                      "ratio": statistics.median(pairs),
                                      "min": min(pairs), "max": max(pairs)}
    return table


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shapes", default="64x32,256x8,1024x2", help="TxB list")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--warmup", type=int, default=1)
    ap.add_argument("--clock", choices=("wall", "cpu"), default="wall",
                    help="wall-clock or process CPU seconds (cpu: for a loaded machine)")
    ap.add_argument("--env", action="append", default=[], metavar="NAME=VALUE",
                    help="set in both systems' worker processes (repeatable), e.g. glibc's "
                         "MALLOC_MMAP_THRESHOLD_ / MALLOC_TRIM_THRESHOLD_")
    ap.add_argument("--venv", default=str(VENV), help="the TL venv (created when missing)")
    ap.add_argument("--setup-only", action="store_true", help="create the TL venv and stop")
    ap.add_argument("--worker", choices=("ours", "tl"), help=argparse.SUPPRESS)
    ap.add_argument("states", nargs="*", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        return worker(args.worker, args.states, args.reps, args.warmup, args.clock)
    tl_python = ensure_env(Path(args.venv))
    if args.setup_only:
        print(tl_python)
        return
    shapes = [(int(t), int(b)) for t, b in (s.split("x") for s in args.shapes.split(","))]
    extra_env = dict(item.split("=", 1) for item in args.env)
    print(f"torch {torch.__version__}, {TL_PIN}, one thread, {args.rounds} rounds x "
          f"{args.reps} reps (+{args.warmup} warm-up), clock {args.clock}, "
          f"environment {extra_env or 'as is'}, load average {os.getloadavg()}")
    table = compare(str(tl_python), shapes, args.rounds, args.reps, args.warmup, args.clock,
                    extra_env)
    print("| T x B | mode | headwise (s) | TL 3.9 (s) | TL / headwise, paired (min-max) |")
    print("|---|---|---:|---:|---:|")
    for key, r in table.items():
        shape, mode = key.split()
        print(f"| {shape} | {mode} | {r['ours_s']:.4f} | {r['tl_s']:.4f} | "
              f"{r['ratio']:.2f}x ({r['min']:.2f}-{r['max']:.2f}) |")
    print(f"load average after: {os.getloadavg()}")


if __name__ == "__main__":
    main()
