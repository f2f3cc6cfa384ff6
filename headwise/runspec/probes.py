"""Parsing ``probes:``: named data sets that score clauses measure roles on (``on: NAME``).

Three kinds, each checked against the model's shape and the training data::

    probes:
      unseen: {task: induction, period: [20, 24]}     # a built-in task, arguments overridden
      halves: {repeated: {half_len: 12}}              # [BOS, r, r], r of half_len tokens
      noise: {random: {length: 16}, examples: 64}     # uniform random tokens after BOS

``task`` names a training task (its arguments are the defaults) or a built-in kind. Every probe
starts like the training data (``BOS``, then the task marker of ``as_task`` when the data has
markers) and runs with ``as_task``'s task id (default: the first task). A probe longer than the
longest training sequence reaches positions whose learned embeddings never trained: an error
naming the probe, unless it says ``allow_untrained_positions: true`` (models with rotary,
sinusoidal or no positions, and pretrained models, are not limited).
"""

from __future__ import annotations

from types import MappingProxyType
from typing import Any

import headwise.validate as check
from headwise.config import ModelConfig
from headwise.errors import HeadwiseError, SpecError
from headwise.runspec.schema import MAX_PROBES, DataSpec, ProbeSpec

DEFAULT_EXAMPLES = 128
GENERATORS = {"repeated": "half_len", "random": "length"}  # generator -> its size argument
_COMMON = ("examples", "as_task", "allow_untrained_positions")


def prefix_len(data: DataSpec) -> int:
    """Positions before a probe's content: ``BOS`` (when the tasks use one) and a marker."""
    from headwise.data import TASKS

    bos = any(TASKS[t.task].starts_with_bos for t in data.tasks)
    return int(bos) + bool(data.markers)


def parse_probes(value: Any, config: ModelConfig, data: DataSpec,
                 pretrained: bool) -> tuple[ProbeSpec, ...]:
    """``probes: {NAME: {...}}`` -> ProbeSpecs (see the module docstring).

    Raises:
        SpecError: naming the probe and field: an unknown task or generator, bad arguments, a
            name that is a task's or ``default``, a probe that does not fit the model, or one
            reaching untrained positions.
    """
    if value is None:
        return ()
    raw = check.mapping(value, "probes", "a mapping of probe name -> settings")
    if len(raw) > MAX_PROBES:
        raise SpecError(f"probes: got {len(raw)} probes, expected at most {MAX_PROBES}")
    out = []
    for name, entry in raw.items():
        check.printable_name(name, "probes", "a probe name")
        path = check.join("probes", name)
        if name == "default" or name in data.names:
            raise SpecError(f"{path}: the name is taken (the held-out data and each task are "
                            f"probes already: default, {', '.join(data.names)}); choose another")
        entry = check.mapping(entry, path, "a mapping {task: KIND, ...} or {repeated: "
                              "{half_len: N}} or {random: {length: N}}")
        out.append(_probe(name, path, dict(entry), config, data, pretrained))
    return tuple(out)


def _probe(name: str, path: str, entry: dict[str, Any], config: ModelConfig, data: DataSpec,
           pretrained: bool) -> ProbeSpec:
    examples = check.integer(entry.pop("examples", DEFAULT_EXAMPLES),
                             check.join(path, "examples"), 1, 100_000)
    as_task = check.string(entry.pop("as_task", data.names[0]), check.join(path, "as_task"),
                           data.names)
    allow = check.boolean(entry.pop("allow_untrained_positions", False),
                          check.join(path, "allow_untrained_positions"))
    kinds = [k for k in ("task", *GENERATORS) if k in entry]
    if len(kinds) != 1:
        raise SpecError(f"{path}: got keys {sorted(entry)}, expected exactly one of 'task', "
                        "'repeated', 'random' (plus examples, as_task, "
                        "allow_untrained_positions)")
    kind = kinds[0]
    if kind == "task":
        task, kwargs, content_len = _task_probe(path, entry, config, data)
        length = content_len + bool(data.markers)
    else:
        check.keys(entry, [kind], path)
        size_key = GENERATORS[kind]
        args = check.mapping(entry[kind], check.join(path, kind), f"{{{size_key}: N}}")
        check.keys(args, [size_key], check.join(path, kind), required=[size_key])
        size = check.integer(args[size_key], f"{path}.{kind}.{size_key}", 1,
                             config.max_seq_len)
        task, kwargs = None, {size_key: size}
        length = prefix_len(data) + (2 * size if kind == "repeated" else size)
    _check_length(path, length, config, data, pretrained, allow)
    return ProbeSpec(name, kind, task, MappingProxyType(kwargs), examples, as_task,  # type: ignore[arg-type]
                     length, allow)


def _task_probe(path: str, entry: dict[str, Any], config: ModelConfig,
                data: DataSpec) -> tuple[str, dict[str, Any], int]:
    """A built-in task probe: (kind, arguments, its sequence length without a marker)."""
    from headwise.data import TASKS, build_task

    given = check.string(entry.pop("task"), check.join(path, "task"),
                         sorted({*data.names, *TASKS}))
    training = {t.name: t for t in data.tasks}.get(given)
    kind = training.task if training is not None else given
    kwargs = {**(dict(training.kwargs) if training is not None else {}), **entry}
    limit = min(data.markers) if data.markers else config.vocab_size
    kwargs.setdefault("vocab_size", limit)
    try:
        task = build_task(kind, kwargs, path)
    except HeadwiseError as e:
        raise SpecError(str(e)) from None
    if task.vocab_size > limit:
        raise SpecError(f"{path}: the task uses {task.vocab_size} token ids, more than the "
                        f"{limit} the model leaves for task symbols")
    return kind, kwargs, task.seq_len


def _check_length(path: str, length: int, config: ModelConfig, data: DataSpec,
                  pretrained: bool, allow: bool) -> None:
    if length > config.max_seq_len:
        raise SpecError(f"{path}: its sequences have T={length} positions, more than "
                        f"model.max_seq_len={config.max_seq_len}")
    learned = config.positional == "learned" and not pretrained
    if learned and length > data.seq_len and not allow:
        raise SpecError(f"{path}: its sequences have T={length} positions, but the longest "
                        f"training sequence has {data.seq_len}: learned position embeddings "
                        f"{data.seq_len}..{length - 1} never trained; shorten the probe or set "
                        "allow_untrained_positions: true")


def default_half_len(data: DataSpec) -> int:
    """``half_len`` of the default ``repeated`` probe: ``[BOS, (marker), r, r]`` no longer than
    the longest training sequence, at most 32; 0 when fewer than 2 positions fit."""
    half = min((data.seq_len - prefix_len(data)) // 2, 32)
    return half if half >= 2 else 0


def probe_names(data: DataSpec, probes: tuple[ProbeSpec, ...]) -> list[str]:
    """Every name a score clause's ``on`` may use: ``default`` (the held-out mixture), each
    task, ``repeated`` (the default induction probe, when one fits) and the declared probes."""
    names = ["default", *data.names]
    if default_half_len(data):
        names.append("repeated")
    return [*names, *(p.name for p in probes if p.name not in names)]
