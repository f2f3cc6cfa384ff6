"""Llama family (Llama, Mistral, Qwen2): RMSNorm, SwiGLU, rotary positions, grouped-query attention.

HF Llama applies RoPE in the "rotate half" layout directly to ``q_proj``/``k_proj`` outputs, the
layout our ``Rotary`` uses, so no permutation is needed. GQA: ``num_key_value_heads`` is our
``n_kv_heads`` and query head ``h`` reads kv head ``h // (n_heads / n_kv_heads)`` in both (HF's
``repeat_kv``). SwiGLU maps to our ``GatedMLP`` (``gate_proj``/``up_proj``/``down_proj``).
Qwen2 has biases on q/k/v only (our ``bias="qkv"``). Mistral's (and Qwen2's optional) sliding
window equals full causal attention for sequences no longer than the window, so the window
becomes our ``max_seq_len``. Scaled RoPE variants (``rope_scaling`` / a ``rope_type`` other than
``"default"``) are refused.
"""

from __future__ import annotations

from typing import Any

from headwise.config import Bias, ModelConfig
from headwise.errors import CheckpointError
from headwise.interop.converter import Converter, Rule
from headwise.interop.hf_config import expect, expect_decoder, refuse, refuse_common, require


def _rope_base(hf: dict[str, Any]) -> float:
    """``rope_theta`` from transformers 4 (top level) or 5 (``rope_parameters``)."""
    # transformers 5 still reads a legacy ``rope_scaling`` next to ``rope_parameters``.
    scaling = hf.get("rope_scaling")
    if not (isinstance(scaling, dict)
            and scaling.get("rope_type", scaling.get("type")) == "default"):
        refuse(hf, "rope_scaling")
    params = hf.get("rope_parameters")
    if isinstance(params, dict):
        rope_type = params.get("rope_type", params.get("type", "default"))
        if rope_type != "default":
            raise CheckpointError(
                f"config.json rope_parameters.rope_type: got {rope_type!r}, expected 'default' "
                "(headwise implements plain RoPE only)"
            )
        if "rope_theta" in params:
            return float(params["rope_theta"])
    return float(hf.get("rope_theta", 10000.0))


def _bias(hf: dict[str, Any], model_type: str) -> Bias:
    if model_type == "qwen2":
        return "qkv"
    attn, mlp = bool(hf.get("attention_bias", False)), bool(hf.get("mlp_bias", False))
    if attn != mlp:
        raise CheckpointError(
            f"config.json attention_bias={attn} with mlp_bias={mlp}: expected both equal "
            "(headwise's bias is 'all', 'none' or 'qkv')"
        )
    return "all" if attn else "none"


def config_from_hf(hf: dict[str, Any]) -> ModelConfig:
    """Translate a Llama / Mistral / Qwen2 ``config.json``.

    Raises:
        CheckpointError: a missing field or a feature headwise lacks (named).
    """
    refuse_common(hf)
    model_type = str(hf.get("model_type"))
    if hf.get("hidden_act", "silu") != "silu":
        raise CheckpointError(f"config.json hidden_act: got {hf['hidden_act']!r}, "
                              "expected 'silu' (SwiGLU)")
    n_heads = require(hf, "num_attention_heads")
    d_model = require(hf, "hidden_size")
    max_seq_len = require(hf, "max_position_embeddings")
    window = hf.get("sliding_window")
    if model_type == "qwen2" and not hf.get("use_sliding_window", False):
        window = None
    if window is not None:
        max_seq_len = min(max_seq_len, int(window))
    return ModelConfig(
        n_layers=require(hf, "num_hidden_layers"), n_heads=n_heads,
        n_kv_heads=hf.get("num_key_value_heads") or n_heads, d_model=d_model,
        d_head=hf.get("head_dim") or d_model // n_heads, d_ff=require(hf, "intermediate_size"),
        vocab_size=require(hf, "vocab_size"), max_seq_len=max_seq_len, causal=True,
        norm="pre", norm_type="rmsnorm", norm_eps=float(hf.get("rms_norm_eps", 1e-6)),
        activation="swiglu", positional="rope", rope_base=_rope_base(hf),
        bias=_bias(hf, model_type), tie_embeddings=bool(hf.get("tie_word_embeddings", False)),
    )


def config_to_hf(c: ModelConfig) -> dict[str, Any]:
    """Our config as a Llama ``config.json`` (``LlamaForCausalLM``), or Qwen2's when the bias is
    on q/k/v only (``bias='qkv'``); the inverse of ``config_from_hf``.

    Raises:
        ConfigError: a field the Llama family has no equivalent for (named): e.g. learned
            positions, LayerNorm, an activation other than ``'swiglu'``, post-norm.
    """
    family = "Llama"
    expect_decoder(c, family)
    for name, allowed in (("positional", ("rope",)), ("norm", ("pre",)),
                          ("norm_type", ("rmsnorm",)), ("activation", ("swiglu",))):
        expect(c, name, allowed, family)
    qwen2 = c.bias == "qkv"
    out: dict[str, Any] = {
        "model_type": "qwen2" if qwen2 else "llama",
        "architectures": ["Qwen2ForCausalLM" if qwen2 else "LlamaForCausalLM"],
        "num_hidden_layers": c.n_layers, "num_attention_heads": c.n_heads,
        "num_key_value_heads": c.n_kv_heads, "hidden_size": c.d_model, "head_dim": c.d_head,
        "intermediate_size": c.d_ff, "vocab_size": c.vocab_size,
        "max_position_embeddings": c.max_seq_len, "rms_norm_eps": c.norm_eps,
        "rope_theta": c.rope_base, "hidden_act": "silu", "attention_dropout": c.dropout,
        "tie_word_embeddings": c.tie_embeddings, "bos_token_id": None, "eos_token_id": None,
    }
    if qwen2:
        out["use_sliding_window"] = False
    else:
        out["attention_bias"] = out["mlp_bias"] = c.bias == "all"
    return out


GLOBAL_KEYS = {
    "embed.weight": Rule("embed_tokens.weight"),
    "ln_final.weight": Rule("norm.weight"),
    "unembed.weight": Rule("lm_head.weight"),  # only read when not tied
}

_L = "layers.{i}."
LAYER_KEYS = {
    "blocks.{i}.ln1.weight": Rule(_L + "input_layernorm.weight"),
    "blocks.{i}.ln2.weight": Rule(_L + "post_attention_layernorm.weight"),
    **{f"blocks.{{i}}.attn.{p}.{t}": Rule(f"{_L}self_attn.{p}.{t}")
       for p in ("q_proj", "k_proj", "v_proj", "o_proj") for t in ("weight", "bias")},
    **{f"blocks.{{i}}.mlp.{p}.{t}": Rule(f"{_L}mlp.{p}.{t}")
       for p in ("gate_proj", "up_proj", "down_proj") for t in ("weight", "bias")},
}

# PEFT module names relative to ``*ForCausalLM`` (``base_model.model.<name>``).
PEFT_MODULES: dict[str, tuple[str, ...]] = {
    **{f"model.layers.{{i}}.self_attn.{p}": (f"blocks.{{i}}.attn.{p}",)
       for p in ("q_proj", "k_proj", "v_proj", "o_proj")},
    **{f"model.layers.{{i}}.mlp.{p}": (f"blocks.{{i}}.mlp.{p}",)
       for p in ("gate_proj", "up_proj", "down_proj")},
}

CONVERTER = Converter(
    model_type=("llama", "mistral", "qwen2"),
    config_from_hf=config_from_hf,
    global_keys=GLOBAL_KEYS,
    layer_keys=LAYER_KEYS,
    prefixes=("model.",),
    ignored=(r"layers\.\d+\.self_attn\.rotary_emb\.inv_freq", r"rotary_emb\.inv_freq",
             r"lm_head\.weight"),
    peft_modules=PEFT_MODULES,
    peft_model_class="LlamaForCausalLM / MistralForCausalLM / Qwen2ForCausalLM",
    peft_task_type="CAUSAL_LM",
    config_to_hf=config_to_hf,
    export_prefix="model.",
    head_keys=("lm_head.weight",),
)
