"""``test_prompt`` against the ranks computed here from the model's logits."""

from __future__ import annotations

import io

import torch

from headwise.config import ModelConfig
from headwise.model import build_model, prompts
from headwise.model.byte_tokenizer import ByteTokenizer


def test_ranks_of_the_answer_tokens() -> None:
    model = build_model(ModelConfig(n_layers=1, n_heads=2, d_model=16, vocab_size=256,
                                    max_seq_len=16), seed=0).eval()
    model.tokenizer = ByteTokenizer()
    out = io.StringIO()
    ranks = prompts.test_prompt("ab", "cd", model, file=out, top_k=3)
    tokens = torch.tensor([list(b"ab cd")])
    with torch.no_grad():
        probs = model(tokens)[0].softmax(-1)
    names = ["a", "b", "\u2423", "c", "d"]
    want = [(names[i], int((probs[i - 1] > probs[i - 1, t]).sum()))
            for i, t in enumerate(b"ab cd") if i >= 2]
    assert ranks == want
    text = out.getvalue()
    assert "Tokenized answer: ['\u2423', 'c', 'd']" in text
    assert text.count("Top 2th token") == 3 and "Top 3th token" not in text
    assert text.rstrip().endswith(f"Ranks of the answer tokens: {want}")
