"""``preserve`` clauses end to end: trained, verified and re-verified from the command line."""

from __future__ import annotations

import json
from pathlib import Path

import torch

from headwise.cli import main

SPEC = """
model: {n_layers: 1, n_heads: 2, d_model: 32, vocab_size: 12, max_seq_len: 10}
data: {tasks: {copy: {length: 4}}, eval_examples: 64}
train: {steps: 40, batch_size: 16, lr: 3.0e-3, eval_every: 10, seed: 0}
contract:
  - {preserve: base, "on": copy, metric: kl, at_most: 0.05}
"""


def test_a_preserve_clause_trains_and_verifies_against_the_starting_model(
        tmp_path: Path) -> None:
    torch.set_num_threads(1)
    spec = tmp_path / "spec.yaml"
    spec.write_text(SPEC)
    runs = {}
    for name, flags in (("plain", []), ("enf", ["--enforce"])):
        code = main(["train", str(spec), "--out", str(tmp_path / name), "--quiet", *flags])
        verdict = json.loads((tmp_path / name / "contract.json").read_text())
        assert code == (0 if verdict["passed"] else 1)
        runs[name] = verdict["clauses"][0]["measured"]
    # Plain training moves the outputs far from the start; the distillation lever keeps them
    # closer (the clause is measured against the same starting weights in both runs).
    assert runs["plain"] > 0.05 and runs["enf"] < runs["plain"]
    # verify re-measures against the starting model rebuilt from the spec: the same value.
    assert main(["verify", str(spec), "--run", str(tmp_path / "enf")]) in (0, 1)
    again = json.loads((tmp_path / "enf" / "contract.json").read_text())["clauses"][0]
    assert abs(again["measured"] - runs["enf"]) < 1e-5
