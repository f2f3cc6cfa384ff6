"""The registry of clause kinds: one entry per kind, asked in this order which kind a raw
clause is (``preserve``, ``path`` and ``circuit`` first, then ``exclusive`` before ``score``
before ``ablation`` before ``task``: a path clause has drop bounds and an ablation clause names
a task too)."""

from __future__ import annotations

from headwise.contract import ablation, circuit, exclusive, path, preserve, score, task
from headwise.contract.kind import ClauseKind

KINDS: dict[str, ClauseKind] = {k.name: k for k in (preserve.KIND, path.KIND, circuit.KIND,
                                                     exclusive.KIND, score.KIND,
                                                     ablation.KIND, task.KIND)}
EVERY_KEY = sorted(set().union(*(k.keys for k in KINDS.values())))
