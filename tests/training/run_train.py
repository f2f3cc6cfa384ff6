"""A small training run for subprocess tests: resume after a kill, torchrun (DDP, FSDP), levers.

Usage: python run_train.py OUT_DIR [--parallel none|ddp|fsdp] [--resume] [--sleep S]
       [--steps N] [--batch B] [--dropout P] [--bias all|none] [--tied] [--bf16]
       [--levers freeze,lora,gates,masks] [--log-every K] [--eval-every K]
       [--checkpoint-every K] [--warmup K]

Run it directly (one process) or under ``torchrun`` (ddp, fsdp). Exit code 130 when interrupted
by SIGINT/SIGTERM (after the loop saved a checkpoint); on success it also writes the finished
model's logits on one input (``logits.safetensors``).

The model has every dimension distinct (2 layers, 3 heads of 5 dims, d_model 15, 24-dim FFN) so
a row or column mix-up in sharding cannot pass by accident. The run exercises every piece of
state a resume must restore: dropout (torch RNG), a data mixture (data generator), AdamW
moments, warm-up + cosine, a pattern objective whose weight a callback changes at each
evaluation, and callback state in ``state.extra``.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch
from safetensors.torch import save_file

from headwise.config import ModelConfig
from headwise.control import LearnedGates, PatternObjective, apply_lora, apply_masks, freeze
from headwise.control.masks import previous_token
from headwise.data import CopyTask, Mixture, ReverseTask
from headwise.model import build_model
from headwise.training import TrainConfig, TrainState, train
from headwise.training.interrupt import Interrupted


def bump(state: TrainState) -> None:
    """A callback whose decisions (weights, state) rank 0 makes for every rank."""
    for obj in state.objectives:
        obj.weight = obj.weight * 1.5
    state.extra["evals"] = state.extra.get("evals", 0) + 1


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("out", type=Path)
    ap.add_argument("--parallel", default=None)
    ap.add_argument("--resume", action="store_true")
    ap.add_argument("--sleep", type=float, default=0.0)
    ap.add_argument("--steps", type=int, default=12)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--dropout", type=float, default=0.0)
    ap.add_argument("--bias", default="none")
    ap.add_argument("--tied", action="store_true")
    ap.add_argument("--bf16", action="store_true")
    ap.add_argument("--levers", default="")
    ap.add_argument("--log-every", type=int, default=1)
    ap.add_argument("--eval-every", type=int, default=4)
    ap.add_argument("--checkpoint-every", type=int, default=4)
    ap.add_argument("--warmup", type=int, default=3)
    args = ap.parse_args()
    levers = set(filter(None, args.levers.split(",")))
    torch.set_num_threads(1)
    cfg = ModelConfig(n_layers=2, n_heads=3, d_head=5, d_model=15, d_ff=24, vocab_size=20,
                      max_seq_len=12, dropout=args.dropout, tie_embeddings=args.tied,
                      bias=args.bias)
    model = build_model(cfg, seed=0)
    data = Mixture({"copy": CopyTask(length=4, vocab_size=20),
                    "reverse": ReverseTask(length=4, vocab_size=20)}, {"copy": 2, "reverse": 1})
    torch.manual_seed(0)  # LoRA's A
    objectives: list[object] = [PatternObjective(model, "L0.H1", "previous_token", weight=0.1)]
    hooks = []
    if "masks" in levers:
        apply_masks(model, {"L1.H2": previous_token()})
    if "lora" in levers:
        apply_lora(model, targets=("q_proj", "v_proj"), heads="L1.H0", rank=2)
    if "gates" in levers:
        gates = LearnedGates(model, n_tasks=2, layers=[1])
        objectives.append(gates.l0_penalty(0.01))
    if "freeze" in levers:
        hooks.append(freeze(model, ["L0.H1", "L1.H2", "blocks.*.mlp", "*.lora_*"]).attach)
    config = TrainConfig(steps=args.steps, batch_size=args.batch, lr=3e-3,
                         warmup_steps=args.warmup, eval_every=args.eval_every, eval_batches=2,
                         checkpoint_every=args.checkpoint_every, log_every=args.log_every,
                         parallel=args.parallel, bf16=args.bf16)

    def slow(opt: torch.optim.Optimizer) -> None:
        if args.sleep:
            opt.register_step_post_hook(lambda *a: time.sleep(args.sleep))

    try:
        train(model, data, config, out_dir=args.out, objectives=objectives, callbacks=[bump],
              optimizer_hooks=[*hooks, slow], resume=args.resume, progress=False)
    except Interrupted:
        sys.exit(130)
    # after training the model is whole again and runs without a process group
    tokens = torch.arange(12).remainder(20)[None]
    logits = model(tokens, task_ids=torch.zeros(1, dtype=torch.long)).detach()
    save_file({"logits": logits.contiguous()}, args.out / "logits.safetensors")


if __name__ == "__main__":
    main()
