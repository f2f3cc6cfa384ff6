"""BERT: HF ``BertModel`` (and ``BertFor*`` bodies) -> headwise post-norm encoder, plus the pooler.

BERT is post-norm (``LN(x + sublayer(x))``), non-causal, with exact-erf GELU, learned absolute
positions, token-type (segment) embeddings and a LayerNorm after the embedding sum (our
``token_type_embed`` and ``embed_norm``); ``layer_norm_eps`` is 1e-12. This covers
all-MiniLM-L6-v2. Our ``unembed`` is tied to the word embeddings. BERT's masked-LM head
(``cls.predictions``: dense + GELU + LayerNorm, the tied decoder and its bias) is read into
``model.mlm_head`` when the checkpoint has it (``BertForMaskedLM``, ``BertForPreTraining``), and
the logits then equal transformers' MLM logits; without it the logits are ``unembed(hidden)``
and the parity target is the hidden states. The NSP head (``cls.seq_relationship``) is ignored.
The pooler (``tanh(W h_[CLS] + b)``) is loaded separately
as ``BertPooler`` by ``headwise.interop.load_pooler``.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor, nn

from headwise.config import ModelConfig
from headwise.errors import ConfigError
from headwise.interop.converter import Converter, Rule
from headwise.interop.hf_config import (
    activation,
    expect,
    expect_mha,
    hf_activation,
    refuse,
    refuse_common,
    require,
)


def config_from_hf(hf: dict) -> ModelConfig:
    """Translate a BERT ``config.json``.

    Raises:
        CheckpointError: a missing field or a feature headwise lacks (named), e.g. relative
            ``position_embedding_type`` or ``is_decoder``.
    """
    refuse_common(hf)
    refuse(hf, "position_embedding_type", allowed="absolute")
    return ModelConfig(
        n_layers=require(hf, "num_hidden_layers"), n_heads=require(hf, "num_attention_heads"),
        d_model=require(hf, "hidden_size"), d_ff=require(hf, "intermediate_size"),
        vocab_size=require(hf, "vocab_size"),
        max_seq_len=require(hf, "max_position_embeddings"),
        causal=False, norm="post", norm_type="layernorm",
        norm_eps=float(hf.get("layer_norm_eps", 1e-12)),
        activation=activation(hf, "hidden_act", "gelu"), positional="learned", bias="all",
        tie_embeddings=True, n_token_types=int(hf.get("type_vocab_size", 2)), embed_norm=True,
    )


def config_to_hf(c: ModelConfig) -> dict[str, Any]:
    """Our config as a BERT ``config.json`` (``BertModel``), the inverse of ``config_from_hf``.

    Raises:
        ConfigError: a field BERT has no equivalent for (named): e.g. pre-norm, no embedding
            norm or no token-type embeddings, an untied unembedding (BertModel has no LM head).
    """
    family = "BERT"
    for name, allowed in (("causal", (False,)), ("norm", ("post",)),
                          ("norm_type", ("layernorm",)), ("positional", ("learned",)),
                          ("bias", ("all",)), ("embed_norm", (True,)), ("attn_only", (False,)),
                          ("tie_embeddings", (True,))):
        expect(c, name, allowed, family)
    if c.n_token_types < 1:
        raise ConfigError(f"model.n_token_types: got {c.n_token_types}, expected >= 1 to export "
                          "as HuggingFace BERT (it always has token-type embeddings)")
    expect_mha(c, family)
    return {
        "model_type": "bert", "architectures": ["BertModel"],
        "num_hidden_layers": c.n_layers, "num_attention_heads": c.n_heads,
        "hidden_size": c.d_model, "intermediate_size": c.d_ff, "vocab_size": c.vocab_size,
        "max_position_embeddings": c.max_seq_len, "type_vocab_size": c.n_token_types,
        "layer_norm_eps": c.norm_eps, "hidden_act": hf_activation(c, family),
        "position_embedding_type": "absolute", "hidden_dropout_prob": c.dropout,
        "attention_probs_dropout_prob": c.dropout,
    }


def rename(key: str) -> str:
    """Legacy TF-era spellings (``LayerNorm.gamma``/``beta``) -> ``weight``/``bias``."""
    if key.endswith(".gamma"):
        return key[: -len("gamma")] + "weight"
    if key.endswith(".beta"):
        return key[: -len("beta")] + "bias"
    return key


GLOBAL_KEYS = {
    "embed.weight": Rule("embeddings.word_embeddings.weight"),
    "pos_embed.weight": Rule("embeddings.position_embeddings.weight"),
    "token_type_embed.weight": Rule("embeddings.token_type_embeddings.weight"),
    "embed_norm.weight": Rule("embeddings.LayerNorm.weight"),
    "embed_norm.bias": Rule("embeddings.LayerNorm.bias"),
}

_L = "encoder.layer.{i}."
LAYER_KEYS = {
    "blocks.{i}.attn.q_proj.weight": Rule(_L + "attention.self.query.weight"),
    "blocks.{i}.attn.q_proj.bias": Rule(_L + "attention.self.query.bias"),
    "blocks.{i}.attn.k_proj.weight": Rule(_L + "attention.self.key.weight"),
    "blocks.{i}.attn.k_proj.bias": Rule(_L + "attention.self.key.bias"),
    "blocks.{i}.attn.v_proj.weight": Rule(_L + "attention.self.value.weight"),
    "blocks.{i}.attn.v_proj.bias": Rule(_L + "attention.self.value.bias"),
    "blocks.{i}.attn.o_proj.weight": Rule(_L + "attention.output.dense.weight"),
    "blocks.{i}.attn.o_proj.bias": Rule(_L + "attention.output.dense.bias"),
    "blocks.{i}.ln1.weight": Rule(_L + "attention.output.LayerNorm.weight"),
    "blocks.{i}.ln1.bias": Rule(_L + "attention.output.LayerNorm.bias"),
    "blocks.{i}.mlp.up_proj.weight": Rule(_L + "intermediate.dense.weight"),
    "blocks.{i}.mlp.up_proj.bias": Rule(_L + "intermediate.dense.bias"),
    "blocks.{i}.mlp.down_proj.weight": Rule(_L + "output.dense.weight"),
    "blocks.{i}.mlp.down_proj.bias": Rule(_L + "output.dense.bias"),
    "blocks.{i}.ln2.weight": Rule(_L + "output.LayerNorm.weight"),
    "blocks.{i}.ln2.bias": Rule(_L + "output.LayerNorm.bias"),
}

# PEFT module names relative to ``BertModel`` (``base_model.model.<name>``).
PEFT_MODULES: dict[str, tuple[str, ...]] = {
    _L + "attention.self.query": ("blocks.{i}.attn.q_proj",),
    _L + "attention.self.key": ("blocks.{i}.attn.k_proj",),
    _L + "attention.self.value": ("blocks.{i}.attn.v_proj",),
    _L + "attention.output.dense": ("blocks.{i}.attn.o_proj",),
    _L + "intermediate.dense": ("blocks.{i}.mlp.up_proj",),
    _L + "output.dense": ("blocks.{i}.mlp.down_proj",),
}

POOLER_KEYS = ("pooler.dense.weight", "pooler.dense.bias")

MLM_HEAD_KEYS = {
    "mlm_head.dense.weight": Rule("cls.predictions.transform.dense.weight"),
    "mlm_head.dense.bias": Rule("cls.predictions.transform.dense.bias"),
    "mlm_head.norm.weight": Rule("cls.predictions.transform.LayerNorm.weight"),
    "mlm_head.norm.bias": Rule("cls.predictions.transform.LayerNorm.bias"),
    "mlm_head.bias": Rule("cls.predictions.bias"),
}

CONVERTER = Converter(
    model_type=("bert",),
    config_from_hf=config_from_hf,
    global_keys=GLOBAL_KEYS,
    layer_keys=LAYER_KEYS,
    prefixes=("bert.",),
    # position_ids: a buffer; pooler: read by load_pooler; cls.*: the MLM head (read by
    # interop.mlm_head; its decoder is tied to the embeddings) and the NSP head.
    ignored=(r"embeddings\.position_ids", r"pooler\.dense\.(weight|bias)", r"cls\..*"),
    rename=rename,
    peft_modules=PEFT_MODULES,
    peft_model_class="BertModel",
    config_to_hf=config_to_hf,
    mlm_head_keys=MLM_HEAD_KEYS,
    mlm_export=("BertForMaskedLM", "bert."),
)


class BertPooler(nn.Module):
    """BERT's pooler: ``tanh(dense(h[:, 0]))``, the [CLS] summary used by classification heads.

    Args:
        d_model: D.
    """

    def __init__(self, d_model: int) -> None:
        super().__init__()
        self.dense = nn.Linear(d_model, d_model)

    def forward(self, hidden: Tensor) -> Tensor:  # (B, T, D) -> (B, D)
        return torch.tanh(self.dense(hidden[:, 0]))
