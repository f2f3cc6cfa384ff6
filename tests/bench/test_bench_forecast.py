"""The forecast benchmark's statistics (bench/forecast_tables.py), against closed forms."""

from __future__ import annotations

import importlib.util
import math
from pathlib import Path
from types import ModuleType

import pytest

TABLES = Path(__file__).resolve().parents[2] / "bench" / "forecast_tables.py"


@pytest.fixture(scope="module")
def bf() -> ModuleType:
    spec = importlib.util.spec_from_file_location("forecast_tables", TABLES)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_sign_test_matches_the_binomial_tail(bf: ModuleType) -> None:
    assert bf.sign_test(0, 0) == 1.0
    assert bf.sign_test(7, 7) == 1.0
    assert bf.sign_test(0, 9) == pytest.approx(2 / 2 ** 9)
    assert bf.sign_test(9, 0) == bf.sign_test(0, 9)
    # 7 wins, 22 losses: 2 * P(X <= 7), X ~ Binomial(29, 1/2)
    assert bf.sign_test(7, 22) == pytest.approx(
        2 * sum(math.comb(29, i) for i in range(8)) / 2 ** 29)
    assert bf.sign_test(1, 2) == 1.0  # 2 * (1 + 3) / 8 = 1, capped at 1


def _row(bf: ModuleType, config: str, right: bool, conf: float | None, head: str = "L0.H0"
         ) -> object:
    return bf.Row(config, 0, head, "self", "self" if right else "none", False, conf)


def test_calibration_bins_every_stated_probability_once(bf: ModuleType) -> None:
    rows = [_row(bf, "a", True, 0.1), _row(bf, "a", False, 0.5), _row(bf, "a", True, 0.69),
            _row(bf, "a", True, 0.9), _row(bf, "a", False, 1.0), _row(bf, "a", True, None)]
    bins = bf.calibration(rows)
    assert [(b["from"], b["to"]) for b in bins] == [(0.0, 0.5), (0.5, 0.7), (0.7, 0.9),
                                                    (0.9, 1.0)]
    assert [b["heads"] for b in bins] == [1, 2, 0, 2]  # 1.0 in the last bin; None (baseline) out
    assert [b["accuracy"] for b in bins] == [1.0, 0.5, 0.0, 0.5]


def test_below_baseline_compares_each_configuration_on_both_splits(bf: ModuleType) -> None:
    # baseline right on every head of a and b, wrong on c
    base = [_row(bf, c, c != "c", None) for c in "abc"]
    seeds = [_row(bf, "a", True, 0.9), _row(bf, "b", False, 0.9), _row(bf, "c", True, 0.9)]
    confs = [_row(bf, "a", False, 0.9), _row(bf, "b", False, 0.9), _row(bf, "c", True, 0.9)]
    preds = {"baseline": {0.2: base}, "held-out seeds": {0.2: seeds},
             "held-out configs": {0.2: confs}}
    # a: worse only when held out by configuration; b: worse on both; c: better on both
    assert bf.below_baseline(preds, ["a", "b", "c"]) == ["a", "b"]
