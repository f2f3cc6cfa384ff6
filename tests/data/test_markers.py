"""Task markers: inserted after BOS, targets shifted with their tokens, auto on shared formats."""

from __future__ import annotations

import pytest
import torch

from headwise.data import BOS, IGNORE, Mixture, build_task
from headwise.data.markers import insert_marker, marker_ids, shares_format, use_markers
from headwise.errors import ConfigError
from headwise.runspec import SpecError, load_spec


def test_marker_goes_after_bos_and_targets_follow_their_tokens() -> None:
    task = build_task("copy", {"vocab_size": 12, "length": 3})
    plain = task.sample(5, torch.Generator().manual_seed(0))
    marked = insert_marker(plain, 11)
    assert marked.tokens.shape == (5, 9)
    assert (marked.tokens[:, 0] == BOS).all() and (marked.tokens[:, 1] == 11).all()
    assert torch.equal(marked.tokens[:, 2:], plain.tokens[:, 1:])
    # Position t of the plain batch is t + 1 here and keeps its target; BOS predicts nothing.
    assert torch.equal(marked.targets[:, 1:], plain.targets)
    assert (marked.targets[:, 0] == IGNORE).all()


def test_a_mixture_marks_each_example_with_its_own_task() -> None:
    tasks = {n: build_task(n, {"vocab_size": 17, "length": 4}) for n in ("copy", "reverse")}
    mix = Mixture(tasks, markers={"copy": 18, "reverse": 19})
    batch = mix.sample(64, torch.Generator().manual_seed(1))
    assert mix.seq_len == 11 and batch.tokens.shape == (64, 11)
    assert torch.equal(batch.tokens[:, 1], 18 + batch.task_ids)
    with pytest.raises(ConfigError, match="markers: id 19 needs vocab_size >= 20"):
        mix.check_model(vocab_size=19)  # id 19 needs 20 ids
    mix.check_model(vocab_size=20, max_seq_len=11)
    with pytest.raises(ConfigError, match="sequence length 11 \\(with its task marker\\)"):
        mix.check_model(vocab_size=20, max_seq_len=10)


def test_auto_turns_markers_on_exactly_when_two_tasks_share_an_input_format() -> None:
    copy, rev, kv = (build_task(n, {"vocab_size": 40}) for n in ("copy", "reverse",
                                                                  "kv_retrieval"))
    assert shares_format([copy, rev]) and not shares_format([copy, kv])
    assert use_markers("auto", [copy, rev]) and not use_markers("auto", [copy, kv])
    assert use_markers("on", [copy, kv]) and not use_markers("off", [copy, rev])
    assert marker_ids(20, 3) == [17, 18, 19]


def _spec(extra: str = "", vocab: int = 20, max_len: int = 16) -> str:
    return (f"model: {{n_layers: 1, n_heads: 2, d_model: 16, vocab_size: {vocab}, "
            f"max_seq_len: {max_len}}}\n"
            "data: {tasks: {copy: {length: 4}, reverse: {length: 4}}" + extra + "}\n")


def test_spec_markers_account_for_vocabulary_and_length() -> None:
    spec = load_spec(_spec())
    assert spec.data.markers == (18, 19) and spec.data.seq_len == 11
    assert [t.kwargs["vocab_size"] for t in spec.data.tasks] == [18, 18]
    assert load_spec(_spec(", task_tokens: 'off'")).data.markers == ()
    assert load_spec(_spec(", task_tokens: false")).data.markers == ()
    with pytest.raises(SpecError, match="data.task_tokens: got 'maybe', expected one of"):
        load_spec(_spec(", task_tokens: maybe"))
    with pytest.raises(SpecError, match="T=11 positions with its task marker, more than "
                                        "model.max_seq_len=10"):
        load_spec(_spec(max_len=10))
    with pytest.raises(SpecError, match="vocab_size=20 less the task markers"):
        load_spec(_spec().replace("length: 4}, rev", "length: 4, vocab_size: 20}, rev"))
