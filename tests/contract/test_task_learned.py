"""A task that learned nothing from its input: the input-blind answers, and the advice."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch

from headwise.cli import main
from headwise.contract.task import input_blind
from headwise.data import IGNORE


def test_input_blind_answers_each_position_with_its_most_common_target() -> None:
    x = IGNORE
    targets = torch.tensor([[3, 5, x], [3, 6, x], [4, 5, 7], [3, 5, x]])
    # Position 0: 3 three times of 4; position 1: 5 three times of 4; position 2: 7 once of 1.
    assert input_blind(targets, "accuracy") == pytest.approx((3 + 3 + 1) / 9)
    # Loss: the targets' own distribution at each position, token-weighted.
    column = -(3 * math.log(3 / 4) + math.log(1 / 4))
    assert input_blind(targets, "loss") == pytest.approx(2 * column / 9)
    # Exact: the rows whose every scored target is the blind answer [3, 5, 7]: rows 0 and 3.
    assert input_blind(targets, "exact") == pytest.approx(2 / 4)
    assert math.isnan(input_blind(torch.full((2, 3), IGNORE), "accuracy"))


SPEC = """
model: {n_layers: 1, n_heads: 2, d_model: 32, vocab_size: 12, max_seq_len: 10}
data: {tasks: {copy: {length: 4}}, eval_examples: 128}
train: {steps: STEPS, batch_size: 32, lr: 3.0e-3, eval_every: 10, seed: 0}
contract:
  - {task: copy, metric: exact, at_least: 0.999}
  - {ablate: L0.H0, task: copy, drop_at_least: 0.9}
"""


@pytest.mark.parametrize("steps", [1, 30])
def test_a_failing_clause_on_a_task_that_never_started_says_so(tmp_path: Path,
                                                             steps: int) -> None:
    """After one step copy is at chance: both clauses on it fail, and the advice names the
    task, not a lever; after 30 steps copy has begun to learn (past the input-blind answers,
    far from the floor) and the advice is the levers' again."""
    spec = tmp_path / "spec.yaml"
    spec.write_text(SPEC.replace("STEPS", str(steps)))
    run = tmp_path / "run"
    assert main(["train", str(spec), "--out", str(run), "--quiet", "--enforce",
                 "--no-report"]) == 1
    verdict = json.loads((run / "contract.json").read_text())
    floor = verdict["clauses"][0]
    blind = floor["details"]["input_blind"]
    advice = [c["advice"] for c in json.loads((run / "enforcement.json").read_text())["clauses"]
              if not c["holds_at_end"]]
    started = floor["ci"][0] > blind
    assert started == (steps > 1), (floor["ci"], blind)
    if started:
        assert not any("did not learn" in a for a in advice)
    else:
        assert len(advice) == 2
        assert all(a.startswith("copy did not learn: its exact") for a in advice)


def test_a_plain_run_and_verify_name_a_task_that_never_started(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    spec = tmp_path / "spec.yaml"
    spec.write_text(SPEC.replace("STEPS", "1"))
    run = tmp_path / "run"
    assert main(["train", str(spec), "--out", str(run), "--quiet", "--no-report"]) == 1
    assert main(["verify", str(spec), "--run", str(run)]) == 1
    out = " ".join(capsys.readouterr().out.split())
    assert out.count("copy did not learn: its exact (contract[0], ") == 2
