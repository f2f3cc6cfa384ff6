"""The registry of clause kinds: one entry per kind, asked in this order which kind a raw
clause is (``preserve`` first, then ``exclusive`` before ``score`` before ``ablation`` before
``task``: an ablation clause also names a task)."""

from __future__ import annotations

from headwise.contract import ablation, exclusive, preserve, score, task
from headwise.contract.kind import ClauseKind

KINDS: dict[str, ClauseKind] = {k.name: k for k in (preserve.KIND, exclusive.KIND, score.KIND,
                                                     ablation.KIND, task.KIND)}
EVERY_KEY = sorted(set().union(*(k.keys for k in KINDS.values())))
