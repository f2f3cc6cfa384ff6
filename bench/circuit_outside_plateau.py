"""Why ``circuit_strict_outside`` fails with its lever saturated: the circuit alone can learn the
task, but not once the whole model has learned it another way.

``headwise/examples/suite/circuit_strict_outside.yaml`` asks that reverse be done by L1.H1
reading the embeddings: everything outside that circuit mean-ablated may cost at most 0.05
accuracy. Its lever ablates the outside stochastically (``StochasticPathAblation``, the
probability ``multiplier x ablation_scale``, capped at ``p_max`` = 0.5). This script trains the
spec's model on reverse with that lever at a fixed probability ``P`` switched on at step
``START`` (0: from the first step) and a constant learning rate, and prints the whole model's
accuracy, the circuit's (everything outside mean-ablated, ``faithfulness``) and the empty
circuit's on the spec's enforcement set every ``--every`` steps.

    OMP_NUM_THREADS=1 .venv/bin/python -m bench.circuit_outside_plateau --p 1.0 --start 0
    OMP_NUM_THREADS=1 .venv/bin/python -m bench.circuit_outside_plateau --p 1.0 --start 60
"""

from __future__ import annotations

import argparse
from pathlib import Path

import torch
import torch.nn.functional as F

import headwise as hw
from headwise.analysis.circuit import circuit_edges, faithfulness
from headwise.control.path_levers import StochasticPathAblation
from headwise.data import IGNORE
from headwise.hooks.graph import all_edges
from headwise.pipeline import compile_spec
from headwise.training.evaluate import forward

SPEC = (Path(__file__).resolve().parent.parent / "headwise" / "examples" / "suite"
        / "circuit_strict_outside.yaml")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--p", type=float, default=1.0, help="ablation probability")
    parser.add_argument("--start", type=int, default=0, help="the step the lever starts at")
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--every", type=int, default=50)
    parser.add_argument("--lr", type=float, default=3e-3)
    args = parser.parse_args()
    torch.manual_seed(0)
    spec = hw.load_spec(SPEC)
    compiled = compile_spec(spec)
    model, data = compiled.model, compiled.data
    inside = circuit_edges(model, ["L1.H1"])
    outside = [e for e in all_edges(model) if e not in inside]

    def pool(n: int, seed: int) -> hw.Batch:
        return data.sample_task("reverse", n, torch.Generator().manual_seed(seed))

    lever = StochasticPathAblation(model, outside, [0], weight=0.0, name="outside", pool=pool)
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr)
    gen = torch.Generator().manual_seed(spec.train.seed)
    print(f"p={args.p} from step {args.start}, lr {args.lr} constant")
    print("| step | loss | model accuracy | circuit alone | empty circuit |")
    print("|---:|---:|---:|---:|---:|")
    for step in range(1, args.steps + 1):
        model.train()
        lever.weight = args.p if step > args.start else 0.0
        batch = data.sample(spec.train.batch_size, gen)
        logits, _ = forward(model, model, batch, [lever], False, torch.device("cpu"), step=step)
        loss = F.cross_entropy(logits.transpose(1, 2), batch.targets, ignore_index=IGNORE)
        opt.zero_grad()
        loss.backward()
        opt.step()
        if step % args.every == 0:
            model.eval()
            f = faithfulness(model, compiled.eval_batch, ["L1.H1"], metric="accuracy")
            print(f"| {step} | {loss.item():.3f} | {f.full:.3f} | {f.circuit:.3f} | "
                  f"{f.empty:.3f} |")


if __name__ == "__main__":
    main()
