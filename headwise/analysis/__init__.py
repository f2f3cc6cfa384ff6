"""Analysis: role scores, importance, activation and path patching, circuits, trajectories.

See docs/roles.md (score definitions and sources). Contracts live in ``headwise.contract``,
reports in ``headwise.report``, role forecasts in ``headwise.forecast``.
"""

from headwise.analysis.circuit import (
    Circuit,
    EdgeDrop,
    Faithfulness,
    circuit_edges,
    discover_circuit,
    edge_drop,
    faithfulness,
)
from headwise.analysis.decompose import accumulated_resid, decompose_resid, stack_head_results
from headwise.analysis.edges import Agreement, EdgeScores, agreement, edge_attribution
from headwise.analysis.explain import Step, Walkthrough, explain_head
from headwise.analysis.importance import (
    ablation_importance,
    example_stats,
    gradient_importance,
    task_metrics,
)
from headwise.analysis.importance_matrix import ImportanceMatrix
from headwise.analysis.logit_attrs import (
    apply_ln_to_stack,
    logit_attrs,
    tokens_to_residual_directions,
)
from headwise.analysis.ov import copying_eigen_ratio, ov_logits, ov_top1
from headwise.analysis.patching import PatchingResult, activation_patching
from headwise.analysis.paths import PathPatcher, PathPatchResult, exact_effects, path_patch
from headwise.analysis.probe_inputs import (
    induction_probe,
    infer_period,
    periodic_probe,
    probe_info,
    random_tokens,
)
from headwise.analysis.role_table import TOP_ROLE_CANDIDATES, RoleTable
from headwise.analysis.roles import (
    PATTERN_ROLES,
    ROLES,
    role_scores,
    role_sums,
    scores_from_patterns,
    target_similarity,
)
from headwise.analysis.trajectories import Trajectory, score_checkpoints
from headwise.hooks.graph import Edge, Node, all_edges, parse_edge

__all__ = [
    "PATTERN_ROLES", "ROLES", "TOP_ROLE_CANDIDATES", "ImportanceMatrix",
    "PatchingResult",
    "RoleTable", "Step", "Trajectory", "Walkthrough", "ablation_importance",
    "activation_patching", "copying_eigen_ratio", "example_stats",
    "explain_head",
    "gradient_importance", "induction_probe", "infer_period",
    "ov_logits", "ov_top1", "periodic_probe", "probe_info", "random_tokens",
    "role_scores", "role_sums", "score_checkpoints", "scores_from_patterns",
    "target_similarity", "task_metrics",
    # TransformerLens-style residual decomposition and direct logit attribution
    "accumulated_resid", "apply_ln_to_stack", "decompose_resid", "logit_attrs",
    "stack_head_results", "tokens_to_residual_directions",
    # paths and circuits
    "Agreement", "Circuit", "Edge", "EdgeDrop", "EdgeScores", "Faithfulness", "Node",
    "PathPatchResult", "PathPatcher", "agreement", "all_edges", "circuit_edges", "discover_circuit",
    "edge_attribution", "edge_drop", "exact_effects", "faithfulness", "parse_edge", "path_patch",
]
