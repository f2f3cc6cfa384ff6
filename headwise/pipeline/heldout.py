"""The two held-out sets of a run, and probe-like samples for levers.

- ``enforcement_data(compiled)``: the *enforcement* set (``data.eval_seed``; file-backed tasks'
  ``eval`` split). Enforcement's multipliers, its stop and the kept evaluation point read it,
  as do the forecast watch and progress lines: everything that acts during training.
- ``verification_data(compiled)``: the *verification* set (``data.verify_seed``; their
  ``verify`` split), drawn apart from both. ``train_run`` reads it once, after training, for
  the verdict ``contract.json``, the exit code and the report show; ``verify`` and ``analyze``
  read it too. A guarantee measured on the data that steered it would not be one.
- ``probe_sampler(spec)``: fresh examples drawn like a named probe, the training data of a
  score clause's lever (never either held-out set's examples).

Each set is one batch per task and the probes score clauses read (``default``: the mixture;
each task's name: its part of it; ``repeated`` and the declared probes:
``headwise.pipeline.spec_probes``), drawn on the CPU and placed on the model's device, with the
starting model ``preserve`` clauses compare with (captured by ``compile_spec``). A file-backed
task's part of either set holds each example of its split at most once (``Task.held_out``:
drawn without replacement; the whole split, and a smaller set, when the split holds fewer
than the task's share), as the bounds a verdict states assume of its examples.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import torch

from headwise.contract import VerifyData
from headwise.control.base_reference import base_of
from headwise.data import Batch, Mixture
from headwise.pipeline.compile import Compiled, held_out_mixture
from headwise.pipeline.spec_probes import declared_probe, repeated_probe, spec_probes
from headwise.runspec import Spec
from headwise.runspec.probes import default_half_len
from headwise.training.device import model_device


def enforcement_data(compiled: Compiled) -> VerifyData:
    """The enforcement set: ``compiled.eval_batch`` by task, and probes from
    ``data.eval_seed``."""
    return _on_device(compiled, _sets(compiled.eval_batch, compiled,
                                      compiled.spec.data.eval_seed))


def verification_data(compiled: Compiled, seed: int | None = None,
                      examples: int | None = None) -> VerifyData:
    """The verification set: ``data.verify_examples`` examples (or ``examples``: the size an
    enforced run drew for its verdict, ``headwise.contract.evidence``) of the ``verify`` split
    drawn from ``data.verify_seed`` (or ``seed``: a fresh set, ``verify --fresh``), and probes
    from the seeds after it."""
    spec = compiled.spec
    seed = spec.data.verify_seed if seed is None else seed
    gen = torch.Generator().manual_seed(seed)
    n = spec.data.verify_examples if examples is None else examples
    batch = held_out_mixture(spec, "verify").sample(n, gen, held_out=True)
    return _on_device(compiled, _sets(batch, compiled, seed))


def _sets(batch: Batch, compiled: Compiled, seed: int) -> VerifyData:
    tasks: dict[str, Batch] = {}
    for i, name in enumerate(compiled.task_names):
        rows = (batch.task_ids == i).nonzero().flatten()
        if rows.numel():
            mask = batch.attention_mask[rows] if batch.attention_mask is not None else None
            tasks[name] = Batch(batch.tokens[rows], batch.targets[rows], mask,
                                batch.task_ids[rows])
    probes: dict[str, Any] = {"default": batch, **tasks, **spec_probes(compiled.spec, seed)}
    return VerifyData(tasks=tasks, probes=probes, base=base_of(compiled.model),
                      named=compiled.spec.contract.named_heads)


def _on_device(compiled: Compiled, data: VerifyData) -> VerifyData:
    device = model_device(compiled.model)
    if device.type == "cpu":
        return data
    return dataclasses.replace(data, tasks={k: b.to(device) for k, b in data.tasks.items()},
                               probes={k: b.to(device) for k, b in data.probes.items()})


def probe_sampler(spec: Spec, data: Mixture | None = None) -> Callable[[str, int, int], Batch]:
    """``fn(name, n, seed)``: ``n`` examples drawn from ``seed`` like a named probe
    (``repeated`` or a declared one), or, for a task of ``data`` (the training mixture), ``n``
    of that task's training examples: the data a lever draws besides the training batch (a
    score clause's probe; the clean means of a path lever)."""
    def sample(name: str, n: int, seed: int) -> Batch:
        gen = torch.Generator().manual_seed(seed)
        declared = {p.name: p for p in spec.probes}
        if name in declared:
            return declared_probe(spec, dataclasses.replace(declared[name], examples=n), gen)
        if data is not None and name in data.names:
            return data.sample_task(name, n, gen)
        return repeated_probe(spec, default_half_len(spec.data), n, gen)
    return sample
