"""``--require certified``, ``verify --fresh``, and the spec keys ``contract.confidence`` and
``data.verify_examples``, end to end on a tiny run."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from cli_runs import cli

from headwise.runspec import load_spec

SPEC = """
model: {n_layers: 1, n_heads: 2, d_model: 16, vocab_size: 12, max_seq_len: 12}
data:
  tasks:
    copy: {length: 3, vocab_size: 8}
  eval_examples: 32
  verify_examples: 48
train: {steps: 4, batch_size: 8, lr: 3.0e-3, seed: 0}
contract:
  confidence: 0.9
  clauses:
    - {task: copy, metric: loss, at_most: 50}
    - {task: copy, metric: exact, at_most: 0.99}
"""


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from headwise.cli import main

    torch.set_num_threads(1)
    directory = tmp_path_factory.mktemp("certified")
    (directory / "spec.yaml").write_text(SPEC)
    assert main(["train", str(directory / "spec.yaml"), "--out", str(directory / "run"),
                 "--quiet", "--require", "certified"]) == 0
    return directory


def test_the_new_spec_keys_parse() -> None:
    spec = load_spec(SPEC)
    assert spec.contract.confidence == 0.9 and len(spec.contract) == 2
    assert (spec.data.eval_examples, spec.data.verify_examples) == (32, 48)
    plain = load_spec(SPEC.replace("  verify_examples: 48\n", ""))
    assert plain.data.verify_examples == 32  # as many as the enforcement set by default


@pytest.mark.parametrize(("old", "new", "message"), [
    ("confidence: 0.9", "confidence: 1.0", r"^contract\.confidence: got 1\.0, expected a "
                                           r"number in \[0\.5, 1\)$"),
    ("confidence: 0.9", "confidence: 0.4", r"^contract\.confidence: got 0\.4, expected a "
                                           "number"),
    ("confidence: 0.9", "confidance: 0.9", r"^contract\.confidance: unknown key \(did you "
                                           r"mean 'confidence'\?\)"),
    ("verify_examples: 48", "verify_examples: 0", r"^data\.verify_examples: got 0, expected an "
                                                  "integer >= 1"),
])
def test_bad_new_keys_name_the_field(old: str, new: str, message: str) -> None:
    from headwise.errors import SpecError

    with pytest.raises(SpecError, match=message):
        load_spec(SPEC.replace(old, new))


def test_the_run_records_bounds_at_the_specs_confidence(run: Path) -> None:
    verdict = json.loads((run / "run" / "contract.json").read_text())
    assert verdict["confidence"] == 0.9 and verdict["certified"]
    loss, exact = verdict["clauses"]
    assert loss["bound"]["method"] == "bootstrap-t" and loss["state"] == "certified"
    assert exact["bound"]["method"] == "clopper-pearson" and exact["bound"]["examples"] == 48
    assert loss["bound"]["upper"] >= loss["measured"]
    report = json.loads((run / "run" / "report.json").read_text())
    assert report["contract"]["clauses"][1]["bound"] == exact["bound"]


def test_require_certified_fails_a_contract_that_only_holds(
        run: Path, capsys: pytest.CaptureFixture[str]) -> None:
    measured = json.loads((run / "run" / "contract.json").read_text())["clauses"][0]["measured"]
    tight = run / "tight.yaml"
    tight.write_text(SPEC.replace("at_most: 50", f"at_most: {measured + 1e-4:.6f}"))
    code, out, _ = cli(capsys, "verify", str(tight), "--run", str(run / "run"))
    assert code == 0 and "holds" in out
    assert "contract[0] holds but is not certified at 90%" in out and "examples" in out
    code, _, _ = cli(capsys, "verify", str(tight), "--run", str(run / "run"), "--require",
                     "certified")
    assert code == 1


def test_fresh_verification_is_written_beside_the_runs_verdict(
        run: Path, capsys: pytest.CaptureFixture[str]) -> None:
    own = (run / "run" / "contract.json").read_bytes()
    code, out, _ = cli(capsys, "verify", str(run / "run" / "spec.yaml"), "--run",
                       str(run / "run"), "--fresh", "777")
    assert code == 0 and "verified on new data (contract.fresh-777.json)" in out
    fresh = json.loads((run / "run" / "contract.fresh-777.json").read_text())
    assert fresh["fresh_seed"] == 777 and fresh["n_clauses"] == 2
    assert (run / "run" / "contract.json").read_bytes() == own  # never over the run's verdict
    manifest = json.loads((run / "run" / "manifest.json").read_text())
    assert "contract.fresh-777.json" in json.dumps(manifest)
    # another draw: the values differ from the run's own verification set
    assert fresh["clauses"][0]["measured"] != json.loads(own)["clauses"][0]["measured"]
    code, _, _ = cli(capsys, "report", str(run / "run"))
    assert code == 0
    html = (run / "run" / "report.html").read_text()
    assert "Re-verification on fresh data" in html and "contract.fresh-777.json" in html


def test_a_fresh_seed_that_meets_the_runs_own_draws_is_refused(
        run: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = cli(capsys, "verify", str(run / "run" / "spec.yaml"), "--run",
                       str(run / "run"), "--fresh", "12350")
    assert code == 2
    (line,) = err.strip().splitlines()
    assert line.startswith("headwise verify: error: --fresh: got 12350, expected a seed")


PAIRS = """
model: {n_layers: 1, n_heads: 2, d_model: 16, vocab_size: 260, max_seq_len: 24}
data:
  tasks:
    qa: {task: pairs, path: qa.jsonl, prompt: q, completion: a, seq_len: 16}
  eval_examples: 16
train: {steps: 3, batch_size: 4, lr: 3.0e-3, seed: 0}
contract:
  - {task: qa, metric: loss, at_most: 50}
  - {task: qa, metric: exact, at_most: 0.99}
"""


def _rows(path: Path, first: int, n: int) -> None:
    path.write_text("".join(f'{{"q": "{i}+1=", "a": "{i + 1}"}}\n'
                            for i in range(first, first + n)))


def test_data_reads_a_file_tasks_new_rows_whole(tmp_path: Path,
                                                capsys: pytest.CaptureFixture[str]) -> None:
    torch.set_num_threads(1)
    _rows(tmp_path / "qa.jsonl", 0, 60)
    (tmp_path / "spec.yaml").write_text(PAIRS)
    run = tmp_path / "run"
    code, _, _ = cli(capsys, "train", str(tmp_path / "spec.yaml"), "--out", str(run),
                     "--quiet")
    assert code in (0, 1)
    own = (run / "contract.json").read_bytes()
    _rows(tmp_path / "new.jsonl", 1000, 37)
    code, out, _ = cli(capsys, "verify", str(tmp_path / "spec.yaml"), "--run", str(run), "--data",
                       f"qa={tmp_path / 'new.jsonl'}")
    assert code in (0, 1)
    (written,) = [p for p in run.iterdir() if p.name.startswith("contract.data-")]
    verdict = json.loads(written.read_text())
    assert verdict["data"] == {"qa": str(tmp_path / "new.jsonl")}
    assert verdict["clauses"][1]["bound"]["examples"] == 37  # every new row, once
    assert (run / "contract.json").read_bytes() == own
    # --fresh says the file task's rows are the same split's again
    code, out, _ = cli(capsys, "verify", str(tmp_path / "spec.yaml"), "--run", str(run), "--fresh",
                       "5000")
    assert "note: qa reads a file: --fresh draws its examples again" in out
    code, _, _ = cli(capsys, "report", str(run))
    html = (run / "report.html").read_text()
    assert written.name in html and "contract.fresh-5000.json" in html
    for bad, message in ((["--data", "qa"], "--data: got 'qa', expected TASK=FILE"),
                         (["--data", f"nope={tmp_path / 'new.jsonl'}"],
                          "--data: got task 'nope', expected one of the spec's tasks read "
                          "from a file ['qa']"),
                         (["--data", f"qa={tmp_path / 'missing.jsonl'}"], "missing.jsonl"),
                         (["--data", f"qa={tmp_path / 'new.jsonl'}", "--data",
                           f"qa={tmp_path / 'qa.jsonl'}"],  # never only the last one
                          "--data: got task 'qa' twice, expected each task once")):
        code, _, err = cli(capsys, "verify", str(tmp_path / "spec.yaml"), "--run", str(run), *bad)
        assert code == 2 and message in err and len(err.strip().splitlines()) == 1
