"""BERT's masked-LM head: read from BertForMaskedLM, initialised as transformers does when a
checkpoint has none, the MLM loss equal to transformers' on the same weights and masks, and
exported back only when it came from the checkpoint."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from safetensors.torch import load_file

from headwise.data import IGNORE, Batch, MLMTask, add_mlm_head
from headwise.data.mlm import mask_tokens
from headwise.interop import load_hf
from headwise.interop.hf_export import export_hf
from headwise.interop.load import convert, load_converted
from headwise.training.metrics import task_loss

transformers = pytest.importorskip("transformers")

V, T = 41, 12


def _config() -> object:
    return transformers.BertConfig(num_hidden_layers=2, num_attention_heads=3, hidden_size=24,
                                   intermediate_size=40, vocab_size=V, type_vocab_size=2,
                                   max_position_embeddings=16, attn_implementation="eager")


@pytest.fixture(scope="module")
def bert_mlm(tmp_path_factory: pytest.TempPathFactory) -> tuple[object, Path]:
    torch.manual_seed(5)
    hf = transformers.BertForMaskedLM(_config())
    with torch.no_grad():  # random norms and biases too, so a swapped tensor shows
        for p in hf.parameters():
            p.normal_(0.0, 0.3)
    path = tmp_path_factory.mktemp("bert_mlm")
    hf.save_pretrained(path)
    return hf.eval(), path


def _masked(seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    original = torch.randint(3, V, (4, T), generator=g)
    original[:, 0] = 1  # a special id (like [CLS]) that is never chosen
    return mask_tokens(original, 0.3, 2, V, torch.tensor([1, 2]), g)


def test_loaded_head_gives_transformers_mlm_logits_and_loss(bert_mlm) -> None:
    hf, path = bert_mlm
    model = load_hf(path)
    assert model.mlm_head is not None and not model.mlm_head.added
    tokens, targets = _masked()
    with torch.no_grad():
        ours = model(tokens)
        ref = hf(input_ids=tokens, labels=targets)
    assert (ours - ref.logits).abs().max() < 1e-4
    valid = targets != IGNORE
    explicit = F.cross_entropy(ours[valid], targets[valid])  # token-level, as transformers
    assert abs(float(explicit) - float(ref.loss)) < 1e-5
    # the trainer averages per example: the mean of transformers' loss on each row alone
    batch = Batch(tokens, targets, None, torch.zeros(4, dtype=torch.long))
    loss, _ = task_loss(ours, batch, 1)
    with torch.no_grad():
        rows = [hf(input_ids=tokens[i:i + 1], labels=targets[i:i + 1]).loss for i in range(4)]
    assert abs(float(loss) - float(torch.stack(rows).mean())) < 1e-5


def test_added_head_is_initialised_as_transformers_does(hf_model_dir) -> None:
    _, path = hf_model_dir("bert")  # a BertModel: no MLM head
    model = load_hf(path)
    assert model.mlm_head is None
    tokens = torch.randint(0, model.config.vocab_size, (2, 7))
    plain = model(tokens)
    assert torch.equal(plain, model.unembed(model.hidden(tokens)))  # the path without a head
    add_mlm_head(model, [MLMTask], seed=3)
    head = model.mlm_head
    assert head is not None and head.added
    # transformers' BertForMaskedLM of the same config, initialised by its _init_weights
    hf_head = transformers.BertForMaskedLM(transformers.BertConfig.from_pretrained(path)
                                           ).cls.predictions
    for ours, theirs in ((head.dense.bias, hf_head.transform.dense.bias),
                         (head.norm.weight, hf_head.transform.LayerNorm.weight),
                         (head.norm.bias, hf_head.transform.LayerNorm.bias),
                         (head.bias, hf_head.bias)):
        assert torch.equal(ours.detach(), theirs.detach())
    w, n = head.dense.weight.detach(), head.dense.weight.numel()
    assert abs(float(w.mean())) < 4 * 0.02 / n ** 0.5
    assert abs(float(w.std()) / 0.02 - 1) < 4 / (2 * n) ** 0.5
    assert head.norm.eps == hf_head.transform.LayerNorm.eps
    # our head on transformers' weights: the same logits as BertForMaskedLM
    hf = transformers.BertForMaskedLM(transformers.BertConfig.from_pretrained(path)).eval()
    hf.bert.load_state_dict(transformers.BertModel.from_pretrained(path).state_dict(),
                            strict=False)
    with torch.no_grad():
        hf.cls.predictions.transform.dense.weight.copy_(w)
        head.bias.normal_()
        hf.cls.predictions.bias.copy_(head.bias)
        assert (model(tokens) - hf(input_ids=tokens).logits).abs().max() < 1e-4
    assert model.mlm_head.dense.weight.requires_grad


def test_export_writes_back_a_loaded_head_and_drops_an_added_one(bert_mlm, hf_model_dir,
                                                                 tmp_path: Path) -> None:
    hf, path = bert_mlm
    out = export_hf(load_hf(path), tmp_path / "mlm")
    assert json.loads((out / "config.json").read_text())["architectures"] == ["BertForMaskedLM"]
    again, info = transformers.BertForMaskedLM.from_pretrained(out, local_files_only=True,
                                                               output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"]
    tokens, _ = _masked(1)
    with torch.no_grad():
        assert (again.eval()(input_ids=tokens).logits - hf(input_ids=tokens).logits
                ).abs().max() < 1e-5
    _, base = hf_model_dir("bert")
    model = load_hf(base)
    add_mlm_head(model, [MLMTask], seed=0)
    plain = export_hf(model, tmp_path / "plain")
    assert json.loads((plain / "config.json").read_text())["architectures"] == ["BertModel"]
    assert not any(k.startswith("cls.") for k in load_file(plain / "model.safetensors"))
    assert load_hf(plain).mlm_head is None


def test_convert_keeps_the_head(bert_mlm, tmp_path: Path) -> None:
    _, path = bert_mlm
    model = load_converted(convert(path, tmp_path / "conv"))
    tokens, _ = _masked(2)
    assert model.mlm_head is not None
    assert torch.equal(model(tokens), load_hf(path)(tokens))
