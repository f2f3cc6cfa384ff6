"""Levers at head granularity: masks, pattern objectives, freezing, LoRA and task gates."""

from headwise.control.freeze import FreezeHandle, freeze
from headwise.control.gates import (
    FixedGates,
    GateTable,
    HardConcreteGate,
    HeadGate,
    L0Penalty,
    LearnedGates,
    gate_table,
    remove_gates,
)
from headwise.control.lora import (
    LoRAConfig,
    LoRALinear,
    apply_lora,
    load_lora,
    lora_modules,
    lora_state_dict,
    merge_lora,
    remove_lora,
    save_lora,
    set_lora_disabled,
    unmerge_lora,
)
from headwise.control.masks import (
    MaskHandle,
    MaskSpec,
    apply_masks,
    block_diagonal,
    causal,
    first_token,
    from_graph,
    from_matrix,
    local,
    previous_token,
    remove_masks,
    self_only,
)
from headwise.control.objective import Objective
from headwise.control.objectives import (
    EntropyBound,
    FFNPenalty,
    HeadDiversity,
    PatternObjective,
)

__all__ = [
    "EntropyBound", "FFNPenalty", "FixedGates", "FreezeHandle", "GateTable", "HardConcreteGate",
    "HeadDiversity", "HeadGate", "L0Penalty", "LearnedGates", "LoRAConfig", "LoRALinear",
    "MaskHandle", "MaskSpec", "Objective", "PatternObjective", "apply_lora", "apply_masks",
    "block_diagonal", "causal", "first_token", "freeze", "from_graph", "from_matrix",
    "gate_table", "load_lora", "local", "lora_modules", "lora_state_dict", "merge_lora",
    "previous_token", "remove_gates", "remove_lora", "remove_masks", "save_lora", "self_only",
    "set_lora_disabled", "unmerge_lora",
]
