"""build_model: the only reader of ModelConfig; turns a config into a Transformer."""

from __future__ import annotations

import math

import torch
from torch import nn

from headwise.config import ModelConfig
from headwise.errors import ConfigError
from headwise.memory import check_memory, model_bytes
from headwise.model.attention import Attention
from headwise.model.block import PostNormBlock, PreNormBlock
from headwise.model.mlm_head import MLMHead
from headwise.model.mlp import MLP, GatedMLP
from headwise.model.norm import LayerNorm, RMSNorm
from headwise.model.positional import LearnedPositional, Rotary, SinusoidalPositional
from headwise.model.transformer import Transformer


def build_model(config: ModelConfig, seed: int | None = None) -> Transformer:
    """Build a randomly initialised model (GPT-2 style init: N(0, 0.02), residual outputs
    scaled by 1/sqrt(2 * n_layers)).

    Args:
        config: the validated config.
        seed: if given, initialise from ``torch.Generator().manual_seed(seed)`` (reproducible
            without touching the global RNG).

    Raises:
        ResourceError: the parameters cannot fit in the memory available.
    """
    c = config
    check_memory("model", model_bytes(c))  # refuse d_model: 1e9 before allocating anything
    rng_state = torch.get_rng_state() if seed is not None else None  # layer constructors draw
    assert c.d_head is not None and c.n_kv_heads is not None and c.d_ff is not None
    qkv_bias = c.bias in ("all", "qkv")
    bias = c.bias == "all"
    # One rotary table serves every layer (it holds no parameters, only cos/sin buffers).
    rotary = Rotary(c.d_head, c.max_seq_len, c.rope_base) if c.positional == "rope" else None
    blocks = []
    for _ in range(c.n_layers):
        attn = Attention(
            nn.Linear(c.d_model, c.n_heads * c.d_head, bias=qkv_bias),
            nn.Linear(c.d_model, c.n_kv_heads * c.d_head, bias=qkv_bias),
            nn.Linear(c.d_model, c.n_kv_heads * c.d_head, bias=qkv_bias),
            nn.Linear(c.n_heads * c.d_head, c.d_model, bias=bias),
            n_heads=c.n_heads, n_kv_heads=c.n_kv_heads, d_head=c.d_head, causal=c.causal,
            rotary=rotary, dropout=c.dropout,
        )
        mlp = None if c.attn_only else _mlp(c, bias)
        block_cls = PreNormBlock if c.norm == "pre" else PostNormBlock
        blocks.append(block_cls(attn, mlp, _norm(c, bias),
                                None if c.attn_only else _norm(c, bias), c.dropout))
    pos: nn.Module | None = None
    if c.positional == "learned":
        pos = LearnedPositional(c.max_seq_len, c.d_model)
    elif c.positional == "sinusoidal":
        pos = SinusoidalPositional(c.max_seq_len, c.d_model)
    embed = nn.Embedding(c.vocab_size, c.d_model)
    unembed = nn.Linear(c.d_model, c.vocab_size, bias=False)
    if c.tie_embeddings:
        unembed.weight = embed.weight
    model = Transformer(
        c, embed=embed, pos_embed=pos,
        token_type_embed=nn.Embedding(c.n_token_types, c.d_model) if c.n_token_types else None,
        embed_norm=_norm(c, bias) if c.embed_norm else None,
        blocks=blocks, ln_final=_norm(c, bias) if c.norm == "pre" else None,
        unembed=unembed, dropout=c.dropout,
    )
    _init_weights(model, c.n_layers, seed)
    if rng_state is not None:
        torch.set_rng_state(rng_state)
    return model


def build_mlm_head(config: ModelConfig, seed: int | None = None, added: bool = True) -> MLMHead:
    """BERT's masked-LM head for a model of ``config``, initialised as transformers does
    (``BertPreTrainedModel._init_weights``): the dense weight N(0, 0.02) (BERT's
    ``initializer_range``), its bias and the output bias 0, the norm's weight 1 and bias 0.

    Args:
        config: the model's config (D, V, activation, ``norm_eps``).
        seed: if given, draw from ``torch.Generator().manual_seed(seed)``.
        added: see ``MLMHead`` (``False`` when the caller loads the checkpoint's head into it).

    Raises:
        ConfigError: a gated activation (``swiglu``), which the head's transform cannot use.
    """
    if config.activation == "swiglu":
        raise ConfigError("model.activation: got 'swiglu', expected a plain activation for the "
                          "masked-LM head's transform (relu, gelu, gelu_tanh, silu)")
    gen = torch.Generator().manual_seed(seed) if seed is not None else None
    dense = nn.Linear(config.d_model, config.d_model)
    with torch.no_grad():
        dense.weight.copy_(torch.randn(dense.weight.shape, generator=gen) * 0.02)
        dense.bias.zero_()
    return MLMHead(dense, LayerNorm(config.d_model, config.norm_eps), config.activation,
                   config.vocab_size, added)


def _norm(c: ModelConfig, bias: bool) -> nn.Module:
    if c.norm_type == "rmsnorm":
        return RMSNorm(c.d_model, c.norm_eps)
    return LayerNorm(c.d_model, c.norm_eps, bias=bias)


def _mlp(c: ModelConfig, bias: bool) -> nn.Module:
    assert c.d_ff is not None
    if c.activation == "swiglu":
        return GatedMLP(nn.Linear(c.d_model, c.d_ff, bias=bias),
                        nn.Linear(c.d_model, c.d_ff, bias=bias),
                        nn.Linear(c.d_ff, c.d_model, bias=bias), c.dropout)
    return MLP(nn.Linear(c.d_model, c.d_ff, bias=bias), nn.Linear(c.d_ff, c.d_model, bias=bias),
               c.activation, c.dropout)


@torch.no_grad()
def _init_weights(model: nn.Module, n_layers: int, seed: int | None) -> None:
    gen = torch.Generator().manual_seed(seed) if seed is not None else None
    resid_std = 0.02 / math.sqrt(2 * n_layers)
    for name, p in model.named_parameters():
        if name.endswith("bias"):
            p.zero_()
        elif p.dim() == 1:  # norm weights
            p.fill_(1.0)
        else:
            std = resid_std if name.endswith(("o_proj.weight", "down_proj.weight")) else 0.02
            p.copy_(torch.randn(p.shape, generator=gen) * std)
