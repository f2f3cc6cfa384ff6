"""ModelConfig validation: each bad field raises ConfigError naming it and what is allowed."""

from __future__ import annotations

import pytest

from headwise.config import PRESETS, ModelConfig, preset
from headwise.errors import ConfigError

# (changes, field named in the message, text that describes the allowed values)
BAD_FIELDS = [
    ({"n_layers": 0}, "n_layers", "integer >= 1"),
    ({"n_layers": 2.0}, "n_layers", "integer >= 1"),
    ({"n_layers": True}, "n_layers", "integer >= 1"),
    ({"n_heads": 0}, "n_heads", "integer >= 1"),
    ({"d_model": -4}, "d_model", "integer >= 1"),
    ({"vocab_size": 0}, "vocab_size", "integer >= 1"),
    ({"max_seq_len": "128"}, "max_seq_len", "integer >= 1"),
    ({"d_model": 10, "n_heads": 4}, "d_head", "not divisible"),
    ({"d_head": 0}, "d_head", "integer >= 1"),
    ({"n_kv_heads": 0}, "n_kv_heads", "integer >= 1"),
    ({"n_kv_heads": 3}, "n_kv_heads", "divisor of n_heads=4"),
    ({"d_ff": 0}, "d_ff", "integer >= 1"),
    ({"n_token_types": -1}, "n_token_types", "integer >= 0"),
    ({"norm": "middle"}, "norm", "['pre', 'post']"),
    ({"norm_type": "batchnorm"}, "norm_type", "['layernorm', 'rmsnorm']"),
    ({"activation": "tanh"}, "activation", "'relu', 'gelu', 'gelu_tanh', 'silu', 'swiglu'"),
    ({"positional": "alibi"}, "positional", "['learned', 'sinusoidal', 'rope', 'none']"),
    ({"bias": "some"}, "bias", "['all', 'none', 'qkv']"),
    ({"causal": "yes"}, "causal", "true or false"),
    ({"tie_embeddings": 1}, "tie_embeddings", "true or false"),
    ({"attn_only": None}, "attn_only", "true or false"),
    ({"embed_norm": "no"}, "embed_norm", "true or false"),
    ({"dropout": 1.0}, "dropout", "[0, 1)"),
    ({"dropout": -0.1}, "dropout", "[0, 1)"),
    ({"dropout": "0.1"}, "dropout", "[0, 1)"),
    ({"norm_eps": 0.0}, "norm_eps", "positive number"),
    ({"rope_base": -1.0}, "rope_base", "positive number"),
    ({"positional": "rope", "d_model": 15, "n_heads": 3}, "d_head", "even number"),
]


@pytest.mark.parametrize("changes, field, allowed", BAD_FIELDS,
                         ids=[f"{f}={list(c.values())[-1]!r}" for c, f, _ in BAD_FIELDS])
def test_bad_field_names_field_value_and_allowed(changes: dict, field: str, allowed: str) -> None:
    with pytest.raises(ConfigError) as err:
        ModelConfig(**changes)
    msg = str(err.value)
    assert msg.startswith(f"{field}:"), msg
    assert allowed in msg, msg
    assert isinstance(err.value, ValueError)


def test_defaults_are_derived() -> None:
    c = ModelConfig(d_model=48, n_heads=6)
    assert (c.d_head, c.n_kv_heads, c.d_ff, c.group_size) == (8, 6, 192, 1)
    g = ModelConfig(d_model=48, n_heads=6, n_kv_heads=2)
    assert g.group_size == 3


def test_explicit_d_head_need_not_divide_d_model() -> None:
    c = ModelConfig(d_model=10, n_heads=3, d_head=4)
    assert c.d_head == 4


def test_bias_booleans_normalised() -> None:
    assert ModelConfig(bias=True).bias == "all"
    assert ModelConfig(bias=False).bias == "none"
    assert ModelConfig(bias="qkv").bias == "qkv"


def test_frozen() -> None:
    c = ModelConfig()
    with pytest.raises(AttributeError):
        c.n_layers = 3  # type: ignore[misc]


def test_replace_validates_again() -> None:
    c = ModelConfig()
    assert c.replace(n_layers=5).n_layers == 5
    with pytest.raises(ConfigError, match="^norm:"):
        c.replace(norm="sandwich")


@pytest.mark.parametrize("name", sorted(PRESETS))
def test_round_trip_through_dict(name: str) -> None:
    c = preset(name)
    assert ModelConfig.from_dict(c.to_dict()) == c


def test_from_dict_rejects_unknown_key_with_suggestion() -> None:
    with pytest.raises(ConfigError) as err:
        ModelConfig.from_dict({"n_layer": 2, "d_model": 64})
    msg = str(err.value)
    assert "model.n_layer" in msg and "unknown field" in msg and "'n_layers'" in msg


def test_from_dict_unknown_key_without_close_match() -> None:
    with pytest.raises(ConfigError, match=r"^cfg\.zzzz: unknown field$"):
        ModelConfig.from_dict({"zzzz": 1}, path="cfg")


def test_from_dict_prefixes_path_on_bad_value() -> None:
    with pytest.raises(ConfigError, match=r"^spec\.model\.activation: got 'tanh', expected one"):
        ModelConfig.from_dict({"activation": "tanh"}, path="spec.model")


def test_from_dict_rejects_non_mapping() -> None:
    with pytest.raises(ConfigError, match=r"^model: got list, expected a mapping"):
        ModelConfig.from_dict([("n_layers", 2)])  # type: ignore[arg-type]


def test_unknown_preset_lists_known() -> None:
    with pytest.raises(ConfigError) as err:
        preset("huge")
    assert "'huge'" in str(err.value) and "tiny" in str(err.value)
