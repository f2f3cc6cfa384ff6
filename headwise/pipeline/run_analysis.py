"""What a trained run's heads do: role scores, ablation importance per task, gates, trajectories.

``analyse_run(compiled)`` measures on the verification set
(``headwise.pipeline.heldout.verification_data``): pattern role scores on its mixture (with
each example's task id, so gates apply), the induction score on the ``repeated`` probe, the
effect of ablating each head on each task, and the gate table. A model of at most
``EXACT_ALL_MAX`` heads has every head ablated; a larger one is screened: attribution patching
estimates every head's effect on each task's loss from one backward
(``headwise.analysis.attribution``), and exact ablation measures the ``SCREEN_KEEP`` largest
per task and every head the contract or the spec's ``heads:`` section names.

``CheckpointRoleTables`` measures the same role table during training, at every evaluation
point a checkpoint follows, and keeps it in the run's callback state (each checkpoint's
``trainer.json``, entry ``extra.role_tables``): the report's trajectory reads what training
measured instead of loading and measuring every checkpoint again
(``headwise.pipeline.run_report.run_trajectory``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from headwise.analysis.attribution import attribution_importance, screen_heads
from headwise.analysis.importance import ablation_importance
from headwise.analysis.importance_matrix import ImportanceMatrix
from headwise.analysis.role_table import RoleTable
from headwise.analysis.roles import role_scores
from headwise.contract import VerifyData
from headwise.control.gates import GateTable, gate_table
from headwise.heads import HeadSet
from headwise.pipeline.compile import Compiled
from headwise.pipeline.heldout import verification_data
from headwise.render.figures import heatmap
from headwise.training import TrainState

# Models with at most this many heads have every head ablated exactly; larger ones are screened.
EXACT_ALL_MAX = 32
SCREEN_KEEP = 6  # heads per task whose exact ablation the screen keeps (with the named heads)
ROLE_TABLES = "role_tables"  # the callback-state entry: {str(step): RoleTable.to_records()}
# Roles shown for every head (the TransformerLens variants are left to the Python API).
DATA_ROLES = ("previous_token", "duplicate_token", "first_token", "self", "local", "entropy")


@dataclass
class RunAnalysis:
    """Role scores (heads x roles), ablation drops (heads x tasks), gate values (tasks x heads),
    and the attribution estimates of every head when the ablations were screened."""

    roles: RoleTable
    importance: ImportanceMatrix
    gates: GateTable | None
    estimate: ImportanceMatrix | None = None

    def to_dict(self) -> dict[str, Any]:
        return {"roles": self.roles.to_records(), "importance": self.importance.to_records(),
                "attribution": None if self.estimate is None else self.estimate.to_records(),
                "gates": None if self.gates is None else {
                    "tasks": self.gates.task_names, "heads": [str(h) for h in self.gates.heads],
                    "values": self.gates.values.tolist()}}


def analyse_run(compiled: Compiled, n_boot: int = 200,
                data: VerifyData | None = None) -> RunAnalysis:
    """Measure a compiled (trained) model on ``data`` (default its verification set; see the
    module docstring)."""
    model = compiled.model
    data = verification_data(compiled) if data is None else data
    table = run_role_table(model, data)
    cfg = compiled.spec.model.config
    estimate, heads = None, None
    if cfg.n_layers * cfg.n_heads > EXACT_ALL_MAX:
        estimate = attribution_importance(model, data.tasks)
        named = [h for c in compiled.spec.contract.clauses for h in c.heads]
        named += [h for rule in compiled.spec.heads for h in rule.heads]
        heads = HeadSet(screen_heads(estimate, SCREEN_KEEP, named), cfg.n_layers, cfg.n_heads)
    importance = ablation_importance(model, data.tasks, heads=heads, n_boot=n_boot)
    gates = gate_table(model, list(compiled.task_names)) if compiled.gates is not None else None
    return RunAnalysis(table, importance, gates, estimate)


def run_role_table(model: nn.Module, data: VerifyData) -> RoleTable:
    """The role table ``headwise analyze`` shows: data roles on the held-out mixture, induction
    on the ``repeated`` probe. Trajectories and forecasts score every checkpoint with this too,
    so a run's last trajectory point is its role table."""
    model.eval()
    with torch.no_grad():
        batch = data.probes["default"]
        table = role_scores(model, batch.tokens, batch.attention_mask, roles=list(DATA_ROLES),
                            task_ids=batch.task_ids)
        if "repeated" in data.probes:
            rep = data.probes["repeated"]
            ind = role_scores(model, rep.tokens, roles=["induction"], task_ids=rep.task_ids)
            table = _join(table, ind)
    return table


class CheckpointRoleTables:
    """A training callback: the run's role table (``run_role_table`` on ``data``, the
    verification set) at every evaluation point a checkpoint follows, recorded in
    ``TrainState.extra[ROLE_TABLES]`` by step, so that each checkpoint carries the tables of
    itself and of the checkpoints before it.

    Put it after any callback that may stop training (a stopped run checkpoints where it
    stops). Runs without checkpoints measure nothing.
    """

    def __init__(self, data: VerifyData) -> None:
        self.data = data

    def __call__(self, state: TrainState) -> None:
        c = state.config
        checkpointed = bool(c.checkpoint_every) and (
            state.step % c.checkpoint_every == 0 or state.step == c.steps or state.stop)
        if state.out_dir is None or not checkpointed:
            return
        table = run_role_table(state.model, self.data)
        state.extra.setdefault(ROLE_TABLES, {})[str(state.step)] = table.to_records()


def _join(a: RoleTable, b: RoleTable) -> RoleTable:
    """Columns of ``b`` appended to ``a`` (same heads)."""
    values = torch.cat([a.values, b.values], dim=1)
    return RoleTable(list(a.heads), [*a.roles, *b.roles], values,
                     {**a.info, "induction_probe": b.info})


def metrics_lines(run_dir: Path) -> list[dict[str, Any]]:
    """The lines of ``metrics.jsonl`` (empty when there is none)."""
    import json

    path = Path(run_dir) / "metrics.jsonl"
    if not path.is_file():
        return []
    out = []
    for line in path.read_text().splitlines():
        try:
            record = json.loads(line)
        except json.JSONDecodeError:  # a line cut short by a kill; later lines still count
            continue
        if isinstance(record, dict):
            out.append(record)
    return out


def role_heatmap_png(model: nn.Module, batch: Any) -> bytes:
    """The report's role-score figure (heads x ``DATA_ROLES``) of ``model`` on ``batch``, as
    PNG; a pipeline run logs it to TensorBoard at checkpoints (``train(figures=...)``)."""
    table = role_scores(model, batch.tokens, batch.attention_mask, roles=list(DATA_ROLES),
                        task_ids=batch.task_ids)
    values = [[None if math.isnan(v) else v for v in row] for row in table.values.tolist()]
    return heatmap(values, "role scores (heads x roles)", table.roles,
                   [str(h) for h in table.heads], vmin=0, vmax=1, annotate=True)
