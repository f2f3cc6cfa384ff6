"""convert / load_converted / the ``headwise convert`` CLI and tokenizers from HF directories."""

from __future__ import annotations

import json
import os

import pytest
import torch

from headwise.cli import main
from headwise.config import ModelConfig
from headwise.errors import CheckpointError
from headwise.interop import convert, encode_batch, load_converted, load_hf, load_tokenizer


@pytest.mark.parametrize("family", ["gpt2", "llama-gqa", "bert"])
def test_convert_roundtrip_matches_hf(hf_model_dir, batch, tmp_path, family):
    hf, path = hf_model_dir(family)
    out = convert(path, tmp_path / "out")
    cfg = json.loads((out / "config.json").read_text())
    assert ModelConfig.from_dict(cfg) == load_hf(path).config
    assert not list(out.glob("*.tmp"))  # atomic writes leave no temporaries
    model = load_converted(out)
    assert model.config.tie_embeddings == (family != "llama-gqa")
    if model.config.tie_embeddings:
        assert model.unembed.weight is model.embed.weight
    tokens, mask = batch
    with torch.no_grad():
        ref = hf(input_ids=tokens, attention_mask=mask)
        real = mask.bool()
        if family == "bert":
            torch.testing.assert_close(model.hidden(tokens, mask)[real],
                                       ref.last_hidden_state[real], atol=1e-4, rtol=0)
        else:
            torch.testing.assert_close(model(tokens, mask)[real], ref.logits[real], atol=1e-4,
                                       rtol=0)


def test_cli_convert(hf_model_dir, tmp_path, capsys):
    _, path = hf_model_dir("llama-gqa")
    assert main(["convert", "--hf", str(path), "--out", str(tmp_path / "o")]) == 0
    assert "2 layers x 6 heads (kv heads 2)" in capsys.readouterr().out
    assert (tmp_path / "o" / "model.safetensors").is_file()


def test_cli_convert_bad_dir_exits_2(tmp_path, capsys):
    assert main(["convert", "--hf", str(tmp_path), "--out", str(tmp_path / "o")]) == 2
    assert "config.json: file not found" in capsys.readouterr().err


def test_tokenizer_from_dir_matches_hf_fast_tokenizer(tmp_path):
    """A WordPiece tokenizer built in memory, saved, and read back by both libraries."""
    transformers = pytest.importorskip("transformers")
    from tokenizers import Tokenizer, models, normalizers, pre_tokenizers, processors

    vocab = {w: i for i, w in enumerate(
        ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "the", "cat", "sat", "on", "mat", "##s", "a"])}
    tok = Tokenizer(models.WordPiece(vocab, unk_token="[UNK]"))
    tok.normalizer = normalizers.BertNormalizer(lowercase=True)
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tok.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]", special_tokens=[("[CLS]", 2), ("[SEP]", 3)])
    tok.save(str(tmp_path / "tokenizer.json"))
    texts = ["The cats sat on the mat", "a dog"]
    ours = load_tokenizer(tmp_path)
    tokens, mask = encode_batch(ours, texts)
    hf = transformers.PreTrainedTokenizerFast(tokenizer_file=str(tmp_path / "tokenizer.json"),
                                              pad_token="[PAD]")
    ref = hf(texts, padding=True, return_tensors="pt")
    assert tokens.tolist() == ref["input_ids"].tolist()
    assert mask.tolist() == ref["attention_mask"].tolist()
    assert tokens.tolist()[1] == [2, 10, 1, 3] + [0] * 5  # [CLS] a [UNK] [SEP], padded


def test_convert_copies_tokenizer(hf_model_dir, tmp_path):
    import shutil

    from tokenizers import Tokenizer, models, pre_tokenizers

    _, path = hf_model_dir("gpt2")
    src = tmp_path / "hf"
    shutil.copytree(path, src)
    tok = Tokenizer(models.WordLevel({"[UNK]": 0, "hi": 1}, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.save(str(src / "tokenizer.json"))
    out = convert(src, tmp_path / "out")
    tokens, _ = encode_batch(load_tokenizer(out), ["hi there"])
    assert tokens.tolist() == [[1, 0]]


def test_missing_tokenizer(tmp_path):
    with pytest.raises(CheckpointError, match=r"tokenizer\.json: file not found"):
        load_tokenizer(tmp_path)


def test_cli_convert_into_a_non_empty_directory_needs_overwrite(hf_model_dir, tmp_path, capsys):
    """A non-empty --out is written into only with --overwrite, which keeps the other files."""
    _, path = hf_model_dir("gpt2")
    out = tmp_path / "out"
    out.mkdir()
    (out / "notes.txt").write_text("mine")
    assert main(["convert", "--hf", str(path), "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "is not empty" in err[0] and sorted(os.listdir(out)) == ["notes.txt"]
    assert "--out: " in err[0] and "pass --overwrite" in err[0] and "overwrite=True" not in err[0]
    assert main(["convert", "--hf", str(path), "--out", str(out), "--overwrite"]) == 0
    assert (out / "notes.txt").read_text() == "mine" and (out / "model.safetensors").is_file()
