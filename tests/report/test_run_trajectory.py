"""A run's trajectory: the role tables training recorded at its checkpoints, else each checkpoint
loaded and measured (the final role table taken for the checkpoint holding the final weights):
the same trajectory as measuring every checkpoint."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from headwise.analysis.role_table import RoleTable
from headwise.jsonfile import read_json_object
from headwise.pipeline import RunOptions, train_run
from headwise.pipeline.heldout import verification_data
from headwise.pipeline.run import RunOutcome
from headwise.pipeline.run_analysis import ROLE_TABLES, run_role_table
from headwise.pipeline.run_report import run_trajectory
from headwise.training import list_checkpoints, load_weights
from headwise.training.sharded_checkpoint import load_checkpoint_weights

# Checkpoints only, no evaluation points: training records no role table.
SPEC = """
model: {n_layers: 1, n_heads: 2, d_model: 16, vocab_size: 12, max_seq_len: 10}
data: {tasks: {copy: {length: 4}}, eval_examples: 16}
train: {steps: 4, batch_size: 8, checkpoint_every: 2}
"""
# Evaluation points at 2, 4, 6 and checkpoints at 3, 6: a recorded table at 6 only.
SPEC_RECORDED = """
model: {n_layers: 2, n_heads: 3, d_model: 24, vocab_size: 12, max_seq_len: 10}
data: {tasks: {copy: {length: 4}}, eval_examples: 16}
train: {steps: 6, batch_size: 8, eval_every: 2, checkpoint_every: 3}
"""


def _train(tmp_path: Path, spec: str) -> RunOutcome:
    path = tmp_path / "spec.yaml"
    path.write_text(spec)
    return train_run(path, tmp_path / "run", RunOptions(progress=False))


def _measured_apart(out: RunOutcome) -> torch.Tensor:
    """Reference: every checkpoint loaded and measured, (checkpoints, heads, roles)."""
    model, data = out.compiled.model, verification_data(out.compiled)
    tables = []
    for _, path in list_checkpoints(out.run_dir):
        load_checkpoint_weights(model, path)
        tables.append(run_role_table(model, data).values)
    load_weights(model, out.run_dir / "model.safetensors")
    return torch.stack(tables)


def test_final_table_is_reused_only_for_the_final_weights(tmp_path: Path) -> None:
    out = _train(tmp_path, SPEC)
    measured = run_trajectory(out.run_dir, out.compiled)
    table = run_role_table(out.compiled.model, verification_data(out.compiled))
    reused = run_trajectory(out.run_dir, out.compiled, table)
    assert measured is not None and reused is not None and measured.steps == [2, 4]
    torch.testing.assert_close(reused.values, measured.values, rtol=0, atol=0, equal_nan=True)
    marked = RoleTable(table.heads, table.roles, table.values * 0 + 0.5)
    only_last = run_trajectory(out.run_dir, out.compiled, marked)
    assert only_last is not None
    assert torch.all(only_last.values[1] == 0.5) and not torch.all(only_last.values[0] == 0.5)


def test_recorded_tables_are_the_checkpoints_tables(tmp_path: Path,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    out = _train(tmp_path, SPEC_RECORDED)
    ckpts = list_checkpoints(out.run_dir)
    assert [s for s, _ in ckpts] == [3, 6]
    extra = read_json_object(ckpts[-1][1] / "trainer.json", ValueError)["extra"]
    assert sorted(extra[ROLE_TABLES]) == ["6"]  # step 3 had no evaluation point
    reference = _measured_apart(out)
    loaded: list[Path] = []
    real_load = load_checkpoint_weights

    def counting(model: torch.nn.Module, path: Path) -> None:
        loaded.append(path)
        real_load(model, path)

    monkeypatch.setattr("headwise.training.sharded_checkpoint.load_checkpoint_weights",
                        counting)
    traj = run_trajectory(out.run_dir, out.compiled)
    assert traj is not None and traj.steps == [3, 6]
    assert loaded == [ckpts[0][1]]  # only the checkpoint training measured nothing at
    # Same weights, same data, same process: the recorded table is the measured one.
    torch.testing.assert_close(traj.values, reference.double(), rtol=0, atol=1e-12,
                               equal_nan=True)
