"""The ``path`` and ``circuit`` clause kinds: parsed with the model's graph, measured by path
patching (against a head's output zeroed by hand where the two are the same thing), refused
where gates make them impossible, and named as unlevered under ``--enforce``."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
import yaml

from headwise.analysis.importance import example_stats
from headwise.cli import main
from headwise.contract import plan, verify
from headwise.errors import SpecError
from headwise.hooks import ablate
from headwise.pipeline import compile_spec
from headwise.pipeline.heldout import verification_data
from headwise.pipeline.run_report import contract_circuits
from headwise.runspec import load_spec

SPEC = {
    "model": {"n_layers": 1, "n_heads": 2, "d_model": 16, "vocab_size": 12, "max_seq_len": 10,
              "attn_only": True},
    "data": {"tasks": {"copy": {"length": 3}}, "eval_examples": 32},
    "train": {"steps": 4, "batch_size": 8, "eval_every": 2},
}


def spec_with(contract: list[dict], **extra: object) -> str:
    return yaml.safe_dump({**SPEC, **extra, "contract": contract}, sort_keys=False)


def loss(model: torch.nn.Module, batch: object, hooks: list = ()) -> float:
    """The task's token-weighted loss, with ``hooks`` attached."""
    m: object = model
    with torch.no_grad(), m.hooks(*hooks):  # type: ignore[attr-defined]
        logits = model(batch.tokens, attention_mask=batch.attention_mask,  # type: ignore[attr-defined]
                       task_ids=batch.task_ids)  # type: ignore[attr-defined]
    num, count = example_stats(logits, batch.targets)["loss"]  # type: ignore[attr-defined]
    return float(num.sum() / count.sum())


def test_a_path_to_the_logits_is_the_head_zeroed_where_that_is_its_only_reader() -> None:
    """In a one-layer attention-only model a head's output reaches the logits alone, so
    ablating the edge ``L0.H1 -> logits`` (zero) equals zeroing the head's output."""
    spec = load_spec(spec_with([
        {"path": "L0.H1 -> logits", "task": "copy", "metric": "loss", "mode": "zero",
         "drop_at_least": 0.0},
        {"circuit": ["L0.H0"], "task": "copy", "metric": "loss", "mode": "zero",
         "outside_drop_at_most": 10.0}]))
    compiled = compile_spec(spec)
    data = verification_data(compiled)
    model, batch = compiled.model, data.tasks["copy"]
    with torch.no_grad():  # an untrained head barely moves the loss: make its output count
        model.blocks[0].attn.o_proj.weight.mul_(30.0)  # type: ignore[union-attr,operator]
    result = verify(model, spec.contract, data).results
    clean, zeroed = loss(model, batch), loss(model, batch, ablate(model, "L0.H1", "zero"))
    assert abs(zeroed - clean) > 1e-3  # the head matters: the comparison is not of two zeros
    assert result[0].measured == pytest.approx(zeroed - clean, abs=1e-5)
    assert result[0].details["clean"] == pytest.approx(clean, abs=1e-6)
    # the circuit of L0.H0: everything of L0.H1 is outside, so its run is L0.H1 zeroed
    assert result[1].details["circuit"] == pytest.approx(zeroed, abs=1e-5)
    assert result[1].measured == pytest.approx(zeroed - clean, abs=1e-5)
    # the report draws each path and circuit clause on the model's grid
    drawn = contract_circuits(compiled, verify(model, spec.contract, data))
    assert list(drawn) == ["contract[0] on the model's grid", "contract[1] on the model's grid"]
    assert all(png.startswith(b"\x89PNG") for png in drawn.values())


def test_a_whole_circuit_keeps_everything() -> None:
    spec = load_spec(spec_with([{"circuit": ["L0.H0", "L0.H1"], "task": "copy",
                                 "keeps_at_least": 0.99}]))
    compiled = compile_spec(spec)
    (r,) = verify(compiled.model, spec.contract, verification_data(compiled)).results
    assert r.measured == pytest.approx(1.0) and r.passed
    assert r.clause.kind == "circuit" and r.threshold == "keeps >= 0.99"


@pytest.mark.parametrize("clause, message", [
    ({"path": "L0.H1 -> L0.H0", "via": "k", "task": "copy", "drop_at_least": 0.1},
     "contract[0].path: L0.H1 -> L0.H0: the sender must be below the receiver"),
    ({"path": "embed -> L0.H0", "task": "copy", "drop_at_least": 0.1},
     "contract[0].path: embed -> L0.H0: got via None, expected q, k or v"),
    ({"path": "L0.H5 -> logits", "task": "copy", "drop_at_least": 0.1},
     "contract[0].path: got 'L0.H5'"),
    ({"path": "L0.H0 -> logits", "task": "copy"}, "contract[0]: missing bound"),
    ({"path": "L0.H0 -> logits", "task": "copy", "drop_at_least": 2}, "contract[0].drop_at_least"),
    ({"circuit": ["L0.H0"], "task": "copy", "keeps_at_least": 0.9,
      "outside_drop_at_most": 0.1}, "contract[0]: got ['keeps_at_least', 'outside_drop_at_most']"),
    ({"circuit": [], "task": "copy", "keeps_at_least": 0.9}, "contract[0].circuit: got []"),
    ({"circuit": ["L0.MLP"], "task": "copy", "keeps_at_least": 0.9},
     "contract[0].circuit[0]: got 'L0.MLP', expected an MLP of layers 0-0 (the model is "
     "attention-only)"),
])
def test_a_bad_path_or_circuit_is_named(clause: dict, message: str) -> None:
    with pytest.raises(SpecError) as e:
        load_spec(spec_with([clause]))
    assert str(e.value).startswith(message), str(e.value)


def test_under_gqa_a_key_path_names_the_kv_head_of_its_group() -> None:
    model = {**SPEC["model"], "n_layers": 2, "n_heads": 4, "n_kv_heads": 2}
    spec = load_spec(yaml.safe_dump({**SPEC, "model": model, "contract": [
        {"path": "L0.H0 -> L1.H3 via k", "task": "copy", "drop_at_most": 1.0}]}))
    (clause,) = spec.contract
    assert str(clause.edges[0]) == "L0.H0 -> L1.H2 via k"  # query heads 2 and 3 share kv 1
    assert sorted(str(h) for h in clause.heads) == ["L0.H0", "L1.H2", "L1.H3"]


def test_plan_refuses_a_path_through_a_head_gated_off_or_a_pattern_a_mask_fixes(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    spec = tmp_path / "spec.yaml"
    two = {**SPEC, "data": {"tasks": {"copy": {"length": 3}, "reverse": {"length": 3}},
                            "eval_examples": 32},
           "heads": {"L0.H0": {"tasks": ["copy"]}, "L0.H1": {"tasks": ["reverse"]}}}
    spec.write_text(yaml.safe_dump({**two, "contract": [
        {"path": "L0.H1 -> logits", "task": "copy", "drop_at_least": 0.2}]}))
    assert main(["plan", str(spec)]) == 2
    err = capsys.readouterr().err
    assert "contract[0]: path L0.H1 -> logits" in err and "switch L0.H1 off on copy" in err
    # a previous-token mask leaves each query one key: no key path can move that head's pattern
    deep = {**SPEC, "model": {**SPEC["model"], "n_layers": 2},
            "heads": {"L1.H0": {"mask": "previous_token"}}}
    for via, code in (("k", 2), ("q", 2), ("v", 0)):
        spec.write_text(yaml.safe_dump({**deep, "contract": [
            {"path": "L0.H1 -> L1.H0", "via": via, "task": "copy", "drop_at_least": 0.2}]}))
        assert main(["plan", str(spec)]) == code, via
        out = capsys.readouterr()
        if code == 2:
            assert out.err.strip().endswith(
                "L1.H0's structural mask (previous_token) leaves each query at most one key, "
                f"so its pattern cannot depend on its {via} input; expected a value path (via "
                "v) or an unmasked receiver"), out.err
    loaded = load_spec(spec)
    compiled = compile_spec(loaded)
    (lever,) = plan(compiled.model, loaded.contract, compiled.structure).levers.values()
    assert lever is not None and lever.description == (
        "ablate the other 2 edges into L1.H0 via v on copy examples; hinge on the "
        "L0.H1 -> L1.H0 via v-ablated model on copy examples")


def test_a_path_names_the_roles_it_implies_on_a_task_whose_circuit_is_known() -> None:
    spec = load_spec(yaml.safe_dump({
        "model": {"n_layers": 2, "n_heads": 2, "d_model": 16, "vocab_size": 36,
                  "max_seq_len": 11},
        "data": {"tasks": {"kv_retrieval": {}}, "eval_examples": 32},
        "train": {"steps": 4, "batch_size": 8, "eval_every": 2},
        "contract": [{"path": "L0.H1 -> L1.H0 via k", "task": "kv_retrieval",
                      "drop_at_least": 0.3},
                     {"path": "L0.H0 -> L1.H1 via v", "task": "kv_retrieval",
                      "drop_at_least": 0.3},
                     {"task": "kv_retrieval", "metric": "accuracy", "at_least": 0.8}]}))
    compiled = compile_spec(spec)
    levers = plan(compiled.model, spec.contract, compiled.structure).levers
    assert [o.name for o in levers[0].assists] == [
        "enforce:assist:previous_token[L0.H1][contract[0]]",
        "enforce:assist:induction[L1.H0][contract[0]]"]
    assert levers[0].description.endswith(
        "if it stops improving, the roles the path implies: previous_token on L0.H1, "
        "induction on L1.H0")
    assert levers[1].assists == []  # a value path implies no role
    # the floor's circuit assists build the circuit the path names, not one beside it
    assert [o.name for o in levers[2].assists] == [
        "enforce:assist:previous_token[L0.H1][contract[2]]",
        "enforce:assist:induction[L1.H0][contract[2]]"]


# One layer, two heads, copy: a plain run copies through both heads (each alone suffices), so
# the edge L0.H1 -> logits is not needed and L0.H0 matters a little.
ENFORCED = {
    "model": {"n_layers": 1, "n_heads": 2, "d_model": 32, "vocab_size": 12, "max_seq_len": 10,
              "attn_only": True},
    "data": {"tasks": {"copy": {"length": 4}}, "eval_examples": 128},
    "train": {"steps": 120, "batch_size": 32, "lr": 3.0e-3, "eval_every": 20, "seed": 0},
    "contract": [
        {"path": "L0.H1 -> logits", "task": "copy", "metric": "accuracy", "drop_at_least": 0.5},
        {"circuit": ["L0.H1"], "task": "copy", "metric": "accuracy",
         "outside_drop_at_most": 0.05}],
}


@pytest.mark.slow
def test_a_path_and_a_circuit_that_a_plain_run_fails_hold_under_enforce(tmp_path: Path) -> None:
    spec = tmp_path / "spec.yaml"
    spec.write_text(yaml.safe_dump(ENFORCED))
    verdicts = {}
    for name, extra in (("plain", []), ("enforced", ["--enforce"])):
        code = main(["train", str(spec), "--out", str(tmp_path / name), "--quiet",
                     "--no-report", *extra])
        verdicts[name] = json.loads((tmp_path / name / "contract.json").read_text())
        assert code == (1 if name == "plain" else 0)
    plain, enforced = (verdicts[k]["clauses"] for k in ("plain", "enforced"))
    assert plain[0]["measured"] < 0.5 and plain[1]["measured"] > 0.05  # both fail plain
    assert enforced[0]["measured"] >= 0.5 and enforced[1]["measured"] <= 0.05
    assert all(c["passed"] for c in enforced)  # on the verification set
    levers = json.loads((tmp_path / "enforced" / "enforcement.json").read_text())["clauses"]
    assert levers[0]["lever"].startswith("ablate the other 2 edges into logits on copy")
    assert levers[1]["lever"] == ("ablate the 4 edges outside the circuit on every copy "
                                  "example from step 0")


def test_a_path_clause_on_a_sharded_run_is_refused_before_training(tmp_path: Path) -> None:
    """Path patching reads each head's output weights whole, which FSDP shards."""
    from headwise.pipeline import RunOptions, train_run

    spec = tmp_path / "spec.yaml"
    spec.write_text(yaml.safe_dump({**SPEC, "train": {**SPEC["train"], "parallel": "fsdp"},
                                    "contract": [{"path": "L0.H1 -> logits", "task": "copy",
                                                  "drop_at_most": 0.9}]}))
    with pytest.raises(SpecError, match=r"^contract\[0\]: a path clause is measured on the "
                                        r"whole model's weights"):
        train_run(spec, tmp_path / "run", RunOptions(progress=False))
    assert not (tmp_path / "run").exists()


def test_a_circuits_lever_acts_from_the_first_step_at_a_fixed_share() -> None:
    """A circuit's outside is ablated from step 0, not from the first violation (a model that
    learned the task through other heads first stays at chance through the circuit for about a
    hundred steps): on every example for the strict part, on ``p_max`` of them for
    faithfulness; the multiplier moves neither."""
    from headwise.contract.enforce import Enforcer

    spec = load_spec(yaml.safe_dump({
        **ENFORCED, "contract": [
            {"circuit": ["L0.H1"], "task": "copy", "outside_drop_at_most": 0.05},
            {"circuit": ["L0.H0"], "task": "copy", "keeps_at_least": 0.9}]}))
    compiled = compile_spec(spec)
    levers = plan(compiled.model, spec.contract, compiled.structure).levers
    strict, kept = levers[0], levers[1]
    assert strict is not None and kept is not None
    assert (strict.start, strict.cap) == (1.0, 1.0)
    assert (kept.start, kept.cap) == (spec.enforce.p_max, spec.enforce.p_max)
    assert [o.weight for o in strict.objectives] == [1.0]  # before any evaluation point
    assert [o.weight for o in kept.objectives] == [spec.enforce.p_max]
    assert strict.description == ("ablate the 4 edges outside the circuit on every copy "
                                  "example from step 0")
    enforcer = Enforcer.__new__(Enforcer)
    enforcer.config = spec.enforce
    for lam in (0.0, 16.0):  # neither a relaxed nor a saturated multiplier moves it
        enforcer._apply(kept, lam, None, {}, True)  # type: ignore[arg-type]
        assert [o.weight for o in kept.objectives] == [spec.enforce.p_max]
    assert enforcer._saturated(kept, 0.0)  # at its limit from the start
