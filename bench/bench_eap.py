"""Edge attribution's cost and its agreement with exact path patching.

Default: the cost of EAP (and EAP-IG) over every edge of a GPT-2-small-shaped model (12 layers
x 12 heads, d_model 768, vocabulary 50257; random weights from transformers' ``GPT2Config()``,
saved once to ``bench/.cache/gpt2_small_random`` and loaded with headwise's converter, nothing
downloaded) in units of one forward+backward pass of the same model on the same batch
(cross-entropy, parameter gradients): every system interleaved once per repetition, one
thread, medians of ``--reps`` after ``--warmup``, ratios the median of per-repetition ratios.

``--agreement SPEC``: train SPEC once (cached in ``bench/.cache/eap_runs/``), then on its first
task's verification examples compare EAP and EAP-IG with exact path patching of every edge
(mean ablation, loss): Spearman rank correlation, top-k overlap, wall time of each; and
``discover_circuit`` at faithfulness 0.9 (accuracy).

    OMP_NUM_THREADS=1 python -m bench.bench_eap --batch 8 --seq 32 --reps 5
    OMP_NUM_THREADS=1 python -m bench.bench_eap \
        --agreement headwise/examples/suite/induction_circuit.yaml
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable
from pathlib import Path

import torch
import torch.nn.functional as F

import headwise as hw
from bench.lab.timing import interleaved, paired
from headwise.analysis import PathPatcher, agreement, all_edges, edge_attribution, exact_effects

CACHE = Path(__file__).resolve().parent / ".cache"


def gpt2_small() -> torch.nn.Module:
    """GPT-2 small's shape with random weights, converted by headwise from a saved HF model."""
    path = CACHE / "gpt2_small_random"
    if not (path / "config.json").is_file():
        from transformers import GPT2Config, GPT2LMHeadModel

        torch.manual_seed(0)
        GPT2LMHeadModel(GPT2Config()).save_pretrained(path)
    return hw.load_hf(path).eval()


def speed(args: argparse.Namespace) -> None:
    model = gpt2_small()
    V = model.config.vocab_size
    gen = torch.Generator().manual_seed(0)
    tokens = torch.randint(0, V, (args.batch, args.seq), generator=gen)
    batch = hw.Batch(tokens, torch.randint(0, V, tokens.shape, generator=gen), None,
                     torch.zeros(args.batch, dtype=torch.long))
    corrupted = torch.randint(0, V, tokens.shape, generator=gen)

    def fwd_bwd() -> None:
        model.zero_grad(set_to_none=True)
        logits = model(tokens)
        F.cross_entropy(logits.flatten(0, 1), batch.targets.flatten()).backward()

    steps: dict[str, Callable[[], object]] = {
        "fwd+bwd": fwd_bwd,
        "eap (mean)": lambda: edge_attribution(model, batch),
        "eap (corrupted)": lambda: edge_attribution(model, batch, source=corrupted)}
    if args.ig:
        steps[f"eap-ig {args.ig} (mean)"] = lambda: edge_attribution(
            model, batch, method="eap-ig", steps=args.ig)
    times = interleaved(steps, args.reps, args.warmup, clock=args.clock)
    print(f"GPT-2 small shape (12 x 12 heads, D 768, V {V}), B={args.batch}, T={args.seq}, "
          f"{len(all_edges(model))} edges, {torch.get_num_threads()} thread(s), "
          f"reps {args.reps}, warmup {args.warmup}, {args.clock} clock")
    for name, ts in times.items():
        ratio = "" if name == "fwd+bwd" else (
            f"  {paired(times, name, 'fwd+bwd'):.2f}x fwd+bwd "
            f"[{statistics.median(ts) / statistics.median(times['fwd+bwd']):.2f}]")
        print(f"  {name:<22} median {statistics.median(ts):7.3f} s{ratio}")


def agreement_on(args: argparse.Namespace) -> None:
    from headwise.cli import main
    from headwise.pipeline.finished import load_compiled
    from headwise.pipeline.heldout import verification_data

    spec = Path(args.agreement)
    run = CACHE / "eap_runs" / spec.stem
    if not (run / "model.safetensors").is_file():
        t0 = time.perf_counter()
        assert main(["train", str(spec), "--out", str(run), "--quiet", "--threads", "1"]) in (0, 1)
        print(f"trained {spec} in {time.perf_counter() - t0:.0f} s")
    compiled = load_compiled(run)
    task, batch = next(iter(verification_data(compiled).tasks.items()))
    model = compiled.model
    edges = all_edges(model)
    t0 = time.perf_counter()
    exact = exact_effects(PathPatcher(model, batch), edges, "loss")
    t_exact = time.perf_counter() - t0
    print(f"{spec.name}: task {task}, {batch.tokens.shape[0]} verification examples, "
          f"{len(edges)} edges; exact path patching of every edge: {t_exact:.2f} s")
    for method, steps in (("eap", 1), ("eap-ig", args.ig or 5)):
        t0 = time.perf_counter()
        scores = edge_attribution(model, batch, method=method, steps=steps)
        took = time.perf_counter() - t0
        parts = [f"{method}{'' if method == 'eap' else f' ({steps} steps)'}: {took:.2f} s "
                 f"({t_exact / took:.0f}x faster)"]
        for k in (5, 10, 20):
            a = agreement(scores, exact, k)
            parts.append(f"top-{k} {a.top_k:.2f}")
        parts.insert(1, f"Spearman {agreement(scores, exact, 5).spearman:.3f}")
        print("  " + ", ".join(parts))
    found = hw.discover_circuit(model, batch)
    f = found.faithfulness
    print(f"  circuit (eap, accuracy, faithfulness >= 0.9): {len(found.edges)} edges, kept "
          f"{f.kept:.3f} (model {f.full:.3f}, circuit {f.circuit:.3f}, none {f.empty:.3f}), "
          f"{found.evaluations} ablated runs")
    for e in found.edges:
        print(f"    {e}  drop {found.drops[e]:+.3f}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--seq", type=int, default=32)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--warmup", type=int, default=1)
    ap.add_argument("--clock", choices=("wall", "cpu"), default="wall",
                    help="time wall-clock seconds (default) or this process's CPU seconds")
    ap.add_argument("--ig", type=int, default=0, help="also time EAP-IG with this many steps")
    ap.add_argument("--agreement", metavar="SPEC", help="agreement with exact path patching on "
                                                        "a run trained from SPEC")
    args = ap.parse_args()
    torch.set_num_threads(1)
    if args.agreement:
        agreement_on(args)
    else:
        speed(args)


if __name__ == "__main__":
    main()
