"""Text generation with a causal model, as TransformerLens's ``HookedTransformer.generate``.

``generate(model, input, max_new_tokens)`` continues ``input`` one token at a time: each step
runs the model on the whole sequence so far (no key/value cache: every step is the ordinary
forward, hooks included) and appends the next token of every sequence, chosen from the last
position's logits:

- ``do_sample=False``: the most likely token (greedy; ties go to the lowest id, ``argmax``);
- ``do_sample=True`` (TransformerLens's default): drawn from ``softmax(logits / temperature)``
  restricted to the ``top_k`` most likely tokens, or else to the smallest set whose
  probability exceeds ``top_p`` (``sample_logits``); ``temperature=0`` is greedy.

A temperature is 0 or a finite number >= ``MIN_TEMPERATURE`` (1e-4: logits up to 1e34 stay
finite in float32 once divided by it; a smaller one is greedy in all but name), and the logits
divided by it must stay finite in the model's dtype (float16 logits of 10 overflow at 1e-4):
``ValueError`` naming ``temperature`` otherwise, never a NaN probability. ``top_k`` is at most
the vocabulary.

Generation stops for a sequence at a stop token (``eos_token_id``: one id or a list, default the
tokenizer's EOS token) when ``stop_at_eos``; a finished sequence is padded with the first stop
token until every sequence has finished or ``max_new_tokens`` were added. The model runs in eval
mode (no dropout) and without gradients; its mode is restored afterwards.
"""

from __future__ import annotations

import math
import operator
from collections.abc import Sequence
from typing import Any

import torch
from torch import Tensor, nn

from headwise.errors import field_error
from headwise.model.eval_mode import eval_mode

RETURN_TYPES = ("input", "str", "tokens")
MIN_TEMPERATURE = 1e-4  # "1e-4" in messages


def sample_logits(logits: Tensor, top_k: int | None = None, top_p: float | None = None,
                  temperature: float = 1.0, freq_penalty: float = 0.0,
                  tokens: Tensor | None = None,
                  generator: torch.Generator | None = None) -> Tensor:
    """One token per row of ``logits`` (B, V), as TransformerLens's ``utils.sample_logits``.

    ``temperature == 0`` is the argmax. Otherwise the logits are divided by ``temperature``
    (a finite number >= ``MIN_TEMPERATURE`` that leaves them finite: see the module),
    lowered by ``freq_penalty`` times each token's count in ``tokens`` (B, T), restricted to the
    ``top_k`` largest (ties with the k-th kept) or else to the smallest prefix of the sorted
    tokens whose probability exceeds ``top_p`` (the most likely token always kept), and a
    token is drawn from their softmax.

    Returns:
        (B,) long token ids.

    Raises:
        ValueError: a temperature outside that rule.
    """
    if temperature == 0.0:
        return logits.argmax(dim=-1)
    _check_temperature(temperature)
    scaled = logits / temperature
    if bool((torch.isfinite(logits) & ~torch.isfinite(scaled)).any()):
        raise ValueError(f"temperature: got {temperature!r}, but logits / temperature overflow "
                         f"{str(logits.dtype).removeprefix('torch.')}; expected a larger "
                         "temperature")
    logits = scaled
    if freq_penalty > 0 and tokens is not None:
        counts = torch.stack([torch.bincount(row, minlength=logits.shape[-1]) for row in tokens])
        logits = logits - freq_penalty * counts[:, : logits.shape[-1]]
    if top_k is not None:
        kth = logits.topk(top_k, dim=-1).values[..., -1:]  # (B, 1)
        logits = logits.masked_fill(logits < kth, float("-inf"))
    elif top_p is not None:
        ordered, order = torch.sort(logits, descending=True)
        drop = ordered.softmax(dim=-1).cumsum(dim=-1) > top_p
        drop[..., 1:] = drop[..., :-1].clone()  # keep the token that crosses top_p
        drop[..., 0] = False
        logits = logits.masked_fill(drop.scatter(-1, order, drop), float("-inf"))
    probs = logits.float().softmax(dim=-1)
    return torch.multinomial(probs, 1, generator=generator)[:, 0]


def generate(model: nn.Module, input: str | Sequence[str] | Tensor = "",
             max_new_tokens: int = 10, stop_at_eos: bool = True,
             eos_token_id: int | Sequence[int] | None = None, do_sample: bool = True,
             top_k: int | None = None, top_p: float | None = None, temperature: float = 1.0,
             freq_penalty: float = 0.0, prepend_bos: bool | None = None,
             return_type: str = "input",
             generator: torch.Generator | None = None) -> str | list[str] | Tensor:
    """Continue ``input`` by up to ``max_new_tokens`` tokens (see the module docstring).

    Args:
        model: a causal headwise ``Transformer`` (with a tokenizer for text input: its own, or
            ``ByteTokenizer`` for a byte-level model).
        input: a string, a list of strings of the same length in tokens, or ids (B, T).
        stop_at_eos: stop a sequence at a stop token (none known: run to ``max_new_tokens``).
        eos_token_id: the stop token(s); ``None``: the tokenizer's EOS token, if any.
        do_sample, top_k, top_p, temperature, freq_penalty: the choice of each token.
        prepend_bos: for text input, as ``model.to_tokens``.
        return_type: ``"input"`` (text for text input, ids for ids), ``"str"`` or
            ``"tokens"``; text leaves out a BOS token that was prepended.
        generator: the random generator of sampling (``None``: torch's global one).

    Returns:
        The prompt and its continuation: a string (one string given), a list of strings, or
        ids (B, T + new tokens).

    Raises:
        ValueError: a bidirectional model, a bad option, prompts of different lengths, or more
            tokens than ``max_seq_len``.
        ConfigError: text input to a model without a tokenizer.
    """
    config: Any = getattr(model, "config", None)
    if config is None or not config.causal:
        raise ValueError("model: generate continues text left to right; expected a causal "
                         "model (config.causal = true)")
    _check(max_new_tokens, return_type, top_k, top_p, temperature, config.vocab_size)
    tokens, bos = _prompt_ids(model, input, prepend_bos)
    if tokens.shape[1] + max_new_tokens > config.max_seq_len:
        raise ValueError(f"max_new_tokens: got {max_new_tokens}, but the prompt has "
                         f"{tokens.shape[1]} tokens and the model at most {config.max_seq_len};"
                         f" expected at most {config.max_seq_len - tokens.shape[1]}")
    stops = _stop_ids(model, eos_token_id) if stop_at_eos else []
    stop = torch.tensor(stops, dtype=torch.long, device=tokens.device)
    finished = torch.zeros(tokens.shape[0], dtype=torch.bool, device=tokens.device)
    with torch.no_grad(), eval_mode(model):
        for _ in range(max_new_tokens):
            logits = model(tokens)[:, -1]  # (B, V)
            if do_sample:
                new = sample_logits(logits, top_k, top_p, temperature, freq_penalty, tokens,
                                    generator)
            else:
                new = logits.argmax(dim=-1)  # (B,)
            if stops:
                new = new.masked_fill(finished, stops[0])
                finished |= torch.isin(new, stop)
            tokens = torch.cat([tokens, new[:, None]], dim=1)  # (B, T + 1)
            if stops and bool(finished.all()):
                break
    text = return_type == "str" or (return_type == "input" and not isinstance(input, Tensor))
    if not text:
        return tokens
    texts = [model.to_string(row[int(bos):]) for row in tokens]  # type: ignore[operator]
    return texts[0] if isinstance(input, str) else texts


def _check(max_new_tokens: int, return_type: str, top_k: int | None, top_p: float | None,
           temperature: float, vocab_size: int) -> None:
    if isinstance(max_new_tokens, bool) or not isinstance(max_new_tokens, int) \
            or max_new_tokens < 0:
        raise ValueError(f"max_new_tokens: got {max_new_tokens!r}, expected an integer >= 0")
    if return_type not in RETURN_TYPES:
        raise ValueError(f"return_type: got {return_type!r}, expected 'input', 'str' or "
                         "'tokens'")
    if top_k is not None and (isinstance(top_k, bool) or not isinstance(top_k, int)
                              or not 1 <= top_k <= vocab_size):
        raise ValueError(f"top_k: got {top_k!r}, expected an integer in [1, {vocab_size}] (the "
                         "vocabulary)")
    if top_p is not None and not 0.0 < top_p <= 1.0:
        raise ValueError(f"top_p: got {top_p!r}, expected a probability in (0, 1]")
    if temperature != 0:
        _check_temperature(temperature)


def _check_temperature(temperature: float) -> None:
    if (isinstance(temperature, bool) or not isinstance(temperature, (int, float))
            or not math.isfinite(temperature) or temperature < MIN_TEMPERATURE):
        raise ValueError(f"temperature: got {temperature!r}, expected 0 (greedy) or a finite "
                         "number >= 1e-4")


def _prompt_ids(model: Any, input: str | Sequence[str] | Tensor,
                prepend_bos: bool | None) -> tuple[Tensor, bool]:
    """The prompt's ids (B, T) on the model's device, and whether a BOS token starts them."""
    if isinstance(input, Tensor):
        if input.dim() != 2 or input.dtype != torch.long or input.shape[1] == 0:
            raise ValueError(f"input: got ids of shape {tuple(input.shape)} ({input.dtype}), "
                             "expected a (B, T) long tensor with T >= 1")
        return input.to(model.embed.weight.device), False
    tokens, mask = model.to_tokens(input, prepend_bos=prepend_bos, return_mask=True)
    if not bool(mask.all()):
        raise ValueError("input: the prompts have different lengths in tokens; expected "
                         "prompts of one length (or generate them one at a time)")
    if tokens.shape[1] == 0:
        raise field_error("input", input, "a prompt of at least one token")
    tokenizer = model.tokenizer
    bos = tokenizer.token_id(tokenizer.bos_token)
    return tokens, bos is not None and bool((tokens[:, 0] == bos).all()) and (
        prepend_bos if prepend_bos is not None else bool(tokenizer.prepend_bos))


def _stop_ids(model: Any, eos_token_id: int | Sequence[int] | None) -> list[int]:
    if eos_token_id is not None:
        ids = _ids(eos_token_id)
        vocab = model.config.vocab_size
        if not ids or any(not 0 <= i < vocab for i in ids):
            raise ValueError(f"eos_token_id: got {eos_token_id!r}, expected token ids in "
                             f"[0, {vocab})")
        return ids
    tokenizer = getattr(model, "tokenizer", None)
    eos = tokenizer.token_id(tokenizer.eos_token) if tokenizer is not None else None
    return [] if eos is None else [eos]


def _ids(eos_token_id: Any) -> list[int]:
    """The ids of ``eos_token_id``: one integer (a Python, NumPy or 0-d tensor one, as
    TransformerLens takes) or a sequence of them; ``[]`` for anything else (refused)."""
    if isinstance(eos_token_id, bool):
        return []
    try:
        return [operator.index(eos_token_id)]
    except TypeError:
        pass
    try:
        items = list(eos_token_id)
        if any(isinstance(i, bool) for i in items):
            return []
        return [operator.index(i) for i in items]
    except TypeError:
        return []
