"""Lever benchmark: pattern-objective overhead, head-scoped LoRA vs full fine-tuning.

Run from the repository root::

    .venv/bin/python -m bench.bench_levers           # defaults: T=256, B=8, 7 reps

Model: 4 layers x 8 heads (32 heads), d_model 256, d_ff 1024, vocab 4096, GPT-2 shaped.
A *training step* is forward, cross-entropy on random next tokens, backward, AdamW step
(``zero_grad(set_to_none=True)`` first). Systems, each with its own model and optimizer:

- ``plain``: the step above over all parameters.
- ``pattern``: the same plus ``PatternObjective(model, "L0.H0", "previous_token")`` (1 of 32
  heads computed explicitly, KL loss added). Target: <= 1.2x ``plain``.
- ``full_ft``: full fine-tuning (identical to ``plain``; timed again for the LoRA comparison).
- ``lora_head``: ``apply_lora(targets=("q_proj", "v_proj"), heads="L3.H0", rank=8)``, AdamW
  over the adapters only.

Speed: one process, one thread, interleaved (each repetition runs every system once, in turn),
median of ``--reps`` after ``--warmup``; ratios are medians of per-repetition ratios, and
``full_ft / plain`` (the same step twice) shows the noise floor. Peak memory: one subprocess
per system; the figure is the growth of the peak resident set size (``VmHWM``, reset after the
model is built) across three training steps (activations, gradients and optimizer state
included). Linux only.
"""

from __future__ import annotations

import argparse
import json
import statistics
from collections.abc import Callable

import torch
import torch.nn.functional as F

from bench.lab.timing import interleaved, paired, status_kib
from bench.lab.workers import module_command, run_worker

SHAPE = {"n_layers": 4, "d_model": 256, "n_heads": 8, "d_ff": 1024, "vocab_size": 4096,
         "max_seq_len": 1024}
SYSTEMS = ("plain", "pattern", "full_ft", "lora_head")


def make_step(system: str, T: int, B: int) -> tuple[Callable[[], float], int]:
    """A training-step closure for ``system`` and its number of trainable parameters."""
    from headwise import ModelConfig, build_model
    from headwise.control import PatternObjective, apply_lora

    cfg = ModelConfig(**SHAPE, activation="gelu_tanh", tie_embeddings=True)  # type: ignore[arg-type]
    model = build_model(cfg, seed=0)
    objective = None
    if system == "pattern":
        objective = PatternObjective(model, "L0.H0", "previous_token", kind="kl")
    if system == "lora_head":
        apply_lora(model, targets=("q_proj", "v_proj"), heads="L3.H0", rank=8, alpha=16)
    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=1e-4, weight_decay=0.01)
    g = torch.Generator().manual_seed(1)
    tokens = torch.randint(0, SHAPE["vocab_size"], (B, T + 1), generator=g)
    x, y = tokens[:, :-1], tokens[:, 1:]

    def step() -> float:
        opt.zero_grad(set_to_none=True)
        with model.hooks(*(objective.hooks() if objective is not None else [])):
            logits = model(x)
        loss = F.cross_entropy(logits.flatten(0, 1), y.flatten())
        if objective is not None:
            loss = loss + objective.loss(x)[0]
        loss.backward()
        opt.step()
        return float(loss.detach())

    return step, sum(p.numel() for p in params)


def speed(T: int, B: int, reps: int, warmup: int) -> dict[str, list[float]]:
    return interleaved({s: make_step(s, T, B)[0] for s in SYSTEMS}, reps, warmup)


def memory_worker(system: str, T: int, B: int) -> None:
    """Three training steps; prints trainable parameters and the growth of peak RSS (MiB).

    The peak is the kernel's high-water mark ``VmHWM``, reset to the current RSS after the
    model is built (``echo 5 > /proc/self/clear_refs``), so that building does not count.
    """
    torch.set_num_threads(1)
    step, n_params = make_step(system, T, B)
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")
    before = status_kib("VmRSS")
    for _ in range(3):
        step()
    after = status_kib("VmHWM")
    print(json.dumps({"system": system, "trainable": n_params,
                      "peak_growth_mib": (after - before) / 1024}))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--T", type=int, default=256)
    ap.add_argument("--B", type=int, default=8)
    ap.add_argument("--reps", type=int, default=7)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--memory-worker", choices=SYSTEMS)
    args = ap.parse_args()
    if args.memory_worker:
        memory_worker(args.memory_worker, args.T, args.B)
        return
    torch.set_num_threads(1)
    times = speed(args.T, args.B, args.reps, args.warmup)
    t = {s: statistics.median(v) for s, v in times.items()}
    mem = {s: run_worker(module_command(__spec__.name, "--memory-worker", s, "--T", args.T,
                                        "--B", args.B), f"{s} memory")
           for s in SYSTEMS}
    print(f"T={args.T} B={args.B} reps={args.reps} warmup={args.warmup} threads=1")
    print(f"{'system':<10} {'step ms':>9} {'trainable':>11} {'peak MiB':>9}")
    for s in SYSTEMS:
        print(f"{s:<10} {t[s] * 1e3:9.1f} {mem[s]['trainable']:11d} "
              f"{mem[s]['peak_growth_mib']:9.1f}")
    print("ratios: median over repetitions of per-repetition ratios")
    print(f"pattern / plain     = {paired(times, 'pattern', 'plain'):.3f}  (target <= 1.2)")
    print(f"full_ft / plain     = {paired(times, 'full_ft', 'plain'):.3f}  (same step twice: "
          "the noise floor)")
    print(f"lora_head / full_ft = {paired(times, 'lora_head', 'full_ft'):.3f}")


if __name__ == "__main__":
    main()
