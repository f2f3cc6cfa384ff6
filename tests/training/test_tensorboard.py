"""train.log: [jsonl, tensorboard]: event files read back with TensorBoard's own reader."""

from __future__ import annotations

import io
import json
import shutil
import sys
from pathlib import Path
from typing import Any

import matplotlib.image
import numpy as np
import pytest
import torch
from safetensors.torch import load_file

from headwise.analysis.roles import role_scores
from headwise.config import ModelConfig
from headwise.control.objective import Objective
from headwise.data import CopyTask, Mixture, ModularAdditionTask
from headwise.errors import ConfigError, SpecError
from headwise.model import build_model
from headwise.pipeline.options import RunOptions
from headwise.pipeline.run import FIGURES
from headwise.pipeline.run_analysis import DATA_ROLES, role_heatmap_png
from headwise.training import TrainConfig, TrainState, checkpoint_dir, load_weights, train
from headwise.training.evaluate import EVAL_SEED_OFFSET
from headwise.training.tensorboard import constraint_scalars

event_accumulator = pytest.importorskip(
    "tensorboard.backend.event_processing.event_accumulator")

CFG = ModelConfig(n_layers=2, n_heads=2, d_model=32, d_ff=48, vocab_size=12, max_seq_len=12)


def _data() -> Mixture:
    return Mixture({"copy": CopyTask(length=4, vocab_size=12),
                    "add": ModularAdditionTask(modulus=5, vocab_size=12)}, {"copy": 1, "add": 1})


def _read(run: Path) -> Any:
    acc = event_accumulator.EventAccumulator(str(run / "tensorboard"),
                                             size_guidance={"scalars": 0, "images": 0})
    acc.Reload()
    return acc


def _scalars(acc: Any, tag: str) -> list[tuple[int, float]]:
    return [(e.step, e.value) for e in acc.Scalars(tag)]


class _Weighted(Objective):
    """A pattern objective stand-in: a fixed loss term so objective tags are logged."""

    name = "prev"
    weight = 0.5

    def hooks(self) -> list[Any]:
        return []

    def loss(self, *args: Any, **kwargs: Any) -> tuple[torch.Tensor, dict[str, float]]:
        return torch.tensor(0.25), {"L0.H1": 0.25}


def _halve(state: TrainState) -> None:
    """A callback that changes a weight and writes constraint state, as enforcement does."""
    state.objectives[0].weight *= 0.5
    state.extra["constraints"] = {"contract[0]": {"violation": 0.1 * state.step,
                                                  "multiplier": 2.0 ** state.step}}


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("tb")
    config = TrainConfig(steps=6, batch_size=8, lr=0.05, log_every=2, eval_every=3, eval_batches=1,
                         checkpoint_every=3, log=("jsonl", "tensorboard"))
    train(build_model(CFG, seed=0), _data(), config, out_dir=out, objectives=[_Weighted()],
          callbacks=[_halve], progress=False, figures=FIGURES)
    return out


def test_scalars_equal_metrics_jsonl(run: Path) -> None:
    acc = _read(run)
    lines = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    checked = 0
    for r in lines:
        kind = r["kind"]
        expected = {f"{kind}/loss": r["loss"],
                    **{f"{kind}/task/{t}/{k}": v[k] for t, v in r["tasks"].items()
                       for k in ("loss", "accuracy", "exact")},
                    **{f"{kind}/objective/{n}/{k}": o[k] for n, o in r["objectives"].items()
                       for k in ("loss", "weight")}}
        if kind == "train":
            expected.update({"train/lr": r["lr"], "train/task_loss": r["task_loss"],
                             "train/grad_norm": r["grad_norm"]})
        for tag, value in expected.items():
            got = dict(_scalars(acc, tag))
            assert got[r["step"]] == pytest.approx(value, rel=1e-6, abs=1e-7), tag  # float32
            checked += 1
    assert checked == 3 * 12 + 2 * 9  # 3 train lines, 2 eval lines, 2 tasks, 1 objective
    # the objective's weight as the loop used it: 0.5, then halved by the callback at step 3
    assert _scalars(acc, "train/objective/prev/weight") == [(2, 0.5), (4, 0.25), (6, 0.25)]


def test_constraints_from_callback_state(run: Path) -> None:
    acc = _read(run)
    assert _scalars(acc, "constraints/contract[0]/multiplier") == [(3, 8.0), (6, 64.0)]
    got = _scalars(acc, "constraints/contract[0]/violation")
    assert [s for s, _ in got] == [3, 6] and [v for _, v in got] == pytest.approx([0.3, 0.6])


def test_role_heatmap_at_checkpoints(run: Path) -> None:
    """Each image is the report's role figure of that checkpoint's weights, pixel for pixel."""
    acc = _read(run)
    images = acc.Images("roles/heatmap")
    assert [im.step for im in images] == [3, 6]
    data = _data()
    batch = data.sample(8, torch.Generator().manual_seed(0 + EVAL_SEED_OFFSET))
    for im in images:
        model = build_model(CFG, seed=1)
        load_weights(model, checkpoint_dir(run, im.step) / "model.safetensors")
        table = role_scores(model, batch.tokens, batch.attention_mask, roles=list(DATA_ROLES),
                            task_ids=batch.task_ids)
        assert table.roles == list(DATA_ROLES) and len(table.heads) == 4
        want = matplotlib.image.imread(io.BytesIO(role_heatmap_png(model, batch)), format="png")
        got = matplotlib.image.imread(io.BytesIO(im.encoded_image_string), format="png")
        assert got.shape == (im.height, im.width, 3) == want.shape[:2] + (3,)
        assert np.abs(got - want[..., :3]).max() <= 0.5 / 255
    # the two checkpoints differ, so the images are not one constant picture
    first, last = (matplotlib.image.imread(io.BytesIO(i.encoded_image_string), format="png")
                   for i in images)
    assert np.abs(first - last).max() > 0


def test_resume_purges_events_after_the_checkpoint(run: Path, tmp_path: Path) -> None:
    """Kill after step 3 (drop the last checkpoint), resume: every step is logged once, with
    the values of the uninterrupted run."""
    out = tmp_path / "run"
    shutil.copytree(run, out)
    shutil.rmtree(checkpoint_dir(out, 6))
    config = TrainConfig(steps=6, batch_size=8, lr=0.05, log_every=2, eval_every=3, eval_batches=1,
                         checkpoint_every=3, log=("jsonl", "tensorboard"))
    obj = _Weighted()
    train(build_model(CFG, seed=0), _data(), config, out_dir=out, objectives=[obj],
          callbacks=[_halve], resume=True, progress=False, figures=FIGURES)
    before, after = _read(run), _read(out)
    for tag in ("eval/loss", "eval/task/copy/accuracy", "constraints/contract[0]/multiplier"):
        assert _scalars(after, tag) == _scalars(before, tag), tag  # bitwise resume
    # the train line at step 4 averages only step 4 after the resume: as in metrics.jsonl
    lines = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    train_loss = [(r["step"], r["loss"]) for r in lines if r["kind"] == "train"]
    got = _scalars(after, "train/loss")
    assert [s for s, _ in got] == [s for s, _ in train_loss] == [2, 4, 6]
    assert [v for _, v in got] == pytest.approx([v for _, v in train_loss], rel=1e-6)
    assert [im.step for im in after.Images("roles/heatmap")] == [3, 6]


def test_logging_to_tensorboard_does_not_change_training(run: Path, tmp_path: Path) -> None:
    """The same run with log: [jsonl] writes the same metrics and the same final weights."""
    config = TrainConfig(steps=6, batch_size=8, lr=0.05, log_every=2, eval_every=3,
                         eval_batches=1, checkpoint_every=3)
    train(build_model(CFG, seed=0), _data(), config, out_dir=tmp_path, objectives=[_Weighted()],
          callbacks=[_halve], progress=False)

    def lines(path: Path) -> list[dict[str, Any]]:
        out = [json.loads(x) for x in (path / "metrics.jsonl").read_text().splitlines()]
        return [{k: v for k, v in r.items() if k != "elapsed_s"} for r in out]

    assert lines(tmp_path) == lines(run)
    ours, theirs = (load_file(p / "model.safetensors") for p in (tmp_path, run))
    assert ours.keys() == theirs.keys()  # (file bytes differ: metadata order is not fixed)
    assert all(torch.equal(ours[k], theirs[k]) for k in ours)


def test_constraint_scalars_from_enforcer_record() -> None:
    """The latest evaluation point of ``extra["enforce"]``; numbers only (None: no lever)."""
    extra = {"enforce": {"history": [
        {"step": 2, "clauses": {"0": {"violation": 0.5, "multiplier": 2.0, "measured": 0.4}}},
        {"step": 4, "clauses": {"0": {"violation": -0.1, "multiplier": 1.6, "measured": 1.0,
                                      "passed": True},
                                "1": {"violation": 0.2, "multiplier": None,
                                      "measured": None}}}]}}
    assert dict(constraint_scalars(extra)) == {
        "constraints/contract[0]/violation": -0.1, "constraints/contract[0]/multiplier": 1.6,
        "constraints/contract[0]/measured": 1.0, "constraints/contract[1]/violation": 0.2}
    # With the clause entries the enforcer keeps, the tags are the clauses' names; a shared
    # name stays apart by its index, and "/" does not nest a tag.
    extra["enforce"]["clauses"] = {"0": {"index": 0, "description": "copy/floor"},
                                   "1": {"index": 1, "description": "copy/floor"}}
    assert sorted(dict(constraint_scalars(extra))) == [
        "constraints/copy_floor (contract[0])/measured",
        "constraints/copy_floor (contract[0])/multiplier",
        "constraints/copy_floor (contract[0])/violation",
        "constraints/copy_floor (contract[1])/violation"]


def test_jsonl_only_writes_no_event_files(tmp_path: Path) -> None:
    train(build_model(CFG, seed=0), _data(), TrainConfig(steps=2, batch_size=4, log_every=1),
          out_dir=tmp_path, progress=False)
    assert (tmp_path / "metrics.jsonl").is_file() and not (tmp_path / "tensorboard").exists()


@pytest.mark.parametrize("value, fragment", [
    (["tensorboard"], "includes jsonl"), (["jsonl", "jsonl"], "each once"),
    (["jsonl", "tensorbord"], "did you mean 'tensorboard'"), ("jsonl", "a list of sinks")])
def test_bad_log_values_name_the_field(value: Any, fragment: str) -> None:
    with pytest.raises(ConfigError, match=r"^train\.log: got .*" + fragment):
        TrainConfig.from_dict({"log": value})


def test_missing_tensorboard_names_field_and_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    from headwise.runspec import load_spec

    monkeypatch.setitem(sys.modules, "tensorboard", None)  # import tensorboard -> ImportError
    with pytest.raises(ConfigError, match=r"^train\.log: .*not installed.*headwise\[tensorboard\]"):
        TrainConfig.from_dict({"log": ["jsonl", "tensorboard"]})
    spec = ("model: {n_layers: 1, n_heads: 2, d_model: 16, vocab_size: 16, max_seq_len: 32}\n"
            "data: {tasks: [copy]}\n"
            "train: {steps: 2, log: [jsonl, tensorboard]}\n")
    with pytest.raises(SpecError) as err:
        load_spec(spec)
    message = str(err.value)
    assert message.startswith("train.log:") and "headwise[tensorboard]" in message
    assert "\n" not in message
    assert TrainConfig.from_dict({"log": ["jsonl"]}).log == ("jsonl",)  # jsonl needs nothing


def test_cli_exit_2_without_tensorboard(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                        capsys: pytest.CaptureFixture[str]) -> None:
    from headwise.cli import main

    monkeypatch.setitem(sys.modules, "tensorboard", None)
    spec = tmp_path / "spec.yaml"
    spec.write_text("model: {n_layers: 1, n_heads: 2, d_model: 16, vocab_size: 16, "
                    "max_seq_len: 32}\ndata: {tasks: [copy]}\n"
                    "train: {steps: 2, log: [jsonl, tensorboard]}\n")
    assert main(["train", str(spec), "--out", str(tmp_path / "run"), "--quiet"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "train.log:" in err[0] and "headwise[tensorboard]" in err[0]
    assert not (tmp_path / "run").exists()  # refused before anything was written


def test_enforcement_state_is_logged(tmp_path: Path) -> None:
    """With --enforce, each enforcement point's violations, multipliers and measured values, as
    enforcement.json records them, are in the event file."""
    from headwise.pipeline.run import train_run

    spec = ("model: {n_layers: 1, n_heads: 2, d_model: 32, vocab_size: 12, max_seq_len: 10}\n"
            "data: {tasks: {copy: {length: 4}}, eval_examples: 64}\n"
            "train: {steps: 40, batch_size: 16, lr: 3.0e-3, eval_every: 20, seed: 0, "
            "log: [jsonl, tensorboard]}\n"
            "contract:\n  - {name: prev, head: L0.H1, score: previous_token, at_least: 0.99}\n")
    outcome = train_run(spec, tmp_path / "run", RunOptions(enforce=True, progress=False))
    history = json.loads((tmp_path / "run" / "enforcement.json").read_text())["history"]
    assert outcome.enforcement is not None and len(history) == 4  # every 10 steps
    acc = _read(tmp_path / "run")
    for field in ("violation", "multiplier", "measured"):
        got = _scalars(acc, f"constraints/prev/{field}")  # the clause's name
        want = [(h["step"], h["clauses"]["0"][field]) for h in history]
        assert [s for s, _ in got] == [s for s, _ in want] == [10, 20, 30, 40], field
        assert [v for _, v in got] == pytest.approx([v for _, v in want], rel=1e-6), field
    assert history[0]["clauses"]["0"]["violation"] > 0  # it failed and the multiplier rose
    assert history[0]["clauses"]["0"]["multiplier"] > 0
