"""Parsing a spec's sections into the dataclasses of ``headwise.runspec.schema``.

Order matters: the model fixes the head shape that ``heads``, ``adapters`` and ``contract`` are
checked against, and ``data`` fixes the task names they may mention.
"""

from __future__ import annotations

import functools
import inspect
from dataclasses import fields, is_dataclass
from pathlib import Path
from types import MappingProxyType
from typing import Any

import headwise.validate as check
from headwise.confidence import DEFAULT_CONFIDENCE
from headwise.config import PRESETS, ModelConfig
from headwise.contract import EnforceConfig
from headwise.data.task import check_causal
from headwise.errors import HeadwiseError, SpecError
from headwise.heads import Head, HeadSet
from headwise.runspec.levers import parse_entropy, parse_mask, parse_objective
from headwise.runspec.schema import (
    MAX_PROBES,
    VERIFY_SEED_OFFSET,
    AdapterSpec,
    DataSpec,
    FFNSpec,
    GateSpec,
    HeadRule,
    ModelSpec,
    PretrainedSpec,
    TaskSpec,
)

TOP_LEVEL = ("name", "description", "model", "data", "probes", "train", "heads", "gates",
             "adapters", "ffn", "contract", "enforce")
ADAPTER_TARGETS = ("q", "k", "v", "o", "up", "down", "gate")


def parse_model(value: Any, base: Path | None) -> ModelSpec:
    """``model:`` as config fields, ``preset: NAME`` (+ overrides), or ``pretrained: {...}``."""
    data = check.mapping(value, "model", "a mapping of ModelConfig fields, {preset: NAME} or "
                         "{pretrained: {path: DIR, format: hf}} or {pretrained: {id: ID}}")
    if "pretrained" in data:
        check.keys(data, ["pretrained"], "model")
        raw = check.mapping(data["pretrained"], "model.pretrained",
                            "a mapping {path, format} or {id, revision}")
        check.keys(raw, ["path", "format", "id", "revision"], "model.pretrained")
        fmt = check.string(raw.get("format", "hf"), "model.pretrained.format", ["hf"])
        repo_id, revision = _pretrained_id(raw)
        if repo_id is None:
            resolved = _resolve(check.string(raw["path"], "model.pretrained.path"), base)
        else:
            resolved = _snapshot(repo_id, revision)
        config = _pretrained_config(resolved)
        pretrained = PretrainedSpec(str(resolved), fmt, repo_id, revision)  # type: ignore[arg-type]
        return ModelSpec(config, pretrained=pretrained)
    name = None
    if "preset" in data:
        name = check.string(data.pop("preset"), "model.preset", sorted(PRESETS))
        data = {**PRESETS[name].to_dict(), **data}
    try:
        config = ModelConfig.from_dict(data, path="model")
    except HeadwiseError as e:
        raise SpecError(str(e)) from None
    return ModelSpec(config, preset=name)


def _resolve(path: str, base: Path | None) -> Path:
    p = Path(path).expanduser()
    return p if p.is_absolute() or base is None else base / p


def _pretrained_id(raw: dict[str, Any]) -> tuple[str | None, str | None]:
    """``(id, revision)`` of ``model.pretrained``, or ``(None, None)`` when it gives a path."""
    if ("path" in raw) == ("id" in raw):
        raise SpecError("model.pretrained: expected exactly one of path (a local directory) or "
                        "id (a model id in the local HuggingFace cache)")
    if "id" not in raw:
        if "revision" in raw:
            raise SpecError("model.pretrained.revision: only used with id, not with path")
        return None, None
    revision = raw.get("revision")
    if revision is not None:
        revision = check.string(revision, "model.pretrained.revision")
    return check.string(raw["id"], "model.pretrained.id"), revision


def _snapshot(repo_id: str, revision: str | None) -> Path:
    from headwise.interop.hub_cache import snapshot_dir

    try:
        return snapshot_dir(repo_id, revision, field="model.pretrained.id",
                            revision_field="model.pretrained.revision")
    except HeadwiseError as e:
        raise SpecError(str(e)) from None


def _pretrained_config(path: Path) -> ModelConfig:
    from headwise.interop import hf_converter

    if not (path / "config.json").is_file():
        raise SpecError(f"model.pretrained.path: {path} has no config.json; expected a "
                        "HuggingFace model directory on local disk")
    try:
        return hf_converter(path)[1]
    except HeadwiseError as e:
        raise SpecError(f"model.pretrained.path: {e}") from None


def parse_data(value: Any, config: ModelConfig, base: Path | None,
               gated: bool = False, tokenizer: str | None = None) -> DataSpec:
    """``data: {tasks: {name: {task: KIND, weight: W, ...kwargs}}, eval_examples, eval_seed,
    verify_seed, task_tokens}``; ``gated``: the spec has task gates (``task_tokens: auto`` then
    adds no markers: the gates already tell the model which task it is doing); ``tokenizer``:
    a pretrained checkpoint's, the default ``tokenizer`` of file-backed tasks (``tokenizer:
    bytes`` reads the file's bytes instead)."""
    from headwise.data import TASKS

    data = check.mapping(value, "data", "a mapping with keys tasks, eval_examples, eval_seed, "
                         "verify_examples, verify_seed, task_tokens")
    check.keys(data, ["tasks", "eval_examples", "eval_seed", "verify_examples", "verify_seed",
                      "task_tokens"], "data", required=["tasks"])
    raw_tasks = data["tasks"]
    if isinstance(raw_tasks, list) and all(isinstance(t, str) for t in raw_tasks):
        raw_tasks = {t: {} for t in raw_tasks}
    raw_tasks = check.mapping(raw_tasks, "data.tasks", "a mapping of task name -> settings")
    if not raw_tasks:
        raise SpecError("data.tasks: got an empty mapping, expected at least one task")
    entries = {}
    for name, entry in raw_tasks.items():
        check.printable_name(name, "data.tasks", "a task name")
        path = check.join("data.tasks", name)
        entry = check.mapping({} if entry is None else entry, path,
                              "a mapping {task: KIND, weight: W, ...task settings}")
        kind_default = name if name in TASKS else None
        if "task" not in entry and kind_default is None:
            raise SpecError(f"{path}.task: missing; {name!r} is not a built-in task, so say "
                            f"which one it is: one of {sorted(TASKS)}")
        kind = check.string(entry.pop("task", kind_default), check.join(path, "task"),
                            sorted(TASKS))
        entries[name] = (path, kind, entry)
    markers = _markers(data.get("task_tokens", "auto"), [TASKS[k] for _, k, _ in
                                                          entries.values()], config, gated)
    vocab = min(markers) if markers else config.vocab_size  # task symbols stay below markers
    tasks = []
    for name, (path, kind, entry) in entries.items():
        weight = check.number(entry.pop("weight", 1.0), check.join(path, "weight"),
                              positive=True)
        if TASKS[kind].splits and "split" in entry:
            raise SpecError(f"{check.join(path, 'split')}: not a spec key; expected it left "
                            "out (a run reads each file's training, enforcement and "
                            "verification rows itself)")
        if TASKS[kind].splits and "tokenizer" in _init_names(TASKS[kind]):
            given = entry.get("tokenizer", tokenizer)
            entry = {**entry, "tokenizer": None if given == "bytes" else given}
        kwargs = _task_kwargs(TASKS[kind], entry, vocab, base, path)
        task = _build_task(TASKS[kind], kwargs, path)
        try:
            check_causal(task, config.causal, path)
        except HeadwiseError as e:
            raise SpecError(str(e)) from None
        if task.vocab_size > vocab:
            why = " less the task markers" if markers else ""
            raise SpecError(f"{path}: the task uses {task.vocab_size} token ids, more than "
                            f"model.vocab_size={config.vocab_size}{why}; expected a task "
                            f"vocab_size <= {vocab}")
        length = task.seq_len + bool(markers)
        if length > config.max_seq_len:
            marked = " with its task marker" if markers else ""
            raise SpecError(f"{path}: the task's sequences have T={length} positions{marked}, "
                            f"more than model.max_seq_len={config.max_seq_len}")
        tasks.append(TaskSpec(name, kind, weight, MappingProxyType(kwargs), task.seq_len))
    eval_seed = check.integer(data.get("eval_seed", 12345), "data.eval_seed", 0)
    eval_examples = check.integer(data.get("eval_examples", 512), "data.eval_examples", 1)
    return DataSpec(
        tuple(tasks),
        eval_examples=eval_examples,
        eval_seed=eval_seed,
        markers=tuple(markers),
        verify_seed=_verify_seed(data.get("verify_seed"), eval_seed),
        verify_examples=check.integer(data.get("verify_examples", eval_examples),
                                      "data.verify_examples", 1),
    )


def parse_contract_section(value: Any) -> tuple[Any, float]:
    """``contract:`` as a list of clauses, or ``{confidence: C, clauses: [...]}`` -> ``(clauses,
    confidence)``; ``confidence`` (default 0.95) is the level of every clause's one-sided bound
    and of the contract's family-wise verdict, in [0.5, 1)."""
    if not isinstance(value, dict):
        return value, DEFAULT_CONFIDENCE
    if "clauses" not in value:
        raise check.fail("contract", value, "a list of clauses, or {confidence: C, clauses: "
                         "[...]}")
    check.keys(value, ["clauses", "confidence"], "contract")
    confidence = check.number(value.get("confidence", DEFAULT_CONFIDENCE), "contract.confidence",
                              0.5, 1.0)
    if confidence >= 1.0:
        raise check.fail("contract.confidence", value["confidence"], "a number in [0.5, 1)")
    return value["clauses"], confidence


def _verify_seed(value: Any, eval_seed: int) -> int:
    """``data.verify_seed`` (default ``eval_seed + VERIFY_SEED_OFFSET``): the verification set
    and its probes draw from ``verify_seed + k`` as the enforcement set does from ``eval_seed
    + k`` (``k < MAX_PROBES + 2``), so the two ranges must not meet."""
    if value is None:
        return eval_seed + VERIFY_SEED_OFFSET
    seed = check.integer(value, "data.verify_seed", 0)
    if abs(seed - eval_seed) < MAX_PROBES + 2:
        raise SpecError(f"data.verify_seed: got {seed}, expected a seed at least "
                        f"{MAX_PROBES + 2} away from data.eval_seed={eval_seed} (the "
                        "verification set is drawn apart from the enforcement set)")
    return seed


def _markers(value: Any, kinds: list[type], config: ModelConfig, gated: bool) -> list[int]:
    """``data.task_tokens``: ``auto`` (markers when two tasks share an input format and no task
    gates tell them apart), ``on`` or ``off`` (``true``/``false`` too) -> each task's marker
    id, or ``[]``."""
    from headwise.data import CONTENT
    from headwise.data.markers import CHOICES, marker_ids, use_markers

    choice = {True: "on", False: "off"}.get(value, value) if isinstance(value, bool) else value
    choice = check.string(choice, "data.task_tokens", CHOICES)
    if not use_markers(choice, kinds) or (choice == "auto" and gated):
        return []
    if config.vocab_size - len(kinds) <= CONTENT:
        raise SpecError(f"data.task_tokens: {len(kinds)} task markers need ids at the top of "
                        f"the vocabulary; model.vocab_size={config.vocab_size} leaves no room "
                        "for the tasks' symbols")
    return marker_ids(config.vocab_size, len(kinds))


def _task_kwargs(cls: type, entry: dict[str, Any], vocab_size: int, base: Path | None,
                 path: str) -> dict[str, Any]:
    """The task's keyword arguments: the spec's, with ``vocab_size`` defaulting to the ids the
    model leaves for task symbols and relative file paths resolved against the spec's
    directory."""
    names = _init_names(cls)
    check.keys(entry, ["task", "weight", *names], path)
    kwargs = dict(entry)
    if "vocab_size" in names and "vocab_size" not in kwargs and not _own_vocab(cls, kwargs):
        kwargs["vocab_size"] = vocab_size
    for key in ("path", "tokenizer"):
        if isinstance(kwargs.get(key), str):
            kwargs[key] = str(_resolve(kwargs[key], base))
    return kwargs


def _init_names(cls: type) -> list[str]:
    """The keyword arguments a task class takes."""
    return ([f.name for f in fields(cls) if f.init] if is_dataclass(cls)
            else list(inspect.signature(cls).parameters))


def _own_vocab(cls: type, kwargs: dict[str, Any]) -> bool:
    """Text tasks with a tokenizer take their vocabulary from it."""
    return bool(kwargs.get("tokenizer")) or getattr(cls, "name", "") == "text"


def _build_task(cls: type, kwargs: dict[str, Any], path: str) -> Any:
    return check.dataclass_from(cls, kwargs, path, strip=f"{getattr(cls, 'name', '')}.") \
        if is_dataclass(cls) else _call(cls, kwargs, path)


def _call(cls: type, kwargs: dict[str, Any], path: str) -> Any:
    try:
        return cls(**kwargs)
    except (HeadwiseError, ValueError, TypeError) as e:
        raise SpecError(f"{path}: {e}") from None


def parse_train(value: Any) -> Any:
    """``train:`` -> ``headwise.training.TrainConfig`` (defaults when absent)."""
    from headwise.training.config import TrainConfig

    return check.dataclass_from(TrainConfig, {} if value is None else value, "train")


def parse_enforce(value: Any) -> EnforceConfig:
    """``enforce:`` -> ``headwise.contract.EnforceConfig`` (defaults when absent): the settings
    ``--enforce`` trains with (docs/contracts.md, "Enforcement levers")."""
    return check.dataclass_from(EnforceConfig, {} if value is None else value, "enforce",
                                skip=("dual",))


def _selector(sel: str, path: str, config: ModelConfig) -> HeadSet:
    try:
        return HeadSet.parse(sel, config.n_layers, config.n_heads)
    except HeadwiseError as e:
        text = str(e)
        for prefix in (f"{sel}: ", f"{sel!r}: "):
            if text.startswith(prefix):
                text = text[len(prefix):]
        raise SpecError(f"{path}: {text}") from None


def parse_heads(value: Any, config: ModelConfig, tasks: tuple[str, ...],
                seq_len: int | None = None) -> tuple[HeadRule, ...]:
    """``heads: {SELECTOR: {mask, objective, entropy, diversity, tasks, freeze, trainable}}``.

    ``seq_len`` (the data's longest sequence) is what fixed-size masks must cover.

    Raises:
        SpecError: a bad selector or entry, an unknown task, or two rules that contradict each
            other on one head (two masks, two objectives, two task lists, freeze + trainable,
            freeze + objective).
    """
    if value is None:
        return ()
    data = check.mapping(value, "heads", "a mapping of head selector -> settings")
    rules = []
    owner: dict[tuple[Head, str], str] = {}
    for sel, entry in data.items():
        path = check.join("heads", sel)
        heads = _selector(sel, path, config)
        entry = check.mapping(entry, path, "a mapping with keys mask, objective, entropy, "
                              "diversity, tasks, freeze, trainable")
        check.keys(entry, ["mask", "objective", "entropy", "diversity", "tasks", "freeze",
                           "trainable"], path)
        if not entry:
            raise SpecError(f"{path}: got an empty mapping, expected at least one of mask, "
                            "objective, entropy, diversity, tasks, freeze, trainable")
        p = functools.partial(check.join, path)
        rule = HeadRule(
            selector=sel,
            heads=tuple(heads),
            mask=parse_mask(entry["mask"], p("mask"), seq_len) if "mask" in entry else None,
            objective=(parse_objective(entry["objective"], p("objective"))
                       if "objective" in entry else None),
            entropy=parse_entropy(entry["entropy"], p("entropy")) if "entropy" in entry else None,
            diversity=(check.number(entry["diversity"], p("diversity"), positive=True)
                       if "diversity" in entry else None),
            tasks=(check.string_list(entry["tasks"], p("tasks"), tasks)
                   if "tasks" in entry else None),
            freeze=check.boolean(entry.get("freeze", False), p("freeze")),
            trainable=check.boolean(entry.get("trainable", False), p("trainable")),
        )
        if rule.diversity is not None and any(
                len(heads.in_layer(l)) != config.n_heads for l in heads.layers):
            raise SpecError(f"{p('diversity')}: the diversity term acts on all heads of a "
                            f"layer; expected a whole-layer selector such as "
                            f"L{heads.layers[0]}.*")
        if rule.freeze and rule.trainable:
            raise SpecError(f"{path}: freeze and trainable are both true; expected one")
        _claim(rule, path, owner)
        rules.append(rule)
    return tuple(rules)


def _claim(rule: HeadRule, path: str, owner: dict[tuple[Head, str], str]) -> None:
    """Record which rule sets what on each head; two rules setting one thing contradict."""
    what = [k for k in ("mask", "objective", "tasks") if getattr(rule, k) is not None]
    what += [k for k in ("freeze", "trainable") if getattr(rule, k)]
    for head in rule.heads:
        for key in what:
            other = owner.get((head, key))
            if other is not None and other != path:
                raise SpecError(f"{path}.{key}: {head} already has {key} from {other}; "
                                f"expected one {key} per head")
            owner[(head, key)] = path
        clash = [(a, b) for a, b in (("freeze", "trainable"), ("freeze", "objective"))
                 if (head, a) in owner and (head, b) in owner]
        if clash:
            a, b = clash[0]
            raise SpecError(f"{path}: {head} has {a} (from {owner[(head, a)]}) and {b} (from "
                            f"{owner[(head, b)]}); a frozen head cannot also be "
                            f"{'trainable' if b == 'trainable' else 'trained by an objective'}")


def _layers(value: Any, path: str, config: ModelConfig) -> tuple[int, ...]:
    raw = [value] if isinstance(value, int) and not isinstance(value, bool) else value
    if not isinstance(raw, list) or not raw:
        raise check.fail(path, value, "a layer index or a non-empty list of them")
    return tuple(check.integer(v, f"{path}[{i}]", 0, config.n_layers - 1)
                 for i, v in enumerate(raw))


def parse_gates(value: Any, rules: tuple[HeadRule, ...], config: ModelConfig
                ) -> GateSpec | None:
    """``gates: {kind: fixed|learned, layers, l0_weight, temperature}``.

    Fixed gates are implied when any head rule assigns ``tasks``; learned gates find their own
    assignment, so they cannot be combined with ``heads.*.tasks``.
    """
    assigned = [r for r in rules if r.tasks is not None]
    if value is None:
        return GateSpec("fixed") if assigned else None
    data = check.mapping(value, "gates", "a mapping with keys kind, layers, l0_weight, "
                         "temperature")
    check.keys(data, ["kind", "layers", "l0_weight", "temperature"], "gates")
    kind = check.string(data.get("kind", "fixed"), "gates.kind", ["fixed", "learned"])
    layers = _layers(data["layers"], "gates.layers", config) if "layers" in data else None
    if kind == "fixed" and not assigned:
        raise SpecError("gates.kind: fixed gates need a task assignment; expected "
                        "heads.<selector>.tasks on at least one head")
    if kind == "learned" and assigned:
        raise SpecError(f"heads.{assigned[0].selector}.tasks: a fixed task assignment "
                        "contradicts gates.kind=learned; expected one or the other")
    return GateSpec(
        kind,  # type: ignore[arg-type]
        layers,
        check.number(data.get("l0_weight", 0.01), "gates.l0_weight", minimum=0.0),
        check.number(data.get("temperature", 0.5), "gates.temperature", positive=True),
    )


def parse_ffn(value: Any, config: ModelConfig) -> FFNSpec | None:
    """``ffn: {weight: 0.01, layers: [0]}``: an L1 penalty on FFN outputs."""
    if value is None:
        return None
    data = check.mapping(value, "ffn", "a mapping {weight, layers}")
    check.keys(data, ["weight", "layers"], "ffn", required=["weight"])
    if config.attn_only:
        raise SpecError("ffn: the model is attention-only (no FFN); expected no ffn section")
    layers = _layers(data["layers"], "ffn.layers", config) if "layers" in data else None
    return FFNSpec(check.number(data["weight"], "ffn.weight", positive=True), layers)


def parse_adapters(value: Any, config: ModelConfig, rules: tuple[HeadRule, ...]
                   ) -> tuple[AdapterSpec, ...]:
    """``adapters: {targets: [q, v], rank: 4, alpha: 8, dropout: 0, layers | heads}``.

    A model carries one adapter set (a list of one mapping is accepted too). Adapters freeze
    every base weight, so they cannot be combined with ``heads.*.freeze``/``trainable``.
    """
    if value is None:
        return ()
    items = [value] if isinstance(value, dict) else value
    if not isinstance(items, list) or not items:
        raise check.fail("adapters", value, "a mapping {targets, rank, alpha, dropout, "
                         "layers | heads}")
    if len(items) > 1:
        raise SpecError(f"adapters: got {len(items)} adapter sets, expected one (a model "
                        "carries one set; list several targets in it instead)")
    clash = [r for r in rules if r.freeze or r.trainable]
    if clash:
        key = "freeze" if clash[0].freeze else "trainable"
        raise SpecError(f"heads.{clash[0].selector}.{key}: adapters freeze every base weight "
                        "and train only the adapters; expected either adapters or "
                        "freeze/trainable")
    path = "adapters"
    data = check.mapping(items[0], path, "a mapping with keys targets, rank, alpha, dropout, "
                         "layers, heads")
    check.keys(data, ["targets", "rank", "alpha", "dropout", "layers", "heads"], path,
               required=["targets", "rank"])
    if "layers" in data and "heads" in data:
        raise SpecError(f"{path}: both layers and heads are given; expected one scope")
    rank = check.integer(data["rank"], f"{path}.rank", minimum=1)
    layers = _layers(data["layers"], f"{path}.layers", config) if "layers" in data else None
    heads = None
    if "heads" in data:
        sel = check.string(data["heads"], f"{path}.heads")
        heads = tuple(_selector(sel, f"{path}.heads", config))
    targets = check.string_list(data["targets"], f"{path}.targets", ADAPTER_TARGETS)
    if heads is not None and set(targets) - {"q", "k", "v", "o"}:
        raise SpecError(f"{path}.targets: head-scoped adapters act on q, k, v, o; got "
                        f"{sorted(set(targets) - {'q', 'k', 'v', 'o'})}")
    if config.attn_only and set(targets) & {"up", "down", "gate"}:
        raise SpecError(f"{path}.targets: the model is attention-only (no MLP); expected "
                        "targets among q, k, v, o")
    if "gate" in targets and config.activation != "swiglu":
        raise SpecError(f"{path}.targets: 'gate' needs a gated MLP (model.activation: swiglu)")
    return (AdapterSpec(
        targets=targets,
        rank=rank,
        alpha=check.number(data.get("alpha", rank), f"{path}.alpha", positive=True),
        dropout=check.number(data.get("dropout", 0.0), f"{path}.dropout", 0.0, 0.99),
        layers=layers,
        heads=heads,
    ),)
