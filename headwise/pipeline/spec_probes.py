"""The probe data sets a run's score clauses measure on: the default ones and the declared ones.

- ``default``: the held-out mixture; each task's name: its part of it
  (``headwise.pipeline.heldout``).
- ``repeated``: random halves repeated once, ``[BOS, (marker), r, r]``, sized by the training
  data (``headwise.runspec.probes.default_half_len``: no position beyond the longest training
  sequence), with symbols drawn below any task marker and without repeats within a half.
- every probe of the spec's ``probes:`` section (``headwise.runspec.probes``).

Every probe is a ``Batch`` framed like the training data (``BOS`` when the tasks use one, then
the marker of the task it runs as) with that task's id, so task gates apply as in training.
Each draws from its own seeded generator (the held-out set's seed ``+ 1 + index``: for the
enforcement set ``data.eval_seed``, for the verification set ``data.verify_seed``):
reproducible, and independent of the held-out sets, of each other and of training.
"""

from __future__ import annotations

import torch

from headwise.analysis.probe_inputs import induction_probe, random_tokens
from headwise.data import BOS, CONTENT, IGNORE, TASKS, Batch, build_task
from headwise.data.markers import insert_marker
from headwise.runspec import ProbeSpec, Spec
from headwise.runspec.probes import DEFAULT_EXAMPLES, default_half_len


def _frame(content: torch.Tensor, spec: Spec, as_task: str, bos: bool) -> Batch:
    """``content`` (n, L) framed like the training data and run as task ``as_task``."""
    n = content.shape[0]
    tokens = content
    if bos:
        tokens = torch.cat([torch.full((n, 1), BOS, dtype=torch.long), tokens], dim=1)
    task_id = spec.data.names.index(as_task)
    batch = Batch(tokens, torch.full_like(tokens, IGNORE), None,
                  torch.full((n,), task_id, dtype=torch.long))
    if spec.data.markers:
        batch = insert_marker(batch, spec.data.markers[task_id], after_bos=bos)
    return batch


def _uses_bos(spec: Spec) -> bool:
    return any(TASKS[t.task].starts_with_bos for t in spec.data.tasks)


def _symbols(spec: Spec) -> tuple[int, int]:
    """(first, end) of the ids probes draw content from: the task symbols, below any marker."""
    end = min(spec.data.markers) if spec.data.markers else spec.model.config.vocab_size
    return (CONTENT if _uses_bos(spec) and end - CONTENT >= 2 else 0), end


def repeated_probe(spec: Spec, half_len: int, n: int, gen: torch.Generator,
                   as_task: str | None = None) -> Batch:
    """``n`` sequences ``[BOS, (marker), r, r]`` with ``r`` of ``half_len`` distinct symbols."""
    first, end = _symbols(spec)
    content = induction_probe(end, n, half_len, gen, reserved=first)
    return _frame(content, spec, as_task or spec.data.names[0], _uses_bos(spec))


def declared_probe(spec: Spec, probe: ProbeSpec, gen: torch.Generator) -> Batch:
    """The batch of one ``probes:`` entry."""
    bos = _uses_bos(spec)
    if probe.kind == "repeated":
        return repeated_probe(spec, int(probe.kwargs["half_len"]), probe.examples, gen,
                              probe.as_task)
    if probe.kind == "random":
        first, end = _symbols(spec)
        content = random_tokens(end, probe.examples, int(probe.kwargs["length"]), gen,
                                reserved=first)
        return _frame(content, spec, probe.as_task, bos)
    assert probe.task is not None
    task = build_task(probe.task, dict(probe.kwargs), f"probes.{probe.name}")
    part = task.sample(probe.examples, gen)
    task_id = spec.data.names.index(probe.as_task)
    batch = Batch(part.tokens, part.targets, part.attention_mask,
                  torch.full((probe.examples,), task_id, dtype=torch.long))
    if spec.data.markers:
        batch = insert_marker(batch, spec.data.markers[task_id], task.starts_with_bos)
    return batch


def spec_probes(spec: Spec, seed: int) -> dict[str, Batch]:
    """``repeated`` (when one fits the training data) and every declared probe, by name, drawn
    from seeds after ``seed`` (a held-out set's)."""
    out: dict[str, Batch] = {}
    half = default_half_len(spec.data)
    if half:
        gen = torch.Generator().manual_seed(seed + 1)
        out["repeated"] = repeated_probe(spec, half, DEFAULT_EXAMPLES, gen)
    for i, probe in enumerate(spec.probes):
        gen = torch.Generator().manual_seed(seed + 2 + i)
        out[probe.name] = declared_probe(spec, probe, gen)
    return out
