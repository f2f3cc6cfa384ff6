"""A run's token names follow its spec's vocabulary: synthetic (markers named after their
tasks), bytes, or a text task's tokenizer."""

from __future__ import annotations

from pathlib import Path

import torch

from headwise.pipeline.run_tokens import spec_token_names
from headwise.runspec import load_spec

MODEL = "model: {n_layers: 1, n_heads: 2, d_model: 16, vocab_size: 20, max_seq_len: 16}\n"


def test_synthetic_tasks_with_markers() -> None:
    spec = load_spec(MODEL + "data: {tasks: {copy: {length: 4}, reverse: {length: 4}}, "
                     "task_tokens: on}\n")
    assert spec.data.markers == (18, 19)  # the top ids: task i of n is vocab_size - n + i
    names = spec_token_names(spec)
    assert names(torch.tensor([1, 19, 4, 9, 2, 9, 4])) == [
        "<bos>", "<reverse>", "s0", "s5", "<sep>", "s5", "s0"]


def test_byte_text_and_tokenizer_text(tmp_path: Path) -> None:
    from tokenizers import Tokenizer, models, pre_tokenizers

    (tmp_path / "corpus.txt").write_text("the cat sat on the mat . " * 20)
    model = MODEL.replace("vocab_size: 20", "vocab_size: 256")
    spec = load_spec(model + f"data: {{tasks: {{lm: {{task: text, path: "
                     f"{tmp_path / 'corpus.txt'}, seq_len: 8}}}}}}\n")
    assert spec_token_names(spec)(torch.tensor(list(b"a b\n"))) == ["a", "\u2423", "b", "\\n"]
    vocab = {"[UNK]": 0, "the": 1, "cat": 2, "sat": 3, "on": 4, "mat": 5, ".": 6}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.save(str(tmp_path / "tokenizer.json"))
    spec = load_spec(model + f"data: {{tasks: {{lm: {{task: text, path: "
                     f"{tmp_path / 'corpus.txt'}, seq_len: 8, tokenizer: {tmp_path}}}}}}}\n")
    assert spec_token_names(spec)(torch.tensor([1, 2, 3, 6])) == ["the", "cat", "sat", "."]
