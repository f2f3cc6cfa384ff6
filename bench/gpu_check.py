"""GPU check: forward / backward / cache ratios and a bf16 training step on CUDA.

Run by ``bench/gpu_check.sh`` on a CUDA machine (prints JSON lines; exits 1 on a failed
check). The ratios are those of ``bench_forward.py`` (same GPT-2-shaped model, same reference
with the same weights), timed with ``torch.cuda.synchronize()`` around each repetition:

- fused forward and forward+backward vs the reference (nanoGPT-style SDPA ``is_causal``);
- one head's pattern cached and all 32 patterns cached vs the no-hook forward;
- a bf16 training step (``train.bf16``) of the same model is finite and its loss is close to
  the float32 step's.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from typing import Any

import torch
import torch.nn.functional as F

from bench.lab.forward_models import SHAPE, build
from bench.lab.timing import paired


def timed(systems: dict[str, Any], reps: int, warmup: int) -> dict[str, list[float]]:
    """Interleaved repetitions, each bracketed by ``torch.cuda.synchronize()``."""
    for _ in range(warmup):
        for fn in systems.values():
            fn()
    torch.cuda.synchronize()
    times: dict[str, list[float]] = {k: [] for k in systems}
    for _ in range(reps):
        for name, fn in systems.items():
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            fn()
            torch.cuda.synchronize()
            times[name].append(time.perf_counter() - t0)
    return times


def ratios(T: int, B: int, reps: int, warmup: int) -> dict[str, Any]:
    ours, ref = build()
    ours, ref = ours.cuda(), ref.cuda()
    g = torch.Generator().manual_seed(1)
    tokens = torch.randint(0, SHAPE["vocab_size"], (B, T), generator=g).cuda()
    targets = torch.randint(0, SHAPE["vocab_size"], (B, T), generator=g).cuda()
    with torch.no_grad():
        diff = (ours(tokens) - ref(tokens)).abs().max().item()
    patterns = [f"blocks.{l}.attn.hook_pattern" for l in range(SHAPE["n_layers"])]

    def fwd(m: torch.nn.Module) -> Any:
        def run() -> None:
            with torch.no_grad():
                m(tokens)
        return run

    def fwd_bwd(m: torch.nn.Module) -> Any:
        def run() -> None:
            m.zero_grad(set_to_none=True)
            F.cross_entropy(m(tokens).flatten(0, 1), targets.flatten()).backward()
        return run

    def cached(names: list[str], heads: str | None) -> Any:
        def run() -> None:
            with torch.no_grad():
                ours.run_with_cache(tokens, names, heads=heads)
        return run

    t = timed({"ref_fwd": fwd(ref), "ours_fwd": fwd(ours),
               "one_head": cached(patterns[:1], "L0.H0"), "all": cached(patterns, None),
               "ref_fwd_bwd": fwd_bwd(ref), "ours_fwd_bwd": fwd_bwd(ours)}, reps, warmup)
    out = {k: statistics.median(v) for k, v in t.items()}
    out.update({"T": T, "B": B, "max_abs_diff": diff,
                "fwd_vs_ref": paired(t, "ref_fwd", "ours_fwd"),
                "fwd_bwd_vs_ref": paired(t, "ref_fwd_bwd", "ours_fwd_bwd"),
                "one_head_vs_nohook": paired(t, "ours_fwd", "one_head"),
                "all_vs_nohook": paired(t, "ours_fwd", "all")})
    return out


def bf16_step() -> dict[str, Any]:
    """Two runs of 5 ``train()`` steps on the demo spec, float32 and bf16, on CUDA."""
    import dataclasses
    import importlib.resources

    from headwise.pipeline import compile_spec
    from headwise.runspec import load_spec
    from headwise.training import train

    path = importlib.resources.files("headwise") / "examples" / "demo.yaml"
    losses = {}
    for bf16 in (False, True):
        c = compile_spec(load_spec(str(path)))
        cfg = dataclasses.replace(c.spec.train, steps=5, eval_every=0, checkpoint_every=0,
                                  log_every=5, device="cuda", bf16=bf16)
        r = train(c.model, c.data, cfg, objectives=c.objectives,
                  optimizer_hooks=c.optimizer_hooks, progress=False)
        losses["bf16" if bf16 else "float32"] = r.metrics["loss"]
    ok = all(torch.isfinite(torch.tensor(v)) for v in losses.values()) and abs(
        losses["bf16"] - losses["float32"]) < 0.05 * abs(losses["float32"]) + 0.05
    return {"check": "bf16_train_step", **losses, "ok": bool(ok)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=5)
    args = ap.parse_args()
    if not torch.cuda.is_available():
        sys.exit("gpu_check: CUDA is not available")
    print(json.dumps({"device": torch.cuda.get_device_name(), "torch": torch.__version__}))
    failed = False
    for T, B in ((256, 8), (1024, 8)):
        r = ratios(T, B, args.reps, args.warmup)
        r["ok"] = r["max_abs_diff"] < 1e-2  # TF32 matmuls may be on: a loose parity bound
        failed |= not r["ok"]
        print(json.dumps(r), flush=True)
    step = bf16_step()
    failed |= not step["ok"]
    print(json.dumps(step), flush=True)
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
