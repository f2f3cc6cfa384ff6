"""A file-backed task read whole (``split: all``, ``every_example``): every row or id once."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from headwise.data import IGNORE, CopyTask, MLMTask, PairsTask, TextTask
from headwise.errors import ConfigError


def test_pairs_every_row_once_in_file_order(tmp_path: Path) -> None:
    path = tmp_path / "qa.csv"
    path.write_text("prompt,completion\n" + "".join(f"p{i},c{i}\n" for i in range(23)))
    whole = PairsTask(path=str(path), seq_len=8, split="all")
    batch = whole.every_example(torch.Generator())
    assert batch.tokens.shape[0] == 23
    parts = sum(PairsTask(path=str(path), seq_len=8, split=s).n_rows
                for s in ("train", "eval", "verify"))
    assert parts == 23  # the three splits deal the same rows
    first = bytes(batch.tokens[0, :3].tolist()).decode()
    assert first == "p0c"  # row 0 first: the prompt, then the completion


def test_text_windows_score_every_id_after_the_first_once(tmp_path: Path) -> None:
    path = tmp_path / "corpus.txt"
    path.write_text("abcdefghijklmnopqrstuvwxyz" * 3)  # 78 ids
    task = TextTask(path=str(path), seq_len=10, split="all")
    batch = task.every_example(torch.Generator())
    assert batch.tokens.shape == (7, 10)  # windows start at 0, 10, ..., 60 (78 - 10 = 68)
    ids = torch.tensor(list(path.read_bytes()))
    assert torch.equal(batch.targets.flatten(), ids[1:71])
    assert torch.equal(batch.tokens[1, 0:1], ids[10:11])


def test_mlm_windows_tile_the_file(tmp_path: Path) -> None:
    path = tmp_path / "corpus.txt"
    path.write_text("the quick brown fox jumps over the lazy dog. " * 4)  # 180 bytes
    task = MLMTask(path=str(path), seq_len=20, split="all")
    batch = task.every_example(torch.Generator().manual_seed(0))
    assert batch.tokens.shape == (9, 20)
    scored = batch.targets != IGNORE
    assert bool(scored.any())


def test_a_generated_task_has_no_fixed_examples() -> None:
    with pytest.raises(ConfigError, match="copy: a generated task has no fixed set"):
        CopyTask(length=3).every_example(torch.Generator())


def test_an_unknown_split_names_all() -> None:
    with pytest.raises(ConfigError, match="'train', 'eval', 'verify' or 'all'"):
        TextTask(path="x.txt", split="everything")
