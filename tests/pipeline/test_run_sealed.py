"""A finished run is read only as it was sealed. Its manifest seals spec.yaml and run.json,
and run.json records each checkpoint's manifest digest. --resume reads only the run's own
record: the sealed files, the spec and flags its checkpoints trained with, checkpoints that are
not links. The commands that read checkpoints (report, analyze --forecast) refuse one that was
added, renamed, replaced by another run's or linked, naming it."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from headwise.cli import main
from headwise.training.safetensors_io import sha256_file

SPEC = """
model: {n_layers: 1, n_heads: 2, d_model: 16, vocab_size: 12, max_seq_len: 10}
data: {tasks: {copy: {length: 4}}, eval_examples: 16}
train: {steps: 4, batch_size: 8, eval_every: 2, checkpoint_every: 2}
"""


def _train(spec: Path, out: Path, seed: str) -> Path:
    assert main(["train", str(spec), "--out", str(out), "--seed", seed, "--quiet",
                 "--no-report"]) in (0, 1)
    return out


@pytest.fixture(scope="module")
def finished(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """The spec and a finished run of it (checkpoints at steps 2 and 4)."""
    root = tmp_path_factory.mktemp("sealed")
    spec = root / "spec.yaml"
    spec.write_text(SPEC)
    return spec, _train(spec, root / "run", "0")


@pytest.fixture(scope="module")
def other(finished: tuple[Path, Path]) -> Path:
    """Another run of the same spec (another seed): its checkpoints are not the first's."""
    spec, run = finished
    return _train(spec, run.parent / "other", "5")


def _refused(spec: Path, run: Path, capsys: pytest.CaptureFixture[str]) -> str:
    before = {p.relative_to(run): p.stat().st_mtime_ns for p in run.rglob("*")}
    assert main(["train", str(spec), "--out", str(run), "--resume", "--steps", "6",
                 "--quiet", "--no-report"]) == 2
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert {p.relative_to(run): p.stat().st_mtime_ns for p in run.rglob("*")} == before
    return line


def test_an_edited_spec_of_a_finished_run_is_refused(
        finished: tuple[Path, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    spec, run = finished
    copy = tmp_path / "run"
    shutil.copytree(run, copy, symlinks=True)
    edited = (copy / "spec.yaml").read_text().replace("length: 4", "length: 3")
    (copy / "spec.yaml").write_text(edited)
    (tmp_path / "edited.yaml").write_text(edited)  # the same edit given on the command line
    line = _refused(tmp_path / "edited.yaml", copy, capsys)
    assert f"{copy / 'spec.yaml'}: contents do not match the sha256 recorded" in line


def test_an_edited_spec_of_an_unfinished_run_is_refused_by_its_checkpoints_record(
        finished: tuple[Path, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """No manifest seals an unfinished run's spec.yaml; its checkpoints record the spec's
    sha256 they trained on."""
    _, run = finished
    copy = tmp_path / "run"
    shutil.copytree(run, copy, symlinks=True)
    (copy / "manifest.json").unlink()
    edited = (copy / "spec.yaml").read_text().replace("length: 4", "length: 3")
    (copy / "spec.yaml").write_text(edited)
    (tmp_path / "edited.yaml").write_text(edited)
    line = _refused(tmp_path / "edited.yaml", copy, capsys)
    assert f"{copy / 'spec.yaml'}: differs from the spec" in line and "trained on" in line


@pytest.mark.parametrize("finished_run", [True, False])
def test_run_json_flags_must_be_those_the_checkpoints_trained_with(
        finished: tuple[Path, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str],
        finished_run: bool) -> None:
    spec, run = finished
    copy = tmp_path / "run"
    shutil.copytree(run, copy, symlinks=True)
    info = json.loads((copy / "run.json").read_text())
    (copy / "run.json").write_text(json.dumps({**info, "enforce": True,
                                               "allow_unenforced": True}))
    if not finished_run:
        (copy / "manifest.json").unlink()
    line = _refused(spec, copy, capsys)
    assert line.startswith(f"headwise train: error: {copy / 'run.json'}")
    assert ("sha256" in line) if finished_run else (
        "records enforce True, but" in line and "trained with False" in line)


def test_a_linked_checkpoint_is_refused(finished: tuple[Path, Path], tmp_path: Path,
                                        capsys: pytest.CaptureFixture[str]) -> None:
    spec, run = finished
    copy = tmp_path / "run"
    shutil.copytree(run, copy, symlinks=True)
    last = sorted((copy / "checkpoints").iterdir())[-1]
    shutil.move(last, tmp_path / "elsewhere")
    last.symlink_to(tmp_path / "elsewhere", target_is_directory=True)
    line = _refused(spec, copy, capsys)
    assert f"{last}: is a symbolic link" in line


def test_run_json_records_every_checkpoint_manifest(finished: tuple[Path, Path]) -> None:
    _, a = finished
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


def _unsealed(a: Path, b: Path) -> None:
    (a / "checkpoints" / "step_0000004" / "manifest.json").unlink()


def _linked(a: Path, b: Path) -> None:
    shutil.rmtree(a / "checkpoints")
    (a / "checkpoints").symlink_to(b / "checkpoints", target_is_directory=True)


@pytest.mark.parametrize(("change", "says"), [
    (_foreign, "step_0000002/manifest.json: missing, or differs from the digest"),
    (_renamed, "step_0000003: not listed in"),
    (_unsealed, "step_0000004/manifest.json: missing, or differs from the digest"),
    (_linked, "checkpoints: is a symbolic link")])
@pytest.mark.parametrize("command", [["report"], ["analyze", "--forecast"]])
def test_a_checkpoint_the_run_did_not_write_is_refused(
        finished: tuple[Path, Path], other: Path, tmp_path: Path,
        capsys: pytest.CaptureFixture[str], change: object, says: str,
        command: list[str]) -> None:
    (_, a), b = finished, other
    copy = tmp_path / "a"
    shutil.copytree(a, copy, symlinks=True)
    change(copy, b)  # type: ignore[operator]
    capsys.readouterr()
    assert main([command[0], str(copy), *command[1:]]) == 2
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert says in line and str(copy) in line
