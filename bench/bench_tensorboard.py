"""TensorBoard logging cost: the demo's training with ``train.log: [jsonl]`` vs
``[jsonl, tensorboard]``, and the attention viewers' share of the demo's report.html.

Run from the repository root::

    .venv/bin/python bench/bench_tensorboard.py            # defaults: 3 reps

Each repetition trains the built-in demo spec (1 layer x 4 heads, 300 steps, evaluation and a
checkpoint every 50 steps: 6 role heatmaps) once per system, in turn, in a fresh temporary run
directory; only ``train()`` is timed (not compiling the spec, verification or the report).
One thread. Prints the median wall time per system and the median of the paired ratios.
Then times the sink's two operations on the trained demo model (median of ``--calls``): one
metrics line written (``TensorBoardSink.write``) and one checkpoint heatmap (role scores on
the first held-out batch, the figure, the image event). Last, writes the demo's report once and
prints its size, and the bytes its viewers take.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

import torch

from headwise.pipeline import compile_spec
from headwise.runspec import load_spec

DEMO = Path(__file__).resolve().parents[1] / "headwise" / "examples" / "demo.yaml"


def _time_train(log: str, out: Path) -> float:
    from headwise.pipeline.run import FIGURES
    from headwise.training import train

    text = DEMO.read_text().replace("  seed: 0\n", f"  seed: 0\n  log: {log}\n", 1)
    spec = load_spec(text)
    compiled = compile_spec(spec)
    t0 = time.perf_counter()
    train(compiled.model, compiled.data, spec.train, out_dir=out,
          objectives=compiled.objectives, optimizer_hooks=compiled.optimizer_hooks,
          eval_data=compiled.eval_data, progress=False, figures=FIGURES)  # as train_run
    return time.perf_counter() - t0


def _time_sink(out: Path, calls: int) -> tuple[float, float]:
    """Median seconds of one ``write`` and one ``checkpoint`` of the TensorBoard sink."""
    import json

    from headwise.training import EVAL_SEED_OFFSET
    from headwise.training.tensorboard import TensorBoardSink

    text = DEMO.read_text().replace("  seed: 0\n", "  seed: 0\n  log: [jsonl, tensorboard]\n")
    spec = load_spec(text)
    compiled = compile_spec(spec, weights=out / "model.safetensors")
    record = json.loads((out / "metrics.jsonl").read_text().splitlines()[0])
    gen = torch.Generator().manual_seed(spec.train.seed + EVAL_SEED_OFFSET)
    batch = compiled.eval_data.sample(spec.train.batch_size, gen)  # as RunLog's probe
    from headwise.pipeline.run import FIGURES

    sink = TensorBoardSink(out / "bench-tb", lambda: batch, FIGURES)
    writes, images = [], []
    for i in range(calls):
        t0 = time.perf_counter()
        sink.write({**record, "step": i})
        writes.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        sink.checkpoint(i, compiled.model)
        images.append(time.perf_counter() - t0)
    sink.close()
    return statistics.median(writes), statistics.median(images)


def _report_sizes(out: Path) -> tuple[int, int]:
    import json

    from headwise.pipeline import RunOptions, train_run
    from headwise.pipeline.run_report import write_run_report
    from headwise.report.viewer import report_viewers

    outcome = train_run(str(DEMO), out, RunOptions(progress=False))
    paths = write_run_report(out, outcome.compiled, outcome.contract)
    report = json.loads(paths["json"].read_text())
    viewers = sum(len(v.encode()) for v in report_viewers(report).values())
    return paths["html"].stat().st_size, viewers


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--calls", type=int, default=20)
    args = parser.parse_args()
    torch.set_num_threads(1)
    systems = {"jsonl": "[jsonl]", "jsonl+tensorboard": "[jsonl, tensorboard]"}
    times: dict[str, list[float]] = {name: [] for name in systems}
    with tempfile.TemporaryDirectory() as tmp:
        for rep in range(args.reps):
            for name, log in systems.items():
                times[name].append(_time_train(log, Path(tmp) / f"{name}-{rep}"))
            print(f"rep {rep}: " + ", ".join(f"{n} {t[-1]:.2f} s" for n, t in times.items()),
                  flush=True)
        ratios = [b / a for a, b in zip(times["jsonl"], times["jsonl+tensorboard"],
                                        strict=True)]
        for name, ts in times.items():
            print(f"{name}: median {statistics.median(ts):.2f} s over {len(ts)} reps")
        of_medians = (statistics.median(times["jsonl+tensorboard"])
                      / statistics.median(times["jsonl"]))
        print(f"ratio tensorboard / jsonl: median of paired {statistics.median(ratios):.3f} "
              f"(ratio of medians {of_medians:.3f})")
        write, image = _time_sink(Path(tmp) / "jsonl+tensorboard-0", args.calls)
        print(f"sink: one metrics line {write * 1e3:.2f} ms, one checkpoint heatmap "
              f"{image * 1e3:.1f} ms (medians of {args.calls})")
        html, viewers = _report_sizes(Path(tmp) / "report")
        print(f"demo report.html: {html} bytes, of which attention viewers {viewers} bytes")


if __name__ == "__main__":
    main()
