"""A run replaces only a run: the user's files in an --out that holds no run are never deleted
or replaced (not by --overwrite, not by demo), and no run is written inside another run at
any depth, not even an empty directory on the way to a refusal."""

from __future__ import annotations

from pathlib import Path

import pytest

from headwise.cli import main

SPEC = """
model: {n_layers: 1, n_heads: 2, d_model: 16, vocab_size: 12, max_seq_len: 10}
data: {tasks: {copy: {length: 4}}, eval_examples: 16}
train: {steps: 2, batch_size: 8, eval_every: 2, checkpoint_every: 2}
"""


@pytest.mark.parametrize("command", [["train", "SPEC", "--overwrite", "--no-report"],
                                     ["train", "SPEC", "--no-report"], ["demo", "--steps", "2"]])
def test_an_out_that_holds_no_run_keeps_every_file_of_the_user(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], command: list[str]) -> None:
    spec = tmp_path / "spec.yaml"
    spec.write_text(SPEC)
    out = tmp_path / "project"
    out.mkdir()
    mine = {"spec.yaml": "name: mine\n", "report.html": "<p>mine</p>", "tokenizer.json": "{}",
            "vocab.txt": "a b\n", "data.1.mine.csv": "k\n", "notes.txt": "n\n"}
    for name, text in mine.items():
        (out / name).write_text(text)
    args = [str(spec) if a == "SPEC" else a for a in command]
    assert main([*args, "--out", str(out), "--quiet"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "exists and belongs to no run" in err[0], err
    assert {p.name: p.read_text() for p in out.iterdir()} == mine
    # Beside files a run never writes, a run is written and they are kept.
    (out / "notes.txt").unlink()
    keep = tmp_path / "keep"
    keep.mkdir()
    (keep / "notes.txt").write_text("n\n")
    assert main(["train", str(spec), "--out", str(keep), "--quiet", "--no-report"]) in (0, 1)
    assert (keep / "notes.txt").read_text() == "n\n" and (keep / "model.safetensors").is_file()


def test_no_run_is_written_inside_a_run_at_any_depth(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    spec = tmp_path / "spec.yaml"
    spec.write_text(SPEC)
    run = tmp_path / "run"
    assert main(["train", str(spec), "--out", str(run), "--quiet", "--no-report"]) in (0, 1)
    before = sorted(p.relative_to(run) for p in run.rglob("*"))
    for inner in (run / "checkpoints" / "step_0000099", run / "sub" / "r"):
        assert main(["train", str(spec), "--out", str(inner), "--quiet", "--no-report"]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and f"is inside a headwise run ({run})" in err[0], err
    assert sorted(p.relative_to(run) for p in run.rglob("*")) == before
    # A path that goes up from a missing directory would create it inside the run first.
    for extra in ([], ["--overwrite"]):
        up = f"{run}/nope/.."
        assert main(["train", str(spec), "--out", up, "--quiet", "--no-report", *extra]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and f"goes up from {run}/nope, which is not a directory" in err[0]
    assert sorted(p.relative_to(run) for p in run.rglob("*")) == before
