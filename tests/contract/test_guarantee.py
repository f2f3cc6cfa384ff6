"""The guarantee's rules: the verification set is read once, after training; impossible clauses
are refused before training; the levers ablate as the clauses measure."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from enforcer_points import enforcement_points, trainer_state

from headwise.cli import main
from headwise.contract import EnforcementRecord, LeverKind, plan
from headwise.contract.score import reachable
from headwise.control.task_levers import AblatedMargin, StochasticAblation
from headwise.heads import Head
from headwise.hooks import ablate
from headwise.patterns import role_target
from headwise.pipeline import compile_spec
from headwise.pipeline import run as run_module
from headwise.pipeline.heldout import enforcement_data, verification_data
from headwise.runspec import load_spec
from headwise.training.checkpoint import checkpoint_dir

SPEC = """
model: {n_layers: 1, n_heads: 2, d_model: 32, vocab_size: 12, max_seq_len: 10}
data: {tasks: {copy: {length: 4}}, eval_examples: 64}
train: {steps: 40, batch_size: 16, lr: 3.0e-3, eval_every: 20, seed: 0}
contract:
  - {head: L0.H1, score: previous_token, at_least: 0.9}
"""


def test_the_verification_set_is_read_once_after_training(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    trained, reads = [], []
    real_train, real_read = run_module.train, run_module.verification_data

    def train(*args: object, **kwargs: object) -> object:
        out = real_train(*args, **kwargs)  # type: ignore[arg-type]
        trained.append(True)
        return out

    def read(compiled: object, *args: object, **kwargs: object) -> object:
        if not trained:
            raise AssertionError("the verification set was read before training ended")
        reads.append(compiled)
        return real_read(compiled, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(run_module, "train", train)
    monkeypatch.setattr(run_module, "verification_data", read)
    spec = tmp_path / "spec.yaml"
    spec.write_text(SPEC)
    assert main(["train", str(spec), "--out", str(tmp_path / "r"), "--quiet",
                 "--enforce"]) in (0, 1)
    assert len(reads) == 1


def test_the_two_held_out_sets_are_drawn_apart() -> None:
    spec = load_spec(SPEC + "probes: {long: {repeated: {half_len: 4}}}\n")
    compiled = compile_spec(spec)
    enf, ver = enforcement_data(compiled), verification_data(compiled)
    assert spec.data.verify_seed != spec.data.eval_seed
    for name in ("default", "repeated", "long"):
        a, b = enf.probes[name].tokens, ver.probes[name].tokens
        assert a.shape == b.shape and not torch.equal(a, b), name
    # No verification sequence is an enforcement sequence (the task has 8^4 contents).
    seen = {tuple(r.tolist()) for r in enf.probes["default"].tokens}
    assert sum(tuple(r.tolist()) in seen for r in ver.probes["default"].tokens) <= 2


def test_a_verify_seed_near_the_eval_seed_is_refused(tmp_path: Path,
                                                     capsys: pytest.CaptureFixture[str]) -> None:
    spec = tmp_path / "spec.yaml"
    spec.write_text(SPEC.replace("eval_examples: 64}", "eval_examples: 64, eval_seed: 5, "
                                                       "verify_seed: 7}"))
    assert main(["plan", str(spec)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("headwise plan: error: data.verify_seed: got 7, expected a seed at least")


def test_reachable_range_under_a_mask_is_the_exact_mass_bound() -> None:
    spec = load_spec(SPEC.replace("contract:", "heads:\n  L0.H0: {mask: first_token}\n"
                                               "  L0.H1: {mask: {local: {window: 2}}}\ncontract:"))
    compiled = compile_spec(spec)
    tokens = torch.randint(0, 12, (3, 9), generator=torch.Generator().manual_seed(0))
    target = role_target("previous_token", tokens, None, causal=True)
    # first_token: only query 1 can reach key 0 = its previous token; 8 defined rows (q >= 1).
    assert reachable(compiled.model, Head(0, 0), target, None) == (pytest.approx(1 / 8),
                                                                   pytest.approx(1 / 8))
    # local(2) allows self and previous: any mass on the previous key from 0 to 1.
    assert reachable(compiled.model, Head(0, 1), target, None) == (0.0, 1.0)


def test_a_clause_a_mask_makes_impossible_exits_2_before_training(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    spec = tmp_path / "spec.yaml"
    spec.write_text(SPEC.replace("contract:", "heads:\n  L0.H1: {mask: first_token}\n"
                                              "contract:"))
    for argv in (["plan", str(spec)], ["train", str(spec), "--out", str(tmp_path / "r")],
                 ["train", str(spec), "--out", str(tmp_path / "r"), "--enforce"]):
        assert main(argv) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and "error: contract[0]: L0.H1: previous_token" in err[0]
        assert "structural mask first_token" in err[0] and "[0.111, 0.111]" in err[0]
    assert not (tmp_path / "r" / "model.safetensors").exists()


GATED = """
model: {n_layers: 2, n_heads: 2, d_model: 32, vocab_size: 16, max_seq_len: 10}
data: {tasks: {copy: {length: 4}, reverse: {length: 4}}, eval_examples: 64}
train: {steps: 20, batch_size: 16, eval_every: 10}
heads:
  L1.H0: {tasks: [copy]}
contract:
  - CLAUSE
"""


@pytest.mark.parametrize("clause", [
    "{ablate: L1.H0, task: reverse, drop_at_least: 0.2}",
    "{heads: L1.H0, tasks: [reverse], exclusive: true}",
])
def test_a_drop_demanded_of_a_gated_off_head_exits_2(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], clause: str) -> None:
    spec = tmp_path / "spec.yaml"
    spec.write_text(GATED.replace("CLAUSE", clause))
    assert main(["plan", str(spec)]) == 2
    err = capsys.readouterr().err.strip()
    assert "error: contract[0]: " in err and "switch L1.H0 off on reverse" in err
    # The same drop on the task the head serves is possible.
    spec.write_text(GATED.replace("CLAUSE", clause.replace("reverse", "copy")))
    assert main(["plan", str(spec)]) == 0


@pytest.mark.parametrize("mode", ["mean", "resample"])
def test_an_ablation_clause_trains_with_the_ablation_it_is_measured_with(mode: str) -> None:
    spec = load_spec(SPEC.replace(
        "  - {head: L0.H1, score: previous_token, at_least: 0.9}",
        f"  - {{ablate: L0.H1, task: copy, mode: {mode}, drop_at_most: 0.05}}\n"
        f"  - {{ablate: L0.H0, task: copy, mode: {mode}, drop_at_least: 0.3}}"))
    compiled = compile_spec(spec)
    levers = plan(compiled.model, spec.contract, compiled.structure).levers
    spare = levers[0].objectives[0]  # type: ignore[union-attr]
    others, margin = levers[1].objectives  # type: ignore[union-attr]
    assert isinstance(spare, StochasticAblation) and isinstance(margin, AblatedMargin)
    assert (spare.mode, others.mode, margin.mode) == (mode, mode, mode)
    if mode == "resample":
        return
    # With p = 1 on one task, the lever's forward is the measurement's mean ablation with the
    # batch as its reference (headwise.hooks.ablate).
    model = compiled.model  # training mode: the lever ablates nothing in eval mode
    batch = compiled.data.sample(16, torch.Generator().manual_seed(1))
    spare.weight = 1.0
    spare.prepare(batch)
    with torch.no_grad(), model.hooks(*spare.hooks()):
        lever = model(batch.tokens, task_ids=batch.task_ids)
    with torch.no_grad(), model.hooks(*ablate(model, "L0.H1", "mean",
                                              reference=batch.tokens)):
        reference = model(batch.tokens, task_ids=batch.task_ids)
    torch.testing.assert_close(lever, reference, atol=1e-5, rtol=1e-5)
    with torch.no_grad():
        clean = model(batch.tokens, task_ids=batch.task_ids)
    assert not torch.allclose(lever, clean, atol=1e-3)


def test_an_all_of_dispensable_clause_ablates_each_head_on_its_own() -> None:
    """``all_of ... drop_at_most`` measures each head ablated alone, so its lever draws each
    head's ablation independently (the model trains with each one missing while the others
    work); ``ablate`` (the set together) draws the set as one."""
    spec = load_spec(SPEC.replace(
        "model: {n_layers: 1, n_heads: 2,", "model: {n_layers: 1, n_heads: 4,").replace(
        "  - {head: L0.H1, score: previous_token, at_least: 0.9}",
        "  - {all_of: L0.H2-3, task: copy, drop_at_most: 0.1}\n"
        "  - {ablate: L0.H0-1, task: copy, drop_at_most: 0.1}"))
    compiled = compile_spec(spec)
    levers = plan(compiled.model, spec.contract, compiled.structure).levers
    each, together = levers[0], levers[1]
    assert each is not None and together is not None
    assert [str(o.heads) for o in each.objectives] == ["L0.H2", "L0.H3"]
    assert [str(o.heads) for o in together.objectives] == ["L0.H0,L0.H1"]
    assert all(isinstance(o, StochasticAblation) for o in [*each.objectives,
                                                          *together.objectives])
    compiled.model.train()
    batch = compiled.data.sample(256, torch.Generator().manual_seed(1))
    kept = []
    for obj in each.objectives:
        obj.weight = 0.5
        obj.prepare(batch, step=7)
        kept.append(obj._keep)  # type: ignore[attr-defined]
    a, b = (k == 0 for k in kept)  # rows where each head is ablated
    # Independent draws at p = 0.5: each head alone is missing on about a quarter of the rows
    # (binomial(256, 1/4): mean 64, sd 6.9; the bounds are 5 sd wide).
    assert 30 < int((a & ~b).sum()) < 98 and 30 < int((b & ~a).sum()) < 98


def test_the_kept_model_is_the_last_evaluation_point_that_held(tmp_path: Path) -> None:
    from safetensors.torch import load_file

    spec = tmp_path / "spec.yaml"
    spec.write_text(SPEC.replace("steps: 40", "steps: 100").replace(
        "seed: 0}", "seed: 0, checkpoint_every: 20}"))
    run = tmp_path / "r"
    assert main(["train", str(spec), "--out", str(run), "--quiet", "--enforce"]) == 0
    e = json.loads((run / "enforcement.json").read_text())
    held = [p["step"] for p in e["history"] if p["passed"]]
    assert held and e["kept_step"] == held[-1]
    # The run's weights are those of the kept step's checkpoint (checkpoints every 20 steps).
    kept = load_file(str(run / "model.safetensors"))
    at = load_file(str(checkpoint_dir(run, e["kept_step"]) / "model.safetensors"))
    assert kept.keys() == at.keys() and all(torch.equal(kept[k], at[k]) for k in kept)


@pytest.mark.parametrize("on_disk", [False, True])
def test_a_later_failure_restores_the_model_of_the_last_point_that_held(
        tmp_path: Path, on_disk: bool) -> None:
    from headwise.contract import Enforcer
    from headwise.contract.results import ClauseResult, ContractResult
    from headwise.errors import CheckpointError

    spec = load_spec(SPEC)
    compiled = compile_spec(spec)
    model = compiled.model
    verdicts = iter([True, True, False])

    class Canned(Enforcer):
        def measure(self, state: object) -> ContractResult:
            passed = next(verdicts)
            return ContractResult([ClauseResult(spec.contract[0], passed,
                                                0.95 if passed else 0.5, ">= 0.9", "L0.H1")])

    levers = plan(compiled.model, spec.contract, compiled.structure).levers
    enforcer = Canned(spec.contract, enforcement_data(compiled), levers)
    state = trainer_state(model, spec.train, out_dir=tmp_path if on_disk else None)
    snapshots = {}
    for step in (10, 20, 30):  # holds at 10 and 20, fails at 30
        with torch.no_grad():
            for p in model.parameters():
                p.add_(0.01 * step)  # "training" between evaluation points
        snapshots[step] = {k: v.clone() for k, v in model.state_dict().items()}
        state.step = step
        enforcer(state)  # type: ignore[arg-type]
        assert not state.stop  # stop: end trains on
    assert enforcer.restore_kept(model, state.out_dir, EnforcementRecord.of(state.extra), 30) == 20
    assert all(torch.equal(v, snapshots[20][k]) for k, v in model.state_dict().items())
    if on_disk:  # the kept file is the one the run recorded, or it is refused
        (tmp_path / "kept.safetensors").write_bytes(b"not the kept model")
        with pytest.raises(CheckpointError, match="not the model kept at step 20"):
            enforcer.restore_kept(model, tmp_path, EnforcementRecord.of(state.extra), 30)


KV = """
model: {n_layers: 2, n_heads: 4, d_model: 32, vocab_size: 36, max_seq_len: 11}
data: {tasks: {kv_retrieval: {}}, eval_examples: 64}
train: {steps: 20, batch_size: 16, eval_every: 5}
contract:
  - {any_of: L0.H0-1, score: previous_token, at_least: 0.5}
  - {task: kv_retrieval, at_least: 0.9}
"""


def test_a_floor_that_stops_improving_switches_its_circuit_assists_on() -> None:
    from headwise.contract import EnforceConfig, Enforcer
    from headwise.contract.results import ClauseResult, ContractResult
    from headwise.control.objectives import PatternObjective

    spec = load_spec(KV)
    compiled = compile_spec(spec)
    config = EnforceConfig(assist_patience=2)
    levers = plan(compiled.model, spec.contract, compiled.structure, config=config).levers
    floor = levers[1]
    assert floor is not None
    # The retrieval circuit on heads no clause names: previous-token in L0, induction in L1.
    assert [(o.target, str(o.heads)) for o in floor.assists  # type: ignore[attr-defined]
            ] == [("previous_token", "L0.H2"), ("induction", "L1.H0")]
    assert all(isinstance(o, PatternObjective) and o.weight == 0.0 for o in floor.assists)
    assert "previous_token on L0.H2, induction on L1.H0" in floor.description
    values = iter([0.30, 0.50, 0.505, 0.507, 0.508])  # improves, then stalls

    class Canned(Enforcer):
        def measure(self, state: object) -> ContractResult:
            v = next(values)
            return ContractResult([
                ClauseResult(spec.contract[0], True, 0.9, ">= 0.5", "L0.H0"),
                ClauseResult(spec.contract[1], False, v, ">= 0.9", "the model")])

    enforcer = Canned(spec.contract, enforcement_data(compiled), levers, config)
    # the task loss's weight: 1 + the floor's multiplier (its lever's scale is 1)
    points = enforcement_points(
        enforcer, compiled.model, spec.train, (5, 10, 15, 20, 25),
        lambda state: (floor.assists[0].weight,
                       1.0 + state.extra["enforce"]["history"][-1]["clauses"]["1"]["multiplier"],
                       state.extra["enforce"]))
    weights = [w for w, _, _ in points]
    task_weights = [t for _, t, _ in points]
    # Points 1-2: no history to judge; point 3 (0.505) improved 0.005 on the best of the last
    # two (0.50): stalled, so the assists switch on from step 15 and stay on, weighted like
    # the task's loss (its weight 1 + the floor's multiplier), so the floor's rising
    # multiplier does not shrink the circuit's share of the gradient.
    assert weights[:2] == [0.0, 0.0]
    assert weights[2:] == pytest.approx([config.assist_weight * w for w in task_weights[2:]])
    assert task_weights[2] < task_weights[4]  # the multiplier kept rising while it failed
    assert points[-1][2]["assisted"] == {"1": 15}


@pytest.mark.parametrize(("clauses", "expected"), [
    # every head of L0-1 named, by floors on the circuit's own roles: the assists share them,
    # one objective per head the clause may drive (which pulls follows its choice: below)
    ("  - {any_of: L0.*, score: previous_token, at_least: 0.8}\n"
     "  - {any_of: L1.*, score: induction, at_least: 0.5}\n",
     [("previous_token", "L0.H0"), ("previous_token", "L0.H1"), ("induction", "L1.H0"),
      ("induction", "L1.H1")]),
    # floors on single heads choose nothing: the first asked head of each layer
    ("  - {head: L0.H1, score: previous_token, at_least: 0.8}\n"
     "  - {head: L0.H0, score: previous_token, at_least: 0.8}\n"
     "  - {head: L1.H1, score: induction, at_least: 0.5}\n"
     "  - {head: L1.H0, score: induction, at_least: 0.5}\n",
     [("previous_token", "L0.H0"), ("induction", "L1.H0")]),
    # a head asked for another role, or capped on this one, is not the circuit's to use
    ("  - {head: L0.H0, score: first_token, at_least: 0.5}\n"
     "  - {any_of: L0.H1, score: previous_token, at_least: 0.8}\n"
     "  - {head: L1.H0, score: induction, at_most: 0.2}\n"
     "  - {head: L1.H1, score: induction, at_least: 0.5}\n",
     [("previous_token", "L0.H1"), ("induction", "L1.H1")]),
    # no head of L1 the circuit may use: no assists
    ("  - {all_of: L1.*, score: self, at_least: 0.5}\n", []),
])
def test_circuit_assists_use_heads_the_contract_leaves_to_them(clauses, expected) -> None:
    spec = load_spec(KV.replace("n_heads: 4", "n_heads: 2").replace(
        "contract:\n  - {any_of: L0.H0-1, score: previous_token, at_least: 0.5}\n",
        "contract:\n" + clauses))
    compiled = compile_spec(spec)
    levers = plan(compiled.model, spec.contract, compiled.structure).levers
    floor = next(lv for lv in levers.values()
                 if lv is not None and lv.kind is LeverKind.TASK_WEIGHT)
    assert [(o.target, str(o.heads)) for o in floor.assists] == expected  # type: ignore[attr-defined]


def test_an_assist_pulls_the_head_its_any_of_clause_drives() -> None:
    """Where the circuit's role falls on heads an ``any_of`` floor on that role chooses among,
    the assist pulls the head the clause drives once it has chosen (the first before), so the
    assist and the clause build the role on one head."""
    from headwise.contract import EnforceConfig, Enforcer
    from headwise.contract.lever import Follows
    from headwise.contract.results import ClauseResult, ContractResult
    from headwise.control.objective import sits_out

    spec = load_spec(KV.replace("n_heads: 4", "n_heads: 2").replace(
        "contract:\n  - {any_of: L0.H0-1, score: previous_token, at_least: 0.5}\n",
        "contract:\n  - {any_of: L0.*, score: previous_token, at_least: 0.8}\n"
        "  - {any_of: L1.*, score: induction, at_least: 0.5}\n"))
    compiled = compile_spec(spec)
    config = EnforceConfig(assist_patience=1)
    levers = plan(compiled.model, spec.contract, compiled.structure, config=config).levers
    floor = levers[2]
    assert floor is not None
    heads = [str(o.heads) for o in floor.assists]  # type: ignore[attr-defined]
    assert [floor.follows[o.name] for o in floor.assists] == [
        Follows(0, "L0.H0", ("L0.H0", "L0.H1")), Follows(0, "L0.H1", ("L0.H0", "L0.H1")),
        Follows(1, "L1.H0", ("L1.H0", "L1.H1")), Follows(1, "L1.H1", ("L1.H0", "L1.H1"))]
    assert "induction on the one of L1.H0,L1.H1 contract[1] drives" in floor.description
    # at weight 0 every candidate but the first sits out of the step: nothing computed for it
    assert [sits_out(o) for o in floor.assists] == [False, True, False, True]
    # before a choice, or with one outside its options, the first option pulls
    assert [f.pulls({}) for f in floor.follows.values()] == [True, False, True, False]
    assert [f.pulls({1: "L2.H0"}) for f in floor.follows.values()][2:] == [True, False]

    class Canned(Enforcer):  # L0.H1 and L1.H1 decide their clauses; retrieval stalls
        def measure(self, state: object) -> ContractResult:
            return ContractResult([
                ClauseResult(spec.contract[0], True, 0.9, ">= 0.8", "L0.H1"),
                ClauseResult(spec.contract[1], False, 0.3, ">= 0.5", "L1.H1"),
                ClauseResult(spec.contract[2], False, 0.3, ">= 0.9", "the model")])

    enforcer = Canned(spec.contract, enforcement_data(compiled), levers, config)
    points = enforcement_points(
        enforcer, compiled.model, spec.train, (5, 10, 15),
        lambda state: ({h: o.weight for h, o in zip(heads, floor.assists, strict=True)},
                       dict(state.extra["enforce"]["chosen"])))
    weights, chosen = points[-1]
    assert chosen == {"0": "L0.H1", "1": "L1.H1"}
    assert weights["L0.H0"] == weights["L1.H0"] == 0.0
    assert weights["L0.H1"] == weights["L1.H1"] > 0.0  # on, weighted like the task's loss
    assert [sits_out(o) for o in floor.assists] == [False, False, False, False]


def test_a_failing_floor_backs_off_only_the_levers_that_degrade_its_task() -> None:
    from headwise.contract import EnforceConfig, Enforcer

    spec = load_spec(SPEC.replace("contract:", "contract:\n  - {task: copy, at_least: 0.99}\n"
                                               "  - {ablate: L0.H0, task: copy, drop_at_most: "
                                               "0.0}"))
    compiled = compile_spec(spec)
    levers = plan(compiled.model, spec.contract, compiled.structure).levers
    # 0: the copy floor, 1: the ablation clause on copy, 2: the score clause.
    assert levers[1].perturbs == {"copy"} and not levers[2].perturbs  # type: ignore[union-attr]
    enforcer = Enforcer(spec.contract, enforcement_data(compiled), levers)
    state = trainer_state(compiled.model, spec.train, step=20)
    lambdas = state.extra.setdefault("enforce", {"history": [], "multipliers": {},
                                                 "chosen": {}, "clauses": {}})["multipliers"]
    lambdas.update({"0": 1.0, "1": 2.0, "2": 4.0})
    enforcer(state)  # type: ignore[arg-type]
    point = state.extra["enforce"]["history"][0]["clauses"]
    assert not point["0"]["passed"]  # the untrained model fails the copy floor
    eta = EnforceConfig().eta
    # The ablation lever on copy's examples is halved; the role lever keeps its multiplier.
    assert point["1"]["multiplier"] == pytest.approx(
        min(max(1.0 + eta * point["1"]["aimed"], 0.0), 16.0))
    # The score clause's multiplier lives in its per-batch lever (0 at the start, whatever the
    # record held) and steps in its room (1 - 0.9), weighed as the 20 batches so far.
    rate = EnforceConfig().eta_batch * 20 / 0.1
    assert point["2"]["multiplier"] == pytest.approx(
        min(max(rate * point["2"]["aimed"], 0.0), 16.0))
    assert point["0"]["multiplier"] == pytest.approx(min(1.0 + eta * point["0"]["aimed"],
                                                         16.0))


def test_an_any_of_carrier_clause_drives_one_head_alone() -> None:
    spec = load_spec("""
model: {n_layers: 1, n_heads: 3, d_model: 48, vocab_size: 12, max_seq_len: 10}
data: {tasks: {copy: {length: 4}}, eval_examples: 64}
train: {steps: 20, batch_size: 16, eval_every: 10}
contract:
  - {any_of: L0.*, task: copy, drop_at_least: 0.3}
""")
    compiled = compile_spec(spec)
    lever = plan(compiled.model, spec.contract, compiled.structure).levers[0]
    assert lever is not None and set(lever.per_head) == {"L0.H0", "L0.H1", "L0.H2"}
    others, margin = lever.per_head["L0.H1"]
    # Some head alone must carry copy: the others of its layer ablated, then the hinge on the
    # model with that head alone zeroed (never the whole layer).
    assert isinstance(others, StochasticAblation) and isinstance(margin, AblatedMargin)
    assert [str(h) for h in others.heads] == ["L0.H0", "L0.H2"]
    assert [str(h) for h in margin.heads] == ["L0.H1"] and margin in lever.loss_terms


@pytest.mark.parametrize("confidence", [0.95, 0.5])
def test_a_clause_held_within_its_noise_keeps_its_multiplier_and_is_not_kept(
        confidence: float) -> None:
    """A clause that holds on the enforcement set by less than ``guard`` standard errors of
    its measurement is not yet safe on fresh data: its multiplier keeps rising, and the kept
    model is the last point at which every clause held past its guard. ``confidence: 0.5``
    (guard 0) is the bare bound: the multiplier falls once the clause holds at all."""
    from headwise.contract import EnforceConfig, Enforcer
    from headwise.contract.results import ClauseResult, ContractResult

    spec = load_spec(SPEC)
    compiled = compile_spec(spec)
    config = EnforceConfig(confidence=confidence)
    assert config.guard == pytest.approx(
        {0.95: 1.6448536 * 2 ** 0.5, 0.5: 0.0}[confidence], rel=1e-6)
    levers = plan(compiled.model, spec.contract, compiled.structure, config=config).levers
    # (measured, stderr): held by 0.01 with a standard error of 0.01; by 0.1; by 0.01 again.
    canned = iter([(0.91, 0.01), (1.0, 0.01), (0.91, 0.01)])

    class Canned(Enforcer):
        def measure(self, state: object) -> ContractResult:
            value, se = next(canned)
            return ContractResult([ClauseResult(spec.contract[0], True, value, ">= 0.9",
                                                "L0.H1", stderr=se)])

    enforcer = Canned(spec.contract, enforcement_data(compiled), levers, config)
    state = trainer_state(compiled.model, spec.train)
    state.extra["enforce"] = {"history": [], "multipliers": {"0": 1.0}, "chosen": {},
                              "clauses": {}}
    multipliers = []
    for step in (10, 20, 30):
        state.step = step
        enforcer(state)  # type: ignore[arg-type]
        multipliers.append(state.extra["enforce"]["multipliers"]["0"])
    first = state.extra["enforce"]["history"][0]["clauses"]["0"]
    assert first["violation"] == pytest.approx(-0.01)
    assert first["aimed"] == pytest.approx(-0.01 + config.guard * 0.01)
    # the score clause's lever measures it on every batch and holds its multiplier (0 at the
    # start, whatever the record held): at an evaluation point its step weighs as the 10
    # batches since the last, in the clause's room (1 - 0.9)
    rate = config.eta_batch * 10 / 0.1
    assert multipliers[0] == pytest.approx(max(rate * first["aimed"], 0.0))
    record = state.extra["enforce"]
    if confidence == 0.95:
        assert multipliers[0] > 0.0  # held by 0.01 < 2.33 x 0.01: still pushed
        assert [p["confident"] for p in record["history"]] == [False, True, False]
        assert record["kept_step"] == 20  # the last point past the guard, not the last held
    else:
        assert multipliers[0] == 0.0  # held: the multiplier does not rise
        assert all(p["confident"] for p in record["history"])
        # kept: the last point certified on the enforcement set, else the last past its guard
        certified = [p["step"] for p in record["history"] if p["certified"]]
        assert record["kept_step"] == (certified[-1] if certified else 30)
