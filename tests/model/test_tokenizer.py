"""to_tokens / to_str_tokens against transformers' tokenizer on tokenizers this test writes, with
TransformerLens's BOS rules spelled out: prepend = tokenize ``bos_token + text``, remove = drop
the first id."""

from __future__ import annotations

import pytest
import torch
import transformers
from tokenizers import Tokenizer, models, pre_tokenizers, processors

from headwise import ModelConfig, build_model
from headwise.errors import ConfigError
from headwise.model.tokenizer import ModelTokenizer

WORDS = ["<unk>", "<s>", "</s>", "<pad>", "the", "cat", "sat", "on", "a", "mat", "dog", "ran"]
TEXTS = ["the cat sat on the mat", "a dog ran", "the cat"]


def _backend(adds_bos: bool) -> Tokenizer:
    """A word-level tokenizer; with ``adds_bos`` its post-processor starts sequences with <s>
    (as Llama's does), else it adds nothing (as GPT-2's)."""
    tok = Tokenizer(models.WordLevel({w: i for i, w in enumerate(WORDS)}, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    if adds_bos:
        tok.post_processor = processors.TemplateProcessing(
            single="<s> $A", pair="<s> $A $B", special_tokens=[("<s>", 1)])
    tok.add_special_tokens(["<unk>", "<s>", "</s>", "<pad>"])
    tok.enable_truncation(2)  # stored settings the methods must ignore
    return tok


def _hf(tok: Tokenizer, side: str = "right") -> transformers.PreTrainedTokenizerFast:
    return transformers.PreTrainedTokenizerFast(
        tokenizer_object=Tokenizer.from_str(tok.to_str()), bos_token="<s>", eos_token="</s>",
        pad_token="<pad>", unk_token="<unk>", padding_side=side)


def _model(tokenizer: ModelTokenizer, max_seq_len: int = 16):
    config = ModelConfig(n_layers=1, n_heads=2, d_model=8, vocab_size=len(WORDS),
                         max_seq_len=max_seq_len)
    model = build_model(config, seed=0)
    model.tokenizer = tokenizer
    return model


@pytest.mark.parametrize("adds_bos", [False, True])
@pytest.mark.parametrize("side", ["right", "left"])
def test_prepend_bos_both_ways_and_padding_sides_match_transformers(adds_bos, side):
    backend = _backend(adds_bos)
    model = _model(ModelTokenizer(backend, bos_token="<s>", pad_token="<pad>"))
    hf = _hf(backend, side)
    # prepend_bos=True (the default with a BOS token): TransformerLens tokenizes bos + text
    # when the tokenizer does not add it itself.
    with_bos = [t if adds_bos else "<s> " + t for t in TEXTS]
    ref = hf(with_bos, padding=True, return_tensors="pt")
    tokens, mask = model.to_tokens(TEXTS, padding_side=side, return_mask=True)
    assert tokens.tolist() == ref["input_ids"].tolist()
    assert mask.tolist() == ref["attention_mask"].tolist()
    assert torch.equal(model.to_tokens(TEXTS, prepend_bos=True, padding_side=side), tokens)
    # prepend_bos=False: the first id removed when the tokenizer adds it, before padding.
    plain = [hf(t)["input_ids"] for t in TEXTS]
    plain = [ids[1:] if adds_bos else ids for ids in plain]
    T = max(map(len, plain))
    pad = [[3] * (T - len(ids)) for ids in plain]
    expected = [ids + p if side == "right" else p + ids for ids, p in zip(plain, pad, strict=True)]
    assert model.to_tokens(TEXTS, prepend_bos=False, padding_side=side).tolist() == expected


def test_one_string_is_a_batch_of_one_and_truncation_keeps_max_seq_len():
    backend = _backend(adds_bos=False)
    model = _model(ModelTokenizer(backend, bos_token="<s>", pad_token="<pad>"), max_seq_len=4)
    hf = _hf(backend)
    assert model.to_tokens("the cat").tolist() == [hf("<s> the cat")["input_ids"]]
    # transformers' truncation=True, max_length=n_ctx, the BOS counted (as TransformerLens)
    ref = hf("<s> " + TEXTS[0], truncation=True, max_length=4)["input_ids"]
    assert model.to_tokens(TEXTS[0]).tolist() == [ref] and len(ref) == 4
    assert model.to_tokens(TEXTS[0], truncate=False).shape == (1, 7)


def test_to_str_tokens_of_text_ids_and_lists_match_batch_decode():
    backend = _backend(adds_bos=True)
    model = _model(ModelTokenizer(backend, bos_token="<s>", pad_token="<pad>"))
    hf = _hf(backend)
    ids = hf(TEXTS[1])["input_ids"]
    ref = hf.batch_decode([[i] for i in ids], clean_up_tokenization_spaces=False)
    assert ref == ["<s>", "a", "dog", "ran"]
    assert model.to_str_tokens(TEXTS[1]) == ref
    assert model.to_str_tokens(torch.tensor(ids)) == ref
    assert model.to_str_tokens(torch.tensor([ids])) == ref  # (1, T)
    assert model.to_str_tokens(TEXTS[1], prepend_bos=False) == ref[1:]
    assert model.to_str_tokens([TEXTS[1], torch.tensor(ids[:2])]) == [ref, ref[:2]]
    with pytest.raises(ConfigError, match=r"input: got 'ids of shape \(2, 4\)"):
        model.to_str_tokens(torch.tensor([ids, ids]))


def test_errors_name_what_is_missing():
    backend = _backend(adds_bos=False)
    with pytest.raises(ConfigError, match="bos_token: got '<bos>', expected a token of the "):
        ModelTokenizer(backend, bos_token="<bos>")
    with pytest.raises(ConfigError, match="padding_side: got 'top'"):
        ModelTokenizer(backend, padding_side="top")
    no_bos = _model(ModelTokenizer(backend))  # no BOS, no pad: encodes as the tokenizer does
    assert no_bos.tokenizer.prepend_bos is False
    assert no_bos.to_tokens("the cat").tolist() == [[4, 5]]
    with pytest.raises(ConfigError, match="prepend_bos: got True, expected False: the "):
        no_bos.to_tokens("the cat", prepend_bos=True)
    with pytest.raises(ConfigError, match="pad_token: the tokenizer has none"):
        no_bos.to_tokens(TEXTS)
    with pytest.raises(ConfigError, match="input: got 3, expected a string or a non-empty"):
        no_bos.to_tokens(3)
    bare = build_model(ModelConfig(n_layers=1, n_heads=2, d_model=8, vocab_size=12), seed=0)
    with pytest.raises(ConfigError, match="tokenizer: the model has none; expected a model "):
        bare.to_tokens("the cat")
