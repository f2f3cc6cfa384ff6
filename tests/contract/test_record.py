"""The enforcement record: typed in the enforcer, JSON only in the checkpoint, and the JSON it
writes reads back to the same record (a resumed run continues from exactly what was saved)."""

from __future__ import annotations

import json

from headwise.contract import EnforcementRecord
from headwise.contract.record import ClauseTrack, EvalPoint, PointValues


def _record() -> EnforcementRecord:
    point = EvalPoint(20, False, False, {
        0: PointValues(0.41, 0.02, 0.49, 0.56, 2.24, False, False),
        3: PointValues(None, None, 1.0, 1.0, None, False, False)})
    track = ClauseTrack(0, "L0.H1: previous_token >= 0.9", "pattern objective", ["obj"], [],
                        first_failed_at=20, failed_evals=1,
                        best={"step": 20, "violation": 0.49, "value": 0.41})
    return EnforcementRecord([point], {0: 2.24}, {0: "L0.H1"}, {0: track}, {0: 20},
                             desaturated={3: [10, 40], 4: [20, None]}, held_at=None,
                             kept_step=None)


def test_the_json_form_reads_back_to_the_same_record() -> None:
    record = _record()
    text = json.dumps(record.to_dict())  # what a checkpoint's trainer.json holds
    assert EnforcementRecord.from_dict(json.loads(text)) == record


def test_json_keys_are_the_clause_indices_as_strings() -> None:
    d = _record().to_dict()
    assert set(d["multipliers"]) == {"0"} and set(d["history"][0]["clauses"]) == {"0", "3"}
    assert d["assisted"] == {"0": 20} and d["chosen"] == {"0": "L0.H1"}
    assert d["desaturated"] == {"3": [10, 40], "4": [20, None]}
    assert "kept_step" not in d and "held_at" not in d  # only what was decided is written


def test_a_run_not_yet_evaluated_has_an_empty_record() -> None:
    assert EnforcementRecord.of({}) == EnforcementRecord()
    assert EnforcementRecord.from_dict(None).history == []
