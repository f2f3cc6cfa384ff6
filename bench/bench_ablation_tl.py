"""Every head's zero-ablation effect on two tasks: headwise's batched ablation against the
loop a TransformerLens user writes (one ``run_with_hooks`` per head), on the same GPT-2-small
weights.

The model: ``transformers.GPT2Config()`` (12 layers x 12 heads, d_model 768, vocabulary
50,257), random weights (seeded), saved once as a HuggingFace checkpoint in
``bench/.cache/gpt2_random``; headwise loads it with ``load_hf``, TransformerLens 3.9 with
``convert_gpt2_weights`` into a ``HookedTransformer`` (no weight processing). Two tasks on
random tokens (B sequences of T tokens): ``induction`` (a random half repeated; the loss on
the second half's next tokens) and ``last`` (the next token at the last position only). Each
head's effect is the loss increase when its ``hook_z`` is zeroed.

Each system runs in its own process with one thread (TransformerLens from its venv, see
bench/README.md), alternating for ``--rounds`` rounds; a round times the whole loop (every
head, both tasks, the clean runs included) after one untimed warm-up pass of two forwards.
The TransformerLens worker's effects are compared with headwise's (max |difference|).

    OMP_NUM_THREADS=1 .venv/bin/python bench/bench_ablation_tl.py \\
        --tl-python bench/.cache/tlvenv3/bin/python [--rounds 3] [--batch 4] [--seq 32]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CKPT = ROOT / "bench" / ".cache" / "gpt2_random"


def make_checkpoint() -> None:
    """GPT2Config() with seeded random weights, saved once."""
    if (CKPT / "config.json").is_file():
        return
    import torch
    import transformers

    torch.manual_seed(0)
    model = transformers.GPT2LMHeadModel(transformers.GPT2Config()).eval()
    model.save_pretrained(CKPT, safe_serialization=True)


def batches(batch: int, seq: int):
    """The two tasks' tokens and targets (-100 where not scored), the same in both workers."""
    import torch

    g = torch.Generator().manual_seed(1)
    half = seq // 2
    first = torch.randint(0, 50257, (batch, half), generator=g)
    ind = torch.cat([first, first], 1)
    ind_t = torch.full_like(ind, -100)
    ind_t[:, half:-1] = ind[:, half + 1:]
    last = torch.randint(0, 50257, (batch, seq), generator=g)
    last_t = torch.full_like(last, -100)
    last_t[:, -1] = torch.randint(0, 50257, (batch,), generator=g)
    return {"induction": (ind, ind_t), "last": (last, last_t)}


def worker_headwise(batch: int, seq: int) -> dict[str, object]:
    import torch

    from headwise.analysis.importance import ablation_importance
    from headwise.interop import load_hf

    torch.set_num_threads(1)
    model = load_hf(CKPT).eval()

    class B:
        def __init__(self, tokens: torch.Tensor, targets: torch.Tensor) -> None:
            self.tokens, self.targets = tokens, targets
            self.attention_mask = self.task_ids = None

    tasks = {k: B(*v) for k, v in batches(batch, seq).items()}
    with torch.no_grad():
        model(tasks["last"].tokens)  # warm-up
        model(tasks["induction"].tokens)
    t0, c0 = time.perf_counter(), time.process_time()
    imp = ablation_importance(model, tasks, n_boot=0)
    wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    drops = imp.matrix("loss").T.flatten().tolist()  # task-major, then layer, head
    return {"wall": wall, "cpu": cpu, "drops": drops}


def worker_tl(batch: int, seq: int) -> dict[str, object]:
    import torch
    import torch.nn.functional as F
    import transformers
    from transformer_lens import HookedTransformer, HookedTransformerConfig
    from transformer_lens.pretrained.weight_conversions import convert_gpt2_weights

    torch.set_num_threads(1)
    hf = transformers.GPT2LMHeadModel.from_pretrained(CKPT).eval()
    cfg = HookedTransformerConfig(n_layers=12, d_model=768, n_ctx=1024, d_head=64, n_heads=12,
                                  d_mlp=3072, d_vocab=50257, act_fn="gelu_new",
                                  normalization_type="LN", default_prepend_bos=False)
    model = HookedTransformer(cfg)
    model.load_and_process_state_dict(convert_gpt2_weights(hf, cfg), fold_ln=False,
                                      center_writing_weights=False, center_unembed=False,
                                      fold_value_biases=False,
                                      refactor_factored_attn_matrices=False)
    model.eval()
    tasks = batches(batch, seq)

    def loss(logits: torch.Tensor, targets: torch.Tensor) -> float:
        valid = targets != -100
        return float(F.cross_entropy(logits[valid].float(), targets[valid]))

    with torch.no_grad():
        model(tasks["last"][0])  # warm-up
        model(tasks["induction"][0])
        t0, c0 = time.perf_counter(), time.process_time()
        drops = []
        for tokens, targets in tasks.values():
            clean = loss(model(tokens), targets)
            for layer in range(12):
                for head in range(12):
                    def zero(z: torch.Tensor, hook: object, head: int = head) -> torch.Tensor:
                        z[:, :, head] = 0.0
                        return z
                    logits = model.run_with_hooks(
                        tokens, fwd_hooks=[(f"blocks.{layer}.attn.hook_z", zero)])
                    drops.append(loss(logits, targets) - clean)
        wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    return {"wall": wall, "cpu": cpu, "drops": drops}


def spawn(python: str, system: str, args: argparse.Namespace) -> dict[str, object]:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
    out = subprocess.run([python, __file__, "--worker", system, "--batch", str(args.batch),
                          "--seq", str(args.seq)], env=env, capture_output=True, text=True)
    if out.returncode:
        raise SystemExit(f"{system} worker failed:\n{out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tl-python", default=str(ROOT / "bench/.cache/tlvenv3/bin/python"))
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--seq", type=int, default=32)
    ap.add_argument("--worker", choices=["headwise", "tl"])
    args = ap.parse_args()
    if args.worker:
        fn = worker_headwise if args.worker == "headwise" else worker_tl
        print(json.dumps(fn(args.batch, args.seq)))
        return
    make_checkpoint()
    hw_wall: list[float] = []
    hw_cpu: list[float] = []
    tl_wall: list[float] = []
    tl_cpu: list[float] = []
    diffs: list[float] = []
    n_effects = 0
    for r in range(args.rounds):
        hw = spawn(sys.executable, "headwise", args)
        tl = spawn(args.tl_python, "tl", args)
        drops = list(zip(hw["drops"], tl["drops"], strict=True))  # type: ignore[call-overload]
        n_effects = len(drops)
        diff = max(abs(a - b) for a, b in drops)
        hw_wall.append(float(hw["wall"])), hw_cpu.append(float(hw["cpu"]))  # type: ignore[arg-type]
        tl_wall.append(float(tl["wall"])), tl_cpu.append(float(tl["cpu"]))  # type: ignore[arg-type]
        diffs.append(diff)
        print(f"round {r}: headwise wall {hw['wall']:.1f} s cpu {hw['cpu']:.1f} s | "
              f"TransformerLens wall {tl['wall']:.1f} s cpu {tl['cpu']:.1f} s | "
              f"max |effect difference| {diff:.2e}", flush=True)
    print(f"\n{n_effects} effects (2 tasks x 144 heads), B={args.batch}, T={args.seq}, "
          f"{args.rounds} rounds, one thread, rusage children: "
          f"{resource.getrusage(resource.RUSAGE_CHILDREN).ru_utime:.0f} s user")
    for name, a, b in (("wall", hw_wall, tl_wall), ("cpu", hw_cpu, tl_cpu)):
        ratio = statistics.median(y / x for x, y in zip(a, b, strict=True))
        print(f"{name}: headwise {statistics.median(a):.1f} s, TransformerLens "
              f"{statistics.median(b):.1f} s, TransformerLens / headwise {ratio:.2f}x "
              f"(ratio of medians {statistics.median(b) / statistics.median(a):.2f}x)")
    print(f"max |effect difference| over rounds: {max(diffs):.2e}")


if __name__ == "__main__":
    main()
