"""Forward-pass benchmark: headwise vs a nanoGPT-style SDPA reference, and what captures cost.

Run from the repository root::

    .venv/bin/python -m bench.bench_forward                       # speed + memory
    .venv/bin/python -m bench.bench_forward --tl-python bench/.cache/tlvenv3/bin/python  # + TL
    .venv/bin/python -m bench.bench_forward --profile --shapes 64x32,256x8 --reps 5

Speed: both systems in one process, one thread, interleaved (each repetition runs every system
once, in turn), median of ``--reps`` after ``--warmup`` runs. Forward runs under
``torch.no_grad()``; forward+backward uses cross-entropy on random targets.
Memory: one subprocess per mode; the figure is the growth of the peak resident set size
(``VmHWM``) across one no-grad forward, i.e. the forward's transient and cached memory.
TransformerLens (optional, memory only): ``--tl-python`` / ``--tl4-python`` name a Python whose
environment has ``transformer_lens`` 3.x / 4.x (never a headwise dependency).
Profile (``--profile``): per-op self CPU time of the no-hook forward and of all patterns cached,
``torch.profiler`` around each call (``profile_ops``). Speed against TransformerLens is
``bench_tl_cache.py``, which also builds that environment (both build TransformerLens's model
with ``bench.lab.forward_models.tl_model``).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import sys
import tempfile
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F

from bench.lab.forward_models import SHAPE, build, tl_model
from bench.lab.timing import CLOCKS, interleaved, medians, paired
from bench.lab.workers import module_command, run_worker


def speed(T: int, B: int, reps: int, warmup: int, clock: str = "wall",
          train: bool = True) -> dict[str, float]:
    ours, ref = build()
    g = torch.Generator().manual_seed(1)
    tokens = torch.randint(0, SHAPE["vocab_size"], (B, T), generator=g)
    targets = torch.randint(0, SHAPE["vocab_size"], (B, T), generator=g)
    with torch.no_grad():
        diff = (ours(tokens) - ref(tokens)).abs().max().item()
    assert diff < 1e-4, f"reference and headwise disagree: max |diff| = {diff}"
    patterns = [f"blocks.{l}.attn.hook_pattern" for l in range(SHAPE["n_layers"])]

    def fwd(model: torch.nn.Module) -> Callable[[], object]:
        def run() -> object:
            with torch.no_grad():
                return model(tokens)
        return run

    def fwd_bwd(model: torch.nn.Module) -> Callable[[], object]:
        def run() -> object:
            model.zero_grad(set_to_none=True)
            loss = F.cross_entropy(model(tokens).flatten(0, 1), targets.flatten())
            loss.backward()
            return loss
        return run

    def cached(names: list[str], heads: str | None) -> Callable[[], object]:
        def run() -> object:
            with torch.no_grad():
                return ours.run_with_cache(tokens, names, heads=heads)
        return run

    fwd_times = interleaved({
        "ref_fwd": fwd(ref), "ours_fwd": fwd(ours),
        "ours_fwd_one_head": cached(patterns[:1], "L0.H0"),
        "ours_fwd_all_patterns": cached(patterns, None),
    }, reps, warmup, clock)
    bwd_times = interleaved({"ref_fwd_bwd": fwd_bwd(ref), "ours_fwd_bwd": fwd_bwd(ours)},
                            reps, warmup, clock) if train else {}
    times = {**fwd_times, **bwd_times}
    ratios = {
        "fwd_vs_ref": paired(times, "ref_fwd", "ours_fwd"),
        "one_head_vs_nohook": paired(times, "ours_fwd", "ours_fwd_one_head"),
        "all_vs_nohook": paired(times, "ours_fwd", "ours_fwd_all_patterns"),
    }
    if train:
        ratios["fwd_bwd_vs_ref"] = paired(times, "ref_fwd_bwd", "ours_fwd_bwd")
    return {**medians(times), **{f"ratio_{k}": v for k, v in ratios.items()},
            "max_abs_diff": diff}


def profile_ops(T: int, B: int, reps: int, top: int = 16) -> str:
    """Where the time goes: per-op self CPU ms per forward, no hooks vs all patterns cached.

    ``torch.profiler`` around one call at a time, the two modes alternating for ``reps``
    rounds (after one warm-up each), no-grad, one thread; ops sorted by their total over both
    modes. The profiler's own overhead inflates small ops; read the shares, not the sums.
    """
    import collections

    from torch.profiler import ProfilerActivity, profile

    ours, _ = build()
    tokens = torch.randint(0, SHAPE["vocab_size"], (B, T),
                           generator=torch.Generator().manual_seed(1))
    patterns = [f"blocks.{l}.attn.hook_pattern" for l in range(SHAPE["n_layers"])]
    modes: dict[str, Callable[[], object]] = {
        "no_hooks": lambda: ours(tokens),
        "all_patterns": lambda: ours.run_with_cache(tokens, patterns)}
    ms = {m: collections.Counter[str]() for m in modes}
    calls = {m: collections.Counter[str]() for m in modes}
    with torch.no_grad():
        for fn in modes.values():
            fn()
        for _ in range(reps):
            for mode, fn in modes.items():
                with profile(activities=[ProfilerActivity.CPU]) as prof:
                    fn()
                for event in prof.key_averages():
                    ms[mode][event.key] += event.self_cpu_time_total / 1e3 / reps
                    calls[mode][event.key] += event.count
    ops = sorted(set(ms["no_hooks"]) | set(ms["all_patterns"]),
                 key=lambda op: -(ms["no_hooks"][op] + ms["all_patterns"][op]))
    lines = ["| op | no hooks (ms) | all patterns (ms) | calls per forward |",
             "|---|---:|---:|---|"]
    for op in ops[:top]:
        lines.append(f"| {op} | {ms['no_hooks'][op]:.1f} | {ms['all_patterns'][op]:.1f} | "
                     f"{calls['no_hooks'][op] // reps} / {calls['all_patterns'][op] // reps} |")
    lines.append(f"| total | {sum(ms['no_hooks'].values()):.1f} | "
                 f"{sum(ms['all_patterns'].values()):.1f} | |")
    return "\n".join(lines)


def memory_worker(mode: str, T: int, B: int) -> None:
    """One no-grad forward; prints the growth of peak RSS (MiB) it caused."""
    torch.set_num_threads(1)
    tokens = torch.randint(0, SHAPE["vocab_size"], (B, T))
    if mode.startswith("tl"):
        model = _tl4_model(None) if mode.startswith("tl4") else tl_model(None)
        run = lambda: model.run_with_cache(  # noqa: E731
            tokens, names_filter=lambda n: n.endswith("hook_pattern"))
    else:
        ours, ref = build()
        patterns = [f"blocks.{l}.attn.hook_pattern" for l in range(SHAPE["n_layers"])]
        run = {
            "ref": lambda: ref(tokens),
            "none": lambda: ours(tokens),
            "one_head": lambda: ours.run_with_cache(tokens, patterns[:1], heads="L0.H0"),
            "all_heads": lambda: ours.run_with_cache(tokens, patterns),
        }[mode]
    before = _peak_rss_kib()
    with torch.no_grad():
        out = run()
    after = _peak_rss_kib()
    del out
    print(json.dumps({"mode": mode, "peak_growth_mib": (after - before) / 1024}))


def _peak_rss_kib() -> int:
    """Peak resident set size of this process (Linux ``VmHWM``; ``ru_maxrss`` elsewhere).

    ``ru_maxrss`` is not used on Linux: a child started by fork+exec inherits its parent's
    high-water mark, which would hide the child's own peak.
    """
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1])
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss


def _tl4_model(state_path: str | None) -> Any:
    """TransformerLens 4 ``TransformerBridge`` over a HF GPT-2 of the same shape (no download).

    The bridge needs a tokenizer; a word-level one over the 4096 ids is saved to a temp dir.
    """
    from tokenizers import Tokenizer
    from tokenizers.models import WordLevel
    from transformer_lens.model_bridge import TransformerBridge
    from transformers import GPT2Config, GPT2LMHeadModel, PreTrainedTokenizerFast

    V, D = SHAPE["vocab_size"], SHAPE["d_model"]
    hf = GPT2LMHeadModel(GPT2Config(
        n_layer=SHAPE["n_layers"], n_embd=D, n_head=SHAPE["n_heads"], n_inner=SHAPE["d_ff"],
        vocab_size=V, n_positions=SHAPE["max_seq_len"], activation_function="gelu_new",
        resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)).eval()
    saved = None
    if state_path is not None:
        saved = torch.load(state_path, weights_only=True)
        hf.load_state_dict(_gpt2_state(saved["state"]), strict=False)
    vocab = {f"t{i}": i for i in range(V)}
    with tempfile.TemporaryDirectory() as tmp:
        PreTrainedTokenizerFast(
            tokenizer_object=Tokenizer(WordLevel(vocab, unk_token="t0")), unk_token="t0",
            pad_token="t1", eos_token="t2", bos_token="t3").save_pretrained(tmp)
        bridge = TransformerBridge.boot_transformers(
            "gpt2", hf_model=hf, tokenizer=PreTrainedTokenizerFast.from_pretrained(tmp))
    if saved is not None:
        with torch.no_grad():
            diff = (bridge(saved["tokens"]) - saved["logits"]).abs().max().item()
        assert diff < 1e-4, f"TransformerLens bridge and headwise disagree: max |diff| = {diff}"
    return bridge


def _gpt2_state(s: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Our state dict as HF GPT-2 keys (Conv1D weights are (in, out))."""
    out = {"transformer.wte.weight": s["embed.weight"], "lm_head.weight": s["embed.weight"],
           "transformer.wpe.weight": s["pos_embed.weight"],
           "transformer.ln_f.weight": s["ln_final.weight"],
           "transformer.ln_f.bias": s["ln_final.bias"]}
    for l in range(SHAPE["n_layers"]):
        p, t = f"blocks.{l}.", f"transformer.h.{l}."
        out[t + "attn.c_attn.weight"] = torch.cat(
            [s[p + f"attn.{n}_proj.weight"] for n in "qkv"]).T.contiguous()
        out[t + "attn.c_attn.bias"] = torch.cat([s[p + f"attn.{n}_proj.bias"] for n in "qkv"])
        for ours, theirs in (("attn.o_proj", "attn.c_proj"), ("mlp.up_proj", "mlp.c_fc"),
                             ("mlp.down_proj", "mlp.c_proj")):
            out[t + theirs + ".weight"] = s[p + ours + ".weight"].T.contiguous()
            out[t + theirs + ".bias"] = s[p + ours + ".bias"]
        for n in ("1", "2"):
            out[t + f"ln_{n}.weight"] = s[p + f"ln{n}.weight"]
            out[t + f"ln_{n}.bias"] = s[p + f"ln{n}.bias"]
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=7)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--shapes", default="256x8,1024x2", help="TxB list")
    ap.add_argument("--clock", choices=sorted(CLOCKS), default="wall",
                    help="wall-clock or process CPU seconds (cpu: for a loaded machine)")
    ap.add_argument("--no-memory", action="store_true")
    ap.add_argument("--no-train", action="store_true", help="skip the forward+backward timings")
    ap.add_argument("--no-speed", action="store_true", help="skip the in-process timings")
    ap.add_argument("--tl-python", default=None,
                    help="a Python with transformer_lens 3.x (HookedTransformer)")
    ap.add_argument("--tl4-python", default=None,
                    help="a Python with transformer_lens 4.x (TransformerBridge)")
    ap.add_argument("--profile", action="store_true",
                    help="print where the time goes (per-op CPU ms, no hooks vs all patterns) "
                         "for each shape, then stop")
    ap.add_argument("--memory-worker", nargs=3, metavar=("MODE", "T", "B"))
    args = ap.parse_args()
    torch.set_num_threads(1)
    if args.memory_worker:
        mode, T, B = args.memory_worker
        return memory_worker(mode, int(T), int(B))
    shapes = [tuple(int(v) for v in s.split("x")) for s in args.shapes.split(",")]
    if args.profile:
        for T, B in shapes:
            print(f"\n## T={T} B={B}: self CPU time per forward, {args.reps} profiled "
                  f"forwards per mode, load average {os.getloadavg()}")
            print(profile_ops(T, B, args.reps))
        return None

    print(f"torch {torch.__version__}, threads {torch.get_num_threads()}, reps {args.reps}, "
          f"warmup {args.warmup}, clock {args.clock}, load average {os.getloadavg()}")
    for T, B in [] if args.no_speed else shapes:
        r = speed(T, B, args.reps, args.warmup, args.clock, train=not args.no_train)
        print(f"\n## T={T} B={B}   (max |logits diff| vs reference {r['max_abs_diff']:.2e})")
        print(f"{'system':<28}{'median s (' + args.clock + ')':>16}")
        for k, v in r.items():
            if not k.startswith(("ratio_", "max_abs")):
                print(f"{k:<28}{v:>10.4f}")
        print("ratios: median over repetitions of the paired ratio (ratio of medians)")
        for key, num, den, what in (
            ("fwd_vs_ref", "ref_fwd", "ours_fwd", "no hooks, forward vs reference (>= 0.95)"),
            ("fwd_bwd_vs_ref", "ref_fwd_bwd", "ours_fwd_bwd",
             "no hooks, forward+backward vs reference (>= 0.95)"),
            ("one_head_vs_nohook", "ours_fwd", "ours_fwd_one_head",
             "one head's pattern cached vs no-hook forward (>= 0.95)"),
            ("all_vs_nohook", "ours_fwd", "ours_fwd_all_patterns",
             "all patterns cached vs no-hook forward"),
        ):
            if "ratio_" + key in r:
                print(f"  {what:<58}{r['ratio_' + key]:.3f}x ({r[num] / r[den]:.3f}x)")
    if not args.no_memory:
        T, B = 1024, 2
        print(f"\n## peak memory growth of one no-grad forward, T={T} B={B} (VmHWM)")
        modes = ["ref", "none", "one_head", "all_heads"] + (["tl_all"] if args.tl_python else [])
        modes += ["tl4_all"] if args.tl4_python else []
        for mode in modes:
            tl = {"tl_all": args.tl_python, "tl4_all": args.tl4_python}
            python = tl.get(mode) or sys.executable
            r = run_worker(module_command(__spec__.name, "--memory-worker", mode, T, B,
                                              python=python), f"{mode} memory")
            print(f"{mode:<12}{r['peak_growth_mib']:>10.1f} MiB")
        pattern_mib = SHAPE["n_layers"] * B * SHAPE["n_heads"] * T * T * 4 / 2**20
        print(f"(all patterns as float32 = {pattern_mib:.0f} MiB)")


if __name__ == "__main__":
    main()
