"""Compiling a validated spec into a model with its levers, the data, and the contract.

``compile_spec(spec)`` builds (or loads) the model, then installs, in this order: LoRA adapters,
structural masks, task gates, a masked-LM head where an ``mlm`` task needs one, pattern
objectives and regularisers, what the contract's clauses need prepared (``Contract.prepare``:
the starting model a ``preserve`` clause compares with, before a run's trained weights load),
and freezing. The result holds everything ``train()`` and ``verify()`` need, and the run's
structure that planning reads (``Compiled.structure``, with each task's circuit: declared by
its generator or proposed from its training examples, ``Compiled.proposals``); the levers are
the same objects the Python API offers (``headwise.control``), so anything a spec does, code
can do.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any

import torch
from torch import nn

from headwise.contract import RunStructure
from headwise.control import masks as mask_lib
from headwise.control.freeze import FreezeHandle, freeze
from headwise.control.gates import FixedGates, LearnedGates
from headwise.control.lora import apply_lora
from headwise.control.objective import Objective
from headwise.control.objectives import (
    EntropyBound,
    FFNPenalty,
    HeadDiversity,
    PatternObjective,
)
from headwise.data import IGNORE, TASKS, Batch, Mixture, build_task
from headwise.data.circuit_proposals import CircuitShare, propose, rank_circuits
from headwise.data.mlm import add_mlm_head
from headwise.errors import HeadwiseError, SpecError
from headwise.heads import Head, HeadSet
from headwise.model import build_model
from headwise.runspec import MaskSpec, Spec
from headwise.training.safetensors_io import load_weights

# Training examples per task that circuits are measured on (never the held-out sets).
PROPOSAL_EXAMPLES = 256

# Spec mask names -> constructors in headwise.control.masks (a fixed table, never an import).
MASK_BUILDERS: dict[str, Callable[..., mask_lib.MaskSpec]] = {
    "causal": lambda: mask_lib.causal(),
    "previous_token": lambda: mask_lib.previous_token(),
    "self_only": lambda: mask_lib.self_only(),
    "first_token": lambda: mask_lib.first_token(),
    "local": lambda window: mask_lib.local(window),
    "block_diagonal": lambda segments: mask_lib.block_diagonal(
        segments if isinstance(segments, int) else list(segments)),
    "from_graph": lambda edges, n=None: mask_lib.from_graph(edges, n),
    "from_matrix": lambda matrix: mask_lib.from_matrix(torch.tensor(matrix, dtype=torch.bool)),
}


@dataclass
class Compiled:
    """A spec turned into objects.

    Attributes:
        spec: the spec.
        model: the model with every lever installed.
        data: the training mixture (task ids in ``spec.data.names`` order).
        eval_data: the mixture the enforcement set is drawn from (file-backed tasks: their
            ``eval`` split).
        eval_batch: the enforcement set's batch: what multipliers, the stop and the kept
            evaluation point read (the verification set is drawn apart, at the end:
            ``headwise.pipeline.heldout.verification_data``).
        objectives: loss terms for ``train()`` (pattern objectives, entropy, diversity, L0),
            each with a unique ``name`` (``pattern[L0.H1]``): checkpoints store weights by name.
        optimizer_hooks: callables ``fn(optimizer)`` for ``train()`` (freezing).
        freeze_handle: the freezing handle, if any.
        gates: the installed gates, if any.
    """

    spec: Spec
    model: nn.Module
    data: Mixture
    eval_data: Mixture
    eval_batch: Batch
    objectives: list[Objective] = field(default_factory=list)
    optimizer_hooks: list[Callable[[torch.optim.Optimizer], Any]] = field(default_factory=list)
    freeze_handle: FreezeHandle | None = None
    gates: FixedGates | LearnedGates | None = None

    @property
    def task_names(self) -> tuple[str, ...]:
        """Task names in task-id order."""
        return self.spec.data.names

    @property
    def structure(self) -> RunStructure:
        """What planning reads of this run besides its model: task names, structural masks,
        the heads fixed gates switch off per task, and each task's circuit (declared by its
        generator, else proposed from its training examples: ``proposals``)."""
        spec, names = self.spec, self.task_names
        masks = {h: r.mask.name for r in spec.heads if r.mask is not None for h in r.heads}
        gated_off: dict[str, frozenset[Head]] = {}
        assignment = getattr(self.gates, "assignment", None)
        if self.gates is not None and assignment is not None:  # fixed gates only
            n_heads = spec.contract.n_heads
            for task_id, name in enumerate(names):
                on = set(assignment.get(task_id, ()))
                gated_off[name] = frozenset(Head(l, h) for l in self.gates.gates
                                            for h in range(n_heads) if Head(l, h) not in on)
        circuits = {name: task.circuit for name, task in self.data.tasks.items()
                    if task.circuit}
        for name, proposal in self.proposals.items():
            if proposal is not None:
                circuits[name] = proposal.roles
        return RunStructure(names, masks, gated_off, circuits)

    @cached_property
    def circuit_shares(self) -> dict[str, list[CircuitShare]]:
        """Per task whose generator declares no circuit, every known circuit's share of its
        scored targets on ``PROPOSAL_EXAMPLES`` training examples, best first
        (``headwise.data.circuit_proposals``); measured once, on first use."""
        gen = torch.Generator().manual_seed(self.spec.train.seed)
        out = {}
        for name, task in self.data.tasks.items():
            if task.circuit:
                continue
            markers = self.data.markers
            one = Mixture({name: task}, None, None if markers is None else {name: markers[name]})
            sample = one.sample(PROPOSAL_EXAMPLES, gen)
            if bool((sample.targets != IGNORE).any()):
                out[name] = rank_circuits(sample)
        return out

    @property
    def proposals(self) -> dict[str, CircuitShare | None]:
        """Per task in ``circuit_shares``, the circuit proposed for its assists: the best that
        explains a clear majority of its targets and whose layers the model has, else
        ``None`` (``headwise.data.circuit_proposals.propose``)."""
        n_layers = self.spec.n_layers
        return {name: propose(ranked, n_layers) for name, ranked in self.circuit_shares.items()}


def compile_spec(spec: Spec, weights: str | Path | None = None) -> Compiled:
    """Build the model, levers, data and held-out batch a spec describes.

    Args:
        spec: a validated spec.
        weights: a ``model.safetensors`` written by a run of this spec, loaded after every lever
            is installed (so adapter and gate parameters load too).

    Raises:
        SpecError: a lever the spec asks for cannot be installed on this model.
        CheckpointError: ``weights`` do not match the spec's model.
    """
    model = _model(spec)
    try:
        if spec.adapters:
            a = spec.adapters[0]
            apply_lora(model, targets=[f"{t}_proj" for t in a.targets], layers=a.layers,
                       heads=_set(spec, a.heads) if a.heads else None, rank=a.rank,
                       alpha=a.alpha, dropout=a.dropout)
        _masks(spec, model)
        gates, gate_objectives = _gates(spec, model)
        # A masked-LM task on a model without the head gets a fresh one, after the adapters
        # (so it trains, as PEFT's modules_to_save) and before the run's weights load.
        add_mlm_head(model, [TASKS[t.task] for t in spec.data.tasks], seed=spec.train.seed)
    except (ValueError, HeadwiseError) as e:  # a lever that does not fit a pretrained model
        raise SpecError(f"heads: cannot install the levers on this model: {e}") from None
    data, eval_data = _data(spec)
    gen = torch.Generator().manual_seed(spec.data.eval_seed)
    eval_batch = eval_data.sample(spec.data.eval_examples, gen, held_out=True)
    out = Compiled(spec, model, data, eval_data, eval_batch, gates=gates)
    out.objectives.extend(gate_objectives)
    _objectives(spec, out)
    if spec.ffn is not None:
        out.objectives.append(FFNPenalty(model, spec.ffn.layers, kind="l1",
                                         weight=spec.ffn.weight))
    spec.contract.prepare(model)  # e.g. the starting model, before any trained weights load
    if weights is not None:
        load_weights(model, Path(weights))
    out.freeze_handle = _freeze(spec, model)
    if out.freeze_handle is not None:
        out.optimizer_hooks.append(out.freeze_handle.attach)
    return out


def _set(spec: Spec, heads: tuple[Head, ...]) -> HeadSet:
    return HeadSet(heads, spec.n_layers, spec.n_heads)


def _model(spec: Spec) -> nn.Module:
    if spec.model.pretrained is not None:
        from headwise.interop import load_hf

        model = load_hf(spec.model.pretrained.path)
        model.train()
        return model
    return build_model(spec.model.config, seed=spec.train.seed)


def _mask(m: MaskSpec) -> mask_lib.MaskSpec:
    return MASK_BUILDERS[m.name](**dict(m.params))


def _masks(spec: Spec, model: nn.Module) -> None:
    table = {_set(spec, r.heads): _mask(r.mask) for r in spec.heads if r.mask is not None}
    if table:
        mask_lib.apply_masks(model, table)


def _gates(spec: Spec, model: nn.Module) -> tuple[FixedGates | LearnedGates | None, list[Any]]:
    """Fixed gates: a head serves the tasks its rule lists, or every task if it lists none."""
    if spec.gates is None:
        return None, []
    names = spec.data.names
    if spec.gates.kind == "learned":
        gates = LearnedGates(model, len(names), layers=spec.gates.layers)
        return gates, [gates.l0_penalty(spec.gates.l0_weight)]
    only: dict[Head, tuple[str, ...]] = {}
    for rule in spec.heads:
        if rule.tasks is not None:
            only.update(dict.fromkeys(rule.heads, rule.tasks))
    layers = spec.gates.layers or tuple(sorted({h.layer for h in only}))
    in_layers = [Head(l, h) for l in layers for h in range(spec.n_heads)]
    assignment = {t: _set(spec, tuple(h for h in in_layers if t in only.get(h, names)))
                  for t in names}
    return FixedGates(model, assignment, task_names=list(names)), []


def _objectives(spec: Spec, out: Compiled) -> None:
    model = out.model
    for rule in spec.heads:
        heads = _set(spec, rule.heads)
        if rule.objective is not None:
            o = rule.objective
            obj = PatternObjective(model, heads, o.target, kind=o.kind, weight=o.weight,
                                   **dict(o.params))
            obj.name = f"pattern[{rule.selector}]"
            out.objectives.append(obj)
        if rule.entropy is not None:
            e = rule.entropy
            bound = EntropyBound(model, heads, min=e.at_least, max=e.at_most, weight=e.weight)
            bound.name = f"entropy[{rule.selector}]"
            out.objectives.append(bound)
        if rule.diversity is not None:
            for layer in heads.layers:
                div = HeadDiversity(model, layer, weight=rule.diversity)
                where = f"@L{layer}" if len(heads.layers) > 1 else ""
                div.name = f"diversity[{rule.selector}{where}]"
                out.objectives.append(div)


def _freeze(spec: Spec, model: nn.Module) -> FreezeHandle | None:
    """``trainable`` heads: only they train. ``freeze`` heads: everything else trains."""
    trainable = [h for r in spec.heads if r.trainable for h in r.heads]
    frozen = [h for r in spec.heads if r.freeze for h in r.heads]
    if trainable:
        return freeze(model, _set(spec, tuple(trainable)))
    if not frozen:
        return None
    frozen_set = _set(spec, tuple(frozen))
    others = HeadSet.all(spec.n_layers, spec.n_heads) - frozen_set
    projections = {f"blocks.{l}.attn.{p}_proj.{w}" for l in frozen_set.layers
                   for p in ("q", "k", "v", "o") for w in ("weight", "bias")}
    names = [n for n, _ in model.named_parameters(remove_duplicate=False)
             if n not in projections or n.endswith("o_proj.bias")]
    return freeze(model, [*(others if len(others) else []), *names])


def _data(spec: Spec) -> tuple[Mixture, Mixture]:
    """The training mixture and the enforcement set's mixture."""
    return held_out_mixture(spec, "train"), held_out_mixture(spec, "eval")


def held_out_mixture(spec: Spec, split: str) -> Mixture:
    """The spec's mixture on one split of its file-backed tasks (``"train"``, ``"eval"``: the
    enforcement set, ``"verify"``: the verification set; ``headwise.data.Task.splits``);
    generated tasks are the same on every split (their sets differ by seed)."""
    tasks = {}
    for t in spec.data.tasks:
        kwargs = dict(t.kwargs)
        if TASKS[t.task].splits:
            kwargs["split"] = split
        try:
            tasks[t.name] = build_task(t.task, kwargs, f"data.tasks.{t.name}")
        except HeadwiseError as e:
            raise SpecError(str(e)) from None
    weights = spec.data.weights
    markers = (dict(zip(spec.data.names, spec.data.markers, strict=True))
               if spec.data.markers else None)
    return Mixture(tasks, weights, markers)
