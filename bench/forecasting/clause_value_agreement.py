"""Do a clause forecast's probability and value agree? Scored on recorded runs.

For every clause of the runs ``clause_trajectories.py`` recorded at ``--seeds`` and every
fraction of the packaged forecaster, prints the share of forecasts whose value lies on the
other side of the clause's bound from the probability's verdict (value holds vs P >= 0.5; an
exclusive clause's value against its floor only), the share whose 90% interval is the value's
whole range, the median interval width over that range (clauses of a finite range), and the
mean absolute error of the value in the clause's ``scale``. Run at two commits, it compares
two ways of forming the value; the probability, accuracy and calibration are
``bench_clause_forecast.py --score``'s.

    .venv/bin/python -m bench.forecasting.clause_value_agreement --seeds 18 19 [--data DIR]
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
from pathlib import Path

from bench.lab.clause_scoring import DEFAULT_DATA, trajectories
from headwise.forecast.clauses import load_clause_forecasters


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--data", type=Path, default=DEFAULT_DATA)
    p.add_argument("--seeds", type=int, nargs="+", required=True)
    args = p.parse_args()
    runs = [json.loads(f.read_text()) for s in args.seeds
            for f in sorted((args.data / f"seed{s}").glob("*.json"))]
    trajs = [t for run in runs for _, t in trajectories(run)]
    print(f"seeds {args.seeds}: {len(trajs)} clauses\n")
    print("| from the first | value on the other side from P | interval = whole range | "
          "median width / range | mean abs error / scale |")
    print("|---|---:|---:|---:|---:|")
    for model in load_clause_forecasters().models:
        other = whole = 0
        widths, errors = [], []
        for t in trajs:
            f = model.forecast(t)
            at_most = None if t.context.get("kind") == "exclusive" else t.at_most
            holds = ((t.at_least is None or f.value >= t.at_least)
                     and (at_most is None or f.value <= at_most))
            other += holds != (f.probability >= 0.5)
            errors.append(abs(f.value - (t.final or 0.0)) / t.scale)
            if math.isfinite(t.high - t.low):
                whole += f.interval == (t.low, t.high)
                widths.append((f.interval[1] - f.interval[0]) / (t.high - t.low))
        n = len(trajs)
        print(f"| {model.fraction:.0%} | {other / n:.3f} | {whole / n:.3f} | "
              f"{statistics.median(widths):.3f} | {statistics.mean(errors):.3f} |")


if __name__ == "__main__":
    main()
