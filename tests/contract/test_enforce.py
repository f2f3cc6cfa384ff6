"""Contract enforcement: a failing contract held by --enforce; the raise schedule; the levers."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch
from enforcer_points import trainer_state

from headwise.cli import main
from headwise.contract import EnforceConfig, Enforcer, LeverKind, plan
from headwise.control.objectives import PatternObjective, RoleBound
from headwise.control.task_levers import (
    PROBE_POOL,
    AblatedMargin,
    OnProbeData,
    StochasticAblation,
)
from headwise.pipeline import compile_spec
from headwise.pipeline.heldout import enforcement_data, probe_sampler
from headwise.runspec import load_spec

DEFAULTS = EnforceConfig()

# One layer, two heads, the copy task. Nothing asks L0.H1 to be a previous-token head, so a
# plain run leaves it attending elsewhere (copy needs a head looking `length` tokens back).
SPEC = """
model: {n_layers: 1, n_heads: 2, d_model: 32, vocab_size: 12, max_seq_len: 10}
data: {tasks: {copy: {length: 4}}, eval_examples: 128}
train: {steps: 120, batch_size: 32, lr: 3.0e-3, eval_every: 20, seed: 0}
contract:
  - {head: L0.H1, score: previous_token, at_least: 0.9}
"""


def test_enforce_turns_a_failing_contract_into_one_that_holds(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    spec = tmp_path / "spec.yaml"
    spec.write_text(SPEC)
    assert main(["train", str(spec), "--out", str(tmp_path / "plain"), "--quiet"]) == 1
    plain = json.loads((tmp_path / "plain" / "contract.json").read_text())
    assert not plain["passed"] and plain["clauses"][0]["measured"] < 0.9

    assert main(["train", str(spec), "--out", str(tmp_path / "enf"), "--quiet",
                 "--enforce"]) == 0
    run = tmp_path / "enf"
    verdict = json.loads((run / "contract.json").read_text())
    assert verdict["passed"] and verdict["clauses"][0]["measured"] >= 0.9
    e = json.loads((run / "enforcement.json").read_text())
    assert e["enforced"] and e["contract_holds"]
    # certified on the enforcement set at the spec's rate: one attempt, no retries/
    assert e["kept_as"] == "certified" and "attempts" not in e
    assert not (run / "retries").exists()
    (clause,) = e["clauses"]
    assert clause["index"] == 0 and clause["lever"].startswith("pattern objective (previous")
    assert clause["lever_objectives"] == ["enforce:previous_token[L0.H1][contract[0]]"]
    # Enforcement measures at its own cadence: every 10 steps (30 points in the budget, but
    # not closer than AdamW's momentum horizon), not at the 6 evaluation points (every 20).
    assert DEFAULTS.cadence(120, 20) == 10 and clause["first_failed_at"] == 10
    # Training ran its whole budget with the constraint kept, and kept the model of the last
    # enforcement point at which the contract held on the enforcement set with its guard.
    steps = [p["step"] for p in e["history"]]
    assert steps == list(range(10, 121, 10)) and e["steps"] == 120
    held = [p["step"] for p in e["history"] if p["passed"]]
    confident = [p["step"] for p in e["history"] if p["confident"]]
    certified = [p["step"] for p in e["history"] if p["certified"]]
    assert confident and certified and set(certified) | set(confident) <= set(held)
    # Kept: the last point certified on the enforcement set (bounds at the contract's level).
    assert e["held_at_step"] == held[0] == clause["held_at"] and e["kept_step"] == certified[-1]
    assert e["kept_as"] == "certified" and e["enforcement_set"]["certified"]
    assert e["enforcement_set"]["step"] == certified[-1]
    assert json.loads((run / "run.json").read_text())["step"] == certified[-1]
    first = e["history"][0]["clauses"]["0"]
    assert first["violation"] == pytest.approx(0.9 - first["measured"])
    # The multiplier steps on the violation aimed past the bound by the guard's standard errors.
    assert first["stderr"] > 0 and first["aimed"] == pytest.approx(
        first["violation"] + DEFAULTS.guard * first["stderr"])
    # The multiplier moved on every training batch before it (the clause failed on each) and
    # then stepped on the aimed violation in the clause's room (0.1), weighed as 10 batches.
    assert first["multiplier"] > DEFAULTS.eta_batch * 10 * first["aimed"] / 0.1 or \
        first["multiplier"] == DEFAULTS.lambda_max
    lines = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    early = next(x for x in lines if x["kind"] == "train" and x["step"] == 10)
    assert early["objectives"]["enforce:batch-dual"]["heads"][
        "enforce:batch-dual/contract[0]"] > 0  # before the first evaluation point (20)
    report = json.loads((run / "report.json").read_text())
    assert report["enforcement"]["held_at_step"] == e["held_at_step"]
    out = " ".join(capsys.readouterr().out.split())  # rich wraps the table's title
    assert (f"first held on the enforcement set at step {held[0]}; model kept: step "
            f"{certified[-1]} (certified on the enforcement set)") in out
    assert "on the verification set (never read during training)" in out
    # verify agrees with what train wrote (it reads the verification set too).
    assert main(["verify", str(spec), "--run", str(run)]) == 0
    assert json.loads((run / "contract.json").read_text()) == verdict

    # enforce.stop: first_hold ends training at the first evaluation point that holds.
    assert main(["train", str(spec), "--out", str(tmp_path / "first"), "--quiet",
                 "--enforce", "--set", "enforce.stop=first_hold"]) == 0
    e = json.loads((tmp_path / "first" / "enforcement.json").read_text())
    assert e["held_at_step"] == e["kept_step"] == e["history"][-1]["step"] == held[0]


def test_multipliers_follow_dual_ascent_and_a_failing_floor_backs_no_lever_off() -> None:
    spec = load_spec(SPEC.replace("contract:", "contract:\n  - {task: copy, at_least: 0.99}"))
    compiled = compile_spec(spec)
    contract = spec.contract
    levers = plan(compiled.model, contract, compiled.structure).levers
    enforcer = Enforcer(contract, enforcement_data(compiled), levers)
    state = trainer_state(compiled.model, spec.train, step=20)
    enforcer(state)  # type: ignore[arg-type]
    point = state.extra["enforce"]["history"][0]["clauses"]
    floor, score = point["0"], point["1"]
    assert not floor["passed"] and not score["passed"]  # an untrained model fails both
    assert floor["multiplier"] == pytest.approx(DEFAULTS.eta * floor["aimed"])
    # The score clause's lever measures it on every batch: its step here is in its room
    # (1 - 0.9) and weighs as the 20 batches since the start.
    rate = DEFAULTS.eta_batch * 20 / 0.1
    assert score["multiplier"] == pytest.approx(min(rate * score["aimed"], 16.0))
    # The levers follow: weight = multiplier x scale.
    (weight_lever,) = levers[0].objectives  # type: ignore[union-attr]
    (pattern,) = levers[1].objectives  # type: ignore[union-attr]
    assert weight_lever.weight == pytest.approx(floor["multiplier"])
    assert pattern.weight == pytest.approx(score["multiplier"] * levers[1].scale)  # type: ignore[union-attr]
    state.step = 40
    enforcer(state)  # type: ignore[arg-type]
    again = state.extra["enforce"]["history"][1]["clauses"]
    # The floor still fails, and the score clause's lever keeps its multiplier: each follows
    # its own violation only.
    for key, before, eta in (("0", floor, DEFAULTS.eta), ("1", score, rate)):
        assert again[key]["multiplier"] == pytest.approx(
            min(before["multiplier"] + eta * again[key]["aimed"], 16.0))
    assert not state.stop
    # The score clause fails with its multiplier at the cap, but so does the floor: the pace
    # (the factor on the learning rate) does not rise while a task has not learned.
    assert again["1"]["multiplier"] == DEFAULTS.lambda_max
    assert [p["pace"] for p in state.extra["enforce"]["history"]] == [1.0, 1.0]
    assert state.extra["lr_scale"] == 1.0
    # Without the floor, the same model and clause: the capped clause fails, so the pace
    # doubles.
    spec = load_spec(SPEC)
    alone = Enforcer(spec.contract, enforcement_data(compiled),
                     plan(compiled.model, spec.contract, compiled.structure).levers)
    state = trainer_state(compiled.model, spec.train, step=20)
    for step in (20, 40):
        state.step = step
        alone(state)  # type: ignore[arg-type]
    last = state.extra["enforce"]["history"][-1]
    assert last["clauses"]["0"]["multiplier"] == DEFAULTS.lambda_max
    assert last["pace"] == state.extra["lr_scale"] == 2.0


def test_only_a_mask_that_fixes_the_pattern_stands_in_for_a_lever(tmp_path: Path) -> None:
    """A structural mask that leaves each query one key fixes the head's pattern (no lever);
    one that leaves several only narrows it, and the head keeps its pattern objective, which
    then moves the score inside the mask: a clause a plain run fails holds enforced."""
    body = SPEC.replace("contract:", "heads:\n  L0.H0: {mask: self_only}\n"
                        "  L0.H1: {mask: {local: {window: 3}}}\ncontract:")
    spec = load_spec(body.replace("contract:\n", "contract:\n  - {head: L0.H0, score: self, "
                                  "at_least: 0.9}\n"))
    compiled = compile_spec(spec)
    planned = plan(compiled.model, spec.contract, compiled.structure)
    fixed, narrowed = planned.levers[0], planned.levers[1]
    assert fixed is not None and fixed.kind == LeverKind.STRUCTURAL and not fixed.objectives
    assert narrowed is not None and narrowed.kind == LeverKind.PATTERN
    (objective,) = narrowed.objectives
    assert isinstance(objective, PatternObjective) and [str(h) for h in objective.heads] == [
        "L0.H1"]
    path = tmp_path / "spec.yaml"
    path.write_text(body)
    for name, flags, code in (("plain", [], 1), ("enforced", ["--enforce"], 0)):
        assert main(["train", str(path), "--out", str(tmp_path / name), "--quiet",
                     *flags]) == code
        (clause,) = json.loads((tmp_path / name / "contract.json").read_text())["clauses"]
        assert (clause["measured"] >= 0.9) == (code == 0), (name, clause["measured"])


def test_plan_gives_every_clause_kind_its_lever() -> None:
    spec = load_spec("""
model: {n_layers: 2, n_heads: 4, d_model: 16, vocab_size: 24, max_seq_len: 12}
data: {tasks: {copy: {length: 4}, reverse: {length: 4}}}
train: {eval_every: 5}
heads:
  L0.H0: {mask: previous_token}
contract:
  - {head: L0.H0, score: previous_token, at_least: 0.9}
  - {any_of: L1.*, score: induction, at_least: 0.5}
  - {head: L0.H2, score: self, at_most: 0.3}
  - {head: L0.H3, score: entropy, at_least: 0.6}
  - {head: L0.H3, score: copying, at_least: 0.5}
  - {ablate: L1.H1, task: copy, drop_at_least: 0.2}
  - {ablate: L1.H2, task: reverse, drop_at_most: 0.02}
  - {heads: L1.H3, tasks: [reverse], exclusive: true}
  - {task: copy, metric: accuracy, at_least: 0.9}
  - {task: reverse, metric: accuracy, at_most: 0.99}
""")
    compiled = compile_spec(spec)
    planned = plan(compiled.model, spec.contract, compiled.structure)
    levers = planned.levers
    kinds = {i: (None if lv is None else lv.kind) for i, lv in levers.items()}
    k = LeverKind
    assert kinds == {0: k.STRUCTURAL, 1: k.PATTERN, 2: k.BOUND, 3: k.BOUND, 4: None,
                     5: k.ABLATION, 6: k.ABLATION, 7: k.ABLATION, 8: k.TASK_WEIGHT, 9: None}
    assert set(levers[1].per_head) == {"L1.H0", "L1.H1", "L1.H2", "L1.H3"}  # type: ignore[union-attr]
    (bound,) = levers[2].objectives  # type: ignore[union-attr]
    assert isinstance(bound, RoleBound) and (bound.role, bound.max) == ("self", 0.25)
    carry, need = levers[5].objectives  # type: ignore[union-attr]
    assert isinstance(carry, StochasticAblation) and isinstance(need, AblatedMargin)
    assert [str(h) for h in carry.heads] == ["L1.H0", "L1.H2", "L1.H3"] and carry.task_ids == [0]
    assert [str(h) for h in need.heads] == ["L1.H1"] and need.task_ids == [0]
    assert levers[5].loss_terms == [need]  # type: ignore[union-attr]
    # The hinge starts once the others' ablation probability is at its cap.
    assert levers[5].loss_from == pytest.approx(DEFAULTS.p_max / DEFAULTS.ablation_scale)  # type: ignore[union-attr]
    (spare,) = levers[6].objectives  # type: ignore[union-attr]
    assert [str(h) for h in spare.heads] == ["L1.H2"] and spare.task_ids == [1]
    others, need_h3, only = levers[7].objectives  # type: ignore[union-attr]
    assert (others.task_ids, need_h3.task_ids, [str(h) for h in only.heads], only.task_ids) == (
        [1], [1], ["L1.H3"], [0])
    assert all(o.weight == 0.0 and o in planned.objectives
               for lv in levers.values() if lv is not None for o in lv.objectives)


def test_enforce_refuses_a_clause_without_a_lever_unless_allowed(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    spec = tmp_path / "spec.yaml"
    spec.write_text(SPEC.replace("steps: 120", "steps: 20").replace(
        "contract:", "contract:\n  - {head: L0.H0, score: copying, at_least: 0.1}"))
    assert main(["train", str(spec), "--out", str(tmp_path / "r"), "--quiet",
                 "--enforce"]) == 2
    assert "contract[0]: no lever can move this clause" in capsys.readouterr().err
    assert main(["train", str(spec), "--out", str(tmp_path / "r"), "--quiet", "--enforce",
                 "--allow-unenforced"]) != 2  # it trains; whether it holds is not the point
    e = json.loads((tmp_path / "r" / "enforcement.json").read_text())
    assert [c["lever"] for c in e["clauses"]] == [None, "pattern objective (previous_token, "
                                                        "ce) on L0.H1"]
    assert main(["plan", str(spec)]) == 1
    out = " ".join(capsys.readouterr().out.split())
    assert "1 clause without a lever: contract[0]" in out
    # where enforcement would measure: every 10 steps (the 20-step budget's own cadence,
    # no denser than AdamW's momentum horizon; EnforceConfig.cadence)
    assert ("measured on the enforcement set (128 examples) every 10 steps of 20 "
            "(enforce.every)") in out
    assert "the verdict on the verification set (128 examples" in out
    assert ("not certified there at the end, it trains again from its initial weights at half "
            "train.lr, once (enforce.retries)") in out
    # --set applies to the spec plan reads, as train's does (here: a contract whose clause a
    # pattern objective moves)
    assert main(["plan", str(spec), "--set",
                 "contract=[{head: L0.H1, score: previous_token, at_least: 0.5}]"]) == 0
    assert "without a lever" not in capsys.readouterr().out


def test_enforce_needs_evaluation_points(tmp_path: Path,
                                         capsys: pytest.CaptureFixture[str]) -> None:
    spec = tmp_path / "spec.yaml"
    spec.write_text(SPEC.replace("eval_every: 20", "eval_every: 0"))
    assert main(["train", str(spec), "--out", str(tmp_path / "r"), "--enforce"]) == 2
    assert "train.eval_every: got 0" in capsys.readouterr().err


def _resumes_exactly(spec: Path, run: Path, killed_after: int) -> None:
    """Forget everything of the finished ``run`` after step ``killed_after``'s checkpoint, as if
    killed there: ``--resume`` must replay the same enforcement and the same weights."""
    import shutil

    from safetensors.torch import load_file

    first = json.loads((run / "enforcement.json").read_text())
    weights = load_file(str(run / "model.safetensors"))
    for step_dir in (run / "checkpoints").iterdir():
        if int(step_dir.name.split("_")[1]) > killed_after:
            shutil.rmtree(step_dir)
    (run / "model.safetensors").unlink()
    code = main(["train", str(spec), "--out", str(run), "--quiet", "--enforce", "--resume"])
    assert code == 0
    assert json.loads((run / "enforcement.json").read_text()) == first
    resumed = load_file(str(run / "model.safetensors"))
    assert all(torch.equal(resumed[k], weights[k]) for k in weights)


def test_enforcement_resumes_exactly(tmp_path: Path) -> None:
    """Kill after the last checkpoint before the contract first held (simulated), between
    enforcement points: --resume replays the same enforcement."""
    spec = tmp_path / "spec.yaml"
    spec.write_text(SPEC.replace("seed: 0}", "seed: 0, checkpoint_every: 20}"))
    run = tmp_path / "run"
    assert main(["train", str(spec), "--out", str(run), "--quiet", "--enforce"]) == 0
    held = json.loads((run / "enforcement.json").read_text())["held_at_step"]
    assert held is not None and held > 20
    _resumes_exactly(spec, run, (held - 1) // 20 * 20)


def test_a_score_clause_on_a_probe_is_enforced_on_batches_drawn_like_that_probe() -> None:
    spec = load_spec("""
model: {n_layers: 2, n_heads: 2, d_model: 16, vocab_size: 24, max_seq_len: 24}
data: {tasks: {induction: {seq_len: 20, period: [3, 8]}}}
probes: {unseen: {task: induction, period: [9, 9]}}
train: {eval_every: 5, batch_size: 8}
contract:
  - {any_of: L1.*, score: induction, at_least: 0.5, "on": unseen}
  - {any_of: L1.*, score: induction, at_least: 0.5, "on": induction}
""")
    compiled = compile_spec(spec)
    levers = plan(compiled.model, spec.contract, compiled.structure,
                  probes=probe_sampler(spec)).levers
    (on_probe,) = levers[0].per_head["L1.H0"]  # type: ignore[union-attr]
    (on_task,) = levers[1].per_head["L1.H0"]  # type: ignore[union-attr]
    assert isinstance(on_probe, OnProbeData) and isinstance(on_task, PatternObjective)
    batch = compiled.data.sample(8, torch.Generator().manual_seed(3))
    on_probe.prepare(batch)
    term, _ = on_probe.loss(batch.tokens)
    assert float(term) == 0.0  # weight 0: no extra forward, no term
    on_probe.weight = 1.0
    seen = []
    inner = on_probe.sample
    on_probe.sample = lambda n, seed: seen.append(inner(n, seed)) or seen[-1]  # type: ignore[method-assign]
    on_probe.prepare(batch)
    term, logs = on_probe.loss(batch.tokens)
    (pool,) = seen  # drawn once: PROBE_POOL batches of the probe's generator
    content = pool.tokens[:, 1:]  # [BOS, period-9 content]
    assert pool.tokens.shape == (PROBE_POOL * 8, 20) and all(
        torch.equal(r[9:], r[:-9]) for r in content)
    assert float(term.detach()) > 0
    assert list(logs) == ["enforce:induction[L1.H0][contract[0]]/L1.H0"]
    # The rows used are rows of the pool picked by hashing the training rows: the same batch
    # picks the same rows (the same term), and no second pool is drawn.
    on_probe.prepare(batch)
    again, _ = on_probe.loss(batch.tokens)
    assert len(seen) == 1 and torch.equal(again.detach(), term.detach())
    rows = on_probe._rows(batch, 0)
    assert all(any(torch.equal(r, p) for p in pool.tokens) for r in rows.tokens)


def test_levers_for_one_task_of_a_mixture_train_on_that_tasks_rows() -> None:
    """A score clause measured ``on`` a task and a floor's circuit assists act on that task's
    rows of the training batches (their objectives' ``task_id``); the plan says so. In a run
    of one task nothing is restricted."""
    spec = load_spec("""
model: {n_layers: 2, n_heads: 2, d_model: 16, vocab_size: 40, max_seq_len: 12}
data: {tasks: {copy: {length: 4}, kv_retrieval: {}}}
train: {eval_every: 5, batch_size: 8}
contract:
  - {head: L0.H0, score: previous_token, at_least: 0.8, "on": copy}
  - {task: kv_retrieval, metric: accuracy, at_least: 0.9}
""")
    compiled = compile_spec(spec)
    names = list(compiled.structure.task_names)
    levers = plan(compiled.model, spec.contract, compiled.structure).levers
    score, floor = levers[0], levers[1]
    assert score is not None and floor is not None and floor.assists
    assert [o.task_id for o in score.objectives] == [names.index("copy")]  # type: ignore[attr-defined]
    assert score.description.endswith("on copy's rows")
    assert {o.task_id for o in floor.assists} == {names.index("kv_retrieval")}  # type: ignore[attr-defined]
    one = load_spec("""
model: {n_layers: 2, n_heads: 2, d_model: 16, vocab_size: 12, max_seq_len: 12}
data: {tasks: {copy: {length: 4}}}
contract:
  - {head: L0.H0, score: previous_token, at_least: 0.8, "on": copy}
""")
    compiled = compile_spec(one)
    (obj,) = plan(compiled.model, one.contract, compiled.structure).levers[0].objectives  # type: ignore[union-attr]
    assert obj.task_id is None  # type: ignore[attr-defined]


def test_a_run_whose_multipliers_relaxed_to_zero_still_says_it_was_enforced() -> None:
    """Multipliers relax to 0 once their clauses hold with margin; ``enforced`` reads the
    history, not the final multipliers."""
    from headwise.contract import EnforcementRecord
    from headwise.contract.enforce import summary
    from headwise.contract.record import EvalPoint, PointValues
    from headwise.contract.results import ContractResult

    def point(step: int, lam: float) -> EvalPoint:
        return EvalPoint(step, lam == 0.0, lam == 0.0,
                         {0: PointValues(0.5, 0.01, -0.1, -0.1, lam, lam == 0.0, False)})
    record = EnforcementRecord([point(10, 2.0), point(20, 0.0)], {0: 0.0})
    final = ContractResult(results=[])
    assert summary(record, final, 20, 20)["enforced"] is True
    record.history = [point(10, 0.0), point(20, 0.0)]
    assert summary(record, final, 20, 20)["enforced"] is False


def test_a_clause_its_capped_multiplier_cannot_move_is_held_by_pacing_the_learning_rate(
        tmp_path: Path) -> None:
    """At a tenth of SPEC's learning rate the previous-token lever dominates L0.H1's gradient
    from the first points (multiplier at lambda_max) yet moves the head by about the learning
    rate per step (AdamW): without the pace the clause fails; with the default pace the
    learning rate doubles at each point at which the capped clause fails and is behind (at
    its recent rate it would not reach its aim in half the steps left), halves for good where
    its violation rose past twice the difference's standard error at a pace above 1, and
    halves where the contract holds."""
    spec = tmp_path / "spec.yaml"
    spec.write_text(SPEC.replace("lr: 3.0e-3", "lr: 3.0e-4").replace(
        "seed: 0}", "seed: 0, checkpoint_every: 20}"))
    runs = {}
    for name, sets in (("unpaced", ["--set", "enforce.pace_max=1"]), ("paced", [])):
        code = main(["train", str(spec), "--out", str(tmp_path / name), "--quiet", "--enforce",
                     *sets])
        runs[name] = (code, json.loads((tmp_path / name / "enforcement.json").read_text()),
                      json.loads((tmp_path / name / "contract.json").read_text()))
    code, e, verdict = runs["unpaced"]
    assert code == 1 and not verdict["passed"] and e["pace"] == []
    assert all(p["clauses"]["0"]["multiplier"] == DEFAULTS.lambda_max
               for p in e["history"] if p["step"] >= 20)
    code, e, verdict = runs["paced"]
    assert code == 0 and verdict["clauses"][0]["state"] == "certified"
    paces = [p["pace"] for p in e["history"]]
    expected, pace, ceiling, seen = [], 1.0, DEFAULTS.pace_max, []
    for point in e["history"]:
        c = point["clauses"]["0"]
        now, capped = c["aimed"], not c["passed"] and c["multiplier"] == DEFAULTS.lambda_max
        if point["passed"]:
            pace = max(pace / 2, 1.0)
        elif capped:
            before = seen[-1][1] if seen else None
            if pace > 1 and before is not None and now - before["aimed"] > 2 * math.hypot(
                    c["stderr"], before["stderr"]):
                pace = ceiling = max(pace / 2, 1.0)
            else:
                step0, first = seen[-2:][0] if seen else (None, None)
                rate = None if first is None else (first["aimed"] - now) / (point["step"] - step0)
                left = 120 - point["step"]
                if rate is None or rate <= 0 or now / rate > left / 2:
                    pace = min(2 * pace, ceiling)
        seen.append((point["step"], c))
        expected.append(pace)
    assert paces == expected and max(paces) > 1 and paces[-1] < max(paces)
    # The learning rate logged after each point is the pace times the peak rate (the schedule
    # suspended), and the schedule's own once the pace is back at 1.
    lines = [json.loads(x) for x in (tmp_path / "paced" / "metrics.jsonl").read_text().splitlines()]
    lrs = {x["step"]: x["lr"] for x in lines if x["kind"] == "train"}
    points = e["history"]
    paced = [(s, p["pace"]) for p, after in zip(points, points[1:], strict=False)
             for s in lrs if p["pace"] > 1 and p["step"] < s <= after["step"]]
    assert paced and all(lrs[s] == pytest.approx(3.0e-4 * pace) for s, pace in paced)
    # The pace is callback state: a run killed while paced resumes at the same rate, exactly.
    at = next(p["step"] for p in e["history"] if p["pace"] > 1 and p["step"] % 20 == 0)
    _resumes_exactly(spec, tmp_path / "paced", at)


def test_advice_reads_the_kept_point_not_an_early_vacuous_hold() -> None:
    """A clause that held only at the first point (a drop cap, before the task was learned)
    and fails at the kept step with its lever saturated: the sets do not disagree, its lever
    is at its limit. Held at the kept step and failing on the verification set: they do."""
    from headwise.contract import ClauseResult, EnforcementRecord, parse_contract
    from headwise.contract.enforce import summary
    from headwise.contract.record import ClauseTrack, EvalPoint, PointValues
    from headwise.contract.results import ContractResult

    (clause,) = parse_contract([{"ablate": "L0.H0", "task": "copy", "drop_at_most": 0.05}],
                               1, 2, ["copy"])
    final = ContractResult([ClauseResult(clause, False, 0.8, clause.threshold_text(), "x")])

    def point(step: int, passed: bool, saturated: bool) -> EvalPoint:
        return EvalPoint(step, passed, passed, {0: PointValues(
            0.0 if passed else 0.8, 0.01, -0.05 if passed else 0.75, 0.0, 16.0, passed,
            saturated)})
    track = ClauseTrack(0, "cap", "ablate L0.H0", ["lever"], [])
    record = EnforcementRecord([point(10, True, False), point(300, False, True)], {0: 16.0},
                               clauses={0: track})
    (item,) = summary(record, final, 300, 300)["clauses"]
    assert item["saturated"] and item["advice"].startswith("its lever saturated")
    # its circuit assisted (it stalled): the rate, not the lever, is what to change
    record.assisted = {0: 150}
    (item,) = summary(record, final, 300, 300)["clauses"]
    assert item["advice"].startswith("it stalled and its task's circuit was assisted from "
                                     "step 150: a circuit whose head reads another head's "
                                     "output forms sooner at a lower train.lr")
    record.assisted = {}
    record.history = [point(10, False, False), point(300, True, False)]
    (item,) = summary(record, final, 300, 300)["clauses"]
    assert item["advice"].startswith("it held on the enforcement set but not on the "
                                     "verification set")
