"""HF ``config.json`` fields, both ways, with errors that name the field (shared by family modules).

Reading (``require``, ``refuse``, ``activation``) raises ``CheckpointError`` naming the HF field;
writing for export (``expect``, ``hf_activation``) raises ``ConfigError`` naming our field.

``check_types`` checks every field the family translators read, by type, before any of them
runs: a string where a number belongs (``layer_norm_epsilon: "abc"``), a list activation, a
float layer count or a non-finite epsilon is a ``CheckpointError`` naming the field, never a
crash or a silent cast. Sizes are then range-checked by ``ModelConfig``.
"""

from __future__ import annotations

import math
from typing import Any, cast

from headwise.config import Activation, ModelConfig
from headwise.errors import CheckpointError, ConfigError, show

# HF activation names -> our ``activation`` values (HF "gelu" is the exact erf form).
ACTIVATIONS: dict[str, str] = {
    "gelu": "gelu",
    "gelu_new": "gelu_tanh",
    "gelu_pytorch_tanh": "gelu_tanh",
    "gelu_fast": "gelu_tanh",
    "relu": "relu",
    "silu": "silu",
    "swish": "silu",
}

# Fields some HF families use for features our model does not have; a truthy value is refused.
_UNSUPPORTED_IF_SET = ("final_logit_softcapping", "attn_logit_softcapping", "add_cross_attention",
                       "is_decoder", "is_encoder_decoder")


_INT, _NUM, _BOOL, _STR = "an integer", "a finite number", "true or false", "a string"
# Fields read by the gpt2, bert and llama translators -> the kind of value they must hold
# (``None`` is allowed for every field: it means unset).
FIELD_KINDS: dict[str, str] = {
    **dict.fromkeys(("n_layer", "n_head", "n_embd", "n_inner", "n_positions", "vocab_size",
                     "type_vocab_size", "num_hidden_layers", "num_attention_heads",
                     "hidden_size", "intermediate_size", "num_key_value_heads", "head_dim",
                     "max_position_embeddings", "sliding_window"), _INT),
    **dict.fromkeys(("layer_norm_epsilon", "layer_norm_eps", "rms_norm_eps", "rope_theta"),
                    _NUM),
    **dict.fromkeys(("tie_word_embeddings", "attention_bias", "mlp_bias",
                     "use_sliding_window", "scale_attn_weights",
                     "scale_attn_by_inverse_layer_idx"), _BOOL),
    **dict.fromkeys(("model_type", "activation_function", "hidden_act",
                     "position_embedding_type"), _STR),
}


def check_types(hf: dict[str, Any], source: str = "config.json") -> None:
    """Check the type of every field in ``FIELD_KINDS`` that ``hf`` sets.

    Raises:
        CheckpointError: ``source`` and the field, its value (shortened) and what was expected.
    """
    for name, kind in FIELD_KINDS.items():
        value = hf.get(name)
        if value is None:
            continue
        ok = {_INT: isinstance(value, int) and not isinstance(value, bool),
              _NUM: isinstance(value, (int, float)) and not isinstance(value, bool)
              and math.isfinite(value),
              _BOOL: isinstance(value, bool), _STR: isinstance(value, str)}[kind]
        if not ok:
            raise CheckpointError(f"{source} {name}: got {show(value, 80)}, expected {kind}")


def require(hf: dict[str, Any], name: str, kind: type | tuple[type, ...] = int) -> Any:
    """``hf[name]``, checked to be of ``kind``.

    Raises:
        CheckpointError: the field is missing or has the wrong type.
    """
    if name not in hf or hf[name] is None:
        raise CheckpointError(f"config.json {name}: missing, expected a value")
    value = hf[name]
    if isinstance(value, bool) and kind is not bool or not isinstance(value, kind):
        raise CheckpointError(f"config.json {name}: got {show(value, 80)}, expected "
                              f"{_kind_name(kind)}")
    return value


def activation(hf: dict[str, Any], name: str, default: str) -> Activation:
    """Our activation name for the HF activation field ``name`` (HF's ``default`` if unset).

    Raises:
        CheckpointError: an activation headwise does not implement.
    """
    value = hf.get(name) or default
    if not isinstance(value, str) or value not in ACTIVATIONS:
        raise CheckpointError(
            f"config.json {name}: got {show(value, 80)}, expected one of {sorted(ACTIVATIONS)}"
        )
    return cast(Activation, ACTIVATIONS[value])


def refuse(hf: dict[str, Any], name: str, allowed: object = None) -> None:
    """Raise if ``hf[name]`` is set to something other than ``allowed`` (with no ``allowed``,
    ``false`` also means the feature is off).

    Raises:
        CheckpointError: naming the field, its value, and that headwise lacks the feature.
    """
    value = hf.get(name)
    if value is None or value == allowed or (allowed is None and value is False):
        return
    raise CheckpointError(
        f"config.json {name}: got {value!r}, expected {allowed!r} or unset "
        "(headwise's model does not implement this feature, so the outputs would differ)"
    )


def refuse_common(hf: dict[str, Any]) -> None:
    """Refuse features none of the supported families implement (softcaps, cross-attention)."""
    for name in _UNSUPPORTED_IF_SET:
        refuse(hf, name)


def _kind_name(kind: type | tuple[type, ...]) -> str:
    kinds = kind if isinstance(kind, tuple) else (kind,)
    return " or ".join(k.__name__ for k in kinds)


# The reverse direction (export): our activation -> the HF name written to config.json, the first
# HF name in ``ACTIVATIONS`` that maps to it (``gelu_tanh`` -> ``gelu_new``, GPT-2's own).
HF_ACTIVATION: dict[str, str] = {}
for _hf_name, _ours in ACTIVATIONS.items():
    HF_ACTIVATION.setdefault(_ours, _hf_name)


def expect(config: ModelConfig, name: str, allowed: tuple[object, ...], family: str) -> None:
    """Refuse to export a config whose field ``name`` has no equivalent in the HF ``family``.

    Raises:
        ConfigError: ``model.<name>: got V, expected ...``, naming the family.
    """
    value = getattr(config, name)
    if any(value == a and type(value) is type(a) for a in allowed):  # True is not 1 here
        return
    options = " or ".join(repr(a) for a in allowed) if allowed else "no value"
    raise ConfigError(
        f"model.{name}: got {value!r}, expected {options} to export as HuggingFace {family} "
        "(it has no equivalent, and headwise never approximates)"
    )


def hf_activation(config: ModelConfig, family: str) -> str:
    """The HF activation name for ``config.activation`` (not SwiGLU, which is Llama's MLP).

    Raises:
        ConfigError: an activation with no HF name.
    """
    expect(config, "activation", tuple(HF_ACTIVATION), family)
    return HF_ACTIVATION[config.activation]


def expect_decoder(config: ModelConfig, family: str) -> None:
    """Refuse what no HF decoder family has: non-causal attention, attention-only blocks,
    token-type embeddings, an embedding norm."""
    for name, allowed in (("causal", (True,)), ("attn_only", (False,)), ("n_token_types", (0,)),
                          ("embed_norm", (False,))):
        expect(config, name, allowed, family)


def expect_mha(config: ModelConfig, family: str) -> None:
    """Refuse grouped-query attention and ``d_head * n_heads != d_model`` (GPT-2, BERT)."""
    expect(config, "n_kv_heads", (config.n_heads,), family)
    if config.d_head is None or config.d_head * config.n_heads != config.d_model:
        raise ConfigError(
            f"model.d_head: got {config.d_head!r}, expected d_model / n_heads = "
            f"{config.d_model / config.n_heads:g} to export as HuggingFace {family} (it has no "
            "separate head size, and headwise never approximates)"
        )
