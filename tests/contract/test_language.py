"""A contract written as users write it trains and verifies; its measured values equal the
definitions computed by hand on the trained model, and its verdicts follow the bounds."""

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
  - {any_of: L1.*, score: induction, at_least: 0.01, on: induction}
  - {any_of: L1.*, score: induction, at_most: 0.99, on: unseen}
  - {any_of: L0.*, score: previous_token, at_least: 0.01, on: repeated}
"""


def _induction_score(pattern: torch.Tensor, tokens: torch.Tensor) -> float:
    """Olsson et al.'s induction score written out: per query ``q`` with at least two allowed
    keys, the attention mass on ``j + 1`` for the latest ``j < q`` holding ``tokens[q]``,
    averaged over the queries that have such a ``j`` (``pattern``: (B, T, T), causal)."""
    total, rows = 0.0, 0
    for b in range(tokens.shape[0]):
        seq = tokens[b].tolist()
        for q in range(1, len(seq)):
            earlier = [j for j in range(q) if seq[j] == seq[q] and j + 1 <= q]
            if earlier:
                total += float(pattern[b, q, max(earlier) + 1])
                rows += 1
    return total / rows


def test_task_floors_bare_on_unseen_probe_and_task_data_train_and_verify(
        tmp_path: Path) -> None:
    from headwise.data.batch import IGNORE
    from headwise.pipeline.finished import load_compiled
    from headwise.pipeline.heldout import verification_data

    torch.set_num_threads(1)
    spec = tmp_path / "spec.yaml"
    spec.write_text(SPEC)
    run = tmp_path / "run"
    code = main(["train", str(spec), "--out", str(run), "--quiet"])
    verdict = json.loads((run / "contract.json").read_text())
    assert verdict["n_clauses"] == 5 and code == (0 if verdict["passed"] else 1)
    by = {c["index"]: c for c in verdict["clauses"]}
    assert by[2]["details"]["probe"] == "induction" and by[3]["details"]["probe"] == "unseen"
    assert by[0]["ci"] is not None and by[0]["ci"][0] <= by[0]["measured"] <= by[0]["ci"][1]
    # The measured values are the definitions, computed here by hand on the trained model.
    compiled = load_compiled(run)
    data = verification_data(compiled)
    batch = data.tasks["induction"]
    with torch.no_grad():
        logits = compiled.model(batch.tokens, task_ids=batch.task_ids)
    scored = batch.targets != IGNORE
    accuracy = float((logits.argmax(-1) == batch.targets)[scored].float().mean())
    assert by[0]["measured"] == pytest.approx(accuracy, abs=1e-6)
    probe = data.probes["unseen"]
    _, cache = compiled.model.run_with_cache(probe.tokens, ["blocks.1.attn.hook_pattern"],
                                             task_ids=probe.task_ids)
    pattern = cache["blocks.1.attn.hook_pattern"]  # (B, H, T, T)
    scores = {f"L1.H{h}": _induction_score(pattern[:, h], probe.tokens) for h in range(2)}
    assert by[3]["per_head"] == pytest.approx(scores, abs=1e-5)
    # any_of decides by the best margin: under an upper bound, the lowest-scoring head.
    assert by[3]["measured"] == pytest.approx(min(scores.values()), abs=1e-5)
    best = max(scores.values())
    # Bounds just above and just below the measured value: the verdict flips with the bound.
    for bound, expected in ((best + 0.01, 1), (best - 0.01, 0)):
        other = tmp_path / f"verify_{expected}.yaml"
        other.write_text(SPEC.split("contract:")[0] + "contract:\n  - {any_of: L1.*, score: "
                         f"induction, at_least: {bound:.6f}, on: unseen}}\n")
        assert main(["verify", str(other), "--run", str(run)]) == expected


@pytest.mark.parametrize("value", ["yes", "on", "off", "no"])
def test_yaml_1_1_words_are_strings_where_a_boolean_is_expected(
        tmp_path: Path, value: str, capsys: pytest.CaptureFixture[str]) -> None:
    spec = tmp_path / "spec.yaml"
    spec.write_text(SPEC.replace("contract:", f"heads: {{L0.H0: {{freeze: {value}}}}}\n"
                                              "contract:"))
    assert main(["train", str(spec), "--out", str(tmp_path / "r"), "--quiet"]) == 2
    assert "heads.L0.H0.freeze: got 'yes', expected true or false".replace(
        "yes", value) in capsys.readouterr().err
