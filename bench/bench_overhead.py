"""Training-loop overhead: ``headwise`` ``train()`` step vs a bare PyTorch loop.

Run from the repository root::

    .venv/bin/python bench/bench_overhead.py                 # demo shape, 7 rounds
    .venv/bin/python bench/bench_overhead.py --compile       # also train.compile (slow: compiles)
    .venv/bin/python bench/bench_overhead.py --shape gpt2 --systems bare,plain,compile --rounds 3

Shapes: ``demo`` is the bundled demo spec (1 layer, 4 heads, d_model 64, vocab 20, copy and
reverse of length 6: B=64, T=14); ``gpt2`` is the GPT-2-shaped bench model of
``bench_levers.py`` (4 layers x 8 heads, d_model 256, vocab 4096) on next-token prediction of
random tokens (B=8, T=128).

Systems (each in its own process, one thread):

- ``bare``: the same model from ``build_model``, ``torch.optim.AdamW`` (PyTorch's default
  implementation) with the demo's lr / betas / weight decay, plain ``F.cross_entropy`` over the
  target positions, batches drawn from the same ``Mixture`` with the same generator.
  No schedule, no clipping, no logging: the floor.
- ``bare_levers``: the bare loop on the levered model below, the pattern objective's hooks
  attached around the forward and its term added to the loss: what the levers themselves cost
  (their extra compute), without headwise's loop.
- ``plain``: ``headwise.training.train()`` with the demo's config (warm-up + cosine, clipping,
  per-task statistics, ``log_every=10``) and no levers; no evaluation, checkpoints or progress
  bar (those are periodic, not per-step costs).
- ``levers``: ``train()`` on the model ``compile_spec`` builds from the demo spec: a
  previous-token mask on L0.H0, a pattern objective on L0.H1 (explicit path for that head),
  fixed task gates on L0.H2 / L0.H3.
- ``compile`` / ``compile_levers``: ``plain`` / ``levers`` with ``train.compile: true``; the
  step time excludes compilation, which is reported separately (first call, warm-up steps).
- ``bare_mask`` / ``bare_objective`` / ``bare_gates``: the bare loop with one of the demo's
  levers only (the previous-token mask on L0.H0; the pattern objective on L0.H1; the fixed
  task gates on L0.H2 / L0.H3): what each lever costs on its own.

Each process runs ``--warmup`` steps (not timed; for ``compile*`` this includes compilation),
then ``--steps`` timed steps; its figures are wall time / steps and CPU time / steps (the
process's own CPU time, ``time.process_time``: on a shared machine it leaves out the time other
jobs held the core, which wall time counts). Processes alternate: each round runs every system
once, in turn (the order rotates by round), and ratios are medians over rounds of the
per-round ratio to ``bare`` (robust to load drift on a shared machine), with the ratio of
medians in brackets.
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib.resources
import json
import os
import statistics
import subprocess
import sys
import time
from typing import Any

import torch
import torch.nn.functional as F

SYSTEMS = ("bare", "plain", "bare_levers", "levers", "compile", "compile_levers", "bare_mask",
           "bare_objective", "bare_gates")
GPT2 = {"n_layers": 4, "d_model": 256, "n_heads": 8, "d_ff": 1024, "vocab_size": 4096,
        "max_seq_len": 1024}


def _demo() -> Any:
    from headwise.pipeline import compile_spec
    from headwise.runspec import load_spec

    path = importlib.resources.files("headwise") / "examples" / "demo.yaml"
    return compile_spec(load_spec(str(path)))


class _RandomLM:
    """Next-token prediction on uniform random tokens (a ``Mixture``-like source)."""

    names = ["lm"]

    def __init__(self, vocab: int, T: int) -> None:
        self.vocab, self.T = vocab, T

    def sample(self, n: int, generator: torch.Generator) -> Any:
        from headwise.data import Batch

        x = torch.randint(0, self.vocab, (n, self.T + 1), generator=generator)
        return Batch(x[:, :-1], x[:, 1:].contiguous(), None, torch.zeros(n, dtype=torch.long))

    def check_model(self, vocab_size: int, max_seq_len: int | None = None) -> None:
        pass


def _setup(shape: str, system: str) -> tuple[Any, Any, Any, list[Any], Any]:
    """``(model, data, train config, objectives, optimizer hooks)`` for a system."""
    from headwise import ModelConfig, build_model

    compiled = _demo()
    config = dataclasses.replace(compiled.spec.train, eval_every=0, checkpoint_every=0,
                                 device="cpu", compile=system.startswith("compile"))
    if shape == "gpt2":
        cfg = ModelConfig(**GPT2, activation="gelu_tanh", tie_embeddings=True)  # type: ignore[arg-type]
        config = dataclasses.replace(config, batch_size=8, lr=3e-4, warmup_steps=0)
        return build_model(cfg, seed=0), _RandomLM(GPT2["vocab_size"], 128), config, [], []
    if system.endswith("levers"):
        return (compiled.model, compiled.data, config, compiled.objectives,
                compiled.optimizer_hooks)
    model = build_model(compiled.model.config, seed=0)
    return model, compiled.data, config, _one_lever(model, system, compiled.data.names), []


def _one_lever(model: Any, system: str, task_names: list[str]) -> list[Any]:
    """Install the one demo lever ``system`` names (none for other systems); its objectives."""
    from headwise.control import FixedGates, PatternObjective, apply_masks, previous_token

    if system == "bare_mask":
        apply_masks(model, {"L0.H0": previous_token()})
    elif system == "bare_gates":
        FixedGates(model, {"copy": "L0.H2", "reverse": "L0.H3"}, task_names=task_names)
    elif system == "bare_objective":
        return [PatternObjective(model, "L0.H1", "previous_token", kind="ce")]
    return []


def _bare_steps(model: Any, opt: torch.optim.Optimizer, data: Any, batch_size: int, n: int,
                gen: torch.Generator, objectives: list[Any]) -> None:
    hooks = [h for obj in objectives for h in obj.hooks()]
    for _ in range(n):
        batch = data.sample(batch_size, gen)
        with model.hooks(*hooks):
            logits = model(batch.tokens, attention_mask=batch.attention_mask,
                           task_ids=batch.task_ids)
        loss = F.cross_entropy(logits.flatten(0, 1), batch.targets.flatten(), ignore_index=-100)
        for obj in objectives:
            loss = loss + obj.loss(batch.tokens, batch.attention_mask)[0]
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()


def worker(shape: str, system: str, warmup: int, steps: int) -> dict[str, float]:
    """Time one system in this process; returns ``{"step_s", "cpu_s", "warmup_s"}``.

    ``train()`` systems run two calls on the same model: ``warmup`` steps (compilation
    included for ``compile*``), then ``steps`` timed steps.
    """
    from headwise.training import train

    torch.set_num_threads(1)
    model, data, config, objectives, hooks = _setup(shape, system)
    gen = torch.Generator().manual_seed(0)
    if system.startswith("bare"):
        opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad],
                                lr=config.lr, betas=config.betas,
                                weight_decay=config.weight_decay)
        t0 = time.perf_counter()
        _bare_steps(model, opt, data, config.batch_size, warmup, gen, objectives)
        t1, c1 = time.perf_counter(), time.process_time()
        _bare_steps(model, opt, data, config.batch_size, steps, gen, objectives)
        t2, c2 = time.perf_counter(), time.process_time()
        return {"step_s": (t2 - t1) / steps, "cpu_s": (c2 - c1) / steps, "warmup_s": t1 - t0}
    kwargs = {"objectives": objectives, "optimizer_hooks": hooks, "progress": False}
    t0 = time.perf_counter()
    train(model, data, dataclasses.replace(config, steps=warmup, warmup_steps=0), **kwargs)
    t1, c1 = time.perf_counter(), time.process_time()
    train(model, data, dataclasses.replace(
        config, steps=steps, warmup_steps=min(config.warmup_steps, steps)), **kwargs)
    t2, c2 = time.perf_counter(), time.process_time()
    return {"step_s": (t2 - t1) / steps, "cpu_s": (c2 - c1) / steps, "warmup_s": t1 - t0}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shape", choices=("demo", "gpt2"), default="demo")
    ap.add_argument("--systems", default="bare,plain,bare_levers,levers",
                    help=f"comma-separated subset of {','.join(SYSTEMS)}")
    ap.add_argument("--compile", action="store_true", help="add compile and compile_levers")
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--warmup", type=int, default=20)
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--worker", choices=SYSTEMS)
    args = ap.parse_args()
    if args.worker:
        print(json.dumps(worker(args.shape, args.worker, args.warmup, args.steps)))
        return
    systems = [s for s in args.systems.split(",") if s]
    if args.compile:
        systems += [s for s in ("compile", "compile_levers") if s not in systems]
    if args.shape == "gpt2":
        systems = [s for s in systems if s in ("bare", "plain", "compile")]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    results: dict[str, list[dict[str, float]]] = {s: [] for s in systems}
    for r in range(args.rounds):
        order = systems[r % len(systems):] + systems[:r % len(systems)]
        for s in order:
            out = subprocess.run([sys.executable, __file__, "--worker", s, "--shape", args.shape,
                                  "--warmup", str(args.warmup), "--steps", str(args.steps)],
                                 capture_output=True, text=True, env=env)
            if out.returncode:
                sys.exit(f"{s} failed:\n{out.stderr[-2000:]}")
            results[s].append(json.loads(out.stdout.strip().splitlines()[-1]))
        print(f"round {r + 1} (load average {os.getloadavg()[0]:.1f}): " + "  ".join(
            f"{s} {results[s][-1]['step_s'] * 1e3:.2f} ms" for s in systems), flush=True)
    print(f"\nshape={args.shape} rounds={args.rounds} warmup={args.warmup} steps={args.steps} "
          f"threads=1 torch={torch.__version__}")
    for key, label in (("step_s", "wall"), ("cpu_s", "CPU")):
        _table(results, systems, key, label)


def _table(results: dict[str, list[dict[str, float]]], systems: list[str], key: str,
           label: str) -> None:
    """Medians of ``key`` per system, and the paired ratios to ``bare``."""
    print(f"\n{'system':<15} {label + ' ms (median)':>17} {'/ bare, paired':>15} "
          f"{'(of medians)':>13} {'warm-up s':>10}")
    med = {s: statistics.median(x[key] for x in results[s]) for s in systems}
    for s in systems:
        ratio, of_medians = "-", ""
        if "bare" in results and s != "bare":
            pairs = zip(results[s], results["bare"], strict=True)
            ratio = f"{statistics.median(a[key] / b[key] for a, b in pairs):.3f}"
            of_medians = f"({med[s] / med['bare']:.3f})"
        warm = statistics.median(x["warmup_s"] for x in results[s])
        print(f"{s:<15} {med[s] * 1e3:17.2f} {ratio:>15} {of_medians:>13} {warm:10.1f}")


if __name__ == "__main__":
    main()
