"""PairsTask: rows read strictly from JSONL / CSV, completion-only targets, splits by row."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from headwise.config import ModelConfig
from headwise.data import IGNORE, Mixture, PairsTask, ReverseTask, TextTask, build_task
from headwise.errors import ConfigError
from headwise.model import build_model
from headwise.training.metrics import task_loss

ROWS = [{"q": f"what is {i} plus {i % 7}?", "a": f" {i + i % 7}", "id": i} for i in range(60)]


def _gen(seed: int = 0) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def _jsonl(tmp_path: Path, rows: list[dict] = ROWS) -> Path:
    path = tmp_path / "data.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    return path


def _task(path: Path, split: str = "train", **kw) -> PairsTask:
    return PairsTask(path=str(path), prompt="q", completion="a", seq_len=24, split=split, **kw)


def test_rows_become_completion_only_examples(tmp_path: Path) -> None:
    task = _task(_jsonl(tmp_path))
    batch = task.sample(50, _gen())
    by_prompt = {r["q"]: r["a"] for r in ROWS}
    assert batch.attention_mask is not None
    for tok, tgt, mask in zip(batch.tokens.tolist(), batch.targets.tolist(),
                              batch.attention_mask.tolist(), strict=True):
        n = sum(mask)
        prompt = next(p for p in by_prompt if bytes(tok[:len(p)]) == p.encode())
        x = (prompt + by_prompt[prompt]).encode()
        assert n == len(x) - 1 and bytes(tok[:n]) == x[:-1]
        expected = [IGNORE] * (len(prompt) - 1) + list(by_prompt[prompt].encode())
        assert tgt == expected + [IGNORE] * (24 - n)
        assert mask == [1] * n + [0] * (24 - n)
    assert torch.equal(task.sample(7, _gen(2)).tokens, task.sample(7, _gen(2)).tokens)


def test_completion_only_loss_matches_explicit_masking(tmp_path: Path) -> None:
    """The trainer's loss on a padded pairs batch equals cross-entropy over the completion
    positions only, each row run alone without padding."""
    task = _task(_jsonl(tmp_path))
    model = build_model(ModelConfig(n_layers=1, n_heads=2, d_model=16, vocab_size=256,
                                    max_seq_len=24), seed=0).eval()
    batch = task.sample(6, _gen(1))
    loss, _ = task_loss(model(batch.tokens, batch.attention_mask), batch, 1)
    by_prompt = {r["q"]: r["a"] for r in ROWS}
    per_row = []
    for tok in batch.tokens.tolist():
        prompt = next(p for p in by_prompt if bytes(tok[:len(p)]) == p.encode())
        p, c = list(prompt.encode()), list(by_prompt[prompt].encode())
        x = torch.tensor([p + c])
        logits = model(x[:, :-1])[0]  # (len-1, V)
        scored = logits[len(p) - 1:]  # positions predicting the completion
        per_row.append(F.cross_entropy(scored, torch.tensor(c)))
    assert torch.allclose(loss, torch.stack(per_row).mean(), atol=1e-6)


def test_csv_reads_as_jsonl_and_tokenizer_encodes_parts(tmp_path: Path) -> None:
    from tokenizers import Tokenizer, models, pre_tokenizers

    path = tmp_path / "data.csv"
    with path.open("w", newline="", encoding="utf-8-sig") as f:  # as spreadsheets save it
        w = csv.DictWriter(f, ["id", "q", "a"])
        w.writeheader()
        w.writerows(ROWS)
    a, b = _task(path), _task(_jsonl(tmp_path))
    assert torch.equal(a.sample(20, _gen()).targets, b.sample(20, _gen()).targets)
    words = sorted({w for r in ROWS for w in (r["q"] + r["a"]).replace("?", " ?").split()})
    tok = Tokenizer(models.WordLevel({"[UNK]": 0, **{w: i + 1 for i, w in enumerate(words)}},
                                     unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.save(str(tmp_path / "tokenizer.json"))
    task = _task(path, tokenizer=str(tmp_path))
    assert task.vocab_size == len(words) + 1
    row = task.sample(1, _gen()).tokens[0]
    for r in ROWS:
        x = tok.encode(r["q"]).ids + tok.encode(r["a"]).ids
        if row[:len(x) - 1].tolist() == x[:-1]:
            break
    else:
        raise AssertionError("the example is no row's prompt + completion")


def test_rows_are_dealt_to_disjoint_splits(tmp_path: Path) -> None:
    path = _jsonl(tmp_path)
    seen = {}
    for split in ("train", "eval", "verify"):
        task = _task(path, split, eval_fraction=0.2)
        tokens = task.sample(400, _gen()).tokens
        seen[split] = {bytes(t).split(b"?")[0] for t in tokens.tolist()}
    assert not seen["train"] & seen["eval"] and not seen["train"] & seen["verify"]
    assert not seen["eval"] & seen["verify"]
    assert len(seen["eval"]) == len(seen["verify"]) == 6 and len(seen["train"]) == 48


@pytest.mark.parametrize(("text", "message"), [
    ('{"q": "a", "a": "b"}\n{"q": "a", \n', "data.jsonl: line 2: not JSON"),
    ('{"q": "a", "a": "b"}\n[1, 2]\n', "data.jsonl: line 2: got an array, expected a JSON object"),
    ('{"q": "a", "a": "b"}\n\n{"q": "a"}\n', "data.jsonl: line 3: field 'a' missing"),
    ('{"q": "a", "a": 5}\n', "data.jsonl: line 1: field 'a' is a number (5), expected a string"),
    ('{"q": null, "a": "b"}\n', "data.jsonl: line 1: field 'q' is null, expected a string"),
    ('{"q": "a", "a": ""}\n', "data.jsonl: line 1: field 'a' encodes to no ids"),
    ('{"q": "' + "x" * 30 + '", "a": "b"}\n',
     "data.jsonl: line 1: prompt + completion have 31 ids, expected at most seq_len + 1 = 25"),
    ("", "data.jsonl: no rows"),
])
def test_bad_jsonl_names_file_line_and_field(tmp_path: Path, text: str, message: str) -> None:
    (tmp_path / "data.jsonl").write_text(text)
    with pytest.raises(ConfigError) as info:
        build_task("pairs", {"path": str(tmp_path / "data.jsonl"), "prompt": "q",
                             "completion": "a", "seq_len": 24}, "data.tasks.qa")
    assert str(info.value).startswith("data.tasks.qa: pairs.path: ")
    assert message in str(info.value) and "\n" not in str(info.value)


@pytest.mark.parametrize(("name", "text", "message"), [
    ("d.csv", "q,a\nx,y\nx,y,z\n", "d.csv: line 3: 3 values, expected 2"),
    ("d.csv", 'q,a\n"x,y\n', "d.csv: line 2: not CSV"),
    ("d.csv", "q,b\nx,y\n", "d.csv: line 2: field 'a' missing"),
    ("d.csv", "q;a\nx;y\n", "d.csv: line 1: the header was read as one field; the file looks "
                           "delimited by ';', expected comma-separated values"),
    ("d.csv", "q\ta\nx\ty\n", "d.csv: line 1: the header was read as one field; the file "
                             "looks delimited by a tab, expected comma-separated values"),
    ("d.txt", "q,a\n", "pairs.path: got"),
])
def test_bad_csv_and_extension(tmp_path: Path, name: str, text: str, message: str) -> None:
    (tmp_path / name).write_text(text)
    with pytest.raises(ConfigError, match=message):
        PairsTask(path=str(tmp_path / name), prompt="q", completion="a")


def test_next_token_tasks_refuse_a_bidirectional_model(tmp_path: Path) -> None:
    (tmp_path / "c.txt").write_text("some words and more words\n" * 40)
    text = TextTask(path=str(tmp_path / "c.txt"), seq_len=8)
    pairs = _task(_jsonl(tmp_path))
    for name, task in (("lm", text), ("qa", pairs)):
        Mixture({name: task}).check_model(256, 32, causal=True)
        with pytest.raises(ConfigError) as info:
            Mixture({name: task}).check_model(256, 32, causal=False)
        assert str(info.value).startswith(
            f"data.tasks.{name}.task: {task.name!r} is next-token prediction, which "
            "model.causal=false sees the answer of; expected task: mlm")
    # a built-in generator on a bidirectional model is a deliberate study, not an error
    Mixture({"reverse": ReverseTask(length=4)}).check_model(64, 32, causal=False)
