"""``test_prompt``: how a model ranks an answer after a prompt, as TransformerLens's
``utils.test_prompt``."""

from __future__ import annotations

import sys
from typing import Any, TextIO

import torch


def test_prompt(prompt: str, answer: str, model: Any, prepend_space_to_answer: bool = True,
                print_details: bool = True, prepend_bos: bool | None = None, top_k: int = 10,
                file: TextIO | None = None) -> list[tuple[str, int]]:
    """Run ``prompt + answer`` and report, for each answer token, its rank (0 = the most
    likely), logit and probability after what precedes it, with the ``top_k`` likeliest tokens.

    Args:
        prompt: the text before the answer.
        answer: the expected continuation (a leading space is added unless
            ``prepend_space_to_answer`` is false or it has one).
        model: a headwise ``Transformer`` with a tokenizer.
        print_details: print the tokens and each answer token's table (else the ranks only).
        prepend_bos: for the prompt, as ``model.to_tokens``; the answer never gets one.
        top_k: how many of the likeliest tokens to list per answer token.
        file: where to print (default standard output).

    Returns:
        ``[(answer token, its rank), ...]``.

    Raises:
        ConfigError: the model has no tokenizer.
    """
    out = file or sys.stdout
    if prepend_space_to_answer and not answer.startswith(" "):
        answer = " " + answer
    prompt_tokens = model.to_tokens(prompt, prepend_bos=prepend_bos)
    answer_tokens = model.to_tokens(answer, prepend_bos=False)
    tokens = torch.cat([prompt_tokens, answer_tokens], dim=1)  # (1, T)
    prompt_str = model.to_str_tokens(prompt_tokens[0])
    answer_str = model.to_str_tokens(answer_tokens[0])
    if print_details:
        print("Tokenized prompt:", prompt_str, file=out)
        print("Tokenized answer:", answer_str, file=out)
    with torch.no_grad():
        logits = model(tokens)[0]  # (T, V)
    probs = logits.softmax(dim=-1)
    start, ranks = len(prompt_str), []
    for index in range(start, start + len(answer_str)):
        token, name = int(tokens[0, index]), answer_str[index - start]
        ordered_probs, ordered = probs[index - 1].sort(descending=True)
        rank = int((ordered == token).nonzero()[0, 0])
        ranks.append((name, rank))
        if print_details:
            print(f"Performance on answer token:\nRank: {rank: <8} Logit: "
                  f"{logits[index - 1, token].item():5.2f} Prob: "
                  f"{probs[index - 1, token].item():6.2%} Token: |{name}|", file=out)
            for i in range(min(top_k, ordered.numel())):
                t = int(ordered[i])
                print(f"Top {i}th token. Logit: {logits[index - 1, t].item():5.2f} Prob: "
                      f"{ordered_probs[i].item():6.2%} Token: |{model.to_string([t])}|",
                      file=out)
    print(f"Ranks of the answer tokens: {ranks}", file=out)
    return ranks
