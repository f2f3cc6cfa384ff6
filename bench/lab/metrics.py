"""A finished run's evaluation curve, read from its ``metrics.jsonl``."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from headwise.pipeline.run_analysis import metrics_lines


def metrics_curve(run_dir: Path) -> list[dict[str, Any]]:
    """The evaluation lines of ``metrics.jsonl`` (empty when there are none)."""
    return [r for r in metrics_lines(run_dir) if r.get("kind") == "eval"]
