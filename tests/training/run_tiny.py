"""A tiny training run for subprocess tests: resume after SIGKILL, and torchrun (DDP).

Usage: python run_tiny.py OUT_DIR [--resume] [--sleep S] [--steps N] [--batch B] [--dropout P]
       [--bias all|none] [--log-every K]

Exit code 130 when interrupted by SIGINT/SIGTERM (after the loop saved a checkpoint).

The run exercises every piece of state a resume must restore: dropout (torch RNG), a data
mixture (data generator), AdamW moments, warm-up + cosine, a pattern objective whose weight a
callback changes at each evaluation, and callback state in ``state.extra``.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any

import torch

from headwise.config import ModelConfig
from headwise.control.objective import Objective
from headwise.data import CopyTask, Mixture, ModularAdditionTask
from headwise.hooks import Hook
from headwise.model import build_model
from headwise.training import TrainConfig, TrainState, train
from headwise.training.interrupt import Interrupted


class PrevTokenObjective(Objective):
    """Pull head L0.H1 towards attending to the previous token (weighted)."""

    name = "prev_L0H1"

    def __init__(self, weight: float) -> None:
        self.weight = weight
        self._pattern: torch.Tensor | None = None

    def hooks(self) -> list[Hook]:
        def keep(value: torch.Tensor, ctx: Any) -> None:
            self._pattern = value  # (B, 1, T, T)

        return [Hook("blocks.0.attn.hook_pattern", keep, heads=(1,))]

    def loss(self, tokens: torch.Tensor, attention_mask: torch.Tensor | None
             ) -> tuple[torch.Tensor, dict[str, float]]:
        assert self._pattern is not None
        prev = self._pattern[:, 0].diagonal(offset=-1, dim1=-2, dim2=-1).mean()
        return self.weight * (1 - prev), {"L0.H1": float(prev.detach())}


def bump(state: TrainState) -> None:
    for obj in state.objectives:
        obj.weight = obj.weight * 1.5
    state.extra["evals"] = state.extra.get("evals", 0) + 1


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("out", type=Path)
    ap.add_argument("--resume", action="store_true")
    ap.add_argument("--sleep", type=float, default=0.0)
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--dropout", type=float, default=0.1)
    ap.add_argument("--bias", default="all")
    ap.add_argument("--log-every", type=int, default=1)
    args = ap.parse_args()
    torch.set_num_threads(1)
    cfg = ModelConfig(n_layers=2, n_heads=2, d_model=16, d_ff=24, vocab_size=20,
                      max_seq_len=12, dropout=args.dropout, tie_embeddings=True,
                      bias=args.bias)
    model = build_model(cfg, seed=0)
    data = Mixture({"copy": CopyTask(length=4, vocab_size=20),
                    "add": ModularAdditionTask(modulus=7, vocab_size=20)}, {"copy": 2, "add": 1})
    config = TrainConfig(steps=args.steps, batch_size=args.batch, lr=3e-3, warmup_steps=5,
                         eval_every=10, eval_batches=2, checkpoint_every=5,
                         log_every=args.log_every)

    def slow(opt: torch.optim.Optimizer) -> None:
        if args.sleep:
            opt.register_step_post_hook(lambda *a: time.sleep(args.sleep))

    try:
        train(model, data, config, out_dir=args.out, objectives=[PrevTokenObjective(0.1)],
              callbacks=[bump], optimizer_hooks=[slow], resume=args.resume, progress=False)
    except Interrupted:
        sys.exit(130)


if __name__ == "__main__":
    main()
