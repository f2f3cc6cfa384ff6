"""headwise: train, coordinate and verify the individual heads and layers of Transformers."""

from headwise.config import ModelConfig, preset
from headwise.errors import (
    CheckpointError,
    ConfigError,
    HeadwiseError,
    SelectorError,
    SpecError,
)
from headwise.heads import Head, HeadSet, kv_head
from headwise.hooks import (
    ActivationCache,
    Hook,
    HookContext,
    HookPoint,
    ablate,
    patch,
    run_with_cache,
    scale,
    steer,
)
from headwise.model import Transformer, build_model

__version__ = "0.1.0"

__all__ = [
    "ActivationCache", "CheckpointError", "ConfigError", "Head", "HeadSet", "HeadwiseError",
    "Hook", "HookContext", "HookPoint", "ModelConfig", "SelectorError", "SpecError",
    "Transformer", "ablate", "build_model", "kv_head", "patch", "preset", "run_with_cache",
    "scale", "steer",
]
