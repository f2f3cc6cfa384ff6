"""GPT-2: HF ``GPT2Model`` / ``GPT2LMHeadModel`` -> headwise (Conv1D transposes, fused qkv split).

HF's ``Conv1D`` stores weights as ``(in, out)``; ours are ``nn.Linear`` ``(out, in)``, so every
matrix is transposed. ``c_attn`` fuses q, k and v along its output axis (``[q | k | v]``, each
``D`` wide); we split it into three Linears. ``gelu_new`` is our ``"gelu_tanh"``. The
unembedding is tied to the token embedding unless ``tie_word_embeddings`` is false.
"""

from __future__ import annotations

from typing import Any

from headwise.config import ModelConfig
from headwise.interop.converter import Converter, Rule
from headwise.interop.hf_config import (
    activation,
    expect,
    expect_decoder,
    expect_mha,
    hf_activation,
    refuse,
    refuse_common,
    require,
)


def config_from_hf(hf: dict[str, Any]) -> ModelConfig:
    """Translate a GPT-2 ``config.json``.

    Raises:
        CheckpointError: a missing field or a feature headwise lacks (named).
    """
    refuse_common(hf)
    refuse(hf, "scale_attn_by_inverse_layer_idx")
    refuse(hf, "scale_attn_weights", allowed=True)
    d_model = require(hf, "n_embd")
    d_ff = hf.get("n_inner") or 4 * d_model
    return ModelConfig(
        n_layers=require(hf, "n_layer"), n_heads=require(hf, "n_head"), d_model=d_model,
        d_ff=d_ff, vocab_size=require(hf, "vocab_size"), max_seq_len=require(hf, "n_positions"),
        causal=True, norm="pre", norm_type="layernorm",
        norm_eps=float(hf.get("layer_norm_epsilon", 1e-5)),
        activation=activation(hf, "activation_function", "gelu_new"), positional="learned",
        bias="all",
        tie_embeddings=bool(hf.get("tie_word_embeddings", True)),
    )


def config_to_hf(c: ModelConfig) -> dict[str, Any]:
    """Our config as a GPT-2 ``config.json`` (``GPT2LMHeadModel``), the inverse of the above.

    Raises:
        ConfigError: a field GPT-2 has no equivalent for (named): e.g. ``norm_type='rmsnorm'``,
            grouped-query attention, ``activation='swiglu'``, bias other than ``'all'``.
    """
    family = "GPT-2"
    expect_decoder(c, family)
    for name, allowed in (("positional", ("learned",)), ("norm", ("pre",)),
                          ("norm_type", ("layernorm",)), ("bias", ("all",))):
        expect(c, name, allowed, family)
    expect_mha(c, family)
    return {
        "model_type": "gpt2", "architectures": ["GPT2LMHeadModel"],
        "n_layer": c.n_layers, "n_head": c.n_heads, "n_embd": c.d_model, "n_inner": c.d_ff,
        "vocab_size": c.vocab_size, "n_positions": c.max_seq_len, "n_ctx": c.max_seq_len,
        "layer_norm_epsilon": c.norm_eps, "activation_function": hf_activation(c, family),
        "tie_word_embeddings": c.tie_embeddings, "scale_attn_weights": True,
        "resid_pdrop": c.dropout, "embd_pdrop": c.dropout, "attn_pdrop": c.dropout,
        "bos_token_id": None, "eos_token_id": None,
    }


GLOBAL_KEYS = {
    "embed.weight": Rule("wte.weight"),
    "pos_embed.weight": Rule("wpe.weight"),
    "ln_final.weight": Rule("ln_f.weight"),
    "ln_final.bias": Rule("ln_f.bias"),
    "unembed.weight": Rule("lm_head.weight"),  # only read when not tied
}

LAYER_KEYS = {
    "blocks.{i}.ln1.weight": Rule("h.{i}.ln_1.weight"),
    "blocks.{i}.ln1.bias": Rule("h.{i}.ln_1.bias"),
    "blocks.{i}.attn.q_proj.weight": Rule("h.{i}.attn.c_attn.weight", True, (0, 3)),
    "blocks.{i}.attn.k_proj.weight": Rule("h.{i}.attn.c_attn.weight", True, (1, 3)),
    "blocks.{i}.attn.v_proj.weight": Rule("h.{i}.attn.c_attn.weight", True, (2, 3)),
    "blocks.{i}.attn.q_proj.bias": Rule("h.{i}.attn.c_attn.bias", False, (0, 3)),
    "blocks.{i}.attn.k_proj.bias": Rule("h.{i}.attn.c_attn.bias", False, (1, 3)),
    "blocks.{i}.attn.v_proj.bias": Rule("h.{i}.attn.c_attn.bias", False, (2, 3)),
    "blocks.{i}.attn.o_proj.weight": Rule("h.{i}.attn.c_proj.weight", True),
    "blocks.{i}.attn.o_proj.bias": Rule("h.{i}.attn.c_proj.bias"),
    "blocks.{i}.ln2.weight": Rule("h.{i}.ln_2.weight"),
    "blocks.{i}.ln2.bias": Rule("h.{i}.ln_2.bias"),
    "blocks.{i}.mlp.up_proj.weight": Rule("h.{i}.mlp.c_fc.weight", True),
    "blocks.{i}.mlp.up_proj.bias": Rule("h.{i}.mlp.c_fc.bias"),
    "blocks.{i}.mlp.down_proj.weight": Rule("h.{i}.mlp.c_proj.weight", True),
    "blocks.{i}.mlp.down_proj.bias": Rule("h.{i}.mlp.c_proj.bias"),
}

# PEFT module names of GPT2LMHeadModel. c_attn fuses q|k|v: adapters on our q/k/v proj export
# exactly as one c_attn adapter with stacked A and block-diagonal B (rank = sum of ranks).
PEFT_MODULES: dict[str, tuple[str, ...]] = {
    "transformer.h.{i}.attn.c_attn": ("blocks.{i}.attn.q_proj", "blocks.{i}.attn.k_proj",
                                      "blocks.{i}.attn.v_proj"),
    "transformer.h.{i}.attn.c_proj": ("blocks.{i}.attn.o_proj",),
    "transformer.h.{i}.mlp.c_fc": ("blocks.{i}.mlp.up_proj",),
    "transformer.h.{i}.mlp.c_proj": ("blocks.{i}.mlp.down_proj",),
}

CONVERTER = Converter(
    model_type=("gpt2",),
    config_from_hf=config_from_hf,
    global_keys=GLOBAL_KEYS,
    layer_keys=LAYER_KEYS,
    prefixes=("transformer.",),
    # Old checkpoints carry the causal-mask buffers; a tied lm_head duplicates wte.
    ignored=(r"h\.\d+\.attn\.(bias|masked_bias)", r"lm_head\.weight"),
    peft_modules=PEFT_MODULES,
    peft_model_class="GPT2LMHeadModel",
    peft_task_type="CAUSAL_LM",
    peft_fan_in_fan_out=True,
    config_to_hf=config_to_hf,
    export_prefix="transformer.",
    head_keys=("lm_head.weight",),
)
