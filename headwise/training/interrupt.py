"""Graceful interruption: SIGINT/SIGTERM during training end the run at a checkpoint.

While ``catch_signals`` is active, the first SIGINT (Ctrl-C) or SIGTERM only sets a flag; the
training loop checks it before each step, saves a checkpoint at the current step and raises
``Interrupted``, which the CLI turns into one line and exit code 130. In one process a second
signal raises ``KeyboardInterrupt`` at once (every file is written atomically, so nothing is
left half written either way). Under ``torchrun`` (``escalate=False``) later signals are
ignored: Ctrl-C reaches each worker twice (from the terminal, then forwarded by ``torchrun``),
and ``torchrun`` itself escalates to SIGKILL after its grace period (30 s).
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from types import FrameType

SIGNALS = (signal.SIGINT, signal.SIGTERM)


class Interrupted(Exception):
    """Training stopped on a signal after saving a checkpoint at ``step``.

    Attributes:
        step: optimiser updates done (and saved, when ``checkpoint`` is set).
        signum: the signal received.
        checkpoint: the checkpoint directory written, or ``None`` without a run directory.
    """

    def __init__(self, step: int, signum: int, checkpoint: Path | None) -> None:
        super().__init__(f"interrupted by {signal.Signals(signum).name} at step {step}")
        self.step = step
        self.signum = signum
        self.checkpoint = checkpoint


@dataclass
class SignalFlag:
    """The first signal received while ``catch_signals`` is active (``None``: none yet)."""

    signum: int | None = None


@contextmanager
def catch_signals(enabled: bool = True, escalate: bool = True) -> Iterator[SignalFlag]:
    """Turn SIGINT/SIGTERM into a flag for the duration of the block.

    Does nothing (the flag stays unset) when ``enabled`` is false or outside the main thread,
    where Python cannot install signal handlers. ``escalate``: a second signal raises
    ``KeyboardInterrupt`` (else it is ignored).
    """
    flag = SignalFlag()
    if not enabled or threading.current_thread() is not threading.main_thread():
        yield flag
        return

    def handler(signum: int, frame: FrameType | None) -> None:
        if flag.signum is not None:
            if escalate:
                raise KeyboardInterrupt
            return
        flag.signum = signum

    previous = {s: signal.signal(s, handler) for s in SIGNALS}
    try:
        yield flag
    finally:
        for s, h in previous.items():
            signal.signal(s, h)
