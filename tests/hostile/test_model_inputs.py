"""Hostile model inputs where data enters the library: negative task ids, meta-device tokens."""

from __future__ import annotations

import pytest
import torch

from headwise import ModelConfig, build_model
from headwise.model.inputs import check_tokens


def test_negative_task_ids_are_refused_even_without_gates() -> None:
    tokens = torch.zeros(2, 3, dtype=torch.long)
    with pytest.raises(ValueError, match=r"^task_ids: got range \[-1, 0\], expected ids >= 0"):
        check_tokens(tokens, 8, task_ids=torch.tensor([-1, 0]))
    with pytest.raises(ValueError, match=r"expected ids in \[0, 2\)"):
        check_tokens(tokens, 8, task_ids=torch.tensor([0, 2]), n_tasks=2)
    check_tokens(tokens, 8, task_ids=torch.tensor([0, 1]), n_tasks=2)


def test_meta_device_tokens_are_refused_by_the_forward() -> None:
    model = build_model(ModelConfig(n_layers=1, n_heads=2, d_model=8, vocab_size=8,
                                    max_seq_len=6), seed=0)
    with pytest.raises(ValueError, match="meta device"):
        model(torch.zeros(2, 3, dtype=torch.long, device="meta"))
    with pytest.raises(ValueError, match="meta device"):
        model.run_with_cache(torch.zeros(2, 3, dtype=torch.long, device="meta"), [])


def test_a_float_attention_mask_or_task_ids_are_refused_by_the_forward() -> None:
    """A float mask of weights (0.5) would silently be read as keep-or-drop; float task ids
    would index gates by truncation."""
    model = build_model(ModelConfig(n_layers=1, n_heads=2, d_model=8, vocab_size=8,
                                    max_seq_len=6), seed=0)
    tokens = torch.zeros(2, 3, dtype=torch.long)
    with pytest.raises(ValueError, match=r"^attention_mask: expected a bool or integer "
                                         r"tensor of 0/1 .* got torch.float32"):
        model(tokens, attention_mask=torch.full((2, 3), 0.5))
    with pytest.raises(ValueError, match=r"^task_ids: expected an integer tensor, got "
                                         r"torch.float32"):
        model(tokens, task_ids=torch.zeros(2))
    for mask in (torch.ones(2, 3, dtype=torch.bool), torch.ones(2, 3, dtype=torch.long)):
        model(tokens, attention_mask=mask)
