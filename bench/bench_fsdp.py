"""Sharded training benchmark: per-rank parameter, gradient and AdamW memory, and step time,
for ``train.parallel`` none (1 process), ddp (2 ranks) and fsdp (1 and 2 ranks).

Run from the repository root::

    .venv/bin/python bench/bench_fsdp.py                 # ~52M parameters, 2 rounds
    .venv/bin/python bench/bench_fsdp.py --small         # a 1-minute smoke run
    .venv/bin/python bench/bench_fsdp.py --device cuda --systems none:1,fsdp:2   # 2 GPUs

Model: 14 layers, d_model 512, 8 heads, d_ff 2048, vocab 8192, untied embeddings (51.9M
parameters). Each system is one ``train()`` call (its own process or ``torchrun``): copy-task
batches of 8 sequences of 64 tokens (global batch, split over the ranks), AdamW, float32, one
thread per rank. After every optimizer step a hook counts, on every rank, the bytes of the
tensors that rank holds: its parameters (a sharded parameter's local rows), their gradients and
AdamW's state; the step time is the median of the steps after the first (which allocates the
optimizer state). Systems alternate in rounds (none, ddp, fsdp x1, fsdp x2, then again), and
each figure is the median over rounds. Memory is counted, not sampled: it is exact, and says
nothing about activations or the allocator (a GPU run with ``torch.cuda.max_memory_allocated``
does that: ``--device cuda`` adds the column ``peak MiB``, the largest
``torch.cuda.max_memory_allocated`` over the steps, activations included; ``bench/gpu_check.sh``
runs it). The per-rank figure is the largest over ranks.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

SHAPE = {"n_layers": 14, "d_model": 512, "n_heads": 8, "d_ff": 2048, "vocab_size": 8192,
         "max_seq_len": 72}
SMALL = {"n_layers": 2, "d_model": 64, "n_heads": 4, "d_ff": 256, "vocab_size": 512,
         "max_seq_len": 72}
SYSTEMS = (("none", 1), ("ddp", 2), ("fsdp", 1), ("fsdp", 2))


def _bytes(tensors: list) -> int:  # type: ignore[type-arg]
    from torch.distributed.tensor import DTensor

    total = 0
    for t in tensors:
        local = t.to_local() if isinstance(t, DTensor) else t
        total += local.numel() * local.element_size()
    return total


def worker(out: Path, parallel: str, steps: int, small: bool, device: str) -> None:
    """One ``train()`` run; each rank writes ``{params, grads, optimizer, step_s, n}``."""
    import torch

    from headwise import ModelConfig, build_model
    from headwise.data import CopyTask, Mixture
    from headwise.training import TrainConfig, train

    torch.set_num_threads(1)
    shape = SMALL if small else SHAPE
    model = build_model(ModelConfig(**shape, tie_embeddings=False, dropout=0.0), seed=0)  # type: ignore[arg-type]
    n_params = sum(p.numel() for p in model.parameters())
    data = Mixture({"copy": CopyTask(length=31, vocab_size=shape["vocab_size"])})
    config = TrainConfig(steps=steps, batch_size=8, lr=1e-4, log_every=steps, device=device,
                         parallel=None if parallel == "none" else parallel)
    records: list[dict[str, float]] = []
    last = [time.perf_counter()]

    def count(opt: torch.optim.Optimizer) -> None:
        def after(*_: object) -> None:
            params = [p for g in opt.param_groups for p in g["params"]]
            state = [v for p in params for v in opt.state.get(p, {}).values()
                     if isinstance(v, torch.Tensor)]
            now = time.perf_counter()
            records.append({"params": _bytes(params),
                            "grads": _bytes([p.grad for p in params if p.grad is not None]),
                            "optimizer": _bytes(state), "step_s": now - last[0]})
            last[0] = now
        opt.register_step_post_hook(after)

    def started(opt: torch.optim.Optimizer) -> None:
        last[0] = time.perf_counter()

    train(model, data, config, optimizer_hooks=[count, started], progress=False)
    mine = {k: records[-1][k] for k in ("params", "grads", "optimizer")}
    mine["step_s"] = statistics.median(r["step_s"] for r in records[1:])
    if device.startswith("cuda"):
        mine["peak"] = torch.cuda.max_memory_allocated()
    rank = int(os.environ.get("RANK", "0"))  # one file per rank (the group is gone by now)
    (out.parent / f"{out.name}.rank{rank}").write_text(json.dumps({**mine, "n": n_params}))


def run_system(parallel: str, ranks: int, steps: int, small: bool, device: str,
               tmp: Path) -> dict[str, float]:
    out = tmp / f"{parallel}{ranks}"
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": os.getcwd()}
    args = [__file__, "--worker", str(out), "--parallel", parallel, "--steps", str(steps),
            "--device", device]
    args += ["--small"] if small else []
    cmd = ([sys.executable, *args] if parallel == "none" else
           [sys.executable, "-m", "torch.distributed.run", "--standalone",
            f"--nproc-per-node={ranks}", *args])
    subprocess.run(cmd, env=env, check=True, capture_output=True)
    per_rank = [json.loads((tmp / f"{out.name}.rank{r}").read_text()) for r in range(ranks)]
    return {k: max(r[k] for r in per_rank) for k in per_rank[0]}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--small", action="store_true")
    ap.add_argument("--worker", type=Path)
    ap.add_argument("--parallel", default="none")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--systems", default=",".join(f"{p}:{n}" for p, n in SYSTEMS),
                    help="comma-separated MODE:RANKS (the first is the baseline)")
    args = ap.parse_args()
    if args.worker is not None:
        worker(args.worker, args.parallel, args.steps, args.small, args.device)
        return
    systems = [(p, int(n)) for p, n in (item.split(":") for item in args.systems.split(","))]
    results: dict[str, list[dict[str, float]]] = {f"{p} x{n}": [] for p, n in systems}
    with tempfile.TemporaryDirectory() as tmp:
        for _ in range(args.rounds):
            for parallel, ranks in systems:
                results[f"{parallel} x{ranks}"].append(run_system(
                    parallel, ranks, args.steps, args.small, args.device, Path(tmp)))
    first = results[f"{systems[0][0]} x{systems[0][1]}"]
    base = statistics.median(r["params"] + r["grads"] + r["optimizer"] for r in first)
    n = int(first[0]["n"])
    peak = "peak" in first[0]
    print(f"model: {n / 1e6:.1f}M parameters; per-rank bytes counted after the last step; "
          f"median of {args.rounds} rounds, {args.steps} steps each")
    print("| system | params MiB | grads MiB | AdamW MiB | total MiB | total / baseline | "
          f"step s |{' peak MiB |' if peak else ''}")
    print(f"|---|---|---|---|---|---|---|{'---|' if peak else ''}")
    for name, rs in results.items():
        med = {k: statistics.median(r[k] for r in rs) for k in rs[0]}
        total = med["params"] + med["grads"] + med["optimizer"]
        mib = 1 << 20
        print(f"| {name} | {med['params'] / mib:.1f} | {med['grads'] / mib:.1f} | "
              f"{med['optimizer'] / mib:.1f} | {total / mib:.1f} | {total / base:.3f} | "
              f"{med['step_s']:.2f} |" + (f" {med['peak'] / mib:.0f} |" if peak else ""))


if __name__ == "__main__":
    main()
