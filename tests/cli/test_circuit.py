"""``headwise circuit``: a trained run's circuit printed, written as clauses, figure and JSON;
bad input exits 2 with one line."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from headwise.cli import main

SPEC = """
model: {n_layers: 2, n_heads: 2, d_model: 16, vocab_size: 12, max_seq_len: 10}
data: {tasks: {copy: {length: 3}}, eval_examples: 24}
train: {steps: 30, batch_size: 16, eval_every: 30, checkpoint_every: 30}
"""


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("circuit")
    (root / "spec.yaml").write_text(SPEC)
    assert main(["train", str(root / "spec.yaml"), "--out", str(root / "run"), "--quiet"]) == 0
    return root / "run"


def test_circuit_prints_and_writes_clauses_figure_and_json(
        run_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    capsys.readouterr()
    files = {k: tmp_path / f"c.{k}" for k in ("yaml", "png", "json")}
    code = main(["circuit", str(run_dir), "--task", "copy", "--metric", "loss",
                 "--clauses", str(files["yaml"]), "--figure", str(files["png"]),
                 "--json", str(files["json"])])
    out = capsys.readouterr().out
    assert code == 0, out
    clauses = yaml.safe_load(files["yaml"].read_text())
    assert clauses[0]["task"] == "copy" and clauses[0]["keeps_at_least"] == 0.9
    record = json.loads(files["json"].read_text())
    assert record["circuit"] == clauses[0]["circuit"] and record["faithfulness"]["kept"] >= 0.9
    # 2 layers x 2 heads with MLPs: layer 0's 6 q/k/v inputs read embed; MLP 0 reads embed
    # and 2 heads; layer 1's 6 inputs read embed, 2 heads and MLP 0; MLP 1 reads 6 senders;
    # the logits read all 7
    assert len(record["edges"]) == 6 * 1 + 3 + 6 * 4 + 6 + 7
    assert files["png"].read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "eap vs exact path patching (loss, every edge): Spearman" in out
    assert "clauses:" in out and "keeps_at_least: 0.9" in out


@pytest.mark.parametrize("argv,message", [
    (["--task", "nope"], "--task: got 'nope', expected one of ['copy']"),
    (["--task", "copy", "--faithfulness", "1.5"], "--faithfulness: got 1.5"),
    (["--task", "copy", "--steps", "0"], "--steps: got 0"),
])
def test_bad_input_exits_2_with_one_line(run_dir: Path, capsys: pytest.CaptureFixture[str],
                                         argv: list[str], message: str) -> None:
    capsys.readouterr()
    assert main(["circuit", str(run_dir), *argv]) == 2
    err = capsys.readouterr().err
    assert message in err and len(err.strip().splitlines()) == 1


def test_help_exits_0(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["circuit", "--help"]) == 0
    text = capsys.readouterr().out
    assert "usage: headwise circuit" in text and "--faithfulness F" in text
