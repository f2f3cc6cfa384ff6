"""Task gates: a task id per example selects which heads contribute in each layer.

A gate sits in ``model.blocks[l].attn.head_gate`` and multiplies each head's output ``z``
(after ``hook_z``, before ``o_proj``) by a per-(task, head) value:
``z[b, :, h, :] *= g[task_ids[b], h]``.

- ``FixedGates(model, {task: heads})``: ``g`` is 1 for the heads assigned to the task in that
  layer and exactly 0 for the others; layers no task mentions get no gate (pass-through), and
  task ids with no entry pass through everywhere.
- ``LearnedGates(model, n_tasks)``: hard-concrete gates (Louizos et al. 2018), as Voita et al.
  (2019) used for heads, with ``l0_penalty()`` as an Objective.

``gate_table(model, task_names)`` reads the (task x head) values back as a printable table.
With ``task_ids=None`` a one-task gate uses task 0; a gate over several tasks raises.
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn

from headwise.control._common import as_headset, attention, model_shape
from headwise.control.objective import Objective
from headwise.heads import Head, HeadSet
from headwise.model.hook_point import Hook, tree_changed


class HeadGate(nn.Module, ABC):
    """Base class: ``gate(z (B, T, H, Dh), task_ids (B,) | None) -> z`` scaled per head."""

    n_tasks: int

    @abstractmethod
    def values(self) -> Tensor:
        """Deterministic (n_tasks, H) gate values (what evaluation uses)."""

    def sample(self, task_ids: Tensor) -> Tensor:
        """(B, H) gate values for these examples (stochastic for learned gates in training).

        Selected with ``index_select``, which refuses an id outside ``[0, n_tasks)`` (indexing
        would read -1 as the last task)."""
        return self.values().index_select(0, task_ids.long())

    def forward(self, z: Tensor, task_ids: Tensor | None) -> Tensor:
        if task_ids is None:
            if self.n_tasks > 1:
                raise ValueError(f"task_ids: a head gate over {self.n_tasks} tasks needs "
                                 "task_ids (B,) in the forward call")
            task_ids = torch.zeros(z.shape[0], dtype=torch.long, device=z.device)
        # The id range is checked where data enters (``check_tokens(..., n_tasks=...)``,
        # ``run_with_cache``, the forward for ids on the host), not here: reading ids on an
        # accelerator would sync every step; ``sample`` never wraps one that slips through.
        g = self.sample(task_ids).to(z.dtype)  # (B, H)
        return z * g[:, None, :, None]


class FixedHeadGate(HeadGate):
    """One layer's fixed 0/1 gates, a buffer ``gates`` (n_tasks, H)."""

    def __init__(self, gates: Tensor) -> None:
        super().__init__()
        self.register_buffer("gates", gates.float())
        self.n_tasks = gates.shape[0]

    def values(self) -> Tensor:
        return self.gates  # type: ignore[return-value]


class HardConcreteGate(HeadGate):
    """One layer's hard-concrete gates with parameters ``log_alpha`` (n_tasks, H).

    Training (Louizos et al. 2018, eq. 10): ``u ~ U(0, 1)``,
    ``s = sigmoid((log u - log(1 - u) + log_alpha) / beta)``,
    ``g = min(1, max(0, s (zeta - gamma) + gamma))``, one sample per (example, head).
    Evaluation: ``g = min(1, max(0, sigmoid(log_alpha) (zeta - gamma) + gamma))``.
    ``P(g != 0) = sigmoid(log_alpha - beta log(-gamma / zeta))`` is the expected L0 norm.
    """

    def __init__(self, n_tasks: int, n_heads: int, init: float = 2.0, beta: float = 2 / 3,
                 gamma: float = -0.1, zeta: float = 1.1) -> None:
        super().__init__()
        self.n_tasks = n_tasks
        self.beta, self.gamma, self.zeta = beta, gamma, zeta
        self.log_alpha = nn.Parameter(torch.full((n_tasks, n_heads), float(init)))

    def _stretch(self, s: Tensor) -> Tensor:
        return (s * (self.zeta - self.gamma) + self.gamma).clamp(0.0, 1.0)

    def values(self) -> Tensor:
        return self._stretch(torch.sigmoid(self.log_alpha))

    def sample(self, task_ids: Tensor) -> Tensor:
        la = self.log_alpha.index_select(0, task_ids.long())  # (B, H)
        if not self.training:
            return self._stretch(torch.sigmoid(la))
        u = torch.rand_like(la).clamp(1e-6, 1 - 1e-6)
        return self._stretch(torch.sigmoid((torch.log(u) - torch.log1p(-u) + la) / self.beta))

    def open_probability(self) -> Tensor:
        """(n_tasks, H) ``P(g != 0)``, differentiable (the L0 penalty's terms)."""
        return torch.sigmoid(self.log_alpha - self.beta * math.log(-self.gamma / self.zeta))


class _Installed:
    """Per-layer gates installed in a model; ``remove()`` restores the previous slots."""

    def __init__(self, model: nn.Module, gates: dict[int, HeadGate]) -> None:
        self.model = model
        self.gates = gates
        self._previous = {}
        for layer, gate in gates.items():
            attn = attention(model, layer)
            self._previous[layer] = attn.head_gate
            attn.head_gate = gate
        tree_changed(model)

    def remove(self) -> None:
        for layer, old in self._previous.items():
            attention(self.model, layer).head_gate = old
        self._previous = {}
        tree_changed(self.model)


def _device(model: nn.Module) -> torch.device:
    """Where the model's parameters live (new gates are created there)."""
    return next(model.parameters()).device


def _task_index(task: Any, task_names: Sequence[str] | None) -> int:
    if isinstance(task, str):
        if task_names is None or task not in task_names:
            raise ValueError(f"assignment: task {task!r} is not among task_names "
                             f"{list(task_names or [])}; pass task_names to use task names")
        return list(task_names).index(task)
    if isinstance(task, bool) or not isinstance(task, int) or task < 0:
        raise ValueError(f"assignment: task got {task!r}, expected a task id >= 0 or a name")
    return task


class FixedGates(_Installed):
    """Install fixed gates from ``{task id or name: heads}``.

    Args:
        model: a headwise Transformer.
        assignment: task id (or name in ``task_names``) -> selector / ``HeadSet`` of the heads
            that serve it.
        task_names: names of tasks 0..n-1 (needed for name keys; fixes ``n_tasks``).

    Raises:
        ValueError: an unknown task name or a negative id.  SelectorError: a bad selector.
    """

    def __init__(self, model: nn.Module, assignment: Mapping[Any, Any],
                 task_names: Sequence[str] | None = None) -> None:
        n_layers, n_heads, _, _ = model_shape(model)
        sets = {_task_index(t, task_names): as_headset(model, hs, f"assignment[{t!r}]")
                for t, hs in assignment.items()}
        n_tasks = max([len(task_names or [])] + [t + 1 for t in sets])
        layers = sorted({l for hs in sets.values() for l in hs.layers})
        gates: dict[int, HeadGate] = {}
        for l in layers:
            g = torch.ones(n_tasks, n_heads)
            for t, hs in sets.items():
                g[t] = 0.0
                g[t, list(hs.in_layer(l))] = 1.0
            gates[l] = FixedHeadGate(g.to(_device(model)))
        self.assignment = sets
        super().__init__(model, gates)


class LearnedGates(_Installed):
    """Install hard-concrete gates on ``layers`` (default all) for ``n_tasks`` tasks.

    Raises:
        ValueError: ``n_tasks`` < 1 or a layer out of range.
    """

    def __init__(self, model: nn.Module, n_tasks: int, layers: Sequence[int] | None = None,
                 init: float = 2.0) -> None:
        n_layers, n_heads, _, _ = model_shape(model)
        if isinstance(n_tasks, bool) or not isinstance(n_tasks, int) or n_tasks < 1:
            raise ValueError(f"n_tasks: got {n_tasks!r}, expected an integer >= 1")
        chosen = list(range(n_layers)) if layers is None else list(layers)
        for l in chosen:
            if isinstance(l, bool) or not isinstance(l, int) or not 0 <= l < n_layers:
                raise ValueError(f"layers: got {l!r}, expected 0-{n_layers - 1}")
        super().__init__(model, {l: HardConcreteGate(n_tasks, n_heads, init).to(_device(model))
                                 for l in chosen})
        self.n_tasks = n_tasks

    def parameters(self) -> list[nn.Parameter]:
        """The gates' ``log_alpha`` parameters (also reachable through ``model.parameters()``)."""
        return [g.log_alpha for g in self.gates.values()]  # type: ignore[misc]

    def l0_penalty(self, weight: float = 1.0) -> L0Penalty:
        """The expected number of open gates as an Objective (see ``L0Penalty``)."""
        return L0Penalty(self, weight)


class L0Penalty(Objective):
    """``weight * sum_{layer, task, head} P(g != 0)`` (Louizos et al. 2018, eq. 12).

    Logged: ``l0/t{task}/L{l}.H{h}`` = that gate's open probability.
    """

    def __init__(self, gates: LearnedGates, weight: float = 1.0) -> None:
        self.name = "l0"
        self.weight = float(weight)
        self.gates = gates
        self._log_names: list[str] | None = None

    def hooks(self) -> list[Hook]:
        return []

    def loss(self, tokens: Tensor, attention_mask: Tensor | None = None
             ) -> tuple[Tensor, dict[str, Tensor]]:
        # One vector of open probabilities (layers x tasks x heads) and names fixed once, so
        # the per-step work does not grow with heads or tasks.
        p = torch.stack([gate.open_probability()  # type: ignore[operator]
                         for gate in self.gates.gates.values()])  # (L, n_tasks, H)
        if self._log_names is None:
            self._log_names = [f"{self.name}/t{t}/L{l}.H{h}" for l in self.gates.gates
                               for t in range(p.shape[1]) for h in range(p.shape[2])]
        logs = dict(zip(self._log_names, p.detach().flatten().unbind(), strict=True))
        return self.weight * p.sum(), logs


@dataclass
class GateTable:
    """Gate values of every head per task: ``values`` (n_tasks, n_layers * H)."""

    task_names: list[str]
    heads: list[Head]
    values: Tensor
    n_layers: int
    n_heads: int

    def active(self, threshold: float = 0.5) -> dict[str, HeadSet]:
        """Per task, the heads whose gate value exceeds ``threshold``."""
        return {name: HeadSet([h for h, v in zip(self.heads, row.tolist(), strict=True)
                               if v > threshold], self.n_layers, self.n_heads)
                for name, row in zip(self.task_names, self.values, strict=True)}

    def __str__(self) -> str:
        width = max(len(n) for n in self.task_names)
        lines = []
        for l in range(self.n_layers):
            cols = range(l * self.n_heads, (l + 1) * self.n_heads)
            lines.append(" " * width + "  " + " ".join(f"{str(self.heads[c]):>6}" for c in cols))
            for name, row in zip(self.task_names, self.values, strict=True):
                lines.append(f"{name:<{width}}  " + " ".join(f"{float(row[c]):6.2f}"
                                                             for c in cols))
        return "\n".join(lines)


def gate_table(model: nn.Module, task_names: Sequence[str] | None = None) -> GateTable:
    """Read every layer's deterministic gate values (1.0 where a layer has no gate).

    Raises:
        ValueError: ``task_names`` shorter than the gates' number of tasks.
    """
    n_layers, n_heads, _, _ = model_shape(model)
    gates = {l: attention(model, l).head_gate for l in range(n_layers)}
    gates = {l: g for l, g in gates.items() if isinstance(g, HeadGate)}
    n_tasks = max([g.n_tasks for g in gates.values()] + [len(task_names or [])] + [1])
    names = list(task_names) if task_names is not None else [f"task{t}" for t in range(n_tasks)]
    if len(names) < n_tasks:
        raise ValueError(f"task_names: got {len(names)} names, the gates have {n_tasks} tasks")
    values = torch.ones(len(names), n_layers * n_heads)
    with torch.no_grad():
        for l, g in gates.items():
            values[: g.n_tasks, l * n_heads:(l + 1) * n_heads] = g.values().float().cpu()
    heads = [Head(l, h) for l in range(n_layers) for h in range(n_heads)]
    return GateTable(names, heads, values, n_layers, n_heads)


def remove_gates(model: nn.Module) -> None:
    """Clear every ``head_gate`` slot holding a ``HeadGate``."""
    n_layers, _, _, _ = model_shape(model)
    for l in range(n_layers):
        if isinstance(attention(model, l).head_gate, HeadGate):
            attention(model, l).head_gate = None
    tree_changed(model)
