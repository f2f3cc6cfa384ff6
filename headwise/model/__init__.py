"""The transparent Transformer: every step of a layer is a named module with hook points."""

from headwise.model.attention import Attention
from headwise.model.block import PostNormBlock, PreNormBlock
from headwise.model.build import build_mlm_head, build_model
from headwise.model.byte_tokenizer import ByteTokenizer
from headwise.model.factored import FactoredMatrix
from headwise.model.inputs import check_tokens
from headwise.model.mlm_head import MLMHead
from headwise.model.mlp import MLP, GatedMLP
from headwise.model.norm import LayerNorm, RMSNorm
from headwise.model.positional import LearnedPositional, Rotary, SinusoidalPositional
from headwise.model.transformer import Transformer

__all__ = ["MLP", "Attention", "ByteTokenizer", "FactoredMatrix", "GatedMLP", "LayerNorm",
           "LearnedPositional", "MLMHead", "PostNormBlock", "PreNormBlock", "RMSNorm", "Rotary",
           "SinusoidalPositional", "Transformer", "build_mlm_head", "build_model",
           "check_tokens"]
