"""The ``--device`` option shared by every command that runs a model."""

from __future__ import annotations

import argparse

from headwise.training.device import DEVICE_CHOICES


def add_device_argument(p: argparse.ArgumentParser, default: str | None,
                        default_text: str) -> None:
    """Add ``--device auto|cpu|cuda|cuda:N`` (checked when the command places the model)."""
    p.add_argument("--device", default=default, metavar="DEVICE",
                   help=f"where the model runs: {DEVICE_CHOICES} (default: {default_text}; "
                        "auto picks CUDA when available)")
