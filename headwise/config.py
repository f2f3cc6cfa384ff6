"""ModelConfig: the validated, frozen description of a Transformer (read only by build_model)."""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, fields, replace
from typing import Any, Literal, TypeVar, get_args

from headwise.errors import ConfigError, did_you_mean, field_error

T = TypeVar("T")

Norm = Literal["pre", "post"]
NormType = Literal["layernorm", "rmsnorm"]
Activation = Literal["relu", "gelu", "gelu_tanh", "silu", "swiglu"]
Positional = Literal["learned", "sinusoidal", "rope", "none"]
Bias = Literal["all", "none", "qkv"]

# Largest accepted sizes: well above any model headwise is meant for (Llama-3-405B has 126
# layers, 128 heads, d_model 16384, d_ff 53248, 128256 tokens), far below sizes that overflow.
# What fits in memory is checked separately, before allocation (``headwise.memory``).
MAXIMA = {"n_layers": 1024, "n_heads": 1024, "d_model": 1 << 16, "d_head": 1 << 14,
          "d_ff": 1 << 20, "vocab_size": 1 << 24, "max_seq_len": 1 << 20,
          "n_token_types": 1 << 10}


@dataclass(frozen=True)
class ModelConfig:
    """Shape and variant choices of a decoder or encoder Transformer.

    Every variant is one value of one field (STYLE 5). ``n_kv_heads`` < ``n_heads`` gives
    grouped-query attention: query head ``h`` reads kv head ``h // (n_heads // n_kv_heads)``.

    Fields beyond DESIGN §3 (needed to load real checkpoints exactly): ``norm_eps``,
    ``rope_base``, ``n_token_types`` and ``embed_norm`` (BERT), and ``bias`` also accepts
    ``"qkv"`` (bias on q/k/v projections only, as in Qwen2). ``bias=True/False`` mean
    ``"all"``/``"none"``.

    Raises:
        ConfigError: naming the field, the value and what is allowed.
    """

    n_layers: int = 2
    n_heads: int = 4
    d_model: int = 64
    d_head: int | None = None
    n_kv_heads: int | None = None
    d_ff: int | None = None
    vocab_size: int = 64
    max_seq_len: int = 128
    causal: bool = True
    norm: Norm = "pre"
    norm_type: NormType = "layernorm"
    norm_eps: float = 1e-5
    activation: Activation = "relu"
    positional: Positional = "learned"
    rope_base: float = 10000.0
    bias: Bias | bool = "all"
    tie_embeddings: bool = False
    dropout: float = 0.0
    attn_only: bool = False
    n_token_types: int = 0
    embed_norm: bool = False

    def __post_init__(self) -> None:
        # Normalise derived defaults first (frozen: use object.__setattr__).
        if isinstance(self.bias, bool):
            object.__setattr__(self, "bias", "all" if self.bias else "none")
        for name in ("n_layers", "n_heads", "d_model", "vocab_size", "max_seq_len"):
            _check_int(name, getattr(self, name), minimum=1, maximum=MAXIMA[name])
        if self.d_head is None:
            if self.d_model % self.n_heads:
                raise field_error(
                    "d_head", None,
                    f"an explicit d_head, since d_model={self.d_model} is not divisible by "
                    f"n_heads={self.n_heads}",
                )
            object.__setattr__(self, "d_head", self.d_model // self.n_heads)
        if self.n_kv_heads is None:
            object.__setattr__(self, "n_kv_heads", self.n_heads)
        if self.d_ff is None:
            object.__setattr__(self, "d_ff", 4 * self.d_model)
        _check_int("d_head", self.d_head, minimum=1, maximum=MAXIMA["d_head"])
        _check_int("n_kv_heads", self.n_kv_heads, minimum=1, maximum=MAXIMA["n_heads"])
        _check_int("d_ff", self.d_ff, minimum=1, maximum=MAXIMA["d_ff"])
        _check_int("n_token_types", self.n_token_types, minimum=0,
                   maximum=MAXIMA["n_token_types"])
        assert self.n_kv_heads is not None and self.d_head is not None
        if self.n_heads % self.n_kv_heads:
            raise field_error(
                "n_kv_heads", self.n_kv_heads, f"a divisor of n_heads={self.n_heads}"
            )
        for name, kind in (
            ("norm", Norm), ("norm_type", NormType), ("activation", Activation),
            ("positional", Positional), ("bias", Bias),
        ):
            allowed = get_args(kind)
            if getattr(self, name) not in allowed:
                raise field_error(name, getattr(self, name), f"one of {list(allowed)}")
        for name in ("causal", "tie_embeddings", "attn_only", "embed_norm"):
            if not isinstance(getattr(self, name), bool):
                raise field_error(name, getattr(self, name), "true or false")
        if not (_real(self.dropout) and 0.0 <= self.dropout < 1.0):
            raise field_error("dropout", self.dropout, "a number in [0, 1)")
        if not (_real(self.norm_eps) and 0 < self.norm_eps < 1):
            raise field_error("norm_eps", self.norm_eps, "a positive number (finite, < 1)")
        if not (_real(self.rope_base) and 0 < self.rope_base <= 1e12):
            raise field_error("rope_base", self.rope_base, "a positive number (finite, <= 1e12)")
        if self.positional == "rope" and self.d_head % 2:
            raise field_error("d_head", self.d_head, "an even number when positional='rope'")

    @property
    def group_size(self) -> int:
        """Query heads per kv head (1 without GQA)."""
        assert self.n_kv_heads is not None
        return self.n_heads // self.n_kv_heads

    def to_dict(self) -> dict[str, Any]:
        """A plain dict that ``ModelConfig.from_dict`` turns back into an equal config."""
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any], path: str = "model") -> ModelConfig:
        """Build from a mapping, rejecting unknown keys by name (with ``path`` prefixed).

        Raises:
            ConfigError: an unknown key, or an invalid value.
        """
        if not isinstance(data, dict):
            raise ConfigError(f"{path}: got {type(data).__name__}, expected a mapping of fields")
        names = {f.name for f in fields(cls)}
        unknown = sorted(set(data) - names)
        if unknown:
            extra = did_you_mean(unknown[0], sorted(names))
            raise ConfigError(f"{path}.{unknown[0]}: unknown field{extra}")
        return construct(cls, data, f"{path}.", path)

    def replace(self, **changes: Any) -> ModelConfig:
        """A copy with some fields changed (validated again)."""
        return replace(self, **changes)


def _check_int(name: str, value: object, minimum: int, maximum: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or not minimum <= value <= maximum:
        raise field_error(name, value, f"an integer >= {minimum} and <= {maximum}")


def _real(value: object) -> bool:
    """A finite int or float (not a bool)."""
    return (isinstance(value, (int, float)) and not isinstance(value, bool)
            and math.isfinite(value))


PRESETS: dict[str, ModelConfig] = {
    # Tiny models for tests and examples; every dimension distinct where it matters.
    "tiny": ModelConfig(n_layers=2, n_heads=3, d_model=12, d_head=4, d_ff=20, vocab_size=17,
                        max_seq_len=16),
    "tiny-gqa-rope": ModelConfig(n_layers=2, n_heads=4, n_kv_heads=2, d_model=24, d_head=6,
                                 d_ff=40, vocab_size=19, max_seq_len=16, positional="rope",
                                 norm_type="rmsnorm", activation="swiglu", bias="none"),
    "tiny-encoder": ModelConfig(n_layers=2, n_heads=3, d_model=12, d_head=4, d_ff=20,
                                vocab_size=17, max_seq_len=16, causal=False, norm="post",
                                activation="gelu"),
    "attn-only-2l": ModelConfig(n_layers=2, n_heads=4, d_model=64, vocab_size=64,
                                max_seq_len=64, attn_only=True),
}


def preset(name: str) -> ModelConfig:
    """A named tiny config (see ``PRESETS``).

    Raises:
        ConfigError: unknown name, listing the known ones.
    """
    if name not in PRESETS:
        raise ConfigError(f"preset: got {name!r}, expected one of {sorted(PRESETS)}")
    return PRESETS[name]



def construct(cls: Callable[..., T], kwargs: Mapping[str, Any], prefix: str, where: str) -> T:
    """``cls(**kwargs)`` for a dataclass that validates itself, with errors placed in a spec.

    Args:
        cls: the dataclass (its ``ConfigError`` messages start with the field name).
        kwargs: the fields, already checked against the known names.
        prefix: put before the dataclass's own messages (``"model."``).
        where: names the whole object when a value has the wrong type (``"model"``).

    Raises:
        ConfigError: an invalid value, naming its field path.
    """
    try:
        return cls(**kwargs)
    except ConfigError as e:
        raise ConfigError(f"{prefix}{e}") from None
    except TypeError as e:  # e.g. comparing a str with an int
        raise ConfigError(f"{where}: {e}") from None
