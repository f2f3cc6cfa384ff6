"""Path patching against an explicit recomputation written from the weights (pre-norm with a
mask and a gate, post-norm, GQA), and the identities any path patching must satisfy."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import headwise as hw
from headwise.analysis.paths import PathPatcher, path_patch
from headwise.control.masks import previous_token
from headwise.data import Batch
from headwise.errors import SpecError
from headwise.hooks.graph import Edge, Node, all_edges, model_shape, parse_edge
from tests.analysis import path_reference as ref

B, T, V = 3, 7, 13
TOL = 1e-10  # float64 throughout: the two computations differ only by rounding


def _model(norm: str = "pre", kv: int = 4) -> torch.nn.Module:
    # every size distinct, so that a transposed or mis-sliced weight cannot pass
    cfg = hw.ModelConfig(n_layers=3, n_heads=4, n_kv_heads=kv, d_model=20, d_head=6, d_ff=28,
                         vocab_size=V, max_seq_len=9, norm=norm, activation="gelu")
    model = hw.build_model(cfg).double().eval()
    with torch.no_grad():  # weights large enough that every path matters, and non-zero
        for name, p in model.named_parameters():  # biases and norm affines: none can be dropped
            p.copy_((1.0 if "ln" in name else 0.0) + 0.4 * torch.randn_like(p))
    return model


def _batches() -> tuple[Batch, Batch]:
    tokens, corrupted = torch.randint(0, V, (B, T)), torch.randint(0, V, (B, T))
    targets = torch.randint(0, V, (B, T))
    targets[:, :2] = -100
    zeros = torch.zeros(B, dtype=torch.long)
    return Batch(tokens, targets, None, zeros), Batch(corrupted, targets, None, zeros)


def _loss(logits: torch.Tensor, batch: Batch) -> float:
    logits = logits.detach()
    return float(F.cross_entropy(logits.transpose(1, 2), batch.targets, ignore_index=-100))


def _post_up(model: torch.nn.Module, rec: ref.Record, l: int, x: torch.Tensor) -> torch.Tensor:
    """Post-norm: the stream entering block l+1 from ``x`` entering block l, the attention and
    MLP outputs of layer l frozen at ``rec``'s."""
    b, eps = model.blocks[l], model.config.norm_eps
    y = ref.layer_norm(x + rec.attn_out[l], b.ln1, eps)
    return ref.layer_norm(y + rec.mlp_out[l], b.ln2, eps)


def _cases(model: torch.nn.Module, c: ref.Record, s: ref.Record) -> list[tuple[str, tuple, object]]:
    """(edge, receiver key, stream the receiver reads) with the explicit recomputation."""
    eps, bl = model.config.norm_eps, model.blocks
    if model.config.norm == "pre":
        return [
            ("L0.H1 -> L2.H2 via k", ("k", 2, 2), c.x[2] - c.results[0][1] + s.results[0][1]),
            ("L0.MLP -> L1.H0 via q", ("q", 1, 0), c.x[1] - c.mlp_out[0] + s.mlp_out[0]),
            ("embed -> L1.MLP", ("mlp", 1), c.y[1] - c.x[0] + s.x[0]),
            ("L1.H3 -> L1.MLP", ("mlp", 1), c.y[1] - c.results[1][3] + s.results[1][3]),
            ("L1.H3 -> logits", ("logits",), c.final - c.results[1][3] + s.results[1][3]),
            ("L0.H0 -> L1.H2 via v", ("v", 1, 2), c.x[1] - c.results[0][0] + s.results[0][0]),
        ]
    # post-norm: the stream recomputed through the norms, every component in between frozen
    s1 = c.x[0] + c.attn_out[0] - c.results[0][1] + s.results[0][1]
    x1 = ref.layer_norm(ref.layer_norm(s1, bl[0].ln1, eps) + c.mlp_out[0], bl[0].ln2, eps)
    x1_mlp = ref.layer_norm(c.y[0] + s.mlp_out[0], bl[0].ln2, eps)
    y1_embed = ref.layer_norm(_post_up(model, c, 0, s.x[0]) + c.attn_out[1], bl[1].ln1, eps)
    s1_l1 = c.x[1] + c.attn_out[1] - c.results[1][3] + s.results[1][3]
    final = _post_up(model, c, 2, ref.layer_norm(
        ref.layer_norm(s1_l1, bl[1].ln1, eps) + c.mlp_out[1], bl[1].ln2, eps))
    return [
        ("L0.H1 -> L2.H2 via k", ("k", 2, 2), _post_up(model, c, 1, x1)),
        ("L0.MLP -> L1.H0 via q", ("q", 1, 0), x1_mlp),
        ("embed -> L1.MLP", ("mlp", 1), y1_embed),
        ("L1.H3 -> logits", ("logits",), final),
    ]


@pytest.mark.parametrize("norm", ["pre", "post"])
def test_path_patch_equals_the_explicit_recomputation(norm: str) -> None:
    model = _model(norm)
    clean, corrupted = _batches()
    c, s = ref.forward(model, clean.tokens), ref.forward(model, corrupted.tokens)
    assert _loss(c.logits, clean) == pytest.approx(_loss(model(clean.tokens), clean), abs=TOL)
    for text, key, stream in _cases(model, c, s):
        sender, rest = text.split(" -> ")
        receiver, _, via = rest.partition(" via ")
        got = path_patch(model, clean, sender, receiver, via or None, source=corrupted)
        want = _loss(ref.forward(model, clean.tokens, {key: stream}).logits, clean)
        assert got.patched == pytest.approx(want, abs=TOL), text
        assert got.clean == pytest.approx(_loss(c.logits, clean), abs=TOL)
        assert abs(got.effect) > 1e-6, text  # each case really changes the receiver


def test_masks_gates_and_mean_source_follow_the_recomputation() -> None:
    model = _model("pre")
    clean, _ = _batches()
    prev = torch.zeros(T, T, dtype=torch.bool)
    prev[torch.arange(1, T), torch.arange(T - 1)] = True
    keep = [hw.apply_masks(model, {"L1.H2": previous_token()}),
            hw.FixedGates(model, {0: "L0.H0,L0.H1,L0.H3,L1.*,L2.*"})]
    mask, gate = {(1, 2): prev}, {(0, 2): 0.0}
    c = ref.forward(model, clean.tokens, mask=mask, gate=gate)
    mean = {u: v.mean(0, keepdim=True) for u, v in
            (("h", c.results[0][0]), ("m", c.mlp_out[0]))}
    for text, key, stream in [
        ("L0.H0 -> L1.H2 via k", ("k", 1, 2), c.x[1] - c.results[0][0] + mean["h"]),
        ("L0.MLP -> L1.H2 via q", ("q", 1, 2), c.x[1] - c.mlp_out[0] + mean["m"]),
    ]:
        sender, rest = text.split(" -> ")
        receiver, via = rest.split(" via ")
        got = path_patch(model, clean, sender, receiver, via, mode="mean")
        want = _loss(ref.forward(model, clean.tokens, {key: stream}, mask, gate).logits, clean)
        assert got.patched == pytest.approx(want, abs=TOL), text
    # a gated-off head sends nothing: ablating its edges changes nothing, to the bit
    assert path_patch(model, clean, "L0.H2", "L1.H0", "v", mode="zero").effect == 0.0
    del keep


def test_gqa_key_and_value_receivers_are_the_kv_heads() -> None:
    model = _model("pre", kv=2)  # query heads 2 and 3 read kv head 1
    clean, corrupted = _batches()
    c, s = ref.forward(model, clean.tokens), ref.forward(model, corrupted.tokens)
    shape = model_shape(model)
    assert parse_edge("L0.H1 -> L1.H3 via k", shape) == parse_edge("L0.H1 -> L1.H2 via k", shape)
    assert parse_edge("L0.H1 -> L1.H3 via q", shape) != parse_edge("L0.H1 -> L1.H2 via q", shape)
    for via in ("k", "v"):
        stream = c.x[1] - c.results[0][1] + s.results[0][1]
        got = path_patch(model, clean, "L0.H1", "L1.H3", via, source=corrupted)
        want = _loss(ref.forward(model, clean.tokens, {(via, 1, 1): stream}).logits, clean)
        assert got.patched == pytest.approx(want, abs=TOL)
    # one edge named twice, or by both query heads of its group, is ablated once
    p = PathPatcher(model, clean, source=corrupted)
    k3 = Edge(Node("head", 0, 1), Node("head", 1, 3), "k")
    assert p.value([k3, k3, parse_edge("L0.H1 -> L1.H2 via k", shape)], "loss") == p.value(
        [parse_edge("L0.H1 -> L1.H3 via k", shape)], "loss")
    q = path_patch(model, clean, "L0.H1", "L1.H3", "q", source=corrupted)
    stream = c.x[1] - c.results[0][1] + s.results[0][1]
    want = _loss(ref.forward(model, clean.tokens, {("q", 1, 3): stream}).logits, clean)
    assert q.patched == pytest.approx(want, abs=TOL)


LLAMA = {"norm_type": "rmsnorm", "activation": "swiglu", "positional": "rope", "bias": "none"}


@pytest.mark.parametrize("norm,kv,attn_only,extra,atol", [
    ("pre", 4, False, {}, 1e-9), ("post", 4, False, {}, 1e-9), ("pre", 2, False, {}, 1e-9),
    ("post", 2, True, {}, 1e-9),
    # BERT's shape: bidirectional, an embedding norm, segment embeddings
    ("post", 4, False, {"causal": False, "embed_norm": True, "n_token_types": 2}, 1e-9),
    # RMSNorm normalises in float32 even in a float64 model: float32 rounding
    ("pre", 2, False, LLAMA, 1e-5)])
def test_every_edge_ablated_is_the_corrupted_run_and_none_is_the_clean_one(
        norm: str, kv: int, attn_only: bool, extra: dict, atol: float) -> None:
    # With every edge replaced by its corrupted source, every receiver reads the corrupted
    # stream, so the whole run is the corrupted run (ACDC's identity).
    cfg = hw.ModelConfig(n_layers=3, n_heads=4, n_kv_heads=kv, d_model=20, d_head=6,
                         vocab_size=V, max_seq_len=9, norm=norm, attn_only=attn_only, **extra)
    model = hw.build_model(cfg).double().eval()
    clean, corrupted = _batches()
    p = PathPatcher(model, clean, source=corrupted)
    torch.testing.assert_close(p.run(all_edges(model)), model(corrupted.tokens), rtol=0,
                               atol=atol)
    assert torch.equal(p.run([]), model(clean.tokens))


def test_edges_are_checked() -> None:
    shape = model_shape(_model())
    for text, message in [("L1.H0 -> L0.H1 via q", "below the receiver"),
                          ("L0.H0 -> L0.H1 via q", "below the receiver"),
                          ("L0.MLP -> L0.MLP", "below the receiver"),
                          ("L0.H0 -> L1.H1", "expected q, k or v"),
                          ("L0.H0 -> logits via q", "only a head receiver"),
                          ("logits -> L1.H0 via q", "sender must be"),
                          ("L0.H9 -> logits", "expected embed, logits, a head"),
                          ("L0.H0 L1.H1", "SENDER -> RECEIVER")]:
        with pytest.raises(SpecError, match=message):
            parse_edge(text, shape)
    assert str(parse_edge(" embed ->  L2.H3 via v", shape)) == "embed -> L2.H3 via v"
    assert len(all_edges(_model())) == len(set(all_edges(_model())))
