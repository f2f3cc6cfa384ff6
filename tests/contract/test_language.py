"""A contract written as users write it trains and verifies: exit 0 or 1 (a verdict), never 2."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from headwise.cli import main

SPEC = """
model: {n_layers: 2, n_heads: 2, d_model: 32, vocab_size: 24, max_seq_len: 24, attn_only: true}
data:
  tasks:
    induction: {seq_len: 20, period: [3, 8]}
  eval_examples: 64
probes:
  unseen: {task: induction, period: [9, 9], examples: 32}
train: {steps: 30, batch_size: 16, lr: 3.0e-3, eval_every: 15, seed: 0}
contract:
  - {task: induction, metric: accuracy, at_least: 0.05}
  - {task: induction, metric: loss, at_most: 50}
  - {any_of: L1.*, score: induction, at_least: 0.0, on: induction}
  - {any_of: L1.*, score: induction, at_most: 1.0, on: unseen}
  - {any_of: L0.*, score: previous_token, at_least: 0.0, on: repeated}
"""


def test_task_floors_bare_on_unseen_probe_and_task_data_train_and_verify(
        tmp_path: Path) -> None:
    torch.set_num_threads(1)
    spec = tmp_path / "spec.yaml"
    spec.write_text(SPEC)
    run = tmp_path / "run"
    code = main(["train", str(spec), "--out", str(run), "--quiet"])
    assert code in (0, 1)  # a verdict, not a refusal (2)
    verdict = json.loads((run / "contract.json").read_text())
    assert verdict["n_clauses"] == 5 and (code == 0) == verdict["passed"]
    by = {c["index"]: c for c in verdict["clauses"]}
    # Every clause was measured (the induction score is defined on the task's own BOS data).
    assert all(c["measured"] is not None for c in by.values())
    assert by[2]["details"]["probe"] == "induction" and by[3]["details"]["probe"] == "unseen"
    assert by[0]["ci"] is not None and by[0]["ci"][0] <= by[0]["measured"] <= by[0]["ci"][1]
    # Bounds 0 <= score <= 1 always hold for a measured score.
    assert by[2]["passed"] and by[3]["passed"] and by[4]["passed"]
    assert main(["verify", str(spec), "--run", str(run)]) == code


@pytest.mark.parametrize("value", ["yes", "on", "off", "no"])
def test_yaml_1_1_words_are_strings_where_a_boolean_is_expected(
        tmp_path: Path, value: str, capsys: pytest.CaptureFixture[str]) -> None:
    spec = tmp_path / "spec.yaml"
    spec.write_text(SPEC.replace("contract:", f"heads: {{L0.H0: {{freeze: {value}}}}}\n"
                                              "contract:"))
    assert main(["train", str(spec), "--out", str(tmp_path / "r"), "--quiet"]) == 2
    assert "heads.L0.H0.freeze: got 'yes', expected true or false".replace(
        "yes", value) in capsys.readouterr().err
