"""Whether a circuit's outside, ablated on half of the training rows, can be learned away.

Trains ``headwise/examples/suite/circuit_strict_outside.yaml``'s model (plain, no contract
levers) with one lever: every edge outside the circuit ``[L1.H1]`` ablated on each training
example with probability ``p`` (``StochasticPathAblation``), the replacement being zero, the
clean mean over the rows of the batch the draw left clean, or the clean mean over a fixed pool
of 128 training examples (what the contract's levers use). Prints the circuit's faithfulness
on the verification set, measured as the clause measures it (every outside edge ablated the
same way: ``mean`` over the verification batch, or ``zero``).

    python -m bench.circuit_lever_means [--steps 300] [--p 0.5] [--batch 32]
"""

from __future__ import annotations

import argparse
import dataclasses
from pathlib import Path

import torch

from headwise.analysis.circuit import circuit_edges, faithfulness
from headwise.control.path_levers import StochasticPathAblation
from headwise.hooks.graph import all_edges
from headwise.pipeline import compile_spec
from headwise.pipeline.heldout import probe_sampler, verification_data
from headwise.runspec import load_spec
from headwise.training import train

SPEC = Path(__file__).resolve().parents[1] / "headwise/examples/suite/circuit_strict_outside.yaml"


def one(source: str, steps: int, p: float, batch: int) -> dict[str, float]:
    """Train with the outside ablated from ``source`` (zero / batch / pool) and measure."""
    spec = load_spec(SPEC)
    compiled = compile_spec(spec)
    model = compiled.model
    outside = [e for e in all_edges(model) if e not in circuit_edges(model, ["L1.H1"])]
    sample = probe_sampler(spec, compiled.data)
    lever = StochasticPathAblation(
        model, outside, [0], weight=p, name="outside", mode="zero" if source == "zero" else "mean",
        pool=(lambda n, seed: sample("reverse", n, seed)) if source == "pool" else None)
    config = dataclasses.replace(spec.train, steps=steps, eval_every=0, checkpoint_every=0,
                                 batch_size=batch)
    train(model, compiled.data, config, objectives=[lever], progress=False)
    f = faithfulness(model, verification_data(compiled).tasks["reverse"], ["L1.H1"],
                     metric="accuracy", mode="zero" if source == "zero" else "mean")
    return {"full": f.full, "circuit": f.circuit, "empty": f.empty, "outside_drop": f.outside_drop}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--p", type=float, default=0.5)
    ap.add_argument("--batch", type=int, default=32)
    args = ap.parse_args()
    torch.set_num_threads(1)
    print("| source | steps | p | batch | full | circuit | no edge | outside drop |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    for source in ("zero", "batch", "pool"):
        r = one(source, args.steps, args.p, args.batch)
        print(f"| {source} | {args.steps} | {args.p} | {args.batch} | {r['full']:.3f} | "
              f"{r['circuit']:.3f} | {r['empty']:.3f} | {r['outside_drop']:.3f} |")


if __name__ == "__main__":
    main()
