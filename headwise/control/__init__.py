"""Levers at head granularity: masks, pattern objectives, freezing, LoRA and task gates."""

from headwise.control.base_reference import BaseReference, base_of, capture_base
from headwise.control.distill import Distill, PatternDistill
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
    lora_disabled,
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
    "BaseReference", "Distill", "EntropyBound", "FFNPenalty", "FixedGates", "FreezeHandle",
    "GateTable", "HardConcreteGate", "HeadDiversity", "HeadGate", "L0Penalty", "LearnedGates",
    "LoRAConfig", "LoRALinear", "MaskHandle", "MaskSpec", "Objective", "PatternDistill",
    "PatternObjective", "apply_lora", "apply_masks", "base_of", "block_diagonal", "capture_base",
    "causal", "first_token", "freeze", "from_graph", "from_matrix", "gate_table", "load_lora",
    "local", "lora_disabled", "lora_modules", "lora_state_dict", "merge_lora",
    "previous_token", "remove_gates", "remove_lora", "remove_masks", "save_lora", "self_only",
    "set_lora_disabled", "unmerge_lora",
]
