"""No host synchronisation on the hot path: ``torch._dynamo.explain`` finds zero graph breaks.

A graph break is where Dynamo must hand control back to Python, typically to read a tensor's
value on the host (``int(t.max())``, ``bool(t.any())``, ``float(loss)``): each one is also a
device synchronisation on a GPU. Traced here: the forward without hooks (fused path), with and
without padding; the demo's training step (mask, pattern objective, fixed task gates) —
forward with the objectives' hooks, objective terms and task loss; and every other objective
kind (entropy bound, head diversity, FFN penalty, induction target, learned gates' L0).
Attaching hooks, ``backward()`` and the optimiser step are outside the traced function by
design: ``train.compile`` compiles the model, and the hooks are attached around the call.
"""

from __future__ import annotations

import importlib.resources
from typing import Any

import pytest
import torch
import torch._dynamo as dynamo

from headwise.config import ModelConfig
from headwise.control.gates import LearnedGates
from headwise.control.objectives import EntropyBound, FFNPenalty, HeadDiversity, PatternObjective
from headwise.data import Batch
from headwise.model import build_model
from headwise.pipeline.compile import compile_spec
from headwise.runspec import load_spec
from headwise.training.metrics import task_loss


def _explain(fn: Any, *args: Any, **kwargs: Any) -> Any:
    dynamo.reset()
    out = dynamo.explain(fn)(*args, **kwargs)
    dynamo.reset()
    return out


def _reasons(out: Any) -> list[str]:
    return [f"{r.reason.splitlines()[0]} at {r.user_stack[-1] if r.user_stack else '?'}"
            for r in out.break_reasons]


def _padded(tokens: torch.Tensor) -> torch.Tensor:
    mask = torch.ones_like(tokens)
    mask[::2, -3:] = 0  # every other example ends in 3 padding positions
    return mask


def _demo() -> Any:
    path = importlib.resources.files("headwise") / "examples" / "demo.yaml"
    return compile_spec(load_spec(str(path)))


@pytest.mark.parametrize("padding", [False, True])
def test_no_hook_forward_has_no_graph_break(padding: bool) -> None:
    compiled = _demo()
    model = build_model(compiled.model.config, seed=0)  # no levers: the plain fused path
    tokens = compiled.data.sample(8, torch.Generator().manual_seed(0)).tokens
    mask = _padded(tokens) if padding else None
    out = _explain(model, tokens, attention_mask=mask)
    assert out.graph_break_count == 0, _reasons(out)
    assert out.graph_count == 1


@pytest.mark.parametrize("padding", [False, True])
def test_demo_training_step_has_no_graph_break(padding: bool) -> None:
    compiled = _demo()
    model, objectives = compiled.model, compiled.objectives
    assert {type(o).__name__ for o in objectives} >= {"PatternObjective"}
    batch = compiled.data.sample(8, torch.Generator().manual_seed(0))
    mask = _padded(batch.tokens) if padding else batch.attention_mask
    n_tasks = len(compiled.data.names)

    def step(tokens: torch.Tensor, attention_mask: torch.Tensor | None,
             task_ids: torch.Tensor, targets: torch.Tensor) -> Any:
        b = Batch(tokens=tokens, targets=targets, task_ids=task_ids,
                  attention_mask=attention_mask)
        logits = model(tokens, attention_mask=attention_mask, task_ids=task_ids)
        terms = [obj.loss(tokens, attention_mask) for obj in objectives]
        loss, stats = task_loss(logits, b, n_tasks)
        return loss + sum(t for t, _ in terms), stats, [logs for _, logs in terms]

    hooks = [h for obj in objectives for h in obj.hooks()]
    with model.hooks(*hooks):
        out = _explain(step, batch.tokens, mask, batch.task_ids, batch.targets)
    assert out.graph_break_count == 0, _reasons(out)


def test_every_objective_kind_and_learned_gates_have_no_graph_break() -> None:
    cfg = ModelConfig(n_layers=2, n_heads=4, d_model=32, vocab_size=20, max_seq_len=16)
    model = build_model(cfg, seed=0)
    gates = LearnedGates(model, n_tasks=2)
    objectives = [EntropyBound(model, "L0.H1", min=0.5), HeadDiversity(model, 1),
                  FFNPenalty(model), PatternObjective(model, "L1.H2", "induction"),
                  gates.l0_penalty()]
    tokens = torch.randint(0, 20, (4, 12))
    task_ids = torch.tensor([0, 1, 0, 1])

    def step(tokens: torch.Tensor, mask: torch.Tensor, task_ids: torch.Tensor) -> Any:
        logits = model(tokens, attention_mask=mask, task_ids=task_ids)
        terms = [obj.loss(tokens, mask) for obj in objectives]
        return logits.sum() + sum(t for t, _ in terms), [logs for _, logs in terms]

    with model.hooks(*[h for obj in objectives for h in obj.hooks()]):
        out = _explain(step, tokens, _padded(tokens), task_ids)
    assert out.graph_break_count == 0, _reasons(out)


def test_explain_does_see_a_host_read() -> None:
    """The check itself can fail: a forward that reads a value on the host breaks the graph."""
    model = build_model(_demo().model.config, seed=0)

    def with_read(tokens: torch.Tensor) -> torch.Tensor:
        if int(tokens.max()) >= 0:
            return model(tokens)
        return model(tokens.clamp_min(0))

    out = _explain(with_read, torch.zeros(2, 5, dtype=torch.long))
    assert out.graph_break_count >= 1
