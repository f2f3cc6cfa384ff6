"""Pattern objectives against hand-computed values and PyTorch's own KL / NLL / cosine."""

from __future__ import annotations

import ast
import math
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from headwise import SelectorError
from headwise.control import (
    EntropyBound,
    FFNPenalty,
    HeadDiversity,
    Objective,
    PatternObjective,
)
from headwise.control.objectives import RoleBound, row_loss
from headwise.hooks import Hook

from .conftest import make


def run(model, obj, tokens, mask=None):  # type: ignore[no-untyped-def]
    with model.hooks(*obj.hooks()):
        model(tokens, attention_mask=mask)
    return obj.loss(tokens, mask)


def uniform_layer0():  # type: ignore[no-untyped-def]
    """q = 0 in layer 0, so every causal row is uniform: P[i, j] = 1 / (i + 1), j <= i."""
    model = make()
    with torch.no_grad():
        model.blocks[0].attn.q_proj.weight.zero_()
        model.blocks[0].attn.q_proj.bias.zero_()
    return model


def test_row_losses_by_hand() -> None:
    P = torch.tensor([[0.5, 0.25, 0.25], [0.5, 0.25, 0.25]])
    Q = torch.tensor([[1.0, 0.0, 0.0], [0.5, 0.5, 0.0]])
    ln2 = math.log(2)
    torch.testing.assert_close(row_loss(P, Q, "kl"), torch.tensor([ln2, 0.5 * ln2]))
    torch.testing.assert_close(row_loss(P, Q, "ce"), torch.tensor([ln2, 0.5 * ln2 + ln2]))
    torch.testing.assert_close(row_loss(P, Q, "mse"), torch.tensor([0.375, 0.125]))



def test_ce_gradient_flows_when_the_target_key_has_almost_no_mass() -> None:
    # P[target] = e^-69 ~ 1e-30: the loss and its gradient on the scores are log_softmax's
    scores = torch.tensor([[0.0, -69.0, -30.0]], requires_grad=True)
    Q = torch.tensor([[0.0, 1.0, 0.0]])
    row_loss(scores.softmax(-1), Q, "ce").sum().backward()
    ref = scores.detach().clone().requires_grad_(True)
    (-(Q * ref.log_softmax(-1)).sum()).backward()
    assert scores.grad is not None and ref.grad is not None
    torch.testing.assert_close(scores.grad, ref.grad)
    assert float(ref.grad[0, 1]) == pytest.approx(-1.0)

@pytest.mark.parametrize("target, kind, expected", [
    ("previous_token", "kl", (math.log(2) + math.log(3) + math.log(4)) / 3),
    ("previous_token", "ce", (math.log(2) + math.log(3) + math.log(4)) / 3),
    ("previous_token", "mse", (0.5 + 6 / 9 + 0.75) / 3),
    # Row 0 has a single allowed key, so no role is defined there (headwise.patterns).
    ("self", "kl", (math.log(2) + math.log(3) + math.log(4)) / 3),
    ("first_token", "kl", (math.log(2) + math.log(3) + math.log(4)) / 3),
    ("uniform", "kl", 0.0),
    ("induction", "kl", (math.log(3) + math.log(4)) / 2),  # rows 2, 3 only
])
def test_objective_values_on_a_hand_computed_example(target, kind, expected) -> None:  # type: ignore[no-untyped-def]
    model = uniform_layer0()
    tokens = torch.tensor([[5, 7, 5, 7]])
    obj = PatternObjective(model, "L0.H2", target, kind=kind, weight=3.0)
    term, logs = run(model, obj, tokens)
    assert float(logs["pattern/L0.H2"]) == pytest.approx(expected, abs=1e-6)
    assert float(term.detach()) == pytest.approx(3.0 * expected, abs=1e-5)


def test_padding_rows_and_keys_are_excluded() -> None:
    model = uniform_layer0()
    tokens = torch.tensor([[5, 7, 5, 7, 1, 1]])
    mask = torch.tensor([[1, 1, 1, 1, 0, 0]])
    obj = PatternObjective(model, "L0.H0", "previous_token")
    _, logs = run(model, obj, tokens, mask)
    expected = (math.log(2) + math.log(3) + math.log(4)) / 3
    assert float(logs["pattern/L0.H0"]) == pytest.approx(expected)


def test_objectives_match_torch_kl_and_nll_on_a_random_model() -> None:
    model = make()
    with torch.no_grad():  # sharpen the patterns so that the losses are far from zero
        model.blocks[1].attn.q_proj.weight.mul_(40.0)
    tokens = torch.randint(0, 23, (3, 10))
    _, cache = model.run_with_cache(tokens, ["blocks.1.attn.hook_pattern"], heads="L1.H3")
    P = cache.head("blocks.1.attn.hook_pattern", 3)  # (B, T, T)
    Q = torch.ones(10, 10).tril()
    Q = Q / Q.sum(-1, keepdim=True)
    logp = P.clamp_min(torch.finfo(P.dtype).tiny).log()
    kl = F.kl_div(logp, Q.expand(3, 10, 10), reduction="none").sum(-1)
    kl = kl[:, 1:].mean()  # row 0 has one allowed key: no role is defined there
    _, logs = run(model, PatternObjective(model, "L1.H3", "uniform"), tokens)
    assert float(logs["pattern/L1.H3"]) == pytest.approx(float(kl), rel=1e-5)
    prev = torch.arange(10).expand(3, 10) - 1
    nll = F.nll_loss(P[:, 1:].log().reshape(-1, 10), prev[:, 1:].reshape(-1))
    for target in ("previous_token", lambda t: torch.arange(t.shape[1]).expand_as(t) - 1,
                   torch.eye(12).roll(-1, dims=1).tril()):
        _, logs = run(model, PatternObjective(model, "L1.H3", target, kind="ce"), tokens)
        assert float(logs["pattern/L1.H3"]) == pytest.approx(float(nll), rel=1e-5)


def test_only_supervised_heads_leave_the_fused_path_and_get_gradient() -> None:
    model = make()
    obj = PatternObjective(model, "L0.H1,L0.H3", "previous_token")
    assert isinstance(obj, Objective)
    seen = {}

    def probe(layer: int):  # type: ignore[no-untyped-def]
        def fn(x, ctx):  # type: ignore[no-untyped-def]
            seen[layer] = model.blocks[layer].attn.explicit_heads()
        return fn

    tokens = torch.randint(0, 23, (2, 8))
    with model.hooks(*obj.hooks(), *[Hook(f"blocks.{l}.attn.hook_z", probe(l))
                                     for l in range(2)]):
        model(tokens)
    assert seen == {0: (1, 3), 1: ()}
    term, logs = obj.loss(tokens)
    assert set(logs) == {"pattern/L0.H1", "pattern/L0.H3"}
    term.backward()
    g = model.blocks[0].attn.q_proj.weight.grad.view(4, 6, 20)
    assert g[[1, 3]].abs().sum() > 0 and g[[0, 2]].abs().sum() == 0
    assert model.blocks[1].attn.q_proj.weight.grad is None


@pytest.mark.parametrize("make_obj", [
    lambda m, heads: PatternObjective(m, heads, "previous_token", kind="kl"),
    lambda m, heads: PatternObjective(m, heads, torch.ones(12, 12).tril(), kind="mse"),
    lambda m, heads: RoleBound(m, heads, "first_token", min=0.6, max=0.9),
])
def test_heads_at_once_equal_each_head_alone_across_shapes_and_extra_hooks(make_obj) -> None:  # type: ignore[no-untyped-def]
    """One objective over heads in two layers = the mean of one-head objectives; the target
    made once per batch shape follows a change of shape and of padding; another hook that
    widens the explicit heads changes nothing."""
    model = make()
    with torch.no_grad():
        for block in model.blocks:
            block.attn.q_proj.weight.mul_(5.0)
    heads = ["L0.H1", "L0.H3", "L1.H0"]
    together = make_obj(model, ",".join(heads))
    alone = [make_obj(model, h) for h in heads]
    widen = Hook("blocks.0.attn.hook_pattern", lambda x, ctx: None)  # every L0 head explicit
    for T, padded in ((8, False), (10, False), (10, True), (8, False)):
        tokens = torch.randint(0, 23, (3, T))
        mask = torch.ones_like(tokens)
        mask[1, -2:] = 0
        mask = mask if padded else None
        terms = []
        for extra in ([], [widen]):
            hooks = [h for o in (together, *alone) for h in o.hooks()]
            with model.hooks(*hooks, *extra):
                model(tokens, attention_mask=mask)
            term, logs = together.loss(tokens, mask)
            terms.append(term)
            parts = [o.loss(tokens, mask) for o in alone]
            expected = torch.stack([t for t, _ in parts]).mean()
            torch.testing.assert_close(term, expected, rtol=1e-6, atol=1e-7)
            assert list(logs) == [k for _, lg in parts for k in lg]
            for _, lg in parts:
                for k, v in lg.items():
                    torch.testing.assert_close(logs[k], v, rtol=1e-6, atol=1e-7)
        torch.testing.assert_close(terms[0], terms[1], rtol=1e-6, atol=1e-7)  # widen: no change


def test_entropy_bound_by_hand() -> None:
    model = uniform_layer0()
    tokens = torch.tensor([[1, 2, 3, 4]])
    # Causal uniform rows: row i holds 1/(i+1) on i+1 keys, entropy log(i+1) nats, normalised
    # by log(i+1) to 1.0; row 0 (one key) is not a defined row.
    ent = [math.log(i + 1) / math.log(i + 1) for i in range(1, 4)]
    obj = EntropyBound(model, "L0.H0", min=0.2, max=0.9)
    term, logs = run(model, obj, tokens)
    hinge = [max(0.0, 0.2 - e) + max(0.0, e - 0.9) for e in ent]
    assert float(term.detach()) == pytest.approx(sum(hinge) / 3, abs=1e-6)
    assert float(logs["entropy/L0.H0"]) == pytest.approx(1.0, abs=1e-6)


def test_head_diversity_pattern_by_hand_and_output_against_cosine() -> None:
    model = uniform_layer0()
    tokens = torch.tensor([[1, 2, 3, 4]])
    term, logs = run(model, HeadDiversity(model, 0, on="pattern", weight=2.0), tokens)
    expected = sum(1 / (i + 1) for i in range(4)) / 4  # every pair overlaps sum_k P^2
    assert float(term.detach()) == pytest.approx(2.0 * expected, abs=1e-6)
    model = make()
    tokens = torch.randint(0, 23, (2, 7))
    _, cache = model.run_with_cache(tokens, ["blocks.1.attn.hook_z"])
    z = cache["blocks.1.attn.hook_z"]  # (B, T, H, Dh)
    cos = F.cosine_similarity(z[:, :, :, None], z[:, :, None, :], dim=-1)  # (B, T, H, H)
    term, logs = run(model, HeadDiversity(model, 1, on="output"), tokens)
    assert float(term.detach()) == pytest.approx(float(cos.mean()), rel=1e-5)
    assert float(logs["diversity/L1.H2"]) == pytest.approx(float(cos[:, :, 2].mean()), rel=1e-5)


def test_ffn_penalty_against_cached_mlp_out() -> None:
    model = make()
    tokens = torch.randint(0, 23, (2, 7))
    _, cache = model.run_with_cache(tokens, ["blocks.0.hook_mlp_out", "blocks.1.hook_mlp_out"])
    m0, m1 = cache["blocks.0.hook_mlp_out"], cache["blocks.1.hook_mlp_out"]
    term, logs = run(model, FFNPenalty(model, [0, 1], kind="l1"), tokens)
    expected = (m0.abs().mean() + m1.abs().mean()) / 2
    assert float(term.detach()) == pytest.approx(float(expected), rel=1e-5)
    target = torch.linspace(-1, 1, 20)
    term, _ = run(model, FFNPenalty(model, 1, kind="target", target=target), tokens)
    assert float(term.detach()) == pytest.approx(float((m1 - target).pow(2).mean()), rel=1e-5)


def test_bad_objective_input_raises_naming_it() -> None:
    model = make()
    with pytest.raises(ValueError, match="target: got 'nxt_token'"):
        PatternObjective(model, "L0.H0", "nxt_token")
    with pytest.raises(ValueError, match="kind: got 'hinge'"):
        PatternObjective(model, "L0.H0", "self", kind="hinge")
    with pytest.raises(SelectorError, match="L2.H0"):
        PatternObjective(model, "L2.H0", "self")
    with pytest.raises(ValueError, match="target: tensor of shape \\(3, 4\\)"):
        PatternObjective(model, "L0.H0", torch.ones(3, 4))
    with pytest.raises(ValueError, match="min=0.8 > max=0.5"):
        EntropyBound(model, "L0.H0", min=0.8, max=0.5)
    with pytest.raises(ValueError, match="max got 1.2, expected a number in \\[0, 1\\]"):
        EntropyBound(model, "L0.H0", max=1.2)
    with pytest.raises(ValueError, match="on: got 'values'"):
        HeadDiversity(model, 0, on="values")
    with pytest.raises(ValueError, match="kind: got 'l2'"):
        FFNPenalty(model, 0, kind="l2")
    with pytest.raises(ValueError, match="layer 1 has no MLP"):
        FFNPenalty(make(attn_only=True), 1)
    obj = PatternObjective(model, "L0.H0", "self")
    with pytest.raises(RuntimeError, match="no attention pattern captured for layer 0"):
        obj.loss(torch.randint(0, 23, (1, 4)))


@pytest.mark.parametrize("make_obj", [
    lambda m: PatternObjective(m, "L1.H1-3", "previous_token", kind="ce"),
    lambda m: RoleBound(m, "L1.H1-3", "previous_token", max=0.1),
])
def test_a_lever_for_one_task_reads_only_that_tasks_rows(make_obj) -> None:  # type: ignore[no-untyped-def]
    """With ``task_id`` set, the loss, its gradient and the batch's scores are those of the
    same objective run on that task's rows alone; a batch without them measures nothing."""
    from headwise.data import Batch

    model = make()
    with torch.no_grad():  # sharpen the patterns so that the losses and scores differ by row
        model.blocks[1].attn.q_proj.weight.mul_(20.0)
    tokens = torch.randint(0, 23, (6, 10))
    task_ids = torch.tensor([0, 1, 0, 1, 1, 0])
    mixed = make_obj(model)
    mixed.task_id = 1
    mixed.prepare(Batch(tokens, torch.full_like(tokens, -100), None, task_ids))
    term, _ = run(model, mixed, tokens)
    (grad,) = torch.autograd.grad(term, [model.blocks[1].attn.q_proj.weight])
    scores = mixed.batch_values()

    alone = make_obj(model)
    mine = tokens[task_ids == 1]
    ref, _ = run(model, alone, mine)
    (ref_grad,) = torch.autograd.grad(ref, [model.blocks[1].attn.q_proj.weight])
    assert float(term.detach()) == pytest.approx(float(ref.detach()), rel=1e-5)
    assert float(ref.detach()) > 0
    assert torch.allclose(grad, ref_grad, rtol=1e-4, atol=1e-7)
    assert torch.allclose(scores, alone.batch_values(), atol=1e-6)
    everything, _ = run(model, make_obj(model), tokens)  # the whole batch differs
    assert float(everything.detach()) != pytest.approx(float(ref.detach()), rel=1e-3)

    mixed.prepare(Batch(tokens, torch.full_like(tokens, -100), None, torch.zeros(6).long()))
    term, _ = run(model, mixed, tokens)
    assert float(term.detach()) == 0.0 and bool(mixed.batch_values().isnan().all())


def test_every_objective_follows_the_protocol() -> None:
    from headwise.control import LearnedGates

    model = make()
    objectives = [PatternObjective(model, "L0.H0", "self"), EntropyBound(model, "L1.*", max=1),
                  HeadDiversity(model, 1), FFNPenalty(model),
                  LearnedGates(model, n_tasks=1).l0_penalty()]
    tokens = torch.randint(0, 23, (2, 5))
    with model.hooks(*[h for o in objectives for h in o.hooks()]):
        model(tokens)
    for obj in objectives:
        assert isinstance(obj, Objective)
        obj.weight = 2.0
        term, logs = obj.loss(tokens)
        assert term.dim() == 0 and term.requires_grad and logs
        assert all(k.startswith(obj.name + "/") for k in logs)


def test_regularizers_do_not_import_objectives() -> None:
    """No cycle: ``objectives`` re-exports the regularisers, so ``regularizers`` must not import
    ``objectives`` (module level or inside a function)."""
    import headwise.control.regularizers as reg

    tree = ast.parse(Path(reg.__file__).read_text())
    imported = {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)}
    imported |= {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    assert "headwise.control.objectives" not in imported
    assert "headwise.control.regularizers" in {
        n.module for n in ast.walk(ast.parse(Path(reg.__file__).with_name(
            "objectives.py").read_text())) if isinstance(n, ast.ImportFrom)}
