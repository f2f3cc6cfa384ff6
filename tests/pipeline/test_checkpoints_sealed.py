"""A finished run's run.json records its checkpoints (each one's manifest digest): commands
that read checkpoints (report, analyze --forecast) refuse one added, renamed, replaced by
another run's, or linked, naming it."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch

from headwise.cli import main
from headwise.training.safetensors_io import sha256_file

SPEC = """
model: {n_layers: 1, n_heads: 2, d_model: 16, vocab_size: 12, max_seq_len: 10}
data: {tasks: {copy: {length: 4}}, eval_examples: 16}
train: {steps: 4, batch_size: 8, eval_every: 2, checkpoint_every: 2}
"""


@pytest.fixture(autouse=True)
def _one_thread() -> None:
    torch.set_num_threads(1)


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    root = tmp_path_factory.mktemp("sealed")
    spec = root / "spec.yaml"
    spec.write_text(SPEC)
    for name, seed in (("a", "0"), ("b", "5")):
        assert main(["train", str(spec), "--out", str(root / name), "--seed", seed, "--quiet",
                     "--no-report"]) in (0, 1)
    return root / "a", root / "b"


def test_run_json_records_every_checkpoint_manifest(runs: tuple[Path, Path]) -> None:
    a, _ = runs
    seals = json.loads((a / "run.json").read_text())["checkpoints"]
    assert seals == {p.name: sha256_file(p / "manifest.json")
                     for p in sorted((a / "checkpoints").iterdir())}
    assert sorted(seals) == ["step_0000002", "step_0000004"]
    assert main(["report", str(a)]) == 0


def _foreign(a: Path, b: Path) -> None:
    shutil.rmtree(a / "checkpoints" / "step_0000002")
    shutil.copytree(b / "checkpoints" / "step_0000002", a / "checkpoints" / "step_0000002")


def _renamed(a: Path, b: Path) -> None:
    shutil.copytree(a / "checkpoints" / "step_0000004", a / "checkpoints" / "step_0000003")


def _linked(a: Path, b: Path) -> None:
    shutil.rmtree(a / "checkpoints")
    (a / "checkpoints").symlink_to(b / "checkpoints", target_is_directory=True)


@pytest.mark.parametrize(("change", "says"), [
    (_foreign, "step_0000002/manifest.json: differs from the digest"),
    (_renamed, "step_0000003: not listed in"),
    (_linked, "checkpoints: is a symbolic link")])
@pytest.mark.parametrize("command", [["report"], ["analyze", "--forecast"]])
def test_a_checkpoint_the_run_did_not_write_is_refused(
        runs: tuple[Path, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str],
        change: object, says: str, command: list[str]) -> None:
    a, b = runs
    copy = tmp_path / "a"
    shutil.copytree(a, copy, symlinks=True)
    change(copy, b)  # type: ignore[operator]
    capsys.readouterr()
    assert main([command[0], str(copy), *command[1:]]) == 2
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert says in line and str(copy) in line
