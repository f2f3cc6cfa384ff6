"""What a finished run says depends only on the run: the tokenizer it trained with is copied
into it and sealed, so replacing the file its spec names changes nothing ``load_run``,
``analyze``, ``report`` or ``export`` read, and an edited copy is refused by name."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from tokenizers import Tokenizer, models, pre_tokenizers

import headwise as hw
from headwise.cli import main

WORDS = ["[UNK]", "the", "cat", "sat", "on", "mat", "a", "dog"]
SPEC = """
model: {n_layers: 1, n_heads: 2, d_model: 16, vocab_size: 8, max_seq_len: 8}
data: {tasks: {lm: {task: text, path: corpus.txt, seq_len: 6, tokenizer: tok}},
       eval_examples: 8}
train: {steps: 2, batch_size: 4, checkpoint_every: 2}
"""


def _tokenizer(words: list[str]) -> str:
    tok = Tokenizer(models.WordLevel({w: i for i, w in enumerate(words)}, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    return tok.to_str()


@pytest.fixture(scope="module")
def text_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("reads")
    (root / "tok").mkdir()
    (root / "tok" / "tokenizer.json").write_text(_tokenizer(WORDS))
    (root / "corpus.txt").write_text("the cat sat on the mat a dog sat\n" * 40)
    (root / "spec.yaml").write_text(SPEC)
    assert main(["train", str(root / "spec.yaml"), "--out", str(root / "run"), "--quiet"]) == 0
    return root / "run"


def test_a_replaced_tokenizer_changes_nothing_the_run_says(
        text_run: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    original = (text_run.parent / "tok" / "tokenizer.json").read_text()
    assert (text_run / "tokenizer.json").read_text() == original
    assert "tokenizer.json" in json.loads((text_run / "manifest.json").read_text())["sha256"]
    before = hw.load_run(text_run).model.to_tokens("the cat sat", prepend_bos=False).tolist()
    assert main(["analyze", str(text_run), "--json", str(tmp_path / "a.json")]) == 0
    try:  # the spec's tokenizer now reads every word backwards
        (text_run.parent / "tok" / "tokenizer.json").write_text(_tokenizer(WORDS[::-1]))
        after = hw.load_run(text_run).model.to_tokens("the cat sat", prepend_bos=False)
        assert after.tolist() == before == [[1, 2, 3]]
        assert main(["analyze", str(text_run), "--json", str(tmp_path / "b.json")]) == 0
        assert (json.loads((tmp_path / "a.json").read_text())
                == json.loads((tmp_path / "b.json").read_text()))
        assert main(["export", str(text_run), "--hf", str(tmp_path / "hf")]) == 0
        assert (tmp_path / "hf" / "tokenizer.json").read_text() == original
    finally:
        (text_run.parent / "tok" / "tokenizer.json").write_text(original)


def test_an_edited_copy_is_refused_by_name(text_run: Path, tmp_path: Path,
                                           capsys: pytest.CaptureFixture[str]) -> None:
    import shutil

    run = Path(shutil.copytree(text_run, tmp_path / "run"))
    (run / "tokenizer.json").write_text(_tokenizer(WORDS[::-1]))
    capsys.readouterr()
    assert main(["analyze", str(run)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and f"{run / 'tokenizer.json'}" in err[0]
    with pytest.raises(hw.CheckpointError, match="tokenizer.json"):
        hw.load_run(run)


PAIRS_SPEC = """
model: {n_layers: 1, n_heads: 2, d_model: 16, vocab_size: 256, max_seq_len: 12}
data: {tasks: {qa: {task: pairs, path: rows.jsonl, prompt: q, completion: a, seq_len: 10}},
       eval_examples: 8}
train: {steps: 2, batch_size: 4, eval_batches: 1, checkpoint_every: 1, eval_every: 2}
contract: [{head: L0.H0, score: previous_token, at_least: 0.0}]
"""


def _rows(seed: int) -> str:
    return "".join(json.dumps({"q": f"{(i * seed) % 97}+{i % 7}=", "a": str(i % 11)}) + "\n"
                   for i in range(60))


@pytest.fixture(scope="module")
def pairs_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("data_reads")
    (root / "rows.jsonl").write_text(_rows(3))
    (root / "spec.yaml").write_text(PAIRS_SPEC)
    assert main(["train", str(root / "spec.yaml"), "--out", str(root / "run"), "--quiet"]) in (0, 1)
    return root / "run"


def _said(run: Path, out: Path) -> tuple[dict, dict]:
    """What ``analyze`` and ``verify`` say about ``run`` (their JSON)."""
    assert main(["analyze", str(run), "--json", str(out)]) == 0
    assert main(["verify", str(run / "spec.yaml"), "--run", str(run)]) in (0, 1)
    verdict = json.loads((run / "contract.json").read_text())
    return json.loads(out.read_text()), verdict


def test_a_replaced_data_file_changes_nothing_the_run_says(
        pairs_run: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The held-out rows ``verify`` and ``analyze`` read were read again from the spec's path;
    a run now reads its own sealed copy of the file (``data.0.rows.jsonl``)."""
    source = pairs_run.parent / "rows.jsonl"
    copy = pairs_run / "data.0.rows.jsonl"
    assert copy.read_text() == _rows(3)
    assert copy.name in json.loads((pairs_run / "manifest.json").read_text())["sha256"]
    before = _said(pairs_run, tmp_path / "a.json")
    try:
        source.write_text(_rows(5))  # other rows: other held-out examples, other scores
        assert _said(pairs_run, tmp_path / "b.json") == before
        source.write_text("not json\n")  # a file the task would refuse
        assert _said(pairs_run, tmp_path / "c.json") == before
        assert hw.load_run(pairs_run).spec.data.tasks[0].kwargs["path"] == str(copy.absolute())
    finally:
        source.write_text(_rows(3))


def test_a_resume_reads_the_data_it_started_with(
        pairs_run: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    import shutil

    root = tmp_path / "moved"
    shutil.copytree(pairs_run.parent, root)
    (root / "rows.jsonl").write_text("not json\n")
    assert main(["train", str(root / "spec.yaml"), "--out", str(root / "run"), "--resume",
                 "--steps", "3", "--quiet"]) in (0, 1), capsys.readouterr().err
    (root / "run" / "data.0.rows.jsonl").write_text(_rows(5))  # an edited copy
    capsys.readouterr()
    assert main(["analyze", str(root / "run")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "data.0.rows.jsonl" in err[0]


def test_a_resume_reads_the_tokenizer_it_started_with(
        text_run: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    import shutil

    root = Path(shutil.copytree(text_run.parent, tmp_path / "moved"))
    (root / "tok" / "tokenizer.json").write_text("not a tokenizer")
    assert main(["train", str(root / "spec.yaml"), "--out", str(root / "run"), "--resume",
                 "--steps", "3", "--quiet"]) == 0, capsys.readouterr().err
    assert (root / "run" / "tokenizer.json").read_text() == _tokenizer(WORDS)
