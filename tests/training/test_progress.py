"""Progress without a terminal: plain lines per interval and per evaluation point, on a clock
the test drives; and a real run whose stdout is a pipe prints them while it trains."""

from __future__ import annotations

import io
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
import yaml

from headwise.cli import main
from headwise.training.progress import EvalLines, ProgressBar, clock


class Clock:
    def __init__(self) -> None:
        self.t = 100.0

    def __call__(self) -> float:
        return self.t


def test_plain_lines_first_log_step_then_one_per_interval_then_the_end() -> None:
    stream, now = io.StringIO(), Clock()
    bar = ProgressBar(total=100, start=0, enabled=True, interval_s=30, stream=stream, now=now)
    tasks = {"copy": {"accuracy": 0.5}, "reverse": {"accuracy": 0.25}}
    for step in range(1, 101):
        now.t += 1.0  # one step per second
        bar.update(step, loss=2.0 / step, tasks=tasks) if step % 5 == 0 else bar.update(step)
    bar.close()
    lines = stream.getvalue().splitlines()
    # step 5 (the first logged), then the first logged step >= 30 s after each line, then 100
    assert [line.split()[1] for line in lines] == ["5/100", "35/100", "65/100", "95/100",
                                                   "100/100"]
    assert lines[0] == ("train 5/100 (5%) [00:05<01:35, 1 step/s] | loss 0.4000 | "
                        "accuracy copy 0.500, reverse 0.250")
    assert lines[-1].startswith("train 100/100 (100%) [01:40<00:00, 1 step/s]")


def test_the_last_steps_line_is_printed_at_close_even_when_an_interval_is_due() -> None:
    """The final line comes after the last evaluation point's, however slow the machine: a
    line due by the interval at the last step waits for ``close``."""
    stream, now = io.StringIO(), Clock()
    bar = ProgressBar(total=10, start=0, enabled=True, interval_s=30, stream=stream, now=now)
    bar.update(1, loss=1.0, tasks={})
    now.t += 60.0  # an interval is due at the last step
    bar.update(10, loss=0.5, tasks={})
    print("eval 10/10", file=stream)
    bar.close()
    assert [line.split()[:2] for line in stream.getvalue().splitlines()] == [
        ["train", "1/10"], ["eval", "10/10"], ["train", "10/10"]]


def test_resumed_bar_counts_the_rate_from_its_start_and_quiet_prints_nothing() -> None:
    stream, now = io.StringIO(), Clock()
    bar = ProgressBar(total=1000, start=400, enabled=True, stream=stream, now=now)
    now.t += 10
    bar.update(500, loss=1.0, tasks={})
    assert stream.getvalue() == "train 500/1000 (50%) [00:10<00:50, 10 step/s] | loss 1.0000\n"
    quiet = io.StringIO()
    off = ProgressBar(total=10, start=0, enabled=False, stream=quiet, now=now)
    off.update(10, loss=1.0, tasks={})
    off.close()
    assert quiet.getvalue() == ""


def test_eval_lines_name_accuracy_and_what_the_pipeline_adds() -> None:
    stream, now = io.StringIO(), Clock()
    lines = EvalLines(200, lambda extra: extra.get("say"), stream=stream, now=now)
    for step, t in ((20, 5.0), (40, 10.0)):
        now.t += t
        lines(SimpleNamespace(step=step, metrics={"tasks": {"copy": {"accuracy": 0.9125}}},
                              extra={"say": "contract 1/2 held"} if step == 40 else {}))
    assert stream.getvalue().splitlines() == [
        "eval 20/200 [00:05<?] eval-batch accuracy copy 0.912",
        "eval 40/200 [00:15<01:20, 2 step/s] eval-batch accuracy copy 0.912 | contract 1/2 held"]


def test_clock() -> None:
    assert (clock(0), clock(59.6), clock(61), clock(3600 + 62)) == ("00:00", "01:00", "01:01",
                                                                    "1:01:02")


@pytest.mark.slow
def test_a_run_whose_stdout_is_a_pipe_prints_progress_while_it_trains(
        tmp_path: Path, capfd: pytest.CaptureFixture[str]) -> None:
    spec = {"model": {"n_layers": 1, "n_heads": 2, "d_model": 8, "vocab_size": 12,
                      "max_seq_len": 8},
            "data": {"tasks": {"copy": {"length": 3}}, "eval_examples": 16},
            "train": {"steps": 100000, "batch_size": 4, "eval_every": 50, "eval_batches": 1,
                      "checkpoint_every": 100000, "log_every": 10},
            "contract": [{"head": "L0.H1", "score": "previous_token", "at_least": 0.99}]}
    path = tmp_path / "spec.yaml"
    path.write_text(yaml.safe_dump(spec))
    entry = "import sys; from headwise.cli import main; sys.exit(main())"
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.Popen([sys.executable, "-c", entry, "train", str(path), "--out",
                             str(tmp_path / "run"), "--enforce"], env=env, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert proc.stdout is not None
    seen: list[str] = []
    deadline = time.monotonic() + 120
    while not any(s.startswith("eval ") for s in seen):  # lines arrive as the run goes
        assert time.monotonic() < deadline and proc.poll() is None, seen
        seen.append(proc.stdout.readline().rstrip("\n"))
    running = proc.poll() is None
    proc.send_signal(signal.SIGINT)
    rest, err = proc.communicate(timeout=60)
    assert running and proc.returncode == 130, err
    assert seen[0].startswith("train 10/100000 (0%) [") and "| loss " in seen[0]
    assert seen[-1].startswith("eval 50/100000 [") and "eval-batch accuracy copy " in seen[-1]
    assert seen[-1].endswith("| contract 0/1 held")
    assert not any("\x1b" in s for s in seen + rest.splitlines())  # plain text, no bar
    # --quiet: nothing but the outcome (in this process: stdout captured at the descriptor)
    capfd.readouterr()
    code = main(["train", str(path), "--out", str(tmp_path / "quiet"), "--steps", "50",
                 "--quiet"])
    out, err = capfd.readouterr()
    assert code in (0, 1), err
    assert "trained 50 steps" in out
    assert not [s for s in out.splitlines() if s.startswith(("train ", "eval "))]
    assert json.loads((tmp_path / "quiet" / "run.json").read_text())["step"] == 50
