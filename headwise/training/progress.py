"""Progress of a training run: a live bar on a terminal, plain lines anywhere else.

On a terminal (or in a notebook) ``ProgressBar`` draws a rich bar (steps, elapsed, remaining,
loss and per-task training accuracy). When stdout is not a terminal (a pipe, ``nohup``, a batch
scheduler, CI) it prints one plain line instead at the first logged step, then at most once
per ``interval_s`` (default 30 s), and at the end::

    train 120/800 (15%) [00:38<03:35, 3.16 step/s] | loss 0.4132 | accuracy copy 0.910

``EvalLines`` is a training callback printing one line per evaluation point, on a terminal too
(above the bar), with each task's accuracy on the evaluation batches (``train.eval_batches``
held-out batches, the figure ``metrics.jsonl`` records; the contract's task clauses measure
their own held-out examples) and whatever ``describe`` adds (the pipeline adds the contract
clauses held under ``--enforce``)::

    eval 120/800 [00:38<03:35, 3.16 step/s] eval-batch accuracy copy 0.912 | contract 1/2 held

Every line is flushed at once, so a log file shows it while the run goes on.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from typing import Any, TextIO

INTERVAL_S = 30.0


def clock(seconds: float) -> str:
    """``MM:SS``, or ``H:MM:SS`` from an hour on."""
    s = max(int(round(seconds)), 0)
    h, m = divmod(s // 60, 60)
    return f"{h}:{m:02d}:{s % 60:02d}" if h else f"{m:02d}:{s % 60:02d}"


def timing(step: int, total: int, start: int, elapsed: float) -> str:
    """``[elapsed<remaining, rate step/s]`` (remaining ``?`` before the first step)."""
    done = step - start
    if done <= 0 or elapsed <= 0:
        return f"[{clock(elapsed)}<?]"
    rate = done / elapsed
    return f"[{clock(elapsed)}<{clock((total - step) / rate)}, {rate:.3g} step/s]"


def accuracies(tasks: dict[str, Any] | None, digits: int = 3) -> str:
    """``copy 0.910, reverse 0.850`` from a metrics record's ``tasks``."""
    return ", ".join(f"{name} {m['accuracy']:.{digits}f}" for name, m in (tasks or {}).items()
                     if isinstance(m, dict) and "accuracy" in m)


def is_terminal(stream: TextIO) -> bool:
    """Whether a live bar can be drawn on ``stream``: a terminal, or a Jupyter notebook (rich's
    detection, which also honours ``FORCE_TERMINAL`` / ``TTY_COMPATIBLE``)."""
    from rich.console import Console

    try:
        console = Console(file=stream)
        return console.is_terminal or console.is_jupyter
    except (AttributeError, ValueError):  # a closed or unusual stream
        return False


class ProgressBar:
    """Training progress: a rich bar on a terminal, else plain lines (no-op when disabled).

    Args:
        total: the run's steps.  start: the step it starts (or resumes) from.
        enabled: whether to show anything.  interval_s: seconds between plain lines.
        stream: where plain lines go (default ``sys.stdout``).  now: the clock (tests).
    """

    def __init__(self, total: int, start: int, enabled: bool, interval_s: float = INTERVAL_S,
                 stream: TextIO | None = None, now: Callable[[], float] = time.monotonic
                 ) -> None:
        self.total, self.start, self.interval_s = total, start, interval_s
        self.stream, self.now = stream or sys.stdout, now
        self.t0 = now()
        self.plain = enabled and not is_terminal(self.stream)
        self.last_line: float | None = None
        self.printed = start
        self.last: tuple[int, float | None, dict[str, Any] | None] = (start, None, None)
        self._progress = None
        if not enabled or self.plain:
            return
        from rich.progress import (
            BarColumn,
            MofNCompleteColumn,
            Progress,
            TextColumn,
            TimeElapsedColumn,
            TimeRemainingColumn,
        )

        self._progress = Progress(TextColumn("train"), BarColumn(), MofNCompleteColumn(),
                                  TimeElapsedColumn(), TimeRemainingColumn(),
                                  TextColumn("{task.fields[info]}"))
        self._progress.start()
        self._task = self._progress.add_task("train", total=total, completed=start, info="")

    def update(self, step: int, loss: float | None = None,
               tasks: dict[str, Any] | None = None) -> None:
        """Move to ``step``; show ``loss`` and each task's accuracy when given (a log step)."""
        if self.plain:
            if loss is not None:
                self.last = (step, loss, tasks)
                due = self.last_line is None or self.now() - self.last_line >= self.interval_s
                if due and step < self.total:  # the last step's line is close()'s, always last
                    self._line()
            return
        if self._progress is None:
            return
        if loss is None:
            self._progress.update(self._task, completed=step)
            return
        info = f"loss {loss:.4f} | acc {accuracies(tasks, 2)}"
        self._progress.update(self._task, completed=step, info=info)

    def _line(self) -> None:
        step, loss, tasks = self.last
        self.last_line, self.printed = self.now(), step
        pct = 100 * step / max(self.total, 1)
        parts = [f"train {step}/{self.total} ({pct:.0f}%) "
                 f"{timing(step, self.total, self.start, self.last_line - self.t0)}"]
        if loss is not None:
            parts.append(f"loss {loss:.4f}")
        if acc := accuracies(tasks):
            parts.append(f"accuracy {acc}")
        print(" | ".join(parts), file=self.stream, flush=True)

    def close(self) -> None:
        """Stop drawing; plain lines end with the last logged step if not yet printed."""
        if self.plain and self.last[1] is not None and self.printed != self.last[0]:
            self._line()
        if self._progress is not None:
            self._progress.stop()


class EvalLines:
    """A training callback: one line per evaluation point (see the module docstring).

    Args:
        total: the run's steps.
        describe: more to say from the callback state ``TrainState.extra`` (``None``: nothing).
        stream: where lines go (default ``sys.stdout`` at call time).
    """

    def __init__(self, total: int,
                 describe: Callable[[dict[str, Any]], str | None] | None = None,
                 stream: TextIO | None = None, now: Callable[[], float] = time.monotonic
                 ) -> None:
        self.total, self.describe = total, describe
        self.stream, self.now = stream, now
        self.t0 = now()
        self.first: tuple[int, float] | None = None  # the rate is measured from the first line

    def __call__(self, state: Any) -> None:
        t = self.now()
        if self.first is None:
            self.first = (state.step, t)
        done, since = state.step - self.first[0], t - self.first[1]
        left = f"{clock((self.total - state.step) * since / done)}, {done / since:.3g} step/s" \
            if done > 0 and since > 0 else "?"
        when = f"[{clock(t - self.t0)}<{left}]"
        parts = [f"eval {state.step}/{self.total} {when} eval-batch accuracy "
                 f"{accuracies(state.metrics.get('tasks')) or '-'}"]
        if self.describe is not None and (more := self.describe(state.extra)):
            parts.append(more)
        print(" | ".join(parts), file=self.stream or sys.stdout, flush=True)
