"""Task gates: fixed gates make unassigned heads irrelevant; hard-concrete maths; the table."""

from __future__ import annotations

import math

import pytest
import torch

from headwise import SelectorError, ablate
from headwise.control import FixedGates, HardConcreteGate, LearnedGates, gate_table, remove_gates

from .conftest import make

A_HEADS, B_HEADS = "L0.H0,L0.H2,L1.H1", "L0.H1,L1.*"
NOT_A = "L0.H1,L0.H3,L1.H0,L1.H2,L1.H3"


def test_ablating_heads_not_assigned_to_a_changes_a_logits_by_exactly_zero() -> None:
    model = make()
    FixedGates(model, {"A": A_HEADS, "B": B_HEADS}, task_names=["A", "B"])
    tokens = torch.randint(0, 23, (4, 9))
    task = torch.tensor([0, 1, 0, 1])
    out = model(tokens, task_ids=task)
    reference = torch.randint(0, 23, (6, 9))
    for mode in ("zero", "mean", "resample"):
        kw = {} if mode == "zero" else dict(reference=reference, task_ids=torch.zeros(6).long())
        with model.hooks(ablate(model, NOT_A, mode=mode, **kw)):  # type: ignore[arg-type]
            ablated = model(tokens, task_ids=task)
        assert torch.equal(ablated[task == 0], out[task == 0]), mode
        assert not torch.equal(ablated[task == 1], out[task == 1]), mode  # B uses L0.H1
    with model.hooks(ablate(model, "L1.H1")):
        assert not torch.equal(model(tokens, task_ids=task)[task == 0], out[task == 0])


def test_fixed_gates_equal_zero_ablation_of_the_other_heads_without_gates() -> None:
    gated, plain = make(), make()
    FixedGates(gated, {0: A_HEADS, 1: B_HEADS})
    tokens = torch.randint(0, 23, (3, 9))
    with plain.hooks(ablate(plain, NOT_A)):
        expected = plain(tokens)
    torch.testing.assert_close(gated(tokens, task_ids=torch.zeros(3).long()), expected,
                               rtol=0, atol=1e-6)
    remove_gates(gated)
    assert torch.equal(gated(tokens), plain(tokens))


def test_layers_without_assignment_pass_through_and_table_reads_back() -> None:
    model = make()
    gates = FixedGates(model, {0: "L1.H0", 1: "L1.H2-3"})
    assert set(gates.gates) == {1} and model.blocks[0].attn.head_gate is None
    table = gate_table(model, ["copy", "sort"])
    assert table.values.tolist() == [[1.0] * 4 + [1, 0, 0, 0], [1.0] * 4 + [0, 0, 1, 1]]
    text = str(table)
    assert "L1.H3" in text and text.splitlines()[-1].split() == ["sort", "0.00", "0.00",
                                                                  "1.00", "1.00"]
    assert str(table.active()["sort"]) == "L0.H0,L0.H1,L0.H2,L0.H3,L1.H2,L1.H3"


def test_hard_concrete_gate_maths() -> None:
    gate = HardConcreteGate(n_tasks=2, n_heads=3)
    la = torch.tensor([[-3.0, 0.0, 1.5], [4.0, -0.5, 0.2]])
    with torch.no_grad():
        gate.log_alpha.copy_(la)
    expected = (torch.sigmoid(la) * 1.2 - 0.1).clamp(0, 1)
    torch.testing.assert_close(gate.values(), expected)
    p_open = torch.sigmoid(la - (2 / 3) * math.log(0.1 / 1.1))
    torch.testing.assert_close(gate.open_probability(), p_open)
    gate.train()
    samples = torch.stack([gate.sample(torch.tensor([0, 1] * 5000)) for _ in range(2)])
    frac_open = (samples.view(2, 5000, 2, 3) > 0).float().mean((0, 1))  # (task, head)
    torch.testing.assert_close(frac_open, p_open.detach(), rtol=0, atol=0.02)
    model = make()
    learned = LearnedGates(model, n_tasks=2, layers=[1])
    term, logs = learned.l0_penalty(weight=0.5).loss(torch.zeros(1, 3).long())
    assert float(term.detach()) == pytest.approx(
        0.5 * 8 * float(torch.sigmoid(torch.tensor(2.0 - (2 / 3) * math.log(0.1 / 1.1)))))
    assert len(logs) == 8


def test_bad_gate_input_raises_naming_it() -> None:
    model = make()
    with pytest.raises(SelectorError, match="L1.H7"):
        FixedGates(model, {0: "L1.H7"})
    with pytest.raises(ValueError, match="task 'C' is not among task_names"):
        FixedGates(model, {"C": "L0.H0"}, task_names=["A", "B"])
    FixedGates(model, {0: "L0.H0", 1: "L0.H1"})
    tokens = torch.randint(0, 23, (2, 5))
    with pytest.raises(ValueError, match="needs task_ids"):
        model(tokens)
    with pytest.raises(ValueError, match="task_ids: got range \\[0, 2\\]"):  # checked at entry
        model.run_with_cache(tokens, ["hook_embed"], task_ids=torch.tensor([0, 2]))
    with pytest.raises(ValueError, match="n_tasks: got 0"):
        LearnedGates(model, n_tasks=0)
