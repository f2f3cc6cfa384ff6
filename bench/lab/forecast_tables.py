"""Tables and statistics of the role forecast benchmark (``bench_forecast``): accuracy per
configuration, confusion, head-by-head sign tests against the baseline, calibration.

Every function reads ``Row`` lists, one row per head and forecaster, and prints markdown or
returns plain numbers; nothing here trains or fits.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

from bench.lab.scoring import sign_test
from headwise.analysis.role_table import SHOWN_MIN_SCORE
from headwise.forecast.roles import calibration as forecast_calibration

FRACTIONS = (0.1, 0.2, 0.4)  # shares of a run's checkpoints a forecast may read


class Row(NamedTuple):
    """One head's forecast: its run and head, final role, forecast, whether its final top score
    is within ``NEAR`` of the threshold, and the forecast's probability (``None``: baseline)."""

    config: str
    seed: int
    head: str
    truth: str
    forecast: str
    near: bool
    confidence: float | None


Rows = list[Row]
NEAR = 0.05

# forecaster name -> fraction of checkpoints seen -> one row per head
Preds = dict[str, dict[float, Rows]]


def acc(rows: Rows, config: str | tuple[str, ...] | None = None) -> tuple[float, int]:
    """Accuracy and head count of ``rows`` (of one configuration, of several, or all)."""
    wanted = (config,) if isinstance(config, str) else config
    sel = [row for row in rows if wanted is None or row.config in wanted]
    return sum(row.truth == row.forecast for row in sel) / max(1, len(sel)), len(sel)


def columns(configs: Sequence[str], base: tuple[str, ...]
            ) -> list[tuple[str, str | tuple[str, ...]]]:
    """Table columns: each base configuration, then the suite's together (with --suite)."""
    cols: list[tuple[str, str | tuple[str, ...]]] = [(c, c) for c in base]
    suite = tuple(c for c in configs if c not in base)
    if suite:
        cols += [(f"suite ({len(suite)} configs)", suite), ("the four above", base)]
    return cols


def print_accuracy(preds: Preds, configs: Sequence[str], base: tuple[str, ...]) -> None:
    """The accuracy table: per fraction and forecaster, per configuration and overall."""
    cols = columns(configs, base)
    print("| checkpoints seen | forecaster | " + " | ".join(c for c, _ in cols) + " | overall |")
    print("|---|---|" + "---|" * (len(cols) + 1))
    for frac in FRACTIONS:
        for scheme, by_frac in preds.items():
            cells = []
            for _, which in cols:
                a, n = acc(by_frac[frac], which)
                cells.append(f"{a:.1%} ({n})")
            a, n = acc(by_frac[frac])
            print(f"| first {frac:.0%} | {scheme} | " + " | ".join(cells)
                  + f" | **{a:.1%}** ({n}) |")


def print_suite(preds: Preds, configs: Sequence[str], base: tuple[str, ...]) -> None:
    """Accuracy at 20% on each suite configuration (with --suite)."""
    suite = [c for c in configs if c not in base]
    if not suite:
        return
    print("\nAt 20%, each suite configuration (heads in brackets)\n")
    print("| forecaster | " + " | ".join(c.removeprefix("suite-") for c in suite) + " |")
    print("|---|" + "---|" * len(suite))
    for scheme, by_frac in preds.items():
        print(f"| {scheme} | " + " | ".join(
            f"{acc(by_frac[0.2], c)[0]:.0%} ({acc(by_frac[0.2], c)[1]})" for c in suite) + " |")


def print_confusion(rows: Rows, title: str) -> None:
    """Rows: final role; columns: forecast."""
    from headwise.forecast.roles import CLASSES

    print(f"\nConfusion at 20% ({title}; rows: final role, columns: forecast)\n")
    print("| final \\ forecast | " + " | ".join(CLASSES) + " |")
    print("|---|" + "---|" * len(CLASSES))
    for t in CLASSES:
        counts = [sum(1 for row in rows if row.truth == t and row.forecast == p)
                  for p in CLASSES]
        if sum(counts):
            print(f"| {t} | " + " | ".join(str(c) for c in counts) + " |")


def print_paired(preds: Preds, schemes: list[str], configs: Sequence[str]) -> None:
    """Per configuration at 20%: each forecaster against the baseline on the same heads: heads
    only it gets right (wins), heads only the baseline gets right (losses), the sign test."""
    base = {(r.config, r.seed, r.head): r.truth == r.forecast for r in preds["baseline"][0.2]}
    print("\nAt 20%, against the baseline head by head (wins / losses: heads only the "
          "forecaster / only the baseline gets right; p: exact sign test)\n")
    print("| configuration | " + " | ".join(f"{s}: wins / losses (p)" for s in schemes) + " |")
    print("|---|" + "---|" * len(schemes))
    for config in configs:
        cells = []
        for scheme in schemes:
            rows = [r for r in preds[scheme][0.2] if r.config == config]
            right = [(r.truth == r.forecast, base[r.config, r.seed, r.head]) for r in rows]
            wins = sum(1 for f, b in right if f and not b)
            losses = sum(1 for f, b in right if b and not f)
            cells.append(f"{wins} / {losses} ({sign_test(wins, losses):.2g})")
        print(f"| {config.removeprefix('suite-')} | " + " | ".join(cells) + " |")


def calibration(rows: Rows) -> list[dict[str, float]]:
    """The forecaster's calibration over ``rows`` (``headwise.forecast.roles.calibration``;
    rows without a stated probability, the baseline's, are left out)."""
    return forecast_calibration([(r.confidence, r.truth == r.forecast) for r in rows
                                 if r.confidence is not None])


def print_calibration(preds: Preds, schemes: list[str]) -> None:
    """At 20%: how often a forecast is right, by the probability it states."""
    print("\nCalibration at 20%: share of forecasts right (heads), by stated probability\n")
    bins = calibration([])
    print("| forecaster | " + " | ".join(f"[{b['from']:.1f}, {b['to']:.1f}"
                                        f"{']' if b['to'] == 1 else ')'}" for b in bins) + " |")
    print("|---|" + "---|" * len(bins))
    for scheme in schemes:
        print(f"| {scheme} | " + " | ".join(f"{b['accuracy']:.1%} ({b['heads']})"
                                            for b in calibration(preds[scheme][0.2])) + " |")


def print_near(preds: Preds) -> None:
    """How many heads end within ``NEAR`` of the threshold, and the errors among them (20%)."""
    rows = preds["baseline"][0.2]
    n_near = sum(1 for row in rows if row.near)
    print(f"\n{n_near} of {len(rows)} heads end with a top score within {NEAR} of "
          f"{SHOWN_MIN_SCORE}; errors at 20% among them / among the others:")
    for scheme in ("baseline", "held-out seeds", "held-out configs"):
        if scheme in preds:
            r = preds[scheme][0.2]
            near = sum(1 for row in r if row.near and row.truth != row.forecast)
            far = sum(1 for row in r if not row.near and row.truth != row.forecast)
            print(f"- {scheme}: {near} / {far} (accuracy on the others "
                  f"{1 - far / max(1, len(r) - n_near):.1%})")


def below_baseline(preds: Preds, configs: Sequence[str]) -> list[str]:
    """The configurations on which the forecaster, held out by seed or by configuration, is
    less accurate than the baseline at 20% of checkpoints (point estimates; the sign tests of
    ``print_paired`` say which differences are more than chance)."""
    base = preds["baseline"][0.2]
    return [c for c in configs
            if any(acc(preds[s][0.2], c)[0] < acc(base, c)[0]
                   for s in ("held-out seeds", "held-out configs"))]
