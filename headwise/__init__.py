"""headwise: train, coordinate and verify the individual heads and layers of Transformers.

The names below are the public API. Each sub-package is also public and holds the rest:
``headwise.control`` (levers), ``headwise.analysis`` (scores, importance, forecasts),
``headwise.contract`` (specialization contracts: parsing, verification, enforcement),
``headwise.data`` (built-in tasks), ``headwise.training`` (the training loop and checkpoints),
``headwise.interop`` (HuggingFace and PEFT), ``headwise.runspec`` and ``headwise.pipeline``
(YAML specs and runs). Training is ``headwise.training.train(...)``.
"""

from headwise import (
    analysis,
    contract,
    control,
    data,
    hooks,
    interop,
    model,
    pipeline,
    runspec,
    training,
)
from headwise.analysis import (
    RoleTable,
    ablation_importance,
    accumulated_resid,
    decompose_resid,
    discover_circuit,
    edge_attribution,
    explain_head,
    gradient_importance,
    logit_attrs,
    path_patch,
    role_scores,
    stack_head_results,
)
from headwise.config import ModelConfig, preset
from headwise.contract import Contract, ContractResult, EnforceConfig, parse_contract, verify
from headwise.control import (
    FixedGates,
    LearnedGates,
    PatternObjective,
    apply_lora,
    apply_masks,
    freeze,
)
from headwise.data import Batch, Mixture, build_task
from headwise.errors import (
    CheckpointError,
    ConfigError,
    HeadwiseError,
    SelectorError,
    SpecError,
)
from headwise.heads import Head, HeadSet, kv_head, select_heads
from headwise.hooks import (
    ActivationCache,
    Hook,
    HookContext,
    HookPoint,
    ablate,
    get_act_name,
    patch,
    run_with_cache,
    scale,
    steer,
)
from headwise.interop import convert, export_peft, import_peft, load_hf
from headwise.model import ByteTokenizer, FactoredMatrix, Transformer, build_model
from headwise.model.generate import generate
from headwise.model.prompts import test_prompt
from headwise.pipeline import compile_spec
from headwise.pipeline.loaded_run import LoadedRun, load_run
from headwise.pipeline.run_export import export_hf
from headwise.runspec import Spec, load_spec
from headwise.training import TrainConfig

__version__ = "0.1.0"

__all__ = [
    # core
    "ModelConfig", "Transformer", "build_model", "preset",
    "Head", "HeadSet", "kv_head", "select_heads",
    "ActivationCache", "Hook", "HookContext", "HookPoint", "run_with_cache",
    "ablate", "patch", "scale", "steer",
    # levers
    "FixedGates", "LearnedGates", "PatternObjective", "apply_lora", "apply_masks", "freeze",
    # verification
    "Contract", "ContractResult", "EnforceConfig", "parse_contract", "RoleTable",
    "ablation_importance", "explain_head", "gradient_importance", "role_scores", "verify",
    # data, training, specs, interop
    "Batch", "Mixture", "build_task", "TrainConfig", "Spec", "load_spec",
    "compile_spec", "convert", "export_peft", "import_peft", "load_hf",
    # errors
    "CheckpointError", "ConfigError", "HeadwiseError", "SelectorError", "SpecError",
    # sub-packages
    "analysis", "contract", "control", "data", "hooks", "interop", "model", "pipeline", "runspec",
    "training",
    # HuggingFace export
    "export_hf",
    # TransformerLens-style analysis
    "FactoredMatrix", "accumulated_resid", "decompose_resid", "logit_attrs", "stack_head_results",
    "ByteTokenizer", "generate", "get_act_name", "test_prompt",
    # finished runs
    "LoadedRun", "load_run",
    # paths and circuits
    "discover_circuit", "edge_attribution", "path_patch",
]
