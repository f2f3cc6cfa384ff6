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


def test_task_ids_out_of_range_are_refused_by_the_forward_never_run_as_another_task() -> None:
    """``task_ids = -1`` used to index the gates from the end: the example ran as the last
    task. Ids on the host are checked by the forward; a gate handed one anyway refuses it."""
    from headwise.control.gates import FixedGates

    model = build_model(ModelConfig(n_layers=1, n_heads=2, d_model=8, vocab_size=8,
                                    max_seq_len=6), seed=0)
    tokens = torch.zeros(2, 3, dtype=torch.long)
    with pytest.raises(ValueError, match=r"^task_ids: got range \[-1, 0\], expected ids >= 0"):
        model(tokens, task_ids=torch.tensor([-1, 0]))
    model(tokens, task_ids=torch.tensor([7, 0]))  # no gates: a mixture's labels, unused
    FixedGates(model, {0: "L0.H0", 1: "L0.H1"})
    for ids in ([-1, 0], [0, 2]):
        with pytest.raises(ValueError, match=r"^task_ids: got range .*, expected ids in "
                                             r"\[0, 2\)"):
            model(tokens, task_ids=torch.tensor(ids))
    with pytest.raises(IndexError):
        model.blocks[0].attn.head_gate(torch.ones(2, 3, 2, 4), torch.tensor([-1, 0]))
    z = model.blocks[0].attn.head_gate(torch.ones(2, 3, 2, 4), torch.tensor([1, 0]))
    assert z[0, :, :, 0].tolist() == [[0.0, 1.0]] * 3 and z[1, :, :, 0].tolist() == [[1.0, 0.0]] * 3


def test_token_type_ids_are_checked_like_the_other_ids() -> None:
    """A (B,) segment tensor with B == T used to broadcast over positions; ids beyond the
    segment embedding ended in an IndexError naming nothing."""
    model = build_model(ModelConfig(n_layers=1, n_heads=2, d_model=8, vocab_size=8,
                                    max_seq_len=6, n_token_types=2), seed=0)
    tokens = torch.zeros(3, 3, dtype=torch.long)
    with pytest.raises(ValueError, match=r"^token_type_ids: expected an integer tensor of "
                                         r"shape \(3, 3\)"):
        model(tokens, token_type_ids=torch.zeros(3, dtype=torch.long))
    with pytest.raises(ValueError, match=r"^token_type_ids: expected an integer tensor"):
        model(tokens, token_type_ids=torch.zeros(3, 3))
    with pytest.raises(ValueError, match=r"^token_type_ids: got range \[0, 2\], expected ids "
                                         r"in \[0, 2\)"):
        model(tokens, token_type_ids=torch.tensor([[0, 1, 2]] * 3))
    model(tokens, token_type_ids=torch.ones(3, 3, dtype=torch.long))
