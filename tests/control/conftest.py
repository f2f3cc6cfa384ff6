"""Small models for the lever tests: every dimension a distinct size."""

from __future__ import annotations

from headwise import ModelConfig, Transformer, build_model

BASE = dict(n_layers=2, n_heads=4, d_model=20, d_head=6, d_ff=28, vocab_size=23,
            max_seq_len=16)


def make(**changes: object) -> Transformer:
    """A seeded tiny model; ``changes`` override ``BASE``."""
    return build_model(ModelConfig(**{**BASE, **changes}), seed=0)  # type: ignore[arg-type]
