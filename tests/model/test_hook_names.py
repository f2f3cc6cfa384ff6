"""``get_act_name`` against TransformerLens's documented examples, and ``cache[name, layer]``."""

from __future__ import annotations

import pytest
import torch

from headwise.config import preset
from headwise.model import build_model
from headwise.model.hook_names import get_act_name


@pytest.mark.parametrize("args, full", [
    (("k", 6, "a"), "blocks.6.attn.hook_k"),  # TransformerLens's docstring examples
    (("pre", 2), "blocks.2.mlp.hook_pre"),
    (("embed",), "hook_embed"),
    (("normalized", 27, "ln2"), "blocks.27.ln2.hook_normalized"),
    (("k6",), "blocks.6.attn.hook_k"),
    (("scale4ln1",), "blocks.4.ln1.hook_scale"),
    (("pre5",), "blocks.5.mlp.hook_pre"),
    (("resid_pre", 0), "blocks.0.hook_resid_pre"),
    (("attn", 1), "blocks.1.attn.hook_pattern"),  # aliases
    (("attn_logits", 1), "blocks.1.attn.hook_attn_scores"),
    (("value", 0), "blocks.0.attn.hook_v"),
    (("mlp_post", 0), "blocks.0.mlp.hook_post"),
    (("normalized",), "ln_final.hook_normalized"),
    (("pos_embed",), "hook_pos_embed"),
    (("blocks.0.attn.hook_z",), "blocks.0.attn.hook_z"),  # a full name as it is
])
def test_short_names_expand_as_transformerlens(args: tuple, full: str) -> None:
    assert get_act_name(*args) == full


def test_every_short_name_of_a_layer_is_a_hook_point() -> None:
    model = build_model(preset("tiny-gqa-rope"), seed=0)
    points = model.hook_dict
    for short in ("resid_pre", "resid_mid", "resid_post", "attn_out", "mlp_out", "q", "k", "v",
                  "rot_q", "rot_k", "z", "attn_scores", "pattern", "result", "pre", "post"):
        assert get_act_name(short, 1) in points, short
    assert get_act_name("normalized", 0, "ln1") in points
    assert get_act_name("embed") in points


def test_cache_takes_transformerlens_keys() -> None:
    model = build_model(preset("tiny"), seed=0).eval()
    tokens = torch.randint(0, 17, (2, 5))
    _, cache = model.run_with_cache(tokens)
    assert cache["pattern", 0] is cache["blocks.0.attn.hook_pattern"]
    assert cache["pattern", -1] is cache["blocks.1.attn.hook_pattern"]  # negative: from the end
    assert cache["resid_post", 1] is cache["blocks.1.hook_resid_post"]
    assert cache["q", 0, "attn"] is cache["blocks.0.attn.hook_q"]
    assert cache["embed"] is cache["hook_embed"]
    # iteration, keys, values and items as a dict's (TransformerLens's cache is iterated so)
    assert list(cache) == cache.keys() and len(cache.keys()) == len(cache)
    assert all(v is cache[k] for k, v in zip(cache, cache.values(), strict=True))
    assert cache.items() == list(zip(cache.keys(), cache.values(), strict=True))
    with pytest.raises(KeyError, match="was not cached"):
        cache["pattern", 5]
    with pytest.raises(ValueError, match="layer: got -1"):
        get_act_name("pattern", -1)
