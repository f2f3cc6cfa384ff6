"""The held-out data a run is verified on: its batches and probes, and probe-like samples.

``probe_sampler(spec)`` draws fresh examples like a named probe: the data of a lever for a score
clause (enforcement trains on data drawn like the clause's, never on the verification examples).

``verify_data(compiled)`` is what verification, enforcement, ``headwise analyze`` and the
forecast watch measure on.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import torch

from headwise.contract import VerifyData
from headwise.data import Batch
from headwise.pipeline.compile import Compiled
from headwise.pipeline.spec_probes import declared_probe, repeated_probe, spec_probes
from headwise.runspec import Spec
from headwise.runspec.probes import default_half_len
from headwise.training.device import model_device


def verify_data(compiled: Compiled) -> VerifyData:
    """Held-out data for verification: one batch per task, and probes for role scores.

    Probes: ``default`` (the held-out mixture), each task's name (its part of it),
    ``repeated`` (random halves repeated once, sized by the training data) and the spec's
    declared probes (``headwise.pipeline.spec_probes``). The
    batches are drawn on the CPU (seeded) and placed on the model's device.
    """
    data = _verify_data_cpu(compiled)
    device = model_device(compiled.model)
    if device.type == "cpu":
        return data
    return VerifyData(tasks={k: b.to(device) for k, b in data.tasks.items()},
                      probes={k: b.to(device) for k, b in data.probes.items()},
                      n_boot=data.n_boot)


def _verify_data_cpu(compiled: Compiled) -> VerifyData:
    batch = compiled.eval_batch
    tasks: dict[str, Batch] = {}
    for i, name in enumerate(compiled.task_names):
        rows = (batch.task_ids == i).nonzero().flatten()
        if rows.numel():
            mask = batch.attention_mask[rows] if batch.attention_mask is not None else None
            tasks[name] = Batch(batch.tokens[rows], batch.targets[rows], mask,
                                batch.task_ids[rows])
    probes: dict[str, Any] = {"default": batch, **tasks, **spec_probes(compiled.spec)}
    return VerifyData(tasks=tasks, probes=probes)


def probe_sampler(spec: Spec) -> Callable[[str, int, int], Batch]:
    """``fn(probe, n, seed)``: ``n`` examples drawn like a named probe (``repeated`` or a
    declared one) from ``seed``: the data of a lever for a score clause measured on a probe."""
    def sample(name: str, n: int, seed: int) -> Batch:
        gen = torch.Generator().manual_seed(seed)
        declared = {p.name: p for p in spec.probes}
        if name in declared:
            return declared_probe(spec, dataclasses.replace(declared[name], examples=n), gen)
        return repeated_probe(spec, default_half_len(spec.data), n, gen)
    return sample
