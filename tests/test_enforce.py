"""Contract enforcement: a failing contract held by --enforce; the raise schedule; the levers."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from headwise.cli import main
from headwise.enforce import Enforcer, prepare_levers
from headwise.pipeline import compile_spec
from headwise.pipeline.run import contract_of, verify_data
from headwise.spec import load_spec

# One layer, two heads, the copy task. Nothing asks L0.H1 to be a previous-token head, so a
# plain run leaves it attending elsewhere (copy needs a head looking `length` tokens back).
SPEC = """
model: {n_layers: 1, n_heads: 2, d_model: 32, vocab_size: 12, max_seq_len: 10}
data: {tasks: {copy: {length: 4}}, eval_examples: 128}
train: {steps: 120, batch_size: 32, lr: 3.0e-3, eval_every: 20, seed: 0}
contract:
  - {head: L0.H1, score: previous_token, at_least: 0.9}
"""


@pytest.fixture(autouse=True)
def _one_thread() -> None:
    torch.set_num_threads(1)


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
    (clause,) = e["clauses"]
    lever = "enforce:previous_token[L0.H1]"
    assert clause["index"] == 0 and clause["lever"] == [lever]
    assert clause["raises"] >= 1 and clause["initial_weights"] == {lever: 0.0}
    assert clause["weights"][lever] >= 1.0
    # Training stopped at the evaluation point where the contract first held.
    assert e["held_at_step"] == e["history"][-1]["step"] < 120
    assert e["cost_steps"] == e["held_at_step"] - clause["first_raised_at"] > 0
    report = json.loads((run / "report.json").read_text())
    assert report["enforcement"]["cost_steps"] == e["cost_steps"]
    out = capsys.readouterr().out
    assert "enforcement: contract held at step" in out
    # verify agrees with what train wrote.
    assert main(["verify", str(spec), "--run", str(run)]) == 0


def test_raise_schedule_doubles_from_start_and_is_capped() -> None:
    enforcer = Enforcer(contract=None, data=None, levers={},  # type: ignore[arg-type]
                        factor=2.0, max_factor=8.0, start_weight=0.5)
    added = SimpleNamespace(name="added", weight=0.0)
    given = SimpleNamespace(name="given", weight=0.25)
    base: dict[str, float] = {}
    seen_added = [enforcer._raise(added, base) for _ in range(6)]
    seen_given = [enforcer._raise(given, base) for _ in range(6)]
    assert seen_added == [0.5, 1.0, 2.0, 4.0, 4.0, 4.0]  # 0 -> start, then x2 up to 8 x 0.5
    assert seen_given == [0.5, 1.0, 2.0, 2.0, 2.0, 2.0]  # x2 up to 8 x 0.25


def test_levers_reuse_objectives_and_skip_masked_heads_and_upper_bounds() -> None:
    spec = load_spec("""
model: {n_layers: 1, n_heads: 4, d_model: 16, vocab_size: 12, max_seq_len: 10}
data: {tasks: {copy: {length: 4}}}
train: {eval_every: 5}
heads:
  L0.H0: {mask: previous_token}
  L0.H1: {objective: {target: previous_token, weight: 0.3}}
contract:
  - {head: L0.H0, score: previous_token, at_least: 0.9}
  - {head: L0.H1, score: previous_token, at_least: 0.9}
  - {head: L0.H2, score: self, at_least: 0.5}
  - {head: L0.H3, score: self, at_most: 0.5}
  - {head: L0.H3, score: entropy, at_least: 0.1}
""")
    compiled = compile_spec(spec)
    given = compiled.objectives[0]
    levers = prepare_levers(compiled, contract_of(spec))
    assert set(levers) == {1, 2}  # masked head, upper bound and a role without target: none
    assert levers[1] == [given]
    (added,) = levers[2]
    assert (added.target, added.weight, added.name) == ("self", 0.0, "enforce:self[L0.H2]")
    assert added in compiled.objectives and spec.heads[0].heads[0] not in compiled.levers


def test_added_lever_never_clashes_with_a_spec_objective(tmp_path: Path) -> None:
    """A clause on a head whose own objective has another target gets a second objective."""
    spec = tmp_path / "spec.yaml"
    spec.write_text(SPEC.replace("train:", "heads: {L0.H1: {objective: {target: self, "
                                          "weight: 0.1}}}\ntrain:").replace("steps: 120",
                                                                            "steps: 20"))
    assert main(["train", str(spec), "--out", str(tmp_path / "r"), "--quiet",
                 "--enforce"]) in (0, 1)
    e = json.loads((tmp_path / "r" / "enforcement.json").read_text())
    assert e["clauses"][0]["lever"] == ["enforce:previous_token[L0.H1]"]


def test_enforcer_raises_only_failing_clauses() -> None:
    spec = load_spec(SPEC)
    compiled = compile_spec(spec)
    contract = contract_of(spec)
    levers = prepare_levers(compiled, contract)
    enforcer = Enforcer(contract, verify_data(compiled), levers)
    state = SimpleNamespace(step=20, model=compiled.model, extra={}, stop=False)
    enforcer(state)  # type: ignore[arg-type]
    # An untrained head is no previous-token head: the clause fails and its lever starts.
    assert levers[0][0].weight == 1.0
    assert state.extra["enforce"]["history"] == [
        {"step": 20, "passed": False, "failed": [0],
         "raised": {"enforce:previous_token[L0.H1]": 1.0}}]
    assert not state.stop


def test_enforce_needs_evaluation_points(tmp_path: Path,
                                         capsys: pytest.CaptureFixture[str]) -> None:
    spec = tmp_path / "spec.yaml"
    spec.write_text(SPEC.replace("eval_every: 20", "eval_every: 0"))
    assert main(["train", str(spec), "--out", str(tmp_path / "r"), "--enforce"]) == 2
    assert "train.eval_every: got 0" in capsys.readouterr().err


def test_enforcement_resumes_exactly(tmp_path: Path) -> None:
    """Kill after the step-40 checkpoint (simulated): --resume replays the same enforcement."""
    import shutil

    from safetensors.torch import load_file

    spec = tmp_path / "spec.yaml"
    spec.write_text(SPEC.replace("seed: 0}", "seed: 0, checkpoint_every: 20}"))
    run = tmp_path / "run"
    assert main(["train", str(spec), "--out", str(run), "--quiet", "--enforce"]) == 0
    first = json.loads((run / "enforcement.json").read_text())
    weights = load_file(str(run / "model.safetensors"))
    held = first["held_at_step"]
    assert held is not None and held > 20
    # Forget everything after the previous evaluation point, as if killed there.
    for step_dir in (run / "checkpoints").iterdir():
        if int(step_dir.name.split("_")[1]) > held - 20:
            shutil.rmtree(step_dir)
    (run / "model.safetensors").unlink()
    assert main(["train", str(spec), "--out", str(run), "--quiet", "--enforce", "--resume"]) == 0
    again = json.loads((run / "enforcement.json").read_text())
    assert again == first
    resumed = load_file(str(run / "model.safetensors"))
    assert all(torch.equal(resumed[k], weights[k]) for k in weights)
