"""Parity with HuggingFace: tiny random models of every family, loaded through our converter."""

from __future__ import annotations

import pytest
import torch

from headwise.errors import CheckpointError
from headwise.interop import load_hf, load_pooler

FAMILIES = ["gpt2", "gpt2-untied-relu", "llama-gqa", "qwen2", "mistral", "bert"]


def _hf_outputs(hf, tokens, mask, token_types=None):
    kwargs = {"token_type_ids": token_types} if token_types is not None else {}
    with torch.no_grad():
        return hf(input_ids=tokens, attention_mask=mask, output_attentions=True,
                  output_hidden_states=True, **kwargs)


# The point holding a block's output (HF's hidden_states[l + 1]): post-norm blocks normalise
# their residual sum last, and hook_resid_post is that sum before the norm (TransformerLens).
_LAYER_OUT = {"pre": "hook_resid_post", "post": "hook_normalized_resid_post"}


def _ours(model, tokens, mask, token_types=None):
    L = len(model.blocks)
    names = [f"blocks.{l}.attn.hook_pattern" for l in range(L)]
    names += [f"blocks.{l}.{_LAYER_OUT[model.config.norm]}" for l in range(L)]
    kwargs = {"token_type_ids": token_types} if token_types is not None else {}
    with torch.no_grad():
        logits, cache = model.run_with_cache(tokens, names, attention_mask=mask, **kwargs)
        hidden = model.hidden(tokens, attention_mask=mask, **kwargs)
    return logits, hidden, cache


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("padded", [False, True], ids=["no-pad", "right-pad"])
def test_outputs_and_patterns_match_hf(hf_model_dir, batch, family, padded):
    hf, path = hf_model_dir(family)
    model = load_hf(path)
    tokens, mask = batch
    if not padded:
        mask = torch.ones_like(mask)
    token_types = None
    if family == "bert":
        token_types = torch.randint(0, 3, tokens.shape, generator=torch.Generator().manual_seed(3))
    ref = _hf_outputs(hf, tokens, mask, token_types)
    logits, hidden, cache = _ours(model, tokens, mask, token_types)
    real = mask.bool()  # compare only non-pad positions (and non-pad query rows)

    if family == "bert":  # no LM head in BertModel: compare hidden states and the pooler
        torch.testing.assert_close(hidden[real], ref.last_hidden_state[real], atol=1e-4, rtol=0)
        pooler = load_pooler(path)
        assert pooler is not None
        torch.testing.assert_close(pooler(hidden), ref.pooler_output, atol=1e-4, rtol=0)
    else:
        torch.testing.assert_close(logits[real], ref.logits[real], atol=1e-4, rtol=0)
    for l in range(len(model.blocks)):
        # HF's hidden_states[l + 1] is the output of layer l (the last one after the final
        # norm for decoders, so compare the final one through `hidden` above instead).
        if l + 1 < len(model.blocks) or family == "bert":
            ours_h = cache[f"blocks.{l}.{_LAYER_OUT[model.config.norm]}"]
            torch.testing.assert_close(ours_h[real], ref.hidden_states[l + 1][real],
                                       atol=1e-4, rtol=0)
        ours_p = cache[f"blocks.{l}.attn.hook_pattern"]  # (B, H, T, T)
        ref_p = ref.attentions[l]
        assert ours_p.shape == ref_p.shape
        for b in range(tokens.shape[0]):
            n = int(real[b].sum())
            torch.testing.assert_close(ours_p[b, :, :n, :n], ref_p[b, :, :n, :n],
                                       atol=1e-5, rtol=0)


def test_bert_left_padding_matches_hf(hf_model_dir, batch):
    """An encoder attends both ways, so left padding must work too."""
    hf, path = hf_model_dir("bert")
    model = load_hf(path)
    tokens, mask = batch
    mask = mask.flip(-1)  # padding first
    ref = _hf_outputs(hf, tokens, mask)
    _, hidden, _ = _ours(model, tokens, mask)
    torch.testing.assert_close(hidden[mask.bool()], ref.last_hidden_state[mask.bool()],
                               atol=1e-4, rtol=0)


@pytest.mark.parametrize("family", ["llama-gqa", "mistral"])
def test_gqa_config_and_head_mapping(hf_model_dir, family):
    """Query head h reads the kv head HF's own ``repeat_kv`` gives it."""
    from transformers.models.llama.modeling_llama import repeat_kv

    hf, path = hf_model_dir(family)
    model = load_hf(path)
    c = model.config
    assert c.n_kv_heads == hf.config.num_key_value_heads < c.n_heads
    assert c.d_head == hf.config.head_dim
    attn = model.blocks[0].attn
    labels = torch.arange(c.n_kv_heads, dtype=torch.float32).view(1, -1, 1, 1)  # kv head ids
    hf_reads = repeat_kv(labels, c.n_heads // c.n_kv_heads).flatten().long().tolist()
    assert attn.kv_heads(list(range(c.n_heads))).tolist() == hf_reads
    torch.testing.assert_close(attn.k_proj.weight, hf.model.layers[0].self_attn.k_proj.weight)


def test_mistral_sliding_window_becomes_max_seq_len(hf_model_dir):
    _, path = hf_model_dir("mistral")
    assert load_hf(path).config.max_seq_len == 32
    assert load_hf(path, max_seq_len=8).config.max_seq_len == 8
    # Raising it past the window would attend where HF's sliding window does not.
    with pytest.raises(CheckpointError, match=r"max_seq_len: got 64, expected at most "
                                              r"the checkpoint's 32"):
        load_hf(path, max_seq_len=64)


def test_qwen2_has_qkv_bias_only(hf_model_dir):
    hf, path = hf_model_dir("qwen2")
    attn = load_hf(path).blocks[1].attn
    assert attn.o_proj.bias is None
    torch.testing.assert_close(attn.k_proj.bias, hf.model.layers[1].self_attn.k_proj.bias)


def test_bert_for_masked_lm_body_loads(batch, tmp_path):
    """A task checkpoint (prefix ``bert.``, MLM head ``cls.*``) loads its encoder exactly."""
    transformers = pytest.importorskip("transformers")
    cfg = transformers.BertConfig(num_hidden_layers=1, num_attention_heads=2, hidden_size=10,
                                  intermediate_size=14, vocab_size=53, max_position_embeddings=16,
                                  hidden_act="gelu_new")
    hf = transformers.BertForMaskedLM(cfg).eval()
    hf.save_pretrained(tmp_path)
    model = load_hf(tmp_path)
    assert model.config.activation == "gelu_tanh"
    tokens, mask = batch
    with torch.no_grad():
        ref = hf.bert(input_ids=tokens, attention_mask=mask).last_hidden_state
        torch.testing.assert_close(model.hidden(tokens, mask)[mask.bool()], ref[mask.bool()],
                                   atol=1e-4, rtol=0)


def _layernorm_inputs(hf, tokens, mask, token_types):
    """What each of HF's BERT LayerNorms receives: the residual sums before the norm."""
    seen = {}
    handles = []
    for l, layer in enumerate(hf.encoder.layer):
        for key, norm in (("mid", layer.attention.output.LayerNorm),
                          ("post", layer.output.LayerNorm)):
            handles.append(norm.register_forward_pre_hook(
                lambda mod, args, key=(l, key): seen.update({key: args[0]})))
    try:
        _hf_outputs(hf, tokens, mask, token_types)
    finally:
        for h in handles:
            h.remove()
    return seen


def test_bert_residual_points_sit_before_the_norm_as_in_transformerlens(hf_model_dir, batch):
    """hook_resid_mid / hook_resid_post hold the sums HF's LayerNorms receive; the
    normalised points hold HF's normalised outputs (hidden_states[l + 1] for resid_post)."""
    hf, path = hf_model_dir("bert")
    model = load_hf(path)
    tokens, mask = batch
    token_types = torch.randint(0, 3, tokens.shape, generator=torch.Generator().manual_seed(3))
    ref_in = _layernorm_inputs(hf, tokens, mask, token_types)
    ref = _hf_outputs(hf, tokens, mask, token_types)
    names = [f"blocks.{l}.{leaf}" for l in range(2) for leaf in (
        "hook_resid_pre", "hook_resid_mid", "hook_normalized_resid_mid", "hook_resid_post",
        "hook_normalized_resid_post")]
    with torch.no_grad():
        _, cache = model.run_with_cache(tokens, names, attention_mask=mask,
                                        token_type_ids=token_types)
    real = mask.bool()
    for l in range(2):
        p = f"blocks.{l}."
        torch.testing.assert_close(cache[p + "hook_resid_mid"][real], ref_in[l, "mid"][real],
                                   atol=1e-4, rtol=0)
        torch.testing.assert_close(cache[p + "hook_resid_post"][real], ref_in[l, "post"][real],
                                   atol=1e-4, rtol=0)
        torch.testing.assert_close(cache[p + "hook_normalized_resid_post"][real],
                                   ref.hidden_states[l + 1][real], atol=1e-4, rtol=0)
        norm1 = hf.encoder.layer[l].attention.output.LayerNorm  # HF's own module on our sum
        with torch.no_grad():
            torch.testing.assert_close(cache[p + "hook_normalized_resid_mid"][real],
                                       norm1(cache[p + "hook_resid_mid"])[real],
                                       atol=1e-5, rtol=0)
        # Pre-norm sums differ from the normalised values (random weights: by far more than 1e-4).
        assert (cache[p + "hook_resid_post"] - cache[p + "hook_normalized_resid_post"]
                ).abs().max() > 0.1
    torch.testing.assert_close(cache["blocks.1.hook_resid_pre"],
                               cache["blocks.0.hook_normalized_resid_post"], atol=0, rtol=0)
