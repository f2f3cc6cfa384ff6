"""``--seed`` / ``--set`` on ``demo`` (``train``'s are in tests/lifecycle/test_same_run.py), and
the override grammar against the mapping it must produce."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from headwise.cli import main
from headwise.errors import SpecError
from headwise.runspec.overrides import apply_overrides, overrides_of


def test_key_paths_walk_mappings_dotted_keys_and_lists() -> None:
    data = {"train": {"lr": 1e-3}, "heads": {"L0.H1": {"mask": "self_only"}},
            "contract": [{"at_least": 0.5}, {"at_most": 0.1}], "probes": None}
    apply_overrides(data, ["train.lr=3e-4", "heads.L0.H1.mask=local", "contract.1.at_most=0.2",
                           "train.log=[jsonl, tensorboard]", "gates.new=on",
                           "probes.p.examples=8"])
    assert data == {"train": {"lr": 3e-4, "log": ["jsonl", "tensorboard"]},
                    "heads": {"L0.H1": {"mask": "local"}},
                    "contract": [{"at_least": 0.5}, {"at_most": 0.2}],
                    "probes": {"p": {"examples": 8}}, "gates": {"new": "on"}}
    assert overrides_of(["a=1"], 7) == ("a=1", "train.seed=7")
    for bad, message in ((["contract.2.x=1"], "--set contract.2.x: contract is a list of 2"),
                         (["train.lr.x=1"], "--set train.lr.x: train.lr is 0.0003"),
                         (["=1"], "--set: got '=1'"), (["train.lr=[1"], "not valid YAML")):
        with pytest.raises(SpecError, match=message.replace("[", r"\[")):
            apply_overrides(data, bad)


def test_demo_takes_seed_and_set(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    run = tmp_path / "demo"
    code = main(["demo", "--out", str(run), "--steps", "3", "--seed", "9", "--set",
                 "train.lr=0.002", "--quiet"])
    assert code in (0, 1), capsys.readouterr().err
    saved = yaml.safe_load((run / "spec.yaml").read_text())
    assert saved["name"] == "demo" and saved["train"]["seed"] == 9
    assert saved["train"]["lr"] == 0.002 and saved["train"]["steps"] == 3
    assert json.loads((run / "run.json").read_text())["set"] == ["train.lr=0.002",
                                                                 "train.seed=9"]
    assert main(["demo", "--out", str(run), "--steps", "3", "--set", "train.lr=-1"]) == 2
    assert "error: train.lr: got -1" in capsys.readouterr().err
