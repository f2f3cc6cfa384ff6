"""What the retrieval circuit assist does to the residual stream of a model with MLPs.

Trains the 2-layer, 4-head ``kv_retrieval`` model of the contract suite (d_model 64, vocabulary
36, batch 64, lr 3e-3, 300 steps, seed 1: a seed that stays at ~0.33 plain) plain or with the
circuit assist (pattern objectives, ``ce``, weight 1: previous-token on L0.H0, induction on
L1.H0), with or without MLPs, then reads, at the four value positions of 4096 fresh examples,
the mean norm of the embedding, of layer 0's attention output and of its MLP output, and how
well a least-squares linear probe (fit on half, scored on the other half) reads the preceding
key from each (chance 1/16).

    OMP_NUM_THREADS=1 PYTHONPATH=$PWD .venv/bin/python bench/kv_residual.py --arm assist
    # --arm plain | assist, --attn-only, --freeze-mlp0 (layer 0's MLP kept at its initial weights)
"""

from __future__ import annotations

import argparse

import torch
import torch.nn.functional as F

from headwise import ModelConfig, build_model
from headwise.control import PatternObjective
from headwise.data import KVRetrievalTask, Mixture
from headwise.training import TrainConfig, train

VALUE_POSITIONS = (2, 4, 6, 8)  # [BOS, k1, v1, ..., k4, v4, QUERY, k]


def probe_accuracy(x: torch.Tensor, labels: torch.Tensor, n_classes: int) -> float:
    """Held-out accuracy of a least-squares one-hot probe (with a bias) fit on the first half."""
    n = x.shape[0] // 2
    features = torch.cat([x, torch.ones(x.shape[0], 1)], 1)
    weights = torch.linalg.lstsq(features[:n], F.one_hot(labels[:n], n_classes).float()).solution
    return float(((features[n:] @ weights).argmax(-1) == labels[n:]).float().mean())


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--arm", choices=("plain", "assist"), default="assist")
    p.add_argument("--attn-only", action="store_true")
    p.add_argument("--freeze-mlp0", action="store_true")
    args = p.parse_args()
    torch.set_num_threads(1)
    task = KVRetrievalTask(vocab_size=36)
    cfg = ModelConfig(n_layers=2, n_heads=4, d_model=64, vocab_size=36, max_seq_len=11,
                      attn_only=args.attn_only)
    model = build_model(cfg, seed=1)
    if args.freeze_mlp0:
        for param in model.blocks[0].mlp.parameters():  # type: ignore[index,union-attr]
            param.requires_grad_(False)
    objectives = []
    if args.arm == "assist":
        for i, (head, role) in enumerate((("L0.H0", "previous_token"), ("L1.H0", "induction"))):
            obj = PatternObjective(model, head, role, kind="ce", weight=1.0)
            obj.name = f"assist{i}:{role}[{head}]"
            objectives.append(obj)
    config = TrainConfig(steps=300, batch_size=64, lr=3e-3, eval_every=100, eval_batches=1,
                         seed=1, device="cpu")
    train(model, Mixture({task.name: task}), config, objectives=objectives, progress=False)
    model.eval()
    batch = task.sample(4096, torch.Generator().manual_seed(99))
    names = ["hook_embed", "blocks.0.hook_attn_out"]
    names += [] if args.attn_only else ["blocks.0.hook_mlp_out"]
    with torch.no_grad():
        logits, cache = model.run_with_cache(batch.tokens, names=names)
    accuracy = float((logits[:, -1].argmax(-1) == batch.targets[:, -1]).float().mean())
    keys = torch.cat([batch.tokens[:, p - 1] for p in VALUE_POSITIONS])
    print(f"{args.arm}, {'attention-only' if args.attn_only else 'with MLPs'}"
          f"{', layer-0 MLP frozen' if args.freeze_mlp0 else ''}: "
          f"accuracy {accuracy:.3f}")
    for name in names:
        x = torch.cat([cache[name][:, p] for p in VALUE_POSITIONS])  # (4B, D)
        print(f"  {name:24s} norm {x.norm(dim=-1).mean():7.3f}   preceding key read by a "
              f"linear probe {probe_accuracy(x, keys, cfg.vocab_size):.3f}")


if __name__ == "__main__":
    main()
