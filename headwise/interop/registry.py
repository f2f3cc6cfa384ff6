"""The converter registry: one ``Converter`` per HuggingFace ``model_type``, listed explicitly.

``CONVERTERS`` is built here, in one place, from the family modules' ``CONVERTER`` tables
(``gpt2``, ``bert``, ``llama``); a family module registers nothing when imported. A new family
is one module with a ``CONVERTER`` and one entry in ``FAMILIES``.
"""

from __future__ import annotations

from headwise.errors import CheckpointError
from headwise.interop import bert, gpt2, llama
from headwise.interop.converter import Converter, Rule

FAMILIES: tuple[Converter, ...] = (gpt2.CONVERTER, bert.CONVERTER, llama.CONVERTER)

CONVERTERS: dict[str, Converter] = {
    name: converter for converter in FAMILIES for name in converter.model_type
}

__all__ = ["CONVERTERS", "FAMILIES", "Converter", "Rule", "get_converter",
           "supported_model_types"]


def get_converter(model_type: object) -> Converter:
    """The converter for an HF ``model_type``.

    Raises:
        CheckpointError: an unknown or missing ``model_type``, listing the supported ones.
    """
    if not isinstance(model_type, str) or model_type not in CONVERTERS:
        raise CheckpointError(
            f"config.json model_type: got {model_type!r}, expected one of {sorted(CONVERTERS)}"
        )
    return CONVERTERS[model_type]


def supported_model_types() -> list[str]:
    """Every HF ``model_type`` headwise can load."""
    return sorted(CONVERTERS)
