"""A run's trajectory takes the final role table for the checkpoint holding the final weights,
and measures every other checkpoint: the same trajectory as measuring them all."""

from __future__ import annotations

from pathlib import Path

import torch

from headwise.analysis.role_table import RoleTable
from headwise.pipeline import RunOptions, train_run
from headwise.pipeline.heldout import verification_data
from headwise.pipeline.run_analysis import run_role_table
from headwise.pipeline.run_report import run_trajectory

SPEC = """
model: {n_layers: 1, n_heads: 2, d_model: 16, vocab_size: 12, max_seq_len: 10}
data: {tasks: {copy: {length: 4}}, eval_examples: 16}
train: {steps: 4, batch_size: 8, eval_every: 2, checkpoint_every: 2}
"""


def test_final_table_is_reused_only_for_the_final_weights(tmp_path: Path) -> None:
    spec = tmp_path / "spec.yaml"
    spec.write_text(SPEC)
    out = train_run(spec, tmp_path / "run", RunOptions(progress=False))
    measured = run_trajectory(out.run_dir, out.compiled)
    table = run_role_table(out.compiled.model, verification_data(out.compiled))
    reused = run_trajectory(out.run_dir, out.compiled, table)
    assert measured is not None and reused is not None and measured.steps == [2, 4]
    torch.testing.assert_close(reused.values, measured.values, rtol=0, atol=0, equal_nan=True)
    marked = RoleTable(table.heads, table.roles, table.values * 0 + 0.5)
    only_last = run_trajectory(out.run_dir, out.compiled, marked)
    assert only_last is not None
    assert torch.all(only_last.values[1] == 0.5) and not torch.all(only_last.values[0] == 0.5)
