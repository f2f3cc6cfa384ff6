"""Edge attribution against exact path patching: EAP is path patching's first-order term."""

from __future__ import annotations

import pytest
import torch

import headwise as hw
from headwise.analysis.edges import EdgeScores, agreement, edge_attribution, spearman
from headwise.analysis.paths import PathPatcher
from headwise.data import Batch
from headwise.hooks.graph import all_edges


def _relative_error(norm: str, kv: int, eps: float) -> float:
    """max |EAP - exact| / max |exact| over every edge, when the corrupted input differs from
    the clean one by a token whose embedding is ``eps`` away (every sender moves by O(eps))."""
    torch.manual_seed(0)
    cfg = hw.ModelConfig(n_layers=3, n_heads=4, n_kv_heads=kv, d_model=20, d_head=6, d_ff=28,
                         vocab_size=13, max_seq_len=9, norm=norm)
    model = hw.build_model(cfg).double().eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            p.copy_((1.0 if "ln" in name else 0.0) + 0.4 * torch.randn_like(p))
        model.embed.weight[12] = model.embed.weight[5] + eps * torch.randn(20, dtype=torch.float64)
    tokens, targets = torch.randint(0, 12, (3, 7)), torch.randint(0, 12, (3, 7))
    tokens[:, 2] = 5
    corrupted = tokens.clone()
    corrupted[:, 2] = 12
    batch = Batch(tokens, targets, None, torch.zeros(3, dtype=torch.long))
    p = PathPatcher(model, batch, source=corrupted)
    edges = all_edges(model)
    exact = torch.tensor([p.value([e], "loss") - p.clean("loss") for e in edges])
    scores = edge_attribution(model, batch, "loss", source=corrupted)
    est = torch.tensor([scores.score(e) for e in edges])
    assert exact.abs().max() > 0.1 * eps  # the perturbation reaches the loss
    return float((est - exact).abs().max() / exact.abs().max())


@pytest.mark.parametrize("norm,kv", [("pre", 4), ("post", 4), ("pre", 2)])
def test_eap_is_the_first_order_term_of_exact_path_patching(norm: str, kv: int) -> None:
    # A first-order estimate's error is second order: relative to the effects (themselves
    # O(eps)) it shrinks like eps. Measured: 1.5e-5 (pre), 7e-6 (post) at eps = 1e-5, and 100x
    # more at eps = 1e-3. Tolerances: 1e-3 at eps = 1e-5, and at least 20x shrinkage.
    small, large = _relative_error(norm, kv, 1e-5), _relative_error(norm, kv, 1e-3)
    assert small < 1e-3
    assert large / small > 20


def test_eap_ig_with_one_step_is_eap_and_bad_arguments_are_refused() -> None:
    cfg = hw.ModelConfig(n_layers=2, n_heads=2, d_model=8, vocab_size=7, max_seq_len=6)
    model = hw.build_model(cfg).double()
    batch = Batch(torch.randint(0, 7, (2, 5)), torch.randint(0, 7, (2, 5)), None,
                  torch.zeros(2, dtype=torch.long))
    eap = edge_attribution(model, batch)
    one = edge_attribution(model, batch, method="eap-ig", steps=1)
    assert torch.equal(eap.scores, one.scores) and eap.mode == "mean" and eap.passes == 1
    three = edge_attribution(model, batch, method="eap-ig", steps=3, mode="zero")
    assert three.passes == 3 and not torch.equal(three.scores, eap.scores)
    with pytest.raises(ValueError, match="no gradient"):
        edge_attribution(model, batch, "accuracy")
    with pytest.raises(ValueError, match="method"):
        edge_attribution(model, batch, method="acdc")
    with pytest.raises(ValueError, match="steps"):
        edge_attribution(model, batch, method="eap-ig", steps=0)
    with pytest.raises(ValueError, match=r"^steps: got 1001, expected an integer in \[1, 1000\]"):
        edge_attribution(model, batch, method="eap-ig", steps=1001)  # MAX_IG_STEPS + 1
    assert not any(p.grad is not None for p in model.parameters())


def test_agreement_counts_the_shared_top_k() -> None:
    cfg = hw.ModelConfig(n_layers=1, n_heads=2, d_model=8, vocab_size=7, max_seq_len=6)
    edges = all_edges(hw.build_model(cfg))[:4]
    scores = EdgeScores(edges, torch.tensor([0.1, -0.5, 0.2, 0.0], dtype=torch.float64),
                        "loss", "eap", 1, "mean")
    exact = dict(zip(edges, [0.3, -0.6, 0.05, 0.01], strict=True))
    a = agreement(scores, exact, 2)  # top 2 by |.|: {1, 2} vs {1, 0}
    assert (a.n_edges, a.k, a.top_k) == (4, 2, 0.5)
    assert a.spearman == pytest.approx(spearman(scores.scores, torch.tensor(list(exact.values()))))
    with pytest.raises(ValueError, match="k: got 5"):
        agreement(scores, exact, 5)


def test_spearman_matches_a_hand_worked_case() -> None:
    a = torch.tensor([1.0, 2.0, 3.0, 4.0])
    assert spearman(a, torch.tensor([10.0, 20.0, 30.0, 40.0])) == pytest.approx(1.0)
    assert spearman(a, -a) == pytest.approx(-1.0)
    # ranks (1, 2, 3, 4) vs (2, 1, 4, 3): 1 - 6 * 4 / (4 * 15) = 0.6
    assert spearman(a, torch.tensor([2.0, 1.0, 4.0, 3.0])) == pytest.approx(0.6)
