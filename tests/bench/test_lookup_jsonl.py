"""The suite's shipped ``lookup.jsonl`` is exactly what ``bench/lookup_jsonl.py`` generates
(6000 rows, four pairs, rows seed 0): generated data, never edited by hand."""

from __future__ import annotations

import json
from pathlib import Path

from bench.lookup_jsonl import rows

SHIPPED = Path(__file__).resolve().parents[2] / "headwise/examples/suite/lookup.jsonl"


def test_the_shipped_lookup_file_is_the_generators_output() -> None:
    want = "".join(json.dumps(r) + "\n" for r in rows(6000, 4, 0))
    assert SHIPPED.read_text(encoding="utf-8") == want
    first = json.loads(want.splitlines()[0])  # the notation the suite spec documents
    letter = first["prompt"][-1]
    pairs = first["prompt"].split(" ?")[0].split()
    assert dict((p[0], p[1]) for p in pairs)[letter] == first["completion"]
