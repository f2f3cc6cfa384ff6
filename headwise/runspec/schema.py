"""The parsed spec: frozen dataclasses for model, data, train, heads, gates, adapters, contract.

These are plain descriptions; ``headwise.pipeline.compile_spec`` turns them into a model, levers,
data and a contract. Every field has been validated by ``headwise.runspec.parse``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Literal

from headwise.config import ModelConfig
from headwise.contract import Contract, EnforceConfig
from headwise.heads import Head


def _empty() -> Mapping[str, Any]:
    return MappingProxyType({})


@dataclass(frozen=True)
class PretrainedSpec:
    """A checkpoint on local disk: ``path`` to a HuggingFace directory, ``format`` ("hf").

    Given as ``{id, revision}`` instead, ``path`` is the id's snapshot in the local HF cache
    (resolved while parsing) and ``id`` / ``revision`` record what the spec said.
    """

    path: str
    format: Literal["hf"] = "hf"
    id: str | None = None
    revision: str | None = None


@dataclass(frozen=True)
class ModelSpec:
    """Either a config (given directly or from a preset) or a pretrained checkpoint.

    ``config`` is always set: for a pretrained model it is the converted config, read from the
    checkpoint's ``config.json`` without loading weights.
    """

    config: ModelConfig
    preset: str | None = None
    pretrained: PretrainedSpec | None = None


@dataclass(frozen=True)
class TaskSpec:
    """One task of the mixture: a user ``name``, the built-in generator ``task`` and its weight;
    ``seq_len`` is the length T of its sequences."""

    name: str
    task: str
    weight: float = 1.0
    kwargs: Mapping[str, Any] = field(default_factory=_empty)
    seq_len: int = 0


MAX_PROBES = 256
"""The most ``probes:`` a spec declares (each held-out set draws its probes from seeds after
its own: ``data.verify_seed`` keeps the two ranges apart)."""
VERIFY_SEED_OFFSET = 1_000_000
"""The default ``data.verify_seed`` is ``data.eval_seed`` plus this."""


@dataclass(frozen=True)
class DataSpec:
    """The training mixture and the two held-out sets: the *enforcement* set
    (``eval_examples`` examples drawn with the seed ``eval_seed``; file-backed tasks: their
    ``eval`` split), which enforcement's multipliers, stop and kept evaluation point read, and
    the *verification* set (``verify_examples`` examples, by default as many or the contract's
    ``Contract.verification_examples`` where that is more, drawn with
    ``verify_seed``; file-backed tasks: their ``verify`` split), read once at the end for the
    reported verdict; ``verify_given``: the spec set ``verify_examples`` itself (else an
    enforced run may draw more, ``headwise.contract.evidence``). Probes are drawn
    from seeds after each set's seed. ``markers``: each task's marker token id
    (``data.task_tokens``), or empty when examples carry no task marker."""

    tasks: tuple[TaskSpec, ...]
    eval_examples: int = 512
    eval_seed: int = 12345
    markers: tuple[int, ...] = ()
    verify_seed: int = 12345 + VERIFY_SEED_OFFSET
    verify_examples: int = 512
    verify_given: bool = False

    @property
    def names(self) -> tuple[str, ...]:
        """Task names in task-id order."""
        return tuple(t.name for t in self.tasks)

    @property
    def weights(self) -> dict[str, float]:
        """Each task's mixture weight (unnormalised), by name."""
        return {t.name: t.weight for t in self.tasks}

    @property
    def seq_len(self) -> int:
        """The longest training sequence (that of a mixed batch, task marker included)."""
        return max(t.seq_len for t in self.tasks) + bool(self.markers)


@dataclass(frozen=True)
class ProbeSpec:
    """A named probe data set for score clauses (``probes:`` in a spec).

    ``kind``: ``task`` (a built-in task ``task`` with ``kwargs``, defaults taken from the
    training task of that name), ``repeated`` (random halves repeated once, ``half_len``) or
    ``random`` (uniform tokens, ``length``). Sequences get the training data's ``BOS`` and the
    task marker of ``as_task``, whose task id they run with (gates). ``seq_len`` is their T.
    """

    name: str
    kind: Literal["task", "repeated", "random"]
    task: str | None
    kwargs: Mapping[str, Any]
    examples: int
    as_task: str
    seq_len: int
    allow_untrained_positions: bool = False


@dataclass(frozen=True)
class MaskSpec:
    """A structural mask by name (``previous_token``, ``local``, ...) with its parameters."""

    name: str
    params: Mapping[str, Any] = field(default_factory=_empty)


@dataclass(frozen=True)
class ObjectiveSpec:
    """A pattern objective: push the heads' attention towards ``target`` with loss ``kind``."""

    target: str
    kind: Literal["ce", "kl", "mse"] = "ce"
    weight: float = 1.0
    params: Mapping[str, Any] = field(default_factory=_empty)


@dataclass(frozen=True)
class EntropySpec:
    """Keep the heads' attention entropy within ``[at_least, at_most]``, normalised to [0, 1]
    (entropy / log(number of allowed keys), the unit of the ``entropy`` role score)."""

    at_least: float | None = None
    at_most: float | None = None
    weight: float = 1.0


@dataclass(frozen=True)
class HeadRule:
    """Everything the spec says about the heads a selector names.

    ``tasks``: the tasks these heads serve (task gates); ``None`` means every task.
    ``freeze``: these heads' weights do not change. ``trainable``: only heads marked trainable
    (and non-attention parameters, unless frozen elsewhere) are trained.
    ``diversity``: weight of a disagreement regulariser among the heads of each selected
    layer (the selector must name whole layers).
    """

    selector: str
    heads: tuple[Head, ...]
    mask: MaskSpec | None = None
    objective: ObjectiveSpec | None = None
    entropy: EntropySpec | None = None
    diversity: float | None = None
    tasks: tuple[str, ...] | None = None
    freeze: bool = False
    trainable: bool = False


@dataclass(frozen=True)
class GateSpec:
    """Task gates: ``fixed`` from ``heads.*.tasks``, or ``learned`` with an L0 penalty."""

    kind: Literal["fixed", "learned"] = "fixed"
    layers: tuple[int, ...] | None = None
    l0_weight: float = 0.01
    temperature: float = 0.5


@dataclass(frozen=True)
class FFNSpec:
    """An L1 penalty on the FFN outputs (``hook_mlp_out``) of ``layers`` (``None``: all)."""

    weight: float
    layers: tuple[int, ...] | None = None


@dataclass(frozen=True)
class AdapterSpec:
    """LoRA adapters on ``targets`` (q, k, v, o, up, down, gate) of some layers or heads."""

    targets: tuple[str, ...]
    rank: int
    alpha: float
    dropout: float = 0.0
    layers: tuple[int, ...] | None = None
    heads: tuple[Head, ...] | None = None


@dataclass(frozen=True)
class Spec:
    """A whole validated spec. ``train`` is a ``headwise.training.TrainConfig``; ``contract``
    is the parsed ``headwise.contract.Contract`` (empty when the spec has none); ``enforce``
    the ``EnforceConfig`` that ``--enforce`` trains with."""

    model: ModelSpec
    data: DataSpec
    train: Any
    contract: Contract
    heads: tuple[HeadRule, ...] = ()
    gates: GateSpec | None = None
    adapters: tuple[AdapterSpec, ...] = ()
    ffn: FFNSpec | None = None
    probes: tuple[ProbeSpec, ...] = ()
    enforce: EnforceConfig = field(default_factory=EnforceConfig)
    text: str = field(default="", repr=False, compare=False)

    @property
    def n_layers(self) -> int:
        """Layers of the model the spec describes."""
        return self.model.config.n_layers

    @property
    def n_heads(self) -> int:
        """Query heads per layer of the model the spec describes."""
        return self.model.config.n_heads

    @property
    def head_levers(self) -> list[str]:
        """The kinds of per-head lever the spec sets (``heads:``, ``gates``, ``adapters``):
        ``gate``, ``learned_gate``, ``mask``, ``objective``, ``entropy``, ``diversity``,
        ``freeze``, ``trainable``, ``adapter``."""
        used = {name for rule in self.heads for name, on in (
            ("gate", rule.tasks is not None), ("mask", rule.mask is not None),
            ("objective", rule.objective is not None), ("entropy", rule.entropy is not None),
            ("diversity", rule.diversity is not None), ("freeze", rule.freeze),
            ("trainable", rule.trainable)) if on}
        if self.gates is not None and self.gates.kind == "learned":
            used.add("learned_gate")
        if self.adapters:
            used.add("adapter")
        return sorted(used)

    @property
    def forecast_context(self) -> dict[str, Any]:
        """What forecasters read against the range of runs they were fit on: the model's
        ``n_layers`` and ``n_heads``, the built-in tasks the run trains and its per-head
        levers (``head_levers``)."""
        return {"n_layers": self.n_layers, "n_heads": self.n_heads,
                "tasks": sorted({t.task for t in self.data.tasks}),
                "levers": self.head_levers}
