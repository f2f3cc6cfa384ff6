"""Reading HF ``config.json`` fields with errors that name the field (shared by family modules)."""

from __future__ import annotations

from typing import Any, cast

from headwise.config import Activation
from headwise.errors import CheckpointError

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


def require(hf: dict[str, Any], name: str, kind: type | tuple[type, ...] = int) -> Any:
    """``hf[name]``, checked to be of ``kind``.

    Raises:
        CheckpointError: the field is missing or has the wrong type.
    """
    if name not in hf or hf[name] is None:
        raise CheckpointError(f"config.json {name}: missing, expected a value")
    value = hf[name]
    if isinstance(value, bool) and kind is not bool or not isinstance(value, kind):
        raise CheckpointError(f"config.json {name}: got {value!r}, expected {_kind_name(kind)}")
    return value


def activation(hf: dict[str, Any], name: str, default: str) -> Activation:
    """Our activation name for the HF activation field ``name`` (HF's ``default`` if unset).

    Raises:
        CheckpointError: an activation headwise does not implement.
    """
    value = hf.get(name) or default
    if value not in ACTIVATIONS:
        raise CheckpointError(
            f"config.json {name}: got {value!r}, expected one of {sorted(ACTIVATIONS)}"
        )
    return cast(Activation, ACTIVATIONS[value])


def refuse(hf: dict[str, Any], name: str, allowed: object = None) -> None:
    """Raise if ``hf[name]`` is set to something other than ``allowed`` (or a falsy value).

    Raises:
        CheckpointError: naming the field, its value, and that headwise lacks the feature.
    """
    value = hf.get(name)
    if value is None or value == allowed or value is False:
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
