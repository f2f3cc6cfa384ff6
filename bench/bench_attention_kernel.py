"""Which attention path is cheaper for short sequences on CPU: the evidence for
``headwise.model.attention.EXPLICIT_MAX_KEYS``.

For each sequence length T it times one ``Attention`` module (forward, and forward + backward),
the fused path against every head on the explicit path, in three situations:

- ``hooked``: a read-only capture of head 1's pattern (what a pattern objective attaches):
  the fused kernel on every head with that pattern computed beside it, vs every head
  explicit. This is the choice the module makes by length (``EXPLICIT_MAX_KEYS``).
- ``mask``: a per-head mask on head 0 (the demo's previous-token mask), no hook: the masked
  fused kernel vs every head explicit (forced here). The module keeps the fused kernel: which
  is cheaper depends on the model's shape (see docs/benchmarks.md).
- ``plain``: no mask, no hook (causal only): the ``is_causal`` fused kernel vs every head
  explicit (forced here, for reference).

With ``--softmax`` it times the softmax alone instead, forward + backward on a (B, 1, T, T)
score tensor (the demo's B=64): ``torch.softmax`` vs ``softmax_keys`` (rows shorter than 16
keys padded with ``-inf`` to 16), the evidence for ``softmax_keys``.

With ``--captures`` it times what read-only captures of patterns cost at longer lengths, one
GPT-2-shaped ``Attention`` module (H=8, d_model 256; T=64 B=32, T=256 B=8, T=1024 B=2), no-grad
forward: no hook; one head captured (the fused call with that head's pattern beside it); every
head captured (the module's one explicit pass, output used: in causal query blocks from
T = 128, ``kernels.causal_blocked``); the same with the pass over all T x T scores forced;
and, for comparison, every head's pattern beside a fused call over every head (the alternative
the module does not take, built from its own ``_fused`` and ``_pattern``).

Each (situation, path) pair runs ``--reps`` rounds of ``--iters`` calls, the paths alternating
within a round; figures are medians over rounds, one torch thread, float32.

    OMP_NUM_THREADS=1 .venv/bin/python bench/bench_attention_kernel.py [--shape demo|gpt2]
    OMP_NUM_THREADS=1 .venv/bin/python bench/bench_attention_kernel.py --softmax
    OMP_NUM_THREADS=1 .venv/bin/python bench/bench_attention_kernel.py --captures
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from collections.abc import Callable

import torch

import headwise.model.attention as attention_module
from headwise import ModelConfig, build_model
from headwise.control import apply_masks, previous_token
from headwise.model.hook_point import Hook
from headwise.model.kernels import softmax_keys

SHAPES = {"demo": {"n_heads": 4, "d_model": 64, "batch": 64},
          "gpt2": {"n_heads": 8, "d_model": 256, "batch": 8}}
FORCE_EXPLICIT = 10**9


def _model(shape: str, T: int, situation: str) -> torch.nn.Module:
    s = SHAPES[shape]
    cfg = ModelConfig(n_layers=1, d_model=s["d_model"], n_heads=s["n_heads"],
                      d_ff=4 * s["d_model"], vocab_size=32, max_seq_len=max(T, 8))
    model = build_model(cfg, seed=0)
    if situation == "mask":
        apply_masks(model, {"L0.H0": previous_token()})
    return model


def _time(fn: Callable[[], None], iters: int) -> float:
    t0 = time.perf_counter()
    for _ in range(iters):
        fn()
    return (time.perf_counter() - t0) / iters


def measure(shape: str, T: int, situation: str, reps: int, iters: int
            ) -> dict[str, tuple[float, float]]:
    """``{path: (forward s, forward+backward s)}`` for one length and situation."""
    model = _model(shape, T, situation)
    attn = model.blocks[0].attn  # type: ignore[index]
    x = torch.randn(SHAPES[shape]["batch"], T, SHAPES[shape]["d_model"], requires_grad=True)
    grad = torch.randn_like(x)
    hooks = []
    if situation == "hooked":
        hooks = [Hook("blocks.0.attn.hook_pattern", lambda v, ctx: None, (1,), read_only=True)]
    paths = {"fused": 0, "explicit": FORCE_EXPLICIT}
    if situation != "hooked":  # the module's own choice there is fused: force the explicit one
        paths = {"fused": 0, "explicit (forced)": FORCE_EXPLICIT}
    out: dict[str, list[tuple[float, float]]] = {p: [] for p in paths}
    saved = attention_module.EXPLICIT_MAX_KEYS
    try:
        with model.hooks(*hooks):  # type: ignore[operator]
            for r in range(reps):
                for name in (list(paths) if r % 2 == 0 else list(paths)[::-1]):
                    limit = paths[name]
                    attention_module.EXPLICIT_MAX_KEYS = limit
                    if name.startswith("explicit (forced)"):
                        attn.hook_pattern.attach(forced := Hook("", lambda v, ctx: None))
                    with torch.no_grad():
                        fwd = _time(lambda: attn(x), iters)
                    both = _time(lambda: attn(x).backward(grad), iters)
                    if name.startswith("explicit (forced)"):
                        attn.hook_pattern.detach(forced)
                    out[name].append((fwd, both))
    finally:
        attention_module.EXPLICIT_MAX_KEYS = saved
    return {p: (statistics.median(a for a, _ in v), statistics.median(b for _, b in v))
            for p, v in out.items()}


def measure_softmax(T: int, reps: int, iters: int) -> dict[str, float]:
    """``{"torch.softmax": s, "softmax_keys": s}``: forward + backward of one (64, 1, T, T)
    causal-masked score tensor, medians over rounds (the two alternating)."""
    g = torch.Generator().manual_seed(T)
    scores = torch.randn(64, 1, T, T, generator=g).masked_fill(
        ~torch.ones(T, T, dtype=torch.bool).tril(), float("-inf"))
    grad = torch.randn(64, 1, T, T, generator=g)
    fns = {"torch.softmax": lambda x: torch.softmax(x, -1), "softmax_keys": softmax_keys}
    out: dict[str, list[float]] = {k: [] for k in fns}

    def step(fn: Callable[[torch.Tensor], torch.Tensor]) -> None:
        fn(scores.detach().requires_grad_()).backward(grad)

    for r in range(reps):
        for name in (list(fns) if r % 2 == 0 else list(fns)[::-1]):
            out[name].append(_time(lambda name=name: step(fns[name]), iters))
    return {k: statistics.median(v) for k, v in out.items()}


CAPTURE_SHAPES = ((64, 32), (256, 8), (1024, 2))  # (T, B)


def measure_captures(T: int, B: int, reps: int, iters: int,
                     clock: str = "wall") -> dict[str, float]:
    """No-grad forward seconds of one GPT-2-shaped Attention per capture path (see module
    docstring), medians over rounds; each round runs every path once, in rotating order."""
    model = _model("gpt2", T, "plain")
    attn = model.blocks[0].attn  # type: ignore[index]
    H, Dh = attn.n_heads, attn.d_head
    x = torch.randn(B, T, SHAPES["gpt2"]["d_model"], generator=torch.Generator().manual_seed(T))
    every = tuple(range(H))

    def capture(heads: tuple[int, ...] | None) -> Callable[[], None]:
        hook = Hook("", lambda v, ctx: None, heads, read_only=True)

        def run() -> None:
            attn.hook_pattern.attach(hook)
            try:
                attn(x)
            finally:
                attn.hook_pattern.detach(hook)
        return run

    plan = attn._layer_plan(T, None, None, x.device)

    def beside_every_head() -> None:
        q, k, v = (p(x).view(B, T, H, Dh).transpose(1, 2)
                   for p in (attn.q_proj, attn.k_proj, attn.v_proj))
        z = attn._fused(q, k, v, plan, 1)
        attn._pattern(q, k, plan, every)
        attn.o_proj(z.transpose(1, 2).reshape(B, T, H * Dh))

    def full_pass() -> None:  # every head captured, the pass over all T x T scores forced
        attn._blocked_capture = lambda q, plan: False  # type: ignore[method-assign]
        try:
            capture(None)()
        finally:
            del attn._blocked_capture

    now = {"wall": time.perf_counter, "cpu": time.process_time}[clock]
    paths: dict[str, Callable[[], None]] = {
        "no hook": lambda: attn(x), "one head": capture((1,)), "every head": capture(None),
        "every head, full pass": full_pass, "every head beside fused": beside_every_head}
    out: dict[str, list[float]] = {k: [] for k in paths}
    with torch.no_grad():
        for r in range(reps + 1):
            names = list(paths)
            for name in names[r % len(names):] + names[:r % len(names)]:
                t0 = now()
                for _ in range(iters):
                    paths[name]()
                t = (now() - t0) / iters
                if r:  # the first round warms up
                    out[name].append(t)
    return {k: statistics.median(v) for k, v in out.items()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shape", choices=sorted(SHAPES), default="demo")
    ap.add_argument("--lengths", default="8,14,16,20,24,28,32,48,64")
    ap.add_argument("--reps", type=int, default=7)
    ap.add_argument("--iters", type=int, default=30)
    ap.add_argument("--softmax", action="store_true",
                    help="time torch.softmax vs softmax_keys alone (lengths 8-20)")
    ap.add_argument("--captures", action="store_true",
                    help="time the capture paths at T=64/256/1024 (GPT-2 shape)")
    ap.add_argument("--clock", choices=("wall", "cpu"), default="wall",
                    help="--captures: wall-clock or process CPU seconds (cpu: loaded machine)")
    args = ap.parse_args()
    torch.set_num_threads(1)
    if args.captures:
        print(f"captures, no-grad forward of one Attention (H=8, d_model 256), reps={args.reps} "
              f"iters={args.iters} threads=1 torch={torch.__version__} clock={args.clock} "
              f"load average {os.getloadavg()}\n")
        print("| T, B | no hook (ms) | one head (ms) | every head: the module's pass (ms) "
              "| every head: full T x T pass (ms) | every head beside fused (ms) "
              "| one head / no hook | module's / no hook | full / module's |")
        print("|---|---:|---:|---:|---:|---:|---:|---:|---:|")
        for T, B in CAPTURE_SHAPES:
            m = measure_captures(T, B, args.reps, args.iters, args.clock)
            a, o, e, full, f = (m[k] * 1e3 for k in (
                "no hook", "one head", "every head", "every head, full pass",
                "every head beside fused"))
            print(f"| {T}, {B} | {a:.2f} | {o:.2f} | {e:.2f} | {full:.2f} | {f:.2f} "
                  f"| {o / a:.3f} | {e / a:.3f} | {full / e:.2f} |", flush=True)
        return
    if args.softmax:
        print(f"softmax fwd+bwd, (64, 1, T, T), reps={args.reps} iters={args.iters} threads=1 "
              f"torch={torch.__version__}\n")
        print("| T | torch.softmax (us) | softmax_keys (us) | ratio |")
        print("|---:|---:|---:|---:|")
        for T in (8, 12, 14, 15, 16, 17, 20):
            m = measure_softmax(T, args.reps, args.iters * 10)
            a, b = m["torch.softmax"], m["softmax_keys"]
            print(f"| {T} | {a * 1e6:.0f} | {b * 1e6:.0f} | {b / a:.2f} |", flush=True)
        return
    s = SHAPES[args.shape]
    print(f"shape={args.shape} (H={s['n_heads']}, d_model={s['d_model']}, B={s['batch']}) "
          f"reps={args.reps} iters={args.iters} threads=1 torch={torch.__version__} "
          f"EXPLICIT_MAX_KEYS={attention_module.EXPLICIT_MAX_KEYS}\n")
    print("| T | situation | fused fwd (us) | explicit fwd (us) | explicit/fused fwd "
          "| fused fwd+bwd (us) | explicit fwd+bwd (us) | explicit/fused fwd+bwd |")
    print("|---:|---|---:|---:|---:|---:|---:|---:|")
    for T in (int(t) for t in args.lengths.split(",")):
        for situation in ("mask", "hooked", "plain"):
            m = measure(args.shape, T, situation, args.reps, args.iters)
            (ff, fb), (ef, eb) = m["fused"], [v for k, v in m.items() if k != "fused"][0]
            print(f"| {T} | {situation} | {ff * 1e6:.0f} | {ef * 1e6:.0f} | {ef / ff:.2f} "
                  f"| {fb * 1e6:.0f} | {eb * 1e6:.0f} | {eb / fb:.2f} |", flush=True)


if __name__ == "__main__":
    main()
