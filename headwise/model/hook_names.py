"""Hook names from TransformerLens's short forms: ``get_act_name("pattern", 0)``.

``get_act_name`` follows TransformerLens's ``utils.get_act_name``: a short activation name
(with its aliases: ``attn`` -> ``pattern``, ``attn_logits`` -> ``attn_scores``, ``key`` / ``query``
/ ``value`` -> ``k`` / ``q`` / ``v``, ``mlp_pre`` / ``mlp_post`` -> ``pre`` / ``post``), a layer and
a sub-layer type (``a``/``attn``, ``m``/``mlp``, ``ln1``, ...) or the compact ``"pattern0a"``
form, to the full hook name. A name that already has a ``.`` or starts with ``hook_`` is
returned as it is. ``cache[name, layer]`` indexes an ``ActivationCache`` the same way.
"""

from __future__ import annotations

import re

_LAYER_TYPES = {"a": "attn", "m": "mlp", "b": "", "block": "", "blocks": "",
                "attention": "attn"}
_ALIASES = {"attn": "pattern", "attn_logits": "attn_scores", "key": "k", "query": "q",
            "value": "v", "mlp_pre": "pre", "mlp_mid": "mid", "mlp_post": "post"}
_ATTN = ("k", "v", "q", "z", "rot_k", "rot_q", "result", "pattern", "attn_scores")
_MLP = ("pre", "post", "mid", "pre_linear")
_NORM = ("scale", "normalized")


def get_act_name(name: str, layer: int | None = None, layer_type: str | None = None) -> str:
    """The full hook name of a short one, as TransformerLens's ``utils.get_act_name``.

    Args:
        name: a short name (``"pattern"``, ``"resid_pre"``, ``"z"``, ``"normalized"``, ...),
            the compact ``"pattern0a"`` form (name, layer, type), or a full hook name.
        layer: the block index (``None``: a model-level point such as ``hook_embed``).
        layer_type: the sub-layer for names that need one (``"ln1"``, ``"a"``, ``"m"``).

    Returns:
        e.g. ``blocks.0.attn.hook_pattern`` for ``("pattern", 0)``, ``hook_embed`` for
        ``"embed"``, ``ln_final.hook_normalized`` for ``"normalized"``.

    Raises:
        ValueError: a layer below 0 or a name that is not a string.
    """
    if not isinstance(name, str):
        raise ValueError(f"name: got {name!r}, expected a hook name or a short name")
    if layer is not None and (isinstance(layer, bool) or int(layer) < 0):
        raise ValueError(f"layer: got {layer!r}, expected a block index >= 0")
    if ("." in name or name.startswith("hook_")) and layer is None and layer_type is None:
        return name
    compact = re.fullmatch(r"([a-z_]+?)(\d+)([a-z]\w*)?", name)
    if compact is not None and layer is None:
        name, layer, layer_type = compact.group(1), int(compact.group(2)), compact.group(3)
    name = _ALIASES.get(name, name)
    if name in _ATTN:
        layer_type = "attn"
    elif name in _MLP:
        layer_type = "mlp"
    elif layer_type in _LAYER_TYPES:
        layer_type = _LAYER_TYPES[layer_type]
    full = f"blocks.{int(layer)}." if layer is not None else ""
    full += f"{layer_type}." if layer_type else ""
    full += f"hook_{name}"
    if name in _NORM and layer is None:
        full = f"ln_final.{full}"
    return full
