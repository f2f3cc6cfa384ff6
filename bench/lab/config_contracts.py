"""The forecast benchmark's four configurations (``bench.lab.role_runs.CONFIGS``) with a
contract each, written as a user of that configuration would before training it: runs beside
the contract suite's that clause-verdict forecasts are fit and scored on
(``bench_clause_forecast --fit-configs`` for some seeds, ``--configs`` for fresh ones; left
out one at a time, the held-out configurations of its held-out-spec split).

The contracts were written once, before any of these runs was trained, and are not changed
to make a forecast right or wrong: what they ask is the test.

``write_specs(directory, seed)`` writes ``<name>.yaml`` per configuration: the configuration
as the forecast benchmark trains it, with an evaluation point where it checkpoints
(``eval_every`` = its ``checkpoint_every``) and its contract; ``clause_trajectories --configs``
(``bench/forecasting/``) trains them plain and under ``--enforce``.
"""

from __future__ import annotations

from pathlib import Path

from bench.lab.role_runs import CONFIGS

CONTRACTS: dict[str, str] = {
    # 2 layers x 4 heads, attention only, d_model 64, random periods 4-12, 1200 steps.
    "induction": """
contract:
  - {name: "a previous-token head in L0", any_of: L0.*, score: previous_token, at_least: 0.8}
  - {name: "an induction head in L1", any_of: L1.*, score: induction, at_least: 0.6}
  - {name: "no BOS sink in L1", all_of: L1.*, score: first_token, at_most: 0.3}
  - {name: "induction accuracy", task: induction, metric: accuracy, at_least: 0.8}
""",
    # copy and reverse with task gates on four heads.
    "gates": """
contract:
  - {name: "copy works", task: copy, metric: accuracy, at_least: 0.95}
  - {name: "reverse works", task: reverse, metric: accuracy, at_least: 0.9}
  - {name: "L0.H3 carries reverse", ablate: L0.H3, task: reverse, metric: accuracy,
     drop_at_least: 0.2}
  - {name: "copy does not need L1.H2", ablate: L1.H2, task: copy, metric: accuracy,
     drop_at_most: 0.02}
""",
    # sort with a previous-token mask on L0.H0 and pattern objectives on L0.H1 and L1.H0.
    "levers": """
contract:
  - {name: "sort works", task: sort, metric: accuracy, at_least: 0.9}
  - {name: "L0.H1 sinks on the first token", head: L0.H1, score: first_token, at_least: 0.9}
  - {name: "L1.H0 attends to itself", head: L1.H0, score: self, at_least: 0.7}
  - {name: "sort does not need L0.H0", ablate: L0.H0, task: sort, metric: accuracy,
     drop_at_most: 0.05}
""",
    # a bidirectional model predicting bracket depth.
    "bidirectional": """
contract:
  - {name: "depth predicted", task: bracket_depth, metric: accuracy, at_least: 0.9}
  - {name: "a counting head in L0", any_of: L0.*, score: entropy, at_least: 0.9}
  - {name: "a focused head in L1", any_of: L1.*, score: entropy, at_most: 0.5}
""",
}


def spec_text(name: str, seed: int) -> str:
    """Configuration ``name`` at training seed ``seed`` with its contract, as YAML."""
    body = CONFIGS[name].replace("SEED", str(seed)).replace("checkpoint_every", "eval_every")
    return f"name: {name}\n{body}{CONTRACTS[name]}"


def write_specs(directory: Path, seed: int = 0) -> list[Path]:
    """Write every configuration's spec into ``directory``; their paths."""
    directory.mkdir(parents=True, exist_ok=True)
    paths = []
    for name in CONTRACTS:
        path = directory / f"{name}.yaml"
        path.write_text(spec_text(name, seed))
        paths.append(path)
    return paths
