"""PEFT exchange: headwise LoRA -> PEFT adapter -> HF model, and PEFT adapter -> headwise."""

from __future__ import annotations

import copy
import json

import pytest
import torch

from headwise.control.lora import apply_lora, lora_modules
from headwise.errors import CheckpointError
from headwise.interop import load_hf
from headwise.interop.peft_export import export_peft, import_peft

peft = pytest.importorskip("peft")

MODEL_TYPE = {"gpt2": "gpt2", "llama-gqa": "llama", "qwen2": "qwen2", "bert": "bert"}


def _train_a_few_steps(model, tokens, steps=3):
    """A few AdamW steps on a next-token loss so every B is nonzero."""
    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=0.05)
    for _ in range(steps):
        logits = model(tokens[:, :-1])
        loss = torch.nn.functional.cross_entropy(logits.flatten(0, 1), tokens[:, 1:].flatten())
        opt.zero_grad()
        loss.backward()
        opt.step()
    model.eval()
    for mod in lora_modules(model).values():
        assert mod.lora_B.abs().sum() > 0


def _ours_out(model, family, tokens, mask):
    with torch.no_grad():
        if family == "bert":
            return model.hidden(tokens, attention_mask=mask)
        return model(tokens, attention_mask=mask)


def _hf_out(hf, family, tokens, mask):
    with torch.no_grad():
        out = hf(input_ids=tokens, attention_mask=mask)
    return out.last_hidden_state if family == "bert" else out.logits


CASES = [
    ("llama-gqa", dict(targets=("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj",
                                "down_proj"), rank=4, alpha=8)),
    ("llama-gqa", dict(targets=("q_proj", "k_proj", "v_proj", "o_proj"), heads="L1.H4,L0.H1",
                       rank=3, alpha=5)),
    ("qwen2", dict(targets=("q_proj", "v_proj"), layers=(1,), rank=2, alpha=2)),
    ("gpt2", dict(targets=("q_proj", "v_proj", "o_proj", "up_proj"), rank=4, alpha=16)),
    ("gpt2", dict(targets=("k_proj",), heads="L0.H2", rank=2, alpha=4)),
    ("bert", dict(targets=("q_proj", "v_proj", "down_proj"), rank=4, alpha=8)),
]


@pytest.mark.parametrize(("family", "kwargs"), CASES,
                         ids=[f"{f}-{'-'.join(k['targets'])}" for f, k in CASES])
def test_export_then_peft_matches_headwise(hf_model_dir, batch, tmp_path, family, kwargs):
    hf, path = hf_model_dir(family)
    model = load_hf(path)
    apply_lora(model, **kwargs)
    tokens, mask = batch
    _train_a_few_steps(model, tokens)
    out = export_peft(model, tmp_path / "adapter", MODEL_TYPE[family],
                      base_model_name_or_path=str(path))
    peft_model = peft.PeftModel.from_pretrained(copy.deepcopy(hf), out).eval()
    n_lora = sum(1 for n, _ in peft_model.named_modules() if n.endswith("lora_A.default"))
    assert n_lora == len(json.loads((out / "adapter_config.json").read_text())["target_modules"])
    real = mask.bool()
    ours = _ours_out(model, family, tokens, mask)
    theirs = _hf_out(peft_model, family, tokens, mask)
    base = _hf_out(hf, family, tokens, mask)
    assert (ours[real] - base[real]).abs().max() > 1e-3  # the adapter matters
    torch.testing.assert_close(ours[real], theirs[real], atol=1e-4, rtol=0)


def test_gpt2_fused_c_attn_uses_rank_pattern(hf_model_dir, batch, tmp_path):
    _, path = hf_model_dir("gpt2")
    model = load_hf(path)
    apply_lora(model, targets=("q_proj", "v_proj", "o_proj"), rank=4, alpha=16)
    cfg = json.loads((export_peft(model, tmp_path, "gpt2") / "adapter_config.json").read_text())
    assert cfg["r"] == 4 and cfg["fan_in_fan_out"] is True
    assert cfg["rank_pattern"] == {"transformer.h.0.attn.c_attn": 8,
                                   "transformer.h.1.attn.c_attn": 8}
    assert cfg["alpha_pattern"] == {"transformer.h.0.attn.c_attn": 32.0,
                                    "transformer.h.1.attn.c_attn": 32.0}


def _peft_adapter(hf, family, tmp_path, **lora_kwargs):
    """A PEFT LoRA with random nonzero A and B, saved with save_pretrained."""
    cfg = peft.LoraConfig(**lora_kwargs)
    pm = peft.get_peft_model(copy.deepcopy(hf), cfg)
    with torch.no_grad():
        for name, p in pm.named_parameters():
            if "lora_" in name:
                p.normal_(0.0, 0.2)
    pm.save_pretrained(tmp_path / "peft")
    return pm.eval(), tmp_path / "peft"


IMPORTS = [
    ("llama-gqa", dict(r=4, lora_alpha=8, target_modules=["q_proj", "k_proj", "v_proj",
                                                          "o_proj", "up_proj"])),
    ("llama-gqa", dict(r=4, lora_alpha=6, use_rslora=True, target_modules=["v_proj", "o_proj"],
                       rank_pattern={"o_proj": 2}, alpha_pattern={"o_proj": 3})),
    ("gpt2", dict(r=3, lora_alpha=6, target_modules=["c_attn", "c_fc"], fan_in_fan_out=True)),
    ("bert", dict(r=2, lora_alpha=4, target_modules=["query", "value", "dense"],
                  layers_to_transform=[1])),
]


@pytest.mark.parametrize(("family", "kwargs"), IMPORTS,
                         ids=[f"{f}-{i}" for i, (f, _) in enumerate(IMPORTS)])
def test_import_peft_matches_peft(hf_model_dir, batch, tmp_path, family, kwargs):
    hf, path = hf_model_dir(family)
    pm, adapter = _peft_adapter(hf, family, tmp_path, **kwargs)
    model = load_hf(path)
    import_peft(model, adapter, MODEL_TYPE[family])
    model.eval()
    tokens, mask = batch
    real = mask.bool()
    ours = _ours_out(model, family, tokens, mask)
    torch.testing.assert_close(ours[real], _hf_out(pm, family, tokens, mask)[real],
                               atol=1e-4, rtol=0)
    base = _hf_out(hf, family, tokens, mask)
    assert (ours[real] - base[real]).abs().max() > 1e-3


def test_roundtrip_import_then_export(hf_model_dir, batch, tmp_path):
    """PEFT -> headwise -> PEFT gives the same HF outputs again."""
    hf, path = hf_model_dir("llama-gqa")
    pm, adapter = _peft_adapter(hf, "llama-gqa", tmp_path, r=2, lora_alpha=4,
                                target_modules=["q_proj", "down_proj"])
    model = load_hf(path)
    import_peft(model, adapter, "llama")
    again = peft.PeftModel.from_pretrained(copy.deepcopy(hf),
                                           export_peft(model, tmp_path / "x", "llama")).eval()
    tokens, mask = batch
    torch.testing.assert_close(_hf_out(again, "llama", tokens, mask),
                               _hf_out(pm, "llama", tokens, mask), atol=1e-5, rtol=0)


def test_export_errors(hf_model_dir, tmp_path):
    _, path = hf_model_dir("gpt2")
    model = load_hf(path)
    with pytest.raises(ValueError, match="has no LoRA adapters"):
        export_peft(model, tmp_path, "gpt2")
    apply_lora(model, targets=("q_proj",), rank=2)
    with pytest.raises(CheckpointError, match="model_type: got 't5'"):
        export_peft(model, tmp_path, "t5")


def _write_adapter(tmp_path, config, tensors):
    from safetensors.torch import save_file

    tmp_path.mkdir(exist_ok=True)
    (tmp_path / "adapter_config.json").write_text(json.dumps(config))
    save_file(tensors, str(tmp_path / "adapter_model.safetensors"))
    return tmp_path


BASE_CFG = {"peft_type": "LORA", "r": 2, "lora_alpha": 4, "bias": "none"}
Q = "base_model.model.model.layers.0.self_attn.q_proj"


@pytest.mark.parametrize(("config", "tensors", "message"), [
    ({**BASE_CFG, "use_dora": True}, {}, "use_dora: got True"),
    ({**BASE_CFG, "bias": "all"}, {}, "bias: got 'all'"),
    ({**BASE_CFG, "modules_to_save": ["lm_head"]}, {}, "modules_to_save"),
    ({**BASE_CFG, "peft_type": "IA3"}, {}, "peft_type: got 'IA3'"),
    (BASE_CFG, {f"{Q}.lora_A.weight": torch.zeros(2, 36)},
     f"missing key '{Q}.lora_B.weight'"),
    (BASE_CFG, {f"{Q}.lora_A.weight": torch.zeros(2, 35), f"{Q}.lora_B.weight": torch.zeros(48, 2)},
     r"lora_A.weight: got shape \(2, 35\), expected \(2, 36\)"),
    (BASE_CFG, {f"{Q}.lora_A.weight": torch.zeros(2, 36), f"{Q}.lora_B.weight": torch.zeros(40, 2)},
     r"lora_B.weight: got shape \(40, 2\), expected \(48, 2\)"),
    (BASE_CFG, {"base_model.model.lm_head.lora_A.weight": torch.zeros(2, 36),
                "base_model.model.lm_head.lora_B.weight": torch.zeros(53, 2)},
     "module 'lm_head' is not one headwise can map"),
    (BASE_CFG, {"base_model.model.model.embed_tokens.lora_embedding_A": torch.zeros(2, 53)},
     "not a LoRA A/B weight"),
])
def test_import_errors(hf_model_dir, tmp_path, config, tensors, message):
    _, path = hf_model_dir("llama-gqa")
    model = load_hf(path)
    adapter = _write_adapter(tmp_path / "a", config, tensors or {
        f"{Q}.lora_A.weight": torch.zeros(2, 36), f"{Q}.lora_B.weight": torch.zeros(48, 2)})
    with pytest.raises(CheckpointError, match=message):
        import_peft(model, adapter, "llama")
    assert not lora_modules(model)


def test_import_of_an_adapter_without_lora_weights_is_refused(hf_model_dir, tmp_path):
    _, path = hf_model_dir("llama-gqa")
    model = load_hf(path)
    (tmp_path / "adapter_config.json").write_text(json.dumps(BASE_CFG))
    from safetensors.torch import save_file

    save_file({}, str(tmp_path / "adapter_model.safetensors"))
    with pytest.raises(CheckpointError, match=r"no LoRA weights \(lora_A / lora_B\) found"):
        import_peft(model, tmp_path, "llama")
    assert not lora_modules(model)
