"""The GPT-2-shaped model the forward benchmarks share, and the same weights elsewhere.

``build`` makes headwise's model of ``SHAPE`` and the nanoGPT-style reference
(``bench.lab.reference_gpt``) with its weights; ``tl_model`` makes TransformerLens 3's
``HookedTransformer`` of that shape, with those weights when a saved state is given (it runs in
a TransformerLens environment, so nothing here imports headwise at module level).
"""

from __future__ import annotations

from typing import Any

import torch

SHAPE: dict[str, Any] = {"n_layers": 4, "d_model": 256, "n_heads": 8, "d_ff": 1024,
                         "vocab_size": 4096, "max_seq_len": 1024}


def build(seed: int = 0) -> tuple[Any, Any]:
    """Our GPT-2-shaped model and the reference with the same weights."""
    from bench.lab.reference_gpt import GPT, load_from_headwise
    from headwise import ModelConfig, build_model

    cfg = ModelConfig(**SHAPE, positional="learned", activation="gelu_tanh", norm="pre",
                      norm_type="layernorm", bias="all", tie_embeddings=True, causal=True)
    ours = build_model(cfg, seed=seed).eval()
    ref = GPT(**SHAPE).eval()
    load_from_headwise(ref, ours)
    return ours, ref


def tl_model(state_path: str | None) -> Any:
    """TransformerLens HookedTransformer of the same shape (weights from ours if given)."""
    from transformer_lens import HookedTransformer, HookedTransformerConfig

    cfg = HookedTransformerConfig(
        n_layers=SHAPE["n_layers"], d_model=SHAPE["d_model"], n_heads=SHAPE["n_heads"],
        d_head=SHAPE["d_model"] // SHAPE["n_heads"], d_mlp=SHAPE["d_ff"],
        d_vocab=SHAPE["vocab_size"], n_ctx=SHAPE["max_seq_len"], act_fn="gelu_new",
        normalization_type="LN", positional_embedding_type="standard",
        default_prepend_bos=False, dtype=torch.float32, device="cpu")
    model = HookedTransformer(cfg).eval()
    if state_path is not None:
        saved = torch.load(state_path, weights_only=True)
        model.load_state_dict(tl_state(saved["state"]), strict=False)
        with torch.no_grad():
            diff = (model(saved["tokens"]) - saved["logits"]).abs().max().item()
        assert diff < 1e-4, f"TransformerLens and headwise disagree: max |diff| = {diff}"
    return model


def tl_state(s: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Our state dict as TransformerLens 3 keys and shapes (heads split out)."""
    H, D = SHAPE["n_heads"], SHAPE["d_model"]
    Dh = D // H
    out = {"embed.W_E": s["embed.weight"], "pos_embed.W_pos": s["pos_embed.weight"],
           "unembed.W_U": s["embed.weight"].T.contiguous(),
           "unembed.b_U": torch.zeros(SHAPE["vocab_size"]),
           "ln_final.w": s["ln_final.weight"], "ln_final.b": s["ln_final.bias"]}
    for l in range(SHAPE["n_layers"]):
        p, t = f"blocks.{l}.", f"blocks.{l}."
        for ours, theirs in (("q", "Q"), ("k", "K"), ("v", "V")):
            w = s[p + f"attn.{ours}_proj.weight"]  # (H*Dh, D)
            out[t + f"attn.W_{theirs}"] = w.view(H, Dh, D).transpose(1, 2).contiguous()
            out[t + f"attn.b_{theirs}"] = s[p + f"attn.{ours}_proj.bias"].view(H, Dh)
        out[t + "attn.W_O"] = s[p + "attn.o_proj.weight"].T.contiguous().view(H, Dh, D)
        out[t + "attn.b_O"] = s[p + "attn.o_proj.bias"]
        for n in ("1", "2"):
            out[t + f"ln{n}.w"] = s[p + f"ln{n}.weight"]
            out[t + f"ln{n}.b"] = s[p + f"ln{n}.bias"]
        out[t + "mlp.W_in"] = s[p + "mlp.up_proj.weight"].T.contiguous()
        out[t + "mlp.b_in"] = s[p + "mlp.up_proj.bias"]
        out[t + "mlp.W_out"] = s[p + "mlp.down_proj.weight"].T.contiguous()
        out[t + "mlp.b_out"] = s[p + "mlp.down_proj.bias"]
    return out
