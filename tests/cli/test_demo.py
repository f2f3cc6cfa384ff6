"""`headwise demo`: the bundled spec and the command's refusals.

The full demo run (its output, its run directory, the subcommands it serves) and the bundled
examples the tutorial trains are tested once, through the tutorial: tests/test_tutorial.py.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from headwise.cli import main
from headwise.cli.demo import demo_spec_path
from headwise.runspec import load_spec


def test_demo_spec_is_bundled_and_uses_every_kind_of_lever() -> None:
    spec = load_spec(demo_spec_path())
    assert len(spec.data.tasks) >= 2
    assert any(r.mask is not None for r in spec.heads)
    assert any(r.objective is not None for r in spec.heads)
    assert spec.gates is not None and any(r.tasks for r in spec.heads)
    assert spec.contract and spec.train.eval_every and spec.train.checkpoint_every


def test_demo_refuses_bad_steps(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["demo", "--steps", "0"]) == 2
    assert "--steps: got 0" in capsys.readouterr().err


def test_demo_never_replaces_another_specs_run(tmp_path: Path,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "spec.yaml").write_text("name: mine\nmodel: {}\n")
    (tmp_path / "model.safetensors").write_bytes(b"precious")
    assert main(["demo", "--out", str(tmp_path)]) == 2
    assert "holds a run of another spec" in capsys.readouterr().err
    assert (tmp_path / "model.safetensors").read_bytes() == b"precious"
