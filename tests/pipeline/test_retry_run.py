"""An enforced run whose kept model is not certified trains again from its initial weights at
half the rate (``headwise.contract.retry``): the second attempt is the run a user would start
with ``--set train.lr=`` half the rate, the run keeps the chosen attempt's weights and verdict,
and a run killed during the second attempt resumes it exactly."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import yaml
from safetensors.torch import load_file

from headwise.cli import main

# copy cannot be learned to 99% exact match in 20 steps: every attempt fails
SPEC = """
model: {n_layers: 1, n_heads: 2, d_model: 32, vocab_size: 12, max_seq_len: 10}
data: {tasks: {copy: {length: 4}}, eval_examples: 128}
train: {steps: 20, batch_size: 16, lr: 3.0e-3, eval_every: 10, seed: 0, checkpoint_every: 10}
contract:
  - {task: copy, metric: exact, at_least: 0.99}
"""


def _train(spec: Path, out: Path, *extra: str) -> int:
    return main(["train", str(spec), "--out", str(out), "--quiet", "--enforce", *extra])


def _same_weights(a: Path, b: Path) -> bool:
    x, y = load_file(str(a)), load_file(str(b))
    return x.keys() == y.keys() and all(x[k].equal(y[k]) for k in x)


@pytest.fixture
def spec(tmp_path: Path) -> Path:
    path = tmp_path / "spec.yaml"
    path.write_text(SPEC)
    return path


def test_a_run_not_certified_trains_again_at_half_the_rate(spec: Path, tmp_path: Path) -> None:
    run = tmp_path / "run"
    assert _train(spec, run) == 1
    e = json.loads((run / "enforcement.json").read_text())
    assert [(a["dir"], a["lr"], a["steps"], a["kept_as"]) for a in e["attempts"]] == [
        (".", 3.0e-3, 20, None), ("retries/1", 1.5e-3, 20, None)]
    assert e["attempt"] == 1  # neither held: the tie keeps the spec's own rate
    retry = run / "retries" / "1"
    assert yaml.safe_load((retry / "spec.yaml").read_text())["train"]["lr"] == 1.5e-3
    assert main(["report", str(run)]) == 0  # the report says so
    assert "trained 2 times from the same initial weights" in (run / "report.html").read_text()
    # The second attempt is exactly the run trained from the start at half the rate, and the
    # run's weights those of the first: each the run with no retry at that rate.
    half, own = tmp_path / "half", tmp_path / "own"
    assert _train(spec, half, "--set", "train.lr=0.0015", "--set", "enforce.retries=0") == 1
    assert _train(spec, own, "--set", "enforce.retries=0") == 1
    assert _same_weights(retry / "model.safetensors", half / "model.safetensors")
    assert _same_weights(run / "model.safetensors", own / "model.safetensors")
    assert not (own / "retries").exists()
    assert "attempts" not in json.loads((own / "enforcement.json").read_text())


def test_the_run_keeps_the_chosen_attempts_weights_and_verdict(
        spec: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Where the second attempt is chosen (here forced, to follow the plumbing; which attempt
    wins is ``best_attempt``'s, tested in tests/contract/test_retry.py), the run directory's
    model and verdict are that attempt's: the verdict is the one its own run at that rate
    measures on the same verification set."""
    monkeypatch.setattr("headwise.pipeline.run.best_attempt", lambda records: len(records) - 1)
    run, half = tmp_path / "run", tmp_path / "half"
    assert _train(spec, run) == 1
    assert _train(spec, half, "--set", "train.lr=0.0015", "--set", "enforce.retries=0") == 1
    assert _same_weights(run / "model.safetensors", half / "model.safetensors")
    assert json.loads((run / "enforcement.json").read_text())["attempt"] == 2
    verdict, alone = (json.loads((d / "contract.json").read_text()) for d in (run, half))
    assert [c["measured"] for c in verdict["clauses"]] == [c["measured"] for c in
                                                           alone["clauses"]]


def test_a_run_killed_in_its_second_attempt_resumes_it_exactly(
        spec: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    run = tmp_path / "run"
    assert _train(spec, run) == 1
    first = json.loads((run / "enforcement.json").read_text())
    weights = load_file(str(run / "model.safetensors"))
    retry = run / "retries" / "1"
    retried = load_file(str(retry / "model.safetensors"))
    # as if killed after the second attempt's checkpoint at step 10: its later checkpoint,
    # its weights and the run's outcome files not yet written
    shutil.rmtree(retry / "checkpoints" / "step_0000020")
    for path in (retry / "model.safetensors", retry / "config.json", run / "contract.json",
                 run / "enforcement.json", run / "manifest.json"):
        path.unlink()
    capsys.readouterr()
    assert _train(spec, run, "--resume") == 1
    # the first attempt is finished (resumed at its end), the second from its checkpoint
    assert "resuming from step 20" in (said := capsys.readouterr().out)
    assert "resuming from step 10" in said
    assert json.loads((run / "enforcement.json").read_text()) == first
    assert all(load_file(str(run / "model.safetensors"))[k].equal(v) for k, v in weights.items())
    assert all(load_file(str(retry / "model.safetensors"))[k].equal(v)
               for k, v in retried.items())


@pytest.mark.parametrize(("world", "parallel", "alone"), [
    (None, None, True), ("1", "none", True), ("2", None, False), (None, "fsdp", False)])
def test_only_a_run_in_one_process_trains_again(
        monkeypatch: pytest.MonkeyPatch, world: str | None, parallel: str | None,
        alone: bool) -> None:
    """Under torchrun (or sharded) ``train`` sets a process group up once per process, so a
    second attempt is left to the user there."""
    import dataclasses

    from headwise.pipeline.run import _one_process
    from headwise.runspec import load_spec

    if world is None:
        monkeypatch.delenv("WORLD_SIZE", raising=False)
    else:
        monkeypatch.setenv("WORLD_SIZE", world)
    spec = load_spec(SPEC)
    spec = dataclasses.replace(spec, train=dataclasses.replace(spec.train, parallel=parallel))
    assert _one_process(spec) is alone
