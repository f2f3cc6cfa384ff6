"""``generate`` against an argmax loop written here, against transformers' ``generate`` on an
exported GPT-2-shaped model, and ``sample_logits`` against TransformerLens's definition."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from headwise.config import ModelConfig, preset
from headwise.model import build_model
from headwise.model.byte_tokenizer import ByteTokenizer
from headwise.model.generate import generate, sample_logits

V = 29
GPT2 = ModelConfig(n_layers=2, n_heads=3, d_model=24, d_ff=40, vocab_size=V, max_seq_len=16,
                   activation="gelu_tanh", tie_embeddings=False)


def _random(config: ModelConfig) -> torch.nn.Module:
    model = build_model(config, seed=0).eval()
    g = torch.Generator().manual_seed(6)
    with torch.no_grad():  # large weights, drawn so that the argmax changes from step to step
        for p in model.parameters():
            p.normal_(0.0, 0.5, generator=g)
    return model


def _argmax_loop(model: torch.nn.Module, prompt: torch.Tensor, n: int) -> torch.Tensor:
    seq = prompt
    with torch.no_grad():
        for _ in range(n):
            seq = torch.cat([seq, model(seq)[:, -1].argmax(-1, keepdim=True)], dim=1)
    return seq


def test_greedy_is_the_argmax_loop() -> None:
    model = _random(GPT2)
    prompt = torch.tensor([[3, 17, 8], [21, 2, 11]])
    out = generate(model, prompt, max_new_tokens=7, do_sample=False)
    assert out.tolist() == _argmax_loop(model, prompt, 7).tolist()  # type: ignore[union-attr]
    assert len(set(out[:, 3:].flatten().tolist())) > 1  # type: ignore[index]  # not one token


def test_greedy_equals_transformers_generate_on_the_export(tmp_path) -> None:
    transformers = pytest.importorskip("transformers")
    from headwise.interop.hf_export import export_hf

    model = _random(GPT2)
    out = export_hf(model, tmp_path / "hf")
    hf = transformers.AutoModelForCausalLM.from_pretrained(
        out, local_files_only=True, attn_implementation="eager").eval()
    prompt = torch.tensor([[3, 17, 8, 1], [21, 2, 11, 0]])
    with torch.no_grad():
        ref = hf.generate(prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=9,
                          do_sample=False, pad_token_id=0, eos_token_id=None)
    assert model.generate(prompt, max_new_tokens=9, do_sample=False).tolist() == ref.tolist()


def test_stop_tokens_end_a_sequence_and_pad_it() -> None:
    """A sequence that reaches a stop token is padded with it; generation ends when all have."""
    model = _random(GPT2)
    prompt = torch.tensor([[3, 17, 8], [21, 2, 11]])
    free = _argmax_loop(model, prompt, 8)
    stop = int(free[1, 3])  # the first token row 1 generates (4), which row 0 never does
    out = generate(model, prompt, max_new_tokens=8, do_sample=False, eos_token_id=stop)
    for row, ref in zip(out.tolist(), free.tolist(), strict=True):  # type: ignore[union-attr]
        new, want = row[3:], ref[3:]
        end = want.index(stop) + 1 if stop in want else len(want)
        assert new[:end] == want[:end]
        assert all(t == stop for t in new[end:])
    assert out.shape[1] == 3 + 8  # row 0 never stops
    stopped = generate(model, prompt[1:], max_new_tokens=8, do_sample=False, eos_token_id=stop)
    assert stopped.tolist() == [free[1, :4].tolist()]  # type: ignore[union-attr]  # ends early


@pytest.mark.parametrize("form", [torch.tensor, np.int64, lambda i: [torch.tensor(i)]])
def test_a_stop_token_given_as_a_tensor_or_numpy_integer_stops(form) -> None:
    """TransformerLens takes ``eos_token_id=tokens[0, -1]`` (a 0-d tensor): it stops there as
    the integer does, i.e. where the argmax loop first produces it."""
    model = _random(GPT2)
    prompt = torch.tensor([[21, 2, 11]])
    free = _argmax_loop(model, prompt, 8)
    stop = int(free[0, 3])
    out = generate(model, prompt, max_new_tokens=8, do_sample=False, eos_token_id=form(stop))
    assert out.tolist() == [free[0, :4].tolist()]  # type: ignore[union-attr]


@pytest.mark.parametrize("bad", [torch.tensor(1.0), "2", [True], torch.tensor([[1, 2]]).float()])
def test_a_stop_token_that_is_no_id_is_named(bad) -> None:
    with pytest.raises(ValueError, match="^eos_token_id: "):
        generate(_random(GPT2), torch.tensor([[1, 2]]), max_new_tokens=2, eos_token_id=bad)


def test_sampling_follows_tl_definitions() -> None:
    """top-k keeps exactly the k largest; top-p the smallest prefix past p; temperature 0 is
    the argmax; the draw's frequencies follow softmax(logits / T) (TransformerLens's
    ``sample_logits``)."""
    logits = torch.tensor([[2.0, 1.0, 0.5, -1.0, 0.0]])
    g = torch.Generator().manual_seed(0)
    draws = [int(sample_logits(logits, top_k=2, generator=g)) for _ in range(300)]
    assert set(draws) == {0, 1}
    probs = torch.softmax(logits[0], -1)  # p = 0.57, 0.21, 0.13, ...: top_p 0.7 keeps 0, 1
    draws = [int(sample_logits(logits, top_p=0.7, generator=g)) for _ in range(300)]
    assert set(draws) == {0, 1} and probs[0] < 0.7 < probs[0] + probs[1]
    assert int(sample_logits(logits, temperature=0.0)) == 0
    draws = [int(sample_logits(logits, temperature=2.0, generator=g)) for _ in range(4000)]
    freq = torch.bincount(torch.tensor(draws), minlength=5).float() / 4000
    torch.testing.assert_close(freq, torch.softmax(logits[0] / 2.0, -1), atol=0.03, rtol=0)


def test_text_in_text_out_with_a_byte_tokenizer() -> None:
    config = ModelConfig(n_layers=1, n_heads=2, d_model=16, d_ff=24, vocab_size=256,
                         max_seq_len=24)
    model = build_model(config, seed=0).eval()
    model.tokenizer = ByteTokenizer()
    text = generate(model, "ab c", max_new_tokens=5, do_sample=False)
    ids = _argmax_loop(model, torch.tensor([list(b"ab c")]), 5)[0].tolist()
    assert text == bytes(ids).decode("utf-8", errors="replace")
    assert model.to_str_tokens("ab c") == ["a", "b", "\u2423", "c"]


@pytest.mark.parametrize("kwargs, field", [
    ({"max_new_tokens": 20}, "max_new_tokens"), ({"top_k": 0}, "top_k"),
    ({"top_p": 1.5}, "top_p"), ({"return_type": "text"}, "return_type"),
    ({"eos_token_id": V}, "eos_token_id"), ({"top_k": V + 1}, "top_k"),
    ({"top_k": 10**20}, "top_k"), ({"temperature": float("nan")}, "temperature"),
    ({"temperature": float("inf")}, "temperature"), ({"temperature": 1e-300}, "temperature"),
    ({"temperature": -1.0}, "temperature"),
])
def test_bad_options_name_the_field(kwargs: dict, field: str) -> None:
    model = _random(GPT2)
    with pytest.raises(ValueError, match=f"^{field}: "):
        generate(model, torch.tensor([[1, 2]]), **{"max_new_tokens": 3, **kwargs})


def test_a_temperature_whose_logits_overflow_is_refused() -> None:
    """float16 logits of 10 divided by 1e-4 (the smallest temperature) overflow: a temperature
    error, never a probability of NaN."""
    logits = torch.tensor([[10.0, 1.0, -3.0]], dtype=torch.float16)
    with pytest.raises(ValueError, match=r"^temperature: got 0\.0001, but logits / "
                                         "temperature overflow float16"):
        sample_logits(logits, temperature=1e-4)
    assert int(sample_logits(logits.float(), temperature=1e-4)) == 0
    with pytest.raises(ValueError, match="^temperature: got nan"):
        sample_logits(logits, temperature=float("nan"))


def test_a_bidirectional_model_is_refused() -> None:
    with pytest.raises(ValueError, match="^model: .*causal"):
        generate(build_model(preset("tiny-encoder"), seed=0), torch.tensor([[1, 2]]))
