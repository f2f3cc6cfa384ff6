"""Tiny random HuggingFace models saved to disk (no downloads), shared by the interop and
pipeline tests through their conftest files."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch

# A hard import: without transformers (the test extra) the HF parity suite must fail in CI,
# not be skipped silently.
import transformers

V, T_MAX = 53, 32


def _randomise(model: torch.nn.Module) -> None:
    # HF inits norms to 1/0 and biases to 0; random values make a swapped tensor visible.
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0.0, 0.3)


def _gpt2() -> Any:
    cfg = transformers.GPT2Config(n_layer=2, n_head=3, n_embd=24, n_inner=40, vocab_size=V,
                                  n_positions=T_MAX, attn_implementation="eager")
    return transformers.GPT2LMHeadModel(cfg)


def _gpt2_untied() -> Any:
    cfg = transformers.GPT2Config(n_layer=2, n_head=3, n_embd=24, vocab_size=V,
                                  n_positions=T_MAX, activation_function="relu",
                                  tie_word_embeddings=False, attn_implementation="eager")
    return transformers.GPT2LMHeadModel(cfg)


def _llama() -> Any:  # GQA: 6 query heads on 2 kv heads; head_dim 8 != hidden/heads
    cfg = transformers.LlamaConfig(num_hidden_layers=2, num_attention_heads=6,
                                   num_key_value_heads=2, head_dim=8, hidden_size=36,
                                   intermediate_size=40, vocab_size=V,
                                   max_position_embeddings=T_MAX, rope_theta=500.0,
                                   rms_norm_eps=1e-5, attn_implementation="eager")
    return transformers.LlamaForCausalLM(cfg)


def _qwen2() -> Any:
    cfg = transformers.Qwen2Config(num_hidden_layers=2, num_attention_heads=4,
                                   num_key_value_heads=2, hidden_size=32, intermediate_size=40,
                                   vocab_size=V, max_position_embeddings=T_MAX,
                                   tie_word_embeddings=True, attn_implementation="eager")
    return transformers.Qwen2ForCausalLM(cfg)


def _mistral() -> Any:
    cfg = transformers.MistralConfig(num_hidden_layers=2, num_attention_heads=4,
                                     num_key_value_heads=1, hidden_size=32, head_dim=8,
                                     intermediate_size=40, vocab_size=V,
                                     max_position_embeddings=64, sliding_window=T_MAX,
                                     attn_implementation="eager")
    return transformers.MistralForCausalLM(cfg)


def _bert() -> Any:
    cfg = transformers.BertConfig(num_hidden_layers=2, num_attention_heads=3, hidden_size=24,
                                  intermediate_size=40, vocab_size=V, type_vocab_size=3,
                                  max_position_embeddings=T_MAX, attn_implementation="eager")
    return transformers.BertModel(cfg)


FAMILIES: dict[str, Callable[[], Any]] = {
    "gpt2": _gpt2, "gpt2-untied-relu": _gpt2_untied, "llama-gqa": _llama, "qwen2": _qwen2,
    "mistral": _mistral, "bert": _bert,
}


@pytest.fixture(scope="session")
def hf_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Callable[[str], tuple[Any, Path]]:
    """``make(family) -> (hf_model in eval mode, directory it was saved to)``, cached."""
    made: dict[str, tuple[Any, Path]] = {}

    def make(family: str) -> tuple[Any, Path]:
        if family not in made:
            torch.manual_seed(1234)
            model = FAMILIES[family]()
            _randomise(model)
            path = tmp_path_factory.mktemp(family)
            model.save_pretrained(path)
            made[family] = (model.eval(), path)
        return made[family]

    return make


@pytest.fixture()
def batch() -> tuple[torch.Tensor, torch.Tensor]:
    """Tokens (3, 11) and a right-padding mask (rows of length 11, 7 and 4)."""
    g = torch.Generator().manual_seed(7)
    tokens = torch.randint(1, V, (3, 11), generator=g)
    mask = torch.ones(3, 11, dtype=torch.long)
    mask[1, 7:] = 0
    mask[2, 4:] = 0
    return tokens, mask
