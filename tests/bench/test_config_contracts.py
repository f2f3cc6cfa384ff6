"""The configurations clause-verdict forecasts are fit and scored on beside the suite
(bench/lab/config_contracts.py): each is the forecast benchmark's configuration, trained the same
way, with a contract that parses."""

from __future__ import annotations

from pathlib import Path

from bench.lab.config_contracts import CONTRACTS, write_specs
from bench.lab.role_runs import CONFIGS
from headwise.runspec import load_spec
from headwise.runspec.yaml_io import parse_yaml


def test_each_configuration_keeps_its_training_and_gets_a_contract(tmp_path: Path) -> None:
    assert set(CONTRACTS) == set(CONFIGS)
    for path in write_specs(tmp_path, seed=3):
        spec = load_spec(path)
        assert len(spec.contract) >= 3
        ours = parse_yaml(path.read_text(), str(path))
        theirs = parse_yaml(CONFIGS[path.stem].replace("SEED", "3"), path.stem)
        every = theirs["train"].pop("checkpoint_every")
        assert ours["train"].pop("eval_every") == every  # an evaluation point per checkpoint
        assert ours["train"] == theirs["train"] and ours["model"] == theirs["model"]
        assert ours["data"] == theirs["data"] and ours.get("heads") == theirs.get("heads")
    # two of them set per-head levers, which the suite's specs never do
    levers = {p.stem: load_spec(p).head_levers for p in sorted(tmp_path.glob("*.yaml"))}
    assert levers == {"bidirectional": [], "gates": ["gate"], "induction": [],
                      "levers": ["mask", "objective"]}
