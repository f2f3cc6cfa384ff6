"""The pace's rule on batch windows (headwise.contract.pace), against hand-computed windows."""

from __future__ import annotations

import json
import math

from headwise.contract.pace import ENTRY, WINDOW, Pace
from headwise.training import LR_SCALE


def _window(pace: Pace, step: int, values: list[float], capped: bool = True) -> int:
    """Feed one window of one clause's violations; returns the step after it."""
    assert len(values) == WINDOW
    for v in values:
        step += 1
        pace.on_batches(step, [v], [capped], 8.0)
    return step


def test_a_capped_clause_doubles_the_pace_at_each_window_end_up_to_pace_max() -> None:
    pace, step = Pace(), 0
    for _ in range(5):
        step = _window(pace, step, [0.5] * WINDOW)
    assert pace.changes == [[WINDOW, 2.0], [2 * WINDOW, 4.0], [3 * WINDOW, 8.0]]
    assert pace.pace == 8.0


def test_nothing_moves_the_pace_below_the_cap_or_where_the_clause_holds_on_average() -> None:
    pace, step = Pace(), 0
    step = _window(pace, step, [0.5] * WINDOW, capped=False)  # the multiplier can still rise
    step = _window(pace, step, [0.3, -0.5] * (WINDOW // 2))  # mean -0.1: holds on average
    assert pace.pace == 1.0 and pace.changes == []


def test_a_rise_past_twice_its_standard_error_halves_the_pace_for_good() -> None:
    pace, step = Pace(), 0
    noisy = [0.40, 0.44] * (WINDOW // 2)  # mean 0.42, sample sd 0.0211, standard error 0.0067
    for _ in range(3):
        step = _window(pace, step, noisy)
    assert pace.pace == 8.0
    # A rise of 0.01 against twice the difference's standard error, 2 hypot(0.0067, 0.0067)
    # = 0.019, is noise: no halving.
    se = math.sqrt(sum((v - 0.42) ** 2 for v in noisy) / (WINDOW - 1) / WINDOW)
    assert 0.01 < 2 * math.hypot(se, se)
    step = _window(pace, step, [v + 0.01 for v in noisy])
    assert pace.pace == 8.0 and pace.ceiling is None
    # A rise of 0.1 is not: the pace halves and never again exceeds the halved value.
    step = _window(pace, step, [v + 0.11 for v in noisy])
    assert pace.pace == 4.0 and pace.ceiling == 4.0
    for _ in range(2):
        step = _window(pace, step, [v + 0.11 for v in noisy])
    assert pace.pace == 4.0


def test_a_blocked_pace_ignores_the_batches_and_eases_to_one() -> None:
    pace = Pace(pace=4.0, blocked=True)
    _window(pace, 0, [0.5] * WINDOW)
    assert pace.pace == 4.0
    pace.ease(20)
    pace.ease(40)
    pace.ease(60)
    assert pace.pace == 1.0 and pace.changes == [[20, 2.0], [40, 1.0]]


def test_the_state_round_trips_through_json_in_the_middle_of_a_window() -> None:
    pace, step = Pace(), 0
    step = _window(pace, step, [0.5] * WINDOW)
    for v in (0.2, 0.3, 0.7):
        step += 1
        pace.on_batches(step, [v], [True], 8.0)
    extra: dict = {}
    pace.save(extra)
    assert extra[LR_SCALE] == 2.0
    again = Pace.of(json.loads(json.dumps(extra)))
    assert again == pace and again.window.n == 3
    assert json.loads(json.dumps(extra))[ENTRY] == extra[ENTRY]
