"""Circuits proposed from a task's training rows reach the floor's assists and ``plan``."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest

from headwise.cli import main
from headwise.contract import plan
from headwise.data.corpus import deal
from headwise.pipeline import compile_spec
from headwise.runspec import load_spec

INDUCTION = (("previous_token", 0), ("induction", 1))


def lookup_file(path: Path, n: int, eval_fraction: float) -> Path:
    """Rows ``j8 e0 d4 ?j`` -> ``8`` on the training split; on the held-out splits the
    completion is ``z``, which no earlier occurrence predicts."""
    rng = random.Random(0)
    lines = []
    for split in deal([1] * n, eval_fraction):
        letters = rng.sample("abcdefghij", 3)
        digits = [rng.choice("0123456789") for _ in letters]
        q = rng.randrange(3)
        prompt = " ".join(a + d for a, d in zip(letters, digits, strict=True)) + " ?" + letters[q]
        lines.append(json.dumps({"prompt": prompt, "completion": digits[q] if split == 0
                                 else "z"}))
    path.write_text("\n".join(lines) + "\n")
    return path


def spec_text(data: Path, n_layers: int = 2, extra: str = "") -> str:
    return f"""
model: {{n_layers: {n_layers}, n_heads: 2, d_model: 16, vocab_size: 256, max_seq_len: 12}}
data:
  tasks:
    lookup: {{task: pairs, path: {data}, seq_len: 11, eval_fraction: 0.5}}
{extra}  eval_examples: 32
train: {{steps: 10, batch_size: 8}}
contract:
  - {{head: L0.H0, score: first_token, at_least: 0.5}}
  - {{task: lookup, metric: accuracy, at_least: 0.9}}
"""


def test_a_file_task_gets_the_circuit_its_training_rows_propose(tmp_path: Path) -> None:
    data = lookup_file(tmp_path / "lookup.jsonl", 400, 0.5)
    compiled = compile_spec(load_spec(spec_text(data)))
    best = compiled.proposals["lookup"]
    # Every training row is explained and no held-out one is: a share of exactly 1 means the
    # sample held training rows only.
    assert best is not None and best.name == "induction" and best.share == 1.0
    assert compiled.structure.circuits == {"lookup": INDUCTION}
    levers = plan(compiled.model, compiled.spec.contract, compiled.structure).levers
    floor = levers[1]
    assert floor is not None
    # on heads no clause names: L0.H0 carries a first-token clause, so L0.H1
    assert [(o.target, str(o.heads)) for o in floor.assists  # type: ignore[attr-defined]
            ] == [("previous_token", "L0.H1"), ("induction", "L1.H0")]


def test_a_declared_circuit_is_kept_and_a_too_shallow_model_gets_none(
        tmp_path: Path, capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("COLUMNS", "400")  # table cells on one line each
    data = lookup_file(tmp_path / "lookup.jsonl", 200, 0.5)
    spec = spec_text(data, extra="    kv_retrieval: {}\n")
    compiled = compile_spec(load_spec(spec))
    assert "kv_retrieval" not in compiled.circuit_shares  # declared: nothing to measure
    assert compiled.structure.circuits == {"kv_retrieval": INDUCTION, "lookup": INDUCTION}
    path = tmp_path / "spec.yaml"
    path.write_text(spec)
    assert main(["plan", str(path)]) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert "declared by the kv_retrieval generator" in out
    assert "induction (previous_token L0 -> induction L1)" in out and "1.00 (0.1" in out
    # the held-out rows' answer is never a training target: the floor cannot move
    assert main(["plan", str(path), "--pilot", "2"]) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert ("the task is not learning; --enforce assists it with induction (previous_token L0 "
            "-> induction L1), which explains 1.00 of its targets") in out
    shallow = tmp_path / "shallow.yaml"
    shallow.write_text(spec_text(data, n_layers=1))
    compiled = compile_spec(load_spec(shallow))
    assert compiled.proposals == {"lookup": None} and compiled.structure.circuits == {}
    assert main(["plan", str(shallow)]) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert "needs 2 layers, the model has 1" in out
