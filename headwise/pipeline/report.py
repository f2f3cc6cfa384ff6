"""A run's report: analysis of the trained heads, contract, enforcement and training curves.

``write_run_report`` gathers what ``headwise.analysis.build_report`` renders (role scores,
ablation importance, the contract verdicts, score trajectories over the run's checkpoints,
expected vs observed patterns of masked and supervised heads, a walkthrough of one gated head)
and adds the enforcement summary, the gate table and held-out accuracy curves; it writes
``report.json`` and the self-contained ``report.html`` into the run directory.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch
from torch import nn

from headwise.analysis import figures
from headwise.analysis.explain import explain_head
from headwise.analysis.report import build_report, expected_vs_observed, write_report
from headwise.analysis.trajectories import Trajectory, score_checkpoints
from headwise.analysis.verify import ContractResult
from headwise.data import TASKS
from headwise.data.batch import token_labels
from headwise.patterns import DEFAULT_WINDOW
from headwise.pipeline.analyze import analyse_run, metrics_curve, run_role_table
from headwise.pipeline.compile import Compiled
from headwise.pipeline.heldout import contract_of, verify_data
from headwise.pipeline.run import load_run
from headwise.training import list_checkpoints, load_weights
from headwise.training.sharded_checkpoint import load_checkpoint_weights

# Structural masks that impose a role (the mask is the role's support, headwise.patterns).
MASK_ROLES = {"previous_token": "previous_token", "self_only": "self",
              "first_token": "first_token", "local": "local"}


def write_run_report(run_dir: Path, compiled: Compiled, contract: ContractResult | None,
                     enforcement: dict[str, Any] | None = None) -> dict[str, Path]:
    """Analyse the trained model in ``compiled`` and write ``run_dir/report.{json,html}``."""
    run_dir = Path(run_dir)
    spec = compiled.spec
    model = compiled.model
    model.eval()
    analysis = analyse_run(compiled)
    trajectory = run_trajectory(run_dir, compiled)
    meta: dict[str, Any] = {"spec": str(run_dir / "spec.yaml"),
                            "tasks": ", ".join(compiled.task_names),
                            "train.steps": spec.train.steps}
    curve = metrics_curve(run_dir)
    if curve:
        last = curve[-1]
        for name, m in last.get("tasks", {}).items():
            meta[f"held-out accuracy: {name}"] = m.get("accuracy")
        meta["trained steps"] = last.get("step")
    if enforcement is not None:
        meta.update(_enforcement_meta(enforcement))
    report = build_report(
        title=f"headwise report: {_title(spec.text) or run_dir.name}",
        model_config=spec.model.config, roles=analysis.roles, importance=analysis.importance,
        contract=contract, trajectory=trajectory, forecast=_forecast(trajectory, compiled),
        supervised=_supervised(compiled), walkthroughs=_walkthroughs(compiled), meta=meta)
    if enforcement is not None:
        report["enforcement"] = json.loads(json.dumps(enforcement, default=str))
    if analysis.gates is not None:
        report["gates"] = analysis.to_dict()["gates"]
    extra = {}
    if curve:
        steps = [r["step"] for r in curve]
        series = {name: [r["tasks"].get(name, {}).get("accuracy") for r in curve]
                  for name in compiled.task_names}
        extra["held-out accuracy per task during training"] = figures.lines(
            steps, series, "held-out accuracy", ylabel="accuracy")
    if enforcement is not None and enforcement.get("history"):
        extra.update(_enforcement_figures(enforcement))
    if analysis.gates is not None:
        g = analysis.gates
        extra["task gates (tasks x heads; 1 = the head serves the task)"] = figures.heatmap(
            g.values.tolist(), "task gates", [str(h) for h in g.heads], g.task_names,
            vmin=0, vmax=1, annotate=True)
    return write_report(report, run_dir, extra)


def report_existing_run(run_dir: str | Path) -> dict[str, Path]:
    """Rebuild ``report.{json,html}`` of a finished run from its files."""
    from headwise.analysis.verify import verify

    run_dir = Path(run_dir)
    compiled = load_run(run_dir)
    spec = compiled.spec
    verdict = None
    if spec.contract:
        contract = contract_of(spec)
        verdict = verify(compiled.model, contract, verify_data(compiled))
    enforcement = None
    if (run_dir / "enforcement.json").is_file():
        enforcement = json.loads((run_dir / "enforcement.json").read_text())
    return write_run_report(run_dir, compiled, verdict, enforcement)


def _title(text: str) -> str | None:
    for line in text.splitlines():
        if line.startswith("name:"):
            return line.split(":", 1)[1].strip().strip("'\"") or None
    return None


def _enforcement_figures(e: dict[str, Any]) -> dict[str, bytes]:
    """Each clause's violation and Lagrange multiplier at every evaluation point."""
    history = e["history"]
    steps = [p["step"] for p in history]
    keys = sorted({k for p in history for k in p["clauses"]}, key=int)
    out = {}
    for field, label in (("violation", "violation (> 0: fails)"),
                         ("multiplier", "Lagrange multiplier")):
        series = {f"contract[{k}]": [p["clauses"].get(k, {}).get(field) for p in history]
                  for k in keys}
        out[f"enforcement: each clause's {label} per evaluation point"] = figures.lines(
            steps, series, f"enforcement: {label}", ylabel=field, ylim=None)
    return out


def _enforcement_meta(e: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {"enforcement: steps": e["steps"],
                           "enforcement: contract held at step": e["held_at_step"]}
    for c in e["clauses"]:
        lam = c.get("multiplier")
        out[f"enforcement: contract[{c['index']}] {c['description']}"] = (
            f"lever: {c.get('lever') or 'none'}; failed at {c['failed_evals']} evaluation(s) "
            f"from step {c['first_failed_at']}; multiplier "
            f"{'-' if lam is None else f'{lam:.2f}'}; held from step {c['held_at']}")
    return out


def run_trajectory(run_dir: Path, compiled: Compiled) -> Trajectory | None:
    """The role table (``run_role_table``) at every checkpoint of ``run_dir``; ``None`` without
    checkpoints. The model's final weights are restored afterwards."""
    ckpts = list_checkpoints(run_dir)
    if not ckpts:
        return None
    model, data = compiled.model, verify_data(compiled)
    final = Path(run_dir) / "model.safetensors"

    def models() -> Iterator[tuple[int, nn.Module]]:
        for step, path in ckpts:
            load_checkpoint_weights(model, path)  # a corrupt one is refused, naming the file
            yield step, model

    try:
        with torch.no_grad():
            return score_checkpoints(models(), lambda m: run_role_table(m, data))
    finally:
        load_weights(model, final)


def _forecast(traj: Trajectory | None, compiled: Compiled) -> dict[str, Any] | None:
    """The packaged forecaster's view from the first 20% of checkpoints (with the contract)."""
    from headwise.analysis.forecast import load_forecaster
    from headwise.analysis.forecast_contract import forecast_summary

    if traj is None or len(traj.steps) < 2:
        return None
    spec = compiled.spec
    return forecast_summary(traj, load_forecaster(), 0.2, None,
                            contract_of(spec) if spec.contract else None)


def _first_example(compiled: Compiled, task: int) -> tuple[torch.Tensor, int]:
    batch = compiled.eval_batch
    rows = (batch.task_ids == task).nonzero().flatten()
    row = int(rows[0]) if rows.numel() else 0
    length = (int(batch.attention_mask[row].sum()) if batch.attention_mask is not None
              else batch.tokens.shape[1])
    return batch.tokens[row, :length], int(batch.task_ids[row])


def _supervised(compiled: Compiled) -> list[dict[str, Any]]:
    """Expected vs observed pattern of each masked or objective-trained head (first example)."""
    tokens, task = _first_example(compiled, 0)
    out = []
    for rule in compiled.spec.heads:
        if rule.objective is not None:
            target, params = rule.objective.target, dict(rule.objective.params)
        elif rule.mask is not None and rule.mask.name in MASK_ROLES:
            target, params = MASK_ROLES[rule.mask.name], dict(rule.mask.params)
        else:
            continue
        for head in rule.heads:
            out.append(expected_vs_observed(compiled.model, tokens, head, target,
                                            window=params.get("window", DEFAULT_WINDOW),
                                            task_ids=torch.tensor([task])))
    return out


def _labels(compiled: Compiled, tokens: torch.Tensor) -> list[str] | None:
    """Token names for figures' axes: synthetic tasks' specials, markers and symbols; ``None``
    (ids) for text tasks, whose ids belong to their own vocabulary."""
    if any(TASKS[t.task].starts_with_bos is False for t in compiled.spec.data.tasks):
        return None
    markers = dict(zip(compiled.spec.data.markers, compiled.task_names, strict=False))
    return token_labels(tokens, markers)


def _walkthroughs(compiled: Compiled) -> list[Any]:
    """A walkthrough of the first head assigned to a task, on that task's first example."""
    names = compiled.task_names
    for rule in compiled.spec.heads:
        if rule.tasks:
            tokens, task_id = _first_example(compiled, names.index(rule.tasks[0]))
            return [explain_head(compiled.model, tokens, rule.heads[0],
                                 labels=_labels(compiled, tokens),
                                 task_ids=torch.tensor([task_id]))]
    return []
