"""Built-in tasks: reproducible, targets equal an explicit per-example reference, clear errors."""

from __future__ import annotations

import pytest
import torch

from headwise.data import (
    BOS,
    CONTENT,
    IGNORE,
    QUERY,
    SEP,
    TASKS,
    Batch,
    BracketDepthTask,
    CopyTask,
    InductionTask,
    KVRetrievalTask,
    ModularAdditionTask,
    ReverseTask,
    SortTask,
    build_task,
)
from headwise.errors import ConfigError

SYNTHETIC = [n for n in TASKS if not TASKS[n].splits]  # generated, not read from files


def _gen(seed: int = 0) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


@pytest.mark.parametrize("name", SYNTHETIC)
def test_seeded_and_reproducible(name: str) -> None:
    task = build_task(name)
    a, b = task.sample(7, _gen(3)), task.sample(7, _gen(3))
    assert torch.equal(a.tokens, b.tokens) and torch.equal(a.targets, b.targets)
    c = task.sample(7, _gen(4))
    assert not torch.equal(a.tokens, c.tokens)
    assert a.tokens.shape == (7, task.seq_len) and a.tokens.dtype == torch.long
    assert int(a.tokens.max()) < task.vocab_size and int(a.tokens.min()) >= 0
    scored = a.targets[a.targets != IGNORE]
    assert scored.numel() > 0 and int(scored.max()) < task.vocab_size
    assert a.task_ids.tolist() == [0] * 7 and a.attention_mask is None


def _answer_part(batch: Batch, n: int) -> tuple[list[list[int]], list[list[int]]]:
    """Inputs x and scored targets per example for the seq-to-seq format."""
    xs, ys = [], []
    for tok, tgt in zip(batch.tokens.tolist(), batch.targets.tolist(), strict=True):
        assert tok[0] == BOS and tok[n + 1] == SEP
        xs.append(tok[1:n + 1])
        ys.append([t for t in tgt if t != IGNORE])
        # teacher forcing: the answer also appears after SEP, and targets are it shifted by one
        assert tok[n + 2:] == ys[-1]
        assert tgt[:n + 1] == [IGNORE] * (n + 1) and tgt[-1] == IGNORE
    return xs, ys


@pytest.mark.parametrize(("cls", "ref"), [
    (CopyTask, lambda x: list(x)),
    (ReverseTask, lambda x: list(reversed(x))),
    (SortTask, lambda x: sorted(x)),
])
def test_seq_to_seq_targets(cls: type, ref: object) -> None:
    task = cls(length=5, vocab_size=11)
    xs, ys = _answer_part(task.sample(50, _gen()), 5)
    for x, y in zip(xs, ys, strict=True):
        assert y == ref(x)  # type: ignore[operator]
        assert all(CONTENT <= v < 11 for v in x)


def test_induction_targets_follow_period() -> None:
    task = InductionTask(vocab_size=40, seq_len=30, period=(3, 9))
    batch = task.sample(200, _gen())
    periods = set()
    for tok, tgt in zip(batch.tokens.tolist(), batch.targets.tolist(), strict=True):
        content = tok[1:]
        # the period is the first repeat of the first symbol (segments are distinct here)
        p = content.index(content[0], 1)
        periods.add(p)
        assert len(set(content[:p])) == p  # distinct within the period
        assert all(content[j] == content[j % p] for j in range(len(content)))
        for t in range(len(tok)):
            j = t - 1
            expected = tok[t + 1] if (t + 1 < len(tok) and j >= p) else IGNORE
            assert tgt[t] == expected
    assert periods == set(range(3, 10))


def test_induction_small_vocab_falls_back_to_replacement() -> None:
    task = InductionTask(vocab_size=CONTENT + 3, seq_len=20, period=(6, 6))
    content = task.sample(20, _gen()).tokens[:, 1:]
    assert torch.equal(content[:, :6], content[:, 6:12])
    assert int(content.max()) < CONTENT + 3


def test_modular_addition_targets() -> None:
    task = ModularAdditionTask(modulus=7, vocab_size=CONTENT + 7)
    batch = task.sample(100, _gen())
    for tok, tgt in zip(batch.tokens.tolist(), batch.targets.tolist(), strict=True):
        bos, a, plus, b, eq = tok
        assert (bos, plus, eq) == (BOS, QUERY, SEP)
        assert tgt == [IGNORE] * 4 + [CONTENT + ((a - CONTENT) + (b - CONTENT)) % 7]


def test_bracket_depth_targets() -> None:
    task = BracketDepthTask(n_pairs=6, max_depth=3, vocab_size=CONTENT + 6)
    batch = task.sample(100, _gen())
    for tok, tgt in zip(batch.tokens.tolist(), batch.targets.tolist(), strict=True):
        depth, seen = 0, []
        for c in tok[1:]:
            assert c in (CONTENT, CONTENT + 1)
            depth += 1 if c == CONTENT else -1
            assert 0 <= depth <= 3
            seen.append(CONTENT + 2 + depth)
        assert depth == 0  # balanced
        assert tgt == [IGNORE] + seen


def test_kv_retrieval_targets() -> None:
    task = KVRetrievalTask(n_pairs=3, n_keys=5, n_values=4, vocab_size=CONTENT + 9)
    batch = task.sample(100, _gen())
    for tok, tgt in zip(batch.tokens.tolist(), batch.targets.tolist(), strict=True):
        keys, values = tok[1:7:2], tok[2:8:2]
        assert len(set(keys)) == 3 and all(CONTENT <= k < CONTENT + 5 for k in keys)
        assert all(CONTENT + 5 <= v < CONTENT + 9 for v in values)
        assert tok[7] == QUERY and tok[8] in keys
        assert tgt == [IGNORE] * 8 + [dict(zip(keys, values, strict=True))[tok[8]]]


@pytest.mark.parametrize(("name", "kwargs", "message"), [
    ("cpy", {}, "did you mean 'copy'"),
    ("copy", {"lenght": 3}, "copy.lenght: unknown argument (did you mean 'length'?)"),
    ("copy", {"length": 0}, "copy.length: got 0, expected an integer >= 1"),
    ("sort", {"length": "4"}, "sort.length: got '4'"),
    ("copy", {"vocab_size": 4}, "copy.vocab_size: got 4, expected an integer >= 5"),
    ("induction", {"period": [9, 3]}, "induction.period: got [9, 3]"),
    ("induction", {"period": [4, 40], "seq_len": 20}, "induction.seq_len: got 20"),
    ("modular_addition", {"modulus": 97}, "modular_addition.vocab_size: got 64"),
    ("bracket_depth", {"n_pairs": -1}, "bracket_depth.n_pairs: got -1"),
    ("kv_retrieval", {"n_pairs": 8, "n_keys": 4}, "kv_retrieval.n_keys: got 4"),
    ("text", {}, "text.path: missing"),
    ("text", {"path": "/nonexistent.txt"}, "text.path: got '/nonexistent.txt'"),
])
def test_bad_arguments_name_the_field(name: str, kwargs: dict, message: str) -> None:
    with pytest.raises(ConfigError) as info:
        build_task(name, kwargs, path="data.tasks.t")
    assert str(info.value).startswith("data.tasks.t: ")
    assert message in str(info.value)
