"""The model's TransformerLens options against their definitions on the same weights:
``return_type`` (TransformerLens's ``lm_cross_entropy_loss``, written with
``torch.nn.functional.cross_entropy``), ``stop_at_layer`` (the cached residual stream),
``names_filter``, MLP weights (an MLP written from ``W_in``/``W_out``), ``W_pos``, ``W_E``,
``W_U`` and ``b_U`` (the forward's two ends), ``to_single_token`` and ``to_string``."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import Tensor

from headwise.config import ModelConfig, preset
from headwise.errors import ConfigError
from headwise.model import Transformer, build_model
from headwise.model.byte_tokenizer import ByteTokenizer


def _model(name: str = "tiny") -> Transformer:
    model = build_model(preset(name), seed=0).eval()
    with torch.no_grad():  # biases and gains away from 0/1 so every term matters
        g = torch.Generator().manual_seed(2)
        for p in model.parameters():
            if p.dim() == 1:
                p.add_(torch.randn(p.shape, generator=g) * 0.3)
    return model


def _tokens(V: int = 17) -> Tensor:
    return torch.randint(0, V, (2, 6), generator=torch.Generator().manual_seed(4))


def test_loss_is_the_next_token_cross_entropy() -> None:
    model, tokens = _model(), _tokens()
    logits = model(tokens)
    want = F.cross_entropy(logits[:, :-1].reshape(-1, 17), tokens[:, 1:].reshape(-1),
                           reduction="none").view(2, 5)
    torch.testing.assert_close(model(tokens, return_type="loss"), want.mean())
    torch.testing.assert_close(model(tokens, return_type="loss", loss_per_token=True), want)
    both = model(tokens, return_type="both")
    assert torch.equal(both[0], logits) and torch.equal(both[1], model(tokens, return_type="loss"))
    assert model(tokens, return_type=None) is None
    mask = torch.tensor([[1, 1, 1, 1, 1, 1], [1, 1, 1, 1, 0, 0]])
    logits = model(tokens, attention_mask=mask)
    per = F.cross_entropy(logits[:, :-1].reshape(-1, 17), tokens[:, 1:].reshape(-1),
                          reduction="none").view(2, 5)
    keep = torch.tensor([[1, 1, 1, 1, 1], [1, 1, 1, 0, 0]], dtype=torch.bool)
    torch.testing.assert_close(model(tokens, attention_mask=mask, return_type="loss"),
                               per[keep].mean())


@pytest.mark.parametrize("args", [("loss",), ("logits", True)])
def test_return_type_given_in_transformerlens_position_is_one_error_line(args: tuple) -> None:
    """TransformerLens's ``model(tokens, "loss")``: here the second positional argument is the
    attention mask, so a string there is named, never an AttributeError from deep inside."""
    model, tokens = _model(), _tokens()
    with pytest.raises(ValueError, match="^attention_mask: got str 'l.*keyword arguments"):
        model(tokens, *args)
    model.tokenizer = ByteTokenizer()
    with pytest.raises(ValueError, match="^attention_mask: got str"):
        model("ab", *args)


def test_return_type_is_checked_and_a_bidirectional_model_has_no_loss() -> None:
    with pytest.raises(ValueError, match="return_type: got 'probs'"):
        _model()(_tokens(), return_type="probs")
    with pytest.raises(ValueError, match="return_type: 'loss' is the next-token loss"):
        _model("tiny-encoder")(_tokens(), return_type="loss")


@pytest.mark.parametrize("stop, point", [(0, "blocks.0.hook_resid_pre"),
                                         (1, "blocks.1.hook_resid_pre"),
                                         (-1, "blocks.1.hook_resid_pre"),
                                         (2, "blocks.1.hook_resid_post")])
def test_stop_at_layer_returns_the_residual_stream_there(stop: int, point: str) -> None:
    model, tokens = _model(), _tokens()
    _, cache = model.run_with_cache(tokens, [point])
    assert torch.equal(model(tokens, stop_at_layer=stop), cache[point])


def test_names_filter_forms() -> None:
    model, tokens = _model(), _tokens()
    _, every = model.run_with_cache(tokens)
    assert set(every.keys()) == set(model.hook_dict)
    _, one = model.run_with_cache(tokens, names_filter="blocks.0.hook_resid_post")
    assert one.keys() == ["blocks.0.hook_resid_post"]
    _, some = model.run_with_cache(tokens, names_filter=["hook_embed", "blocks.1.hook_mlp_out"])
    assert set(some.keys()) == {"hook_embed", "blocks.1.hook_mlp_out"}
    _, by = model.run_with_cache(tokens, names_filter=lambda n: n.endswith("hook_z"))
    assert set(by.keys()) == {"blocks.0.attn.hook_z", "blocks.1.attn.hook_z"}
    torch.testing.assert_close(by["blocks.1.attn.hook_z"], every["blocks.1.attn.hook_z"])
    with pytest.raises(ValueError, match="names: got both"):
        model.run_with_cache(tokens, names_filter="hook_embed", names=["hook_embed"])


@pytest.mark.parametrize("name", ["tiny", "tiny-gqa-rope"])
def test_mlp_weights_compute_the_mlp_as_transformerlens_writes_it(name: str) -> None:
    """``act(x @ W_in + b_in) @ W_out + b_out`` (gated: ``act(x @ W_gate) * (x @ W_in + b_in)``)
    is the block's ``hook_mlp_out`` for ``x`` its MLP input."""
    model = _model(name)
    tokens = _tokens(model.config.vocab_size)
    _, cache = model.run_with_cache(tokens, ["blocks.1.hook_resid_mid", "blocks.1.hook_mlp_out"])
    act = {"relu": F.relu, "gelu": F.gelu, "gelu_tanh": lambda v: F.gelu(v, approximate="tanh"),
           "swiglu": F.silu}[model.config.activation]
    with torch.no_grad():
        x = model.blocks[1].ln2(cache["blocks.1.hook_resid_mid"])
        pre = x @ model.W_in[1] + model.b_in[1]
        if model.config.activation == "swiglu":
            post = act(x @ model.W_gate[1]) * pre
        else:
            post = act(pre)
        out = post @ model.W_out[1] + model.b_out[1]
    torch.testing.assert_close(out, cache["blocks.1.hook_mlp_out"], atol=1e-6, rtol=0)
    assert model.W_in.shape == (2, model.config.d_model, model.config.d_ff)
    assert model.W_out.shape == (2, model.config.d_ff, model.config.d_model)


def test_position_and_unembedding_tables() -> None:
    model = _model()
    assert torch.equal(model.W_pos, model.pos_embed.weight)
    T = 3
    assert torch.equal(model.W_pos[:T], model.pos_embed(T))
    assert torch.equal(model.b_U, torch.zeros(17))
    with pytest.raises(ConfigError, match="W_pos: the model has 'rope' positions"):
        assert _model("tiny-gqa-rope").W_pos is None
    attn_only = build_model(ModelConfig(n_layers=1, n_heads=2, d_model=8, vocab_size=11,
                                        max_seq_len=4, attn_only=True), seed=0)
    with pytest.raises(ConfigError, match="W_in: the model is attention-only"):
        assert attn_only.W_in is None


@pytest.mark.parametrize("tie", [False, True])
def test_embedding_tables_compute_the_ends_of_the_forward(tie: bool) -> None:
    """TransformerLens's definitions: ``hook_embed = W_E[tokens]``, ``hook_pos_embed =
    W_pos[:T]``, and the logits ``ln_final(resid_final) @ W_U + b_U``."""
    config = ModelConfig(n_layers=2, n_heads=2, d_model=16, d_ff=24, vocab_size=19,
                         max_seq_len=8, tie_embeddings=tie)
    model = build_model(config, seed=0).eval()
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() == 1:
                p.add_(0.3)
    tokens = _tokens(19)
    logits, cache = model.run_with_cache(tokens, ["hook_embed", "hook_pos_embed",
                                                  "blocks.1.hook_resid_post"])
    assert torch.equal(cache["hook_embed"], model.W_E[tokens])
    torch.testing.assert_close(cache["hook_pos_embed"].expand(2, -1, -1),
                               model.W_pos[:6].expand(2, -1, -1))
    with torch.no_grad():
        want = model.ln_final(cache["blocks.1.hook_resid_post"]) @ model.W_U + model.b_U
    torch.testing.assert_close(logits, want, atol=1e-6, rtol=0)
    assert (model.W_U.data_ptr() == model.W_E.data_ptr()) == tie


def test_single_tokens_and_strings_with_bytes() -> None:
    model = build_model(ModelConfig(n_layers=1, n_heads=2, d_model=8, vocab_size=256,
                                    max_seq_len=16), seed=0)
    model.tokenizer = ByteTokenizer()
    assert model.to_single_token("a") == 97
    with pytest.raises(ConfigError, match="string: got 'ab'"):
        model.to_single_token("ab")
    assert model.to_string(torch.tensor([104, 105])) == "hi"
    assert model.to_string(torch.tensor([[104, 105], [111, 107]])) == ["hi", "ok"]
    tokens, mask = model.to_tokens(["hi", "hey"], return_mask=True)
    assert tokens.tolist() == [[104, 105, 0], [104, 101, 121]]
    assert mask.tolist() == [[1, 1, 0], [1, 1, 1]]
    torch.testing.assert_close(model(["hi", "hey"]), model(tokens, attention_mask=mask))
    with pytest.raises(ConfigError, match="prepend_bos: got True"):
        model.to_tokens("hi", prepend_bos=True)
