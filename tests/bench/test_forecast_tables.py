"""The role forecast benchmark's tables (bench/lab/forecast_tables.py), against closed forms."""

from __future__ import annotations

from bench.lab.forecast_tables import Row, below_baseline, calibration


def _row(config: str, right: bool, conf: float | None, head: str = "L0.H0") -> Row:
    return Row(config, 0, head, "self", "self" if right else "none", False, conf)


def test_calibration_bins_every_stated_probability_once() -> None:
    rows = [_row("a", True, 0.1), _row("a", False, 0.5), _row("a", True, 0.69),
            _row("a", True, 0.9), _row("a", False, 1.0), _row("a", True, None)]
    bins = calibration(rows)
    assert [(b["from"], b["to"]) for b in bins] == [(0.0, 0.5), (0.5, 0.7), (0.7, 0.9),
                                                    (0.9, 1.0)]
    assert [b["heads"] for b in bins] == [1, 2, 0, 2]  # 1.0 in the last bin; None (baseline) out
    assert [b["accuracy"] for b in bins] == [1.0, 0.5, 0.0, 0.5]


def test_below_baseline_compares_each_configuration_on_both_splits() -> None:
    # baseline right on every head of a and b, wrong on c
    base = [_row(c, c != "c", None) for c in "abc"]
    seeds = [_row("a", True, 0.9), _row("b", False, 0.9), _row("c", True, 0.9)]
    confs = [_row("a", False, 0.9), _row("b", False, 0.9), _row("c", True, 0.9)]
    preds = {"baseline": {0.2: base}, "held-out seeds": {0.2: seeds},
             "held-out configs": {0.2: confs}}
    # a: worse only when held out by configuration; b: worse on both; c: better on both
    assert below_baseline(preds, ["a", "b", "c"]) == ["a", "b"]
