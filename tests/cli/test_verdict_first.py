"""`headwise train` prints the verdict before any report output, also into a pipe; the report
follows with progress lines; `--no-report` stops after the verdict."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import headwise

SPEC = """
model: {n_layers: 1, n_heads: 2, d_model: 16, vocab_size: 12, max_seq_len: 10}
data: {tasks: {copy: {length: 4}}, eval_examples: 32}
train: {steps: 4, batch_size: 8, eval_every: 2, checkpoint_every: 2}
heads: {L0.H0: {mask: previous_token}}
contract:
  - {head: L0.H0, score: previous_token, at_least: 0.99}
"""
CLI = "import sys; from headwise.cli import main; sys.exit(main(sys.argv[1:]))"


def _train(tmp_path: Path, *flags: str) -> tuple[list[str], Path]:
    spec = tmp_path / "spec.yaml"
    spec.write_text(SPEC)
    run = tmp_path / "run"
    root = str(Path(headwise.__file__).resolve().parent.parent)
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": root}
    done = subprocess.run([sys.executable, "-c", CLI, "train", str(spec), "--out", str(run),
                           "--quiet", "--threads", "1", *flags], env=env,
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stdout
    return done.stdout.splitlines(), run


def test_verdict_line_comes_before_any_report_output_in_a_pipe(tmp_path: Path) -> None:
    lines, run = _train(tmp_path)
    verdict = next(i for i, line in enumerate(lines) if line.startswith("contract HOLDS"))
    report = [i for i, line in enumerate(lines) if line.startswith("report:")]
    assert report and verdict < report[0]
    assert lines[report[0]] == "report: attention viewer (0/5 done)"
    assert "left)" in lines[report[1]]  # an estimate of what is left, once a phase is done
    assert lines[report[-1]] == f"report: written {run / 'report.html'}"
    assert (run / "report.html").is_file() and (run / "report.json").is_file()
    assert not any("\x1b[" in line for line in lines)  # plain lines without a terminal


def test_no_report_prints_the_verdict_and_writes_no_report(tmp_path: Path) -> None:
    lines, run = _train(tmp_path, "--no-report")
    assert any(line.startswith("contract HOLDS") for line in lines)
    assert not any(line.startswith("report:") for line in lines)
    text = "".join("".join(lines).split())  # a long line wraps in a pipe: compare unspaced
    assert "(noreport;writeitwith" in text and f"`headwisereport{run}`" in text
    assert not (run / "report.html").exists() and (run / "model.safetensors").is_file()
