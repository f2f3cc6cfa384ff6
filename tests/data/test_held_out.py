"""Held-out sets hold each of a file's examples at most once (``Task.held_out``): a verdict's
bounds treat the set's examples as independent, so a row drawn twice, or overlapping windows of
a text, would count as evidence the file does not hold. Generated tasks draw as before."""

from __future__ import annotations

from pathlib import Path

import torch

import headwise as hw
from headwise.data import IGNORE, CopyTask, Mixture, MLMTask, PairsTask, TextTask
from headwise.pipeline import compile_spec
from headwise.pipeline.heldout import verification_data


def _pairs(tmp_path: Path, rows: int, split: str = "verify") -> PairsTask:
    path = tmp_path / "qa.csv"
    path.write_text("prompt,completion\n" + "".join(f"p{i},c{i}\n" for i in range(rows)))
    return PairsTask(path=str(path), seq_len=8, split=split, eval_fraction=0.5)


def _rows(batch: hw.Batch) -> list[tuple[int, ...]]:
    return [tuple(r) for r in batch.tokens.tolist()]


def test_a_split_smaller_than_asked_gives_every_row_once(tmp_path: Path) -> None:
    task = _pairs(tmp_path, 40)
    assert task.n_examples == task.n_rows and 0 < task.n_rows < 100
    got = _rows(task.held_out(100, torch.Generator().manual_seed(0)))
    assert len(got) == task.n_rows  # not 100 draws: the split holds fewer rows
    assert sorted(got) == sorted(_rows(task.every_example(torch.Generator())))


def test_a_larger_split_gives_distinct_rows_and_another_seed_others(tmp_path: Path) -> None:
    task = _pairs(tmp_path, 200)
    n = task.n_rows // 2
    a = _rows(task.held_out(n, torch.Generator().manual_seed(0)))
    b = _rows(task.held_out(n, torch.Generator().manual_seed(1)))
    assert len(a) == len(set(a)) == n and len(set(b)) == n
    split = set(_rows(task.every_example(torch.Generator())))
    assert set(a) <= split and set(b) <= split and set(a) != set(b)
    # sampling with replacement, as training draws, repeats rows at this size
    drawn = _rows(task.sample(n, torch.Generator().manual_seed(0)))
    assert len(set(drawn)) < n


def test_text_held_out_windows_are_tiles_that_never_overlap(tmp_path: Path) -> None:
    path = tmp_path / "corpus.txt"
    path.write_text("".join(chr(33 + i) for i in range(78)))  # 78 distinct ids: 7 windows
    task = TextTask(path=str(path), seq_len=10, split="all")
    assert task.n_examples == 7
    tiles = _rows(task.every_example(torch.Generator()))
    got = _rows(task.held_out(5, torch.Generator().manual_seed(3)))
    assert len(set(got)) == 5 and set(got) <= set(tiles)
    ids = torch.tensor(list(path.read_bytes()))
    starts = [bytes(ids).find(bytes(r)) for r in got]
    assert all(s % 10 == 0 for s in starts)  # each on a tile's start: no two share a target


def test_mlm_held_out_windows_are_tiles(tmp_path: Path) -> None:
    """Byte ids, no wrapping specials: window ``k`` is bytes ``20k .. 20k + 19`` of the file,
    read back through the masking (a masked position's target is its original id)."""
    path = tmp_path / "corpus.txt"
    path.write_text("the quick brown fox jumps over the lazy dog. " * 4)  # 180 bytes
    raw = torch.tensor(list(path.read_bytes()))
    task = MLMTask(path=str(path), seq_len=20, split="all")
    assert task.n_examples == 9

    def originals(batch: hw.Batch) -> torch.Tensor:
        return torch.where(batch.targets != IGNORE, batch.targets, batch.tokens)

    got = task.examples_at(torch.tensor([4, 0, 7]), torch.Generator().manual_seed(0))
    for row, k in zip(originals(got), (4, 0, 7), strict=True):
        assert torch.equal(row, raw[20 * k:20 * k + 20])
    whole = task.held_out(50, torch.Generator().manual_seed(0))
    assert whole.tokens.shape[0] == 9  # every tile once
    assert sorted(map(tuple, originals(whole).tolist())) == sorted(
        tuple(raw[20 * k:20 * k + 20].tolist()) for k in range(9))


def test_a_generated_task_draws_its_held_out_set_as_before() -> None:
    task = CopyTask(length=3)
    a = task.held_out(64, torch.Generator().manual_seed(5))
    b = task.sample(64, torch.Generator().manual_seed(5))
    assert torch.equal(a.tokens, b.tokens) and torch.equal(a.targets, b.targets)
    mix = Mixture({"copy": task, "again": CopyTask(length=4)})
    c = mix.sample(50, torch.Generator().manual_seed(2), held_out=True)
    d = mix.sample(50, torch.Generator().manual_seed(2))
    assert torch.equal(c.tokens, d.tokens) and torch.equal(c.task_ids, d.task_ids)


def test_a_mixture_keeps_a_small_splits_rows_once_and_the_generated_share(tmp_path: Path) -> None:
    qa = _pairs(tmp_path, 30)
    mix = Mixture({"qa": qa, "copy": CopyTask(length=3, vocab_size=200)})
    batch = mix.sample(200, torch.Generator().manual_seed(0), held_out=True)
    ours = batch.tokens[batch.task_ids == 0]
    assert ours.shape[0] == qa.n_rows and len(set(map(tuple, ours.tolist()))) == qa.n_rows
    assert int((batch.task_ids == 1).sum()) > 60  # the generated task keeps its share


SPEC = """
name: small_split
model: {n_layers: 1, n_heads: 2, d_model: 16, vocab_size: 260, max_seq_len: 24}
data:
  tasks:
    qa: {task: pairs, path: qa.csv, seq_len: 16}
  eval_examples: 256
train: {steps: 1, batch_size: 4, lr: 3.0e-3, seed: 0}
contract:
  - {task: qa, metric: exact, at_least: 0.5}
"""


def test_a_runs_verification_set_counts_each_file_row_once(tmp_path: Path) -> None:
    """256 examples asked of a verify split of a few rows: the verdict reads those rows once
    each, so its bounds count as many examples as the file holds there, not 256."""
    (tmp_path / "qa.csv").write_text("prompt,completion\n" + "".join(
        f"{i}+1=,{i + 1}\n" for i in range(120)))
    (tmp_path / "spec.yaml").write_text(SPEC)
    compiled = compile_spec(hw.load_spec(tmp_path / "spec.yaml"))
    split = PairsTask(path=str(tmp_path / "qa.csv"), seq_len=16, split="verify")
    qa = verification_data(compiled).tasks["qa"]
    assert qa.tokens.shape[0] == split.n_rows < 256
    assert sorted(_rows(qa)) == sorted(_rows(split.every_example(torch.Generator())))
    enforcement = compiled.eval_batch
    eval_split = PairsTask(path=str(tmp_path / "qa.csv"), seq_len=16, split="eval")
    assert enforcement.tokens.shape[0] == eval_split.n_rows
