"""Small models for the lever tests: every dimension a distinct size."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch

from headwise import ModelConfig, Transformer, build_model

BASE = dict(n_layers=2, n_heads=4, d_model=20, d_head=6, d_ff=28, vocab_size=23,
            max_seq_len=16)


def make(**changes: object) -> Transformer:
    """A seeded tiny model; ``changes`` override ``BASE``."""
    return build_model(ModelConfig(**{**BASE, **changes}), seed=0)  # type: ignore[arg-type]


@pytest.fixture(autouse=True)
def _one_thread() -> Iterator[None]:
    """Tiny models run fastest on one thread, and the CI machine is shared."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)
