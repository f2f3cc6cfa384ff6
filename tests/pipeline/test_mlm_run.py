"""An mlm run on a pretrained BertForMaskedLM through the CLI: its head trains, the run reloads,
and the export is a BertForMaskedLM that transformers loads with the run's logits."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from headwise.cli import main
from headwise.interop import load_hf
from headwise.training.safetensors_io import load_weights

transformers = pytest.importorskip("transformers")

WORDS = [f"w{i}" for i in range(35)]
SPECIALS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]


def _checkpoint(tmp_path: Path) -> Path:
    from tokenizers import Tokenizer, models, pre_tokenizers, processors

    tok = Tokenizer(models.WordLevel({t: i for i, t in enumerate(SPECIALS + WORDS)},
                                     unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.add_special_tokens(SPECIALS)
    tok.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]", special_tokens=[("[CLS]", 2), ("[SEP]", 3)])
    cfg = transformers.BertConfig(num_hidden_layers=1, num_attention_heads=2, hidden_size=16,
                                  intermediate_size=24, vocab_size=len(SPECIALS + WORDS),
                                  max_position_embeddings=16, attn_implementation="eager")
    torch.manual_seed(0)
    path = tmp_path / "bert"
    transformers.BertForMaskedLM(cfg).save_pretrained(path)
    tok.save(str(path / "tokenizer.json"))
    return path


@pytest.mark.slow
def test_mlm_run_trains_the_checkpoints_head_and_exports_it(tmp_path: Path) -> None:
    base = _checkpoint(tmp_path)
    g = torch.Generator().manual_seed(0)
    docs = [" ".join(WORDS[j] for j in torch.randint(0, 35, (10,), generator=g).tolist())
            for _ in range(60)]
    (tmp_path / "corpus.txt").write_text("\n\n".join(docs))
    (tmp_path / "spec.yaml").write_text(f"""
model: {{pretrained: {{path: {base}}}}}
data: {{tasks: {{m: {{task: mlm, path: corpus.txt, seq_len: 12, tokenizer: {base}}}}},
        eval_examples: 16}}
train: {{steps: 3, batch_size: 4, lr: 1.0e-2}}
""")
    run = tmp_path / "run"
    assert main(["train", str(tmp_path / "spec.yaml"), "--out", str(run), "--quiet"]) == 0
    model = load_hf(base)  # the checkpoint with its head, then the run's weights
    load_weights(model, run / "model.safetensors")
    head = model.mlm_head
    assert head is not None and not head.added
    start = transformers.BertForMaskedLM.from_pretrained(base, local_files_only=True)
    assert not torch.equal(head.dense.weight, start.cls.predictions.transform.dense.weight)
    assert main(["export", str(run), "--hf", str(tmp_path / "hf")]) == 0
    hf = transformers.BertForMaskedLM.from_pretrained(tmp_path / "hf", local_files_only=True)
    tokens = torch.randint(5, 40, (2, 9), generator=g)
    with torch.no_grad():
        assert (model.eval()(tokens) - hf.eval()(input_ids=tokens).logits).abs().max() < 1e-5
