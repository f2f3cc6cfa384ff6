"""A run's report: analysis of the trained heads, contract, enforcement and training curves.

``write_run_report`` gathers what ``headwise.report.build_report`` renders (role scores,
ablation importance, the contract verdicts, the enforcement summary, the attention viewer of
the heads the contract names, score trajectories over the run's checkpoints, the training
curves of ``metrics.jsonl``, expected vs observed patterns of masked and supervised heads, a
walkthrough of one gated head) and the gate table; it writes ``report.json`` and the
self-contained ``report.html`` into the run directory. Tokens are named as everywhere else
(``headwise.pipeline.run_tokens``).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch import nn

from headwise.analysis.circuit import circuit_edges
from headwise.analysis.explain import explain_head
from headwise.analysis.role_table import RoleTable
from headwise.analysis.trajectories import Trajectory
from headwise.atomic import hold_lock
from headwise.contract import ContractResult, VerifyData, verify
from headwise.contract.forecast import forecast_summary
from headwise.errors import CheckpointError, SelectorError, SpecError
from headwise.heads import HeadSet, select_heads
from headwise.hooks.graph import Edge
from headwise.jsonfile import read_json_object
from headwise.patterns import DEFAULT_WINDOW
from headwise.pipeline.compile import Compiled
from headwise.pipeline.finished import load_compiled, run_checkpoints, verdict_examples
from headwise.pipeline.heldout import verification_data
from headwise.pipeline.loaded_run import MAX_CONTRACT_BYTES
from headwise.pipeline.reverify import fresh_verdicts
from headwise.pipeline.run_analysis import (
    ROLE_TABLES,
    analyse_run,
    metrics_lines,
    run_role_table,
)
from headwise.pipeline.run_dir import SEALED_FILES
from headwise.pipeline.run_tokens import spec_token_names
from headwise.render import figures
from headwise.report.build import build_report, expected_vs_observed, write_report
from headwise.report.circuit_figure import circuit_figure
from headwise.report.sections import training_curves
from headwise.report.viewer import (
    MAX_TOKENS,
    MAX_VIEWER_HEADS,
    AttentionViewer,
    attention_viewer,
)
from headwise.training import load_weights
from headwise.training.manifest import check_sealed, seal

# Structural masks that impose a role (the mask is the role's support, headwise.patterns).
MASK_ROLES = {"previous_token": "previous_token", "self_only": "self",
              "first_token": "first_token", "local": "local"}


# What a report's progress callback receives: the phase starting, phases done, phases in all.
Progress = Callable[[str, int, int], None]
PHASES = ("attention viewer", "role scores and importance", "trajectories", "patterns and "
          "walkthroughs", "writing report.html")


def write_run_report(run_dir: Path, compiled: Compiled, contract: ContractResult | None,
                     enforcement: dict[str, Any] | None = None,
                     heads: str | None = None,
                     progress: Progress | None = None) -> dict[str, Path]:
    """Analyse the trained model in ``compiled`` and write ``run_dir/report.{json,html}``,
    sealed in the run's manifest (holding the run's writer lock).

    ``heads``: a selector of the heads the attention viewer shows (``headwise report
    --heads``); default those the contract and the spec's ``heads:`` name, else every head
    (at most ``MAX_VIEWER_HEADS``). ``progress(phase, done, total)`` is called as each of the
    ``PHASES`` starts.

    Raises:
        CheckpointError: ``metrics.jsonl`` or ``enforcement.json`` is not the one the run's
            manifest seals (naming it).
        StorageError: another process is writing the run.
    """
    run_dir = Path(run_dir)
    with hold_lock(run_dir):
        check_sealed(run_dir, SEALED_FILES)  # the files a report quotes are the run's own
        paths = _write_run_report(run_dir, compiled, contract, enforcement, heads,
                                  progress or (lambda phase, done, total: None))
        seal(run_dir, [p.name for p in paths.values()], optional=True)  # rebuilt on demand
    return paths


def _write_run_report(run_dir: Path, compiled: Compiled, contract: ContractResult | None,
                      enforcement: dict[str, Any] | None, heads: str | None,
                      progress: Progress) -> dict[str, Path]:
    spec = compiled.spec
    model = compiled.model
    model.eval()
    names = spec_token_names(spec, run_dir)
    progress(PHASES[0], 0, len(PHASES))
    attention, note = report_attention(compiled, heads, names)
    progress(PHASES[1], 1, len(PHASES))
    data = verification_data(compiled)  # drawn once for every section that measures
    analysis = analyse_run(compiled, data=data)
    progress(PHASES[2], 2, len(PHASES))
    trajectory = run_trajectory(run_dir, compiled, analysis.roles, data)
    progress(PHASES[3], 3, len(PHASES))
    meta: dict[str, Any] = {"spec": str(run_dir / "spec.yaml"),
                            "tasks": ", ".join(compiled.task_names),
                            "train.steps": spec.train.steps}
    lines = metrics_lines(run_dir)
    curve = [r for r in lines if r.get("kind") == "eval"]
    if curve:
        last = curve[-1]
        for name, m in last.get("tasks", {}).items():
            meta[f"eval-batch accuracy: {name}"] = m.get("accuracy")
        meta["trained steps"] = last.get("step")
    report = build_report(
        title=f"headwise report: {_title(spec.text) or run_dir.name}",
        model_config=spec.model.config, roles=analysis.roles,
        importance=[analysis.importance, *([analysis.estimate] if analysis.estimate else [])],
        contract=None if contract is None else contract.to_dict(),
        reverified=fresh_verdicts(run_dir), trajectory=trajectory,
        forecast=_forecast(trajectory, compiled, enforcement is not None),
        supervised=_supervised(compiled, names), walkthroughs=_walkthroughs(compiled, names),
        attention=attention, attention_note=note, training=training_curves(lines),
        enforcement=(None if enforcement is None
                     else json.loads(json.dumps(enforcement, default=str))), meta=meta)
    progress(PHASES[4], 4, len(PHASES))
    extra = {}
    if analysis.gates is not None:
        report["gates"] = analysis.to_dict()["gates"]
        g = analysis.gates
        extra["task gates (tasks x heads; 1 = the head serves the task)"] = figures.heatmap(
            g.values.tolist(), "task gates", [str(h) for h in g.heads], g.task_names,
            vmin=0, vmax=1, annotate=True)
    extra.update(contract_circuits(compiled, contract))
    return write_report(report, run_dir, extra)


def contract_circuits(compiled: Compiled, contract: ContractResult | None) -> dict[str, bytes]:
    """A circuit figure per clause of the verdict that names edges (path and circuit clauses),
    on the model's grid: the edges it names weighted by its measured value, the edges among
    the nodes it names (a circuit of heads) drawn alike; the title says what was measured
    against which bound."""
    if contract is None:
        return {}
    cfg: Any = compiled.model.config
    out = {}
    for r in contract.results:
        c = r.clause
        if not c.edges:
            continue
        value = "not measured" if r.measured is None else f"{r.measured:.3f}"
        weight = abs(r.measured or 0.0) or 1.0
        named = [e for e in c.edges if isinstance(e, Edge)]
        edges = (dict.fromkeys(named, weight) if len(named) == len(c.edges) else
                 dict.fromkeys(circuit_edges(compiled.model, [str(x) for x in c.edges]), 1.0))
        out[f"{c.path} on the model's grid"] = circuit_figure(
            edges, cfg.n_layers, cfg.n_heads, title=f"{c.path}: {c.describe()}, {value} "
            f"({c.threshold_text()})", has_mlp=not cfg.attn_only)
    return out


def report_existing_run(run_dir: str | Path, heads: str | None = None,
                        progress: Progress | None = None) -> dict[str, Path]:
    """Rebuild ``report.{json,html}`` of a finished run from its files (``heads``,
    ``progress``: as ``write_run_report``). The contract's verdict is the run's own sealed
    ``contract.json`` (measured once, after training); a run without one is verified here.

    Raises:
        SpecError: ``heads`` is not a selector of the run's model (naming ``--heads``).
    """
    run_dir = Path(run_dir)
    compiled = load_compiled(run_dir)
    report_heads(compiled, heads)  # a bad selector is refused before any measurement
    spec = compiled.spec
    verdict = None
    if spec.contract:
        verdict = _sealed_verdict(run_dir, compiled)
        if verdict is None:
            verdict = verify(compiled.model, spec.contract, verification_data(
                compiled, examples=verdict_examples(run_dir, compiled)))
    enforcement = None
    if (run_dir / "enforcement.json").exists():
        check_sealed(run_dir, ["enforcement.json"])
        enforcement = read_enforcement(run_dir / "enforcement.json")
    return write_run_report(run_dir, compiled, verdict, enforcement, heads, progress)


def _sealed_verdict(run_dir: Path, compiled: Compiled) -> ContractResult | None:
    """The verdict the run measured on its weights (``contract.json``, checked against the
    run's manifest: the same weights and verification set give the same numbers), or
    ``None`` when the run has none."""
    file = run_dir / "contract.json"
    if not file.is_file():
        return None
    check_sealed(run_dir, [file.name])
    data = read_json_object(file, CheckpointError, MAX_CONTRACT_BYTES)
    return ContractResult.from_dict(data, compiled.spec.contract, str(file))


_OPT_INT, _OPT_NUM, _OPT_STR = (int, type(None)), (int, float, type(None)), (str, type(None))
_CLAUSE_FIELDS = {"index": (int,), "description": (str,), "failed_evals": (int,),
                  "first_failed_at": _OPT_INT, "held_at": _OPT_INT, "multiplier": _OPT_NUM,
                  "lever": _OPT_STR}


def read_enforcement(path: Path) -> dict[str, Any]:
    """A run's ``enforcement.json``, with every field the report quotes checked.

    Raises:
        CheckpointError: not a JSON object of the shape ``headwise.contract.summary`` writes
            (naming the file and the field).
    """
    data = read_json_object(path, CheckpointError)

    def bad(field: str, expected: str) -> CheckpointError:
        return CheckpointError(f"{path}: {field}: expected {expected}")

    if type(data.get("steps")) is not int:
        raise bad("steps", "an integer")
    if not isinstance(data.get("held_at_step"), _OPT_INT):
        raise bad("held_at_step", "an integer or null")
    for key in ("clauses", "history"):
        if not isinstance(data.get(key), list) or not all(isinstance(c, dict)
                                                          for c in data[key]):
            raise bad(key, "a list of objects")
    for i, clause in enumerate(data["clauses"]):
        for name, types in _CLAUSE_FIELDS.items():
            if not isinstance(clause.get(name), types) or isinstance(clause.get(name), bool):
                raise bad(f"clauses[{i}].{name}", " or ".join(
                    "null" if t is type(None) else t.__name__ for t in types))
    attempts = data.get("attempts")
    if attempts is not None:
        if not isinstance(attempts, list) or not all(
                isinstance(a, dict) and isinstance(a.get("dir"), str)
                and isinstance(a.get("lr"), (int, float)) and not isinstance(a.get("lr"), bool)
                and isinstance(a.get("kept_as"), _OPT_STR) for a in attempts):
            raise bad("attempts", "a list of objects with 'dir', 'lr' and 'kept_as'")
        if type(data.get("attempt")) is not int or not 1 <= data["attempt"] <= len(attempts):
            raise bad("attempt", f"an integer in [1, {len(attempts)}]")
    for i, point in enumerate(data["history"]):
        if type(point.get("step")) is not int or not isinstance(point.get("clauses"), dict) \
                or not all(isinstance(k, str) and k.isdigit() and isinstance(v, dict)
                           for k, v in point["clauses"].items()):
            raise bad(f"history[{i}]", "an object with an integer 'step' and 'clauses' by "
                                       "clause index")
    return data


def _title(text: str) -> str | None:
    for line in text.splitlines():
        if line.startswith("name:"):
            return line.split(":", 1)[1].strip().strip("'\"") or None
    return None


def run_trajectory(run_dir: Path, compiled: Compiled, final: RoleTable | None = None,
                   data: VerifyData | None = None) -> Trajectory | None:
    """The role table (``run_role_table``) at every checkpoint of ``run_dir``; ``None`` without
    checkpoints.

    A checkpoint whose table training recorded (``CheckpointRoleTables``: the latest
    checkpoint's ``trainer.json`` holds them all) takes it, without loading its weights; the
    others are loaded and measured on ``data`` (default the verification set). Among those, a
    checkpoint whose weights are the run's final weights takes ``final`` (that model's role
    table, already measured) instead of a second measurement. The model's final weights are
    restored afterwards.

    Raises:
        CheckpointError: a checkpoint's weights or recorded tables are corrupt (naming the
            file).
    """
    from headwise.training.sharded_checkpoint import load_checkpoint_weights  # torch.distributed

    ckpts = run_checkpoints(Path(run_dir))
    if not ckpts:
        return None
    recorded = recorded_role_tables(ckpts[-1][1])
    tables = {step: recorded[step] for step, _ in ckpts if step in recorded}
    missing = [(step, path) for step, path in ckpts if step not in recorded]
    if not missing:
        return Trajectory(sorted(tables.items()))
    model = compiled.model
    data = verification_data(compiled) if data is None else data
    weights = {k: v.detach().clone() for k, v in model.state_dict().items()}

    def is_final(m: nn.Module) -> bool:
        state = m.state_dict()
        return state.keys() == weights.keys() and all(torch.equal(state[k], weights[k])
                                                      for k in weights)

    try:
        with torch.no_grad():
            for step, path in missing:
                load_checkpoint_weights(model, path)  # a corrupt one is refused, naming the file
                tables[step] = (final if final is not None and is_final(model)
                                else run_role_table(model, data))
    finally:
        load_weights(model, Path(run_dir) / "model.safetensors")
    return Trajectory(sorted(tables.items()))


def recorded_role_tables(checkpoint: Path) -> dict[int, RoleTable]:
    """The role tables training recorded up to ``checkpoint`` (``CheckpointRoleTables``), by
    step; empty when it recorded none (a run trained without them).

    Raises:
        CheckpointError: ``trainer.json`` differs from the checkpoint's manifest, or its entry
            ``extra.role_tables`` is not role-table records by step (naming the file).
    """
    file = checkpoint / "trainer.json"
    if not file.is_file():
        return {}
    if (checkpoint / "shards").is_dir():  # a sharded checkpoint is read whole or refused
        from headwise.training.sharded_checkpoint import read_sharded_meta  # torch.distributed

        read_sharded_meta(checkpoint)
    check_sealed(checkpoint, [file.name])
    extra = read_json_object(file, CheckpointError).get("extra")
    entry = extra.get(ROLE_TABLES) if isinstance(extra, dict) else None
    if entry is None:
        return {}
    where = f"{file}: extra.{ROLE_TABLES}"
    if not isinstance(entry, dict):
        raise CheckpointError(f"{where}: expected an object of role tables by step")
    out = {}
    for step, records in entry.items():
        try:
            out[int(step)] = RoleTable.from_records(records)
        except (TypeError, ValueError, KeyError, AttributeError):
            raise CheckpointError(f"{where}.{step}: expected a step and a list of role-table "
                                  "records ({layer, head, role: score or null})") from None
    return out


def _forecast(traj: Trajectory | None, compiled: Compiled, enforced: bool
              ) -> dict[str, Any] | None:
    """The packaged forecasters' view from the first 20% of checkpoints (with the contract)."""
    from headwise.forecast.role_scores import load_role_score_forecaster
    from headwise.forecast.roles import load_forecaster

    if traj is None or len(traj.steps) < 2:
        return None
    spec = compiled.spec
    return forecast_summary(traj, load_forecaster(), 0.2, None,
                            spec.contract if spec.contract else None,
                            load_role_score_forecaster(),
                            {"enforced": enforced, "context": compiled.spec.forecast_context})


def _first_example(compiled: Compiled, task: int) -> tuple[torch.Tensor, int]:
    batch = compiled.eval_batch
    rows = (batch.task_ids == task).nonzero().flatten()
    row = int(rows[0]) if rows.numel() else 0
    length = (int(batch.attention_mask[row].sum()) if batch.attention_mask is not None
              else batch.tokens.shape[1])
    return batch.tokens[row, :length], int(batch.task_ids[row])


def report_heads(compiled: Compiled, selector: str | None) -> tuple[HeadSet, str]:
    """The heads a run's attention viewer shows, and how they were chosen (in words).

    ``selector`` (``report --heads``) if given; else the heads the contract's clauses and the
    spec's ``heads:`` rules name; else every head; at most ``MAX_VIEWER_HEADS`` of them.

    Raises:
        SpecError: ``selector`` is not a selector of the run's model (naming ``--heads``).
    """
    model = compiled.model
    cfg = compiled.spec.model.config
    if selector is not None:
        try:
            chosen = select_heads(model, selector, "--heads")
        except SelectorError as e:
            raise SpecError(f"--heads: {e}") from None
        note = f"the heads {selector} (--heads)"
    else:
        named = {h for clause in compiled.spec.contract.clauses for h in clause.heads}
        named |= {h for rule in compiled.spec.heads for h in rule.heads}
        chosen = HeadSet(sorted(named), cfg.n_layers, cfg.n_heads) if named else \
            HeadSet.all(cfg.n_layers, cfg.n_heads)
        note = ("the heads named by the contract or the spec's heads: section" if named
                else "every head")
    shown = sorted(chosen)[:MAX_VIEWER_HEADS]
    if len(shown) < len(chosen):
        note += f" (the first {MAX_VIEWER_HEADS} of {len(chosen)}; choose with --heads)"
    return HeadSet(shown, cfg.n_layers, cfg.n_heads), f"Showing {note}."


def report_attention(compiled: Compiled, selector: str | None,
                     names: Callable[[torch.Tensor], list[str]]) -> tuple[AttentionViewer, str]:
    """The viewer of the report's heads (``report_heads``) on the first held-out example,
    its tokens spelled by ``names``, and how the heads were chosen.

    Raises:
        SpecError: as ``report_heads``.
    """
    heads, note = report_heads(compiled, selector)
    tokens, task = _first_example(compiled, 0)
    tokens = tokens[:MAX_TOKENS]
    viewer = attention_viewer(compiled.model, tokens, heads, labels=names(tokens),
                              title="attention of the report's heads on the first held-out "
                              "example", task_ids=torch.tensor([task]))
    return viewer, note


def _supervised(compiled: Compiled, names: Callable[[torch.Tensor], list[str]]
                ) -> list[dict[str, Any]]:
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
                                            labels=names(tokens),
                                            task_ids=torch.tensor([task])))
    return out


def _walkthroughs(compiled: Compiled, names: Callable[[torch.Tensor], list[str]]
                  ) -> list[Any]:
    """A walkthrough of the first head assigned to a task, on that task's first example."""
    for rule in compiled.spec.heads:
        if rule.tasks:
            tokens, task_id = _first_example(compiled, compiled.task_names.index(rule.tasks[0]))
            return [explain_head(compiled.model, tokens, rule.heads[0],
                                 labels=names(tokens),
                                 task_ids=torch.tensor([task_id]))]
    return []
