"""Run options: the shaping options a run records, --seed folded into the overrides, and a
resume that compares two RunOptions."""

from __future__ import annotations

from pathlib import Path

import pytest

from headwise.errors import SpecError
from headwise.pipeline import RunOptions
from headwise.pipeline.resume import recorded_options, resume_options


def test_a_fresh_run_fills_the_defaults_and_folds_the_seed_last() -> None:
    opts = RunOptions(overrides=("train.lr=0.01",), seed=3, progress=False).filled()
    assert opts.overrides == ("train.lr=0.01", "train.seed=3") and opts.seed is None
    assert (opts.enforce, opts.enforce_budget, opts.allow_unenforced) == (False, 1.0, False)
    assert not opts.progress  # what a run prints is kept
    assert RunOptions().filled().overrides == ()


def test_a_resume_takes_the_runs_options_and_refuses_a_different_one(tmp_path: Path) -> None:
    run = recorded_options({"enforce": True, "enforce_budget": 1.2, "allow_unenforced": False,
                            "steps": 100, "set": ["train.seed=1"]})
    opts = resume_options(run, RunOptions(device="cpu"), tmp_path)
    assert (opts.enforce, opts.enforce_budget, opts.steps, opts.overrides, opts.device) == (
        True, 1.2, 100, ("train.seed=1",), "cpu")
    assert resume_options(run, RunOptions(steps=200), tmp_path).steps == 200  # extends it
    with pytest.raises(SpecError, match=r"^--enforce: the run in .* was trained with --enforce"):
        resume_options(run, RunOptions(enforce=False), tmp_path)
    with pytest.raises(SpecError, match=r"^--seed: the run in .* was trained with --seed 1"):
        resume_options(run, RunOptions(seed=2), tmp_path)
    with pytest.raises(SpecError, match=r"^--steps: got 50, but the run"):
        resume_options(run, RunOptions(steps=50), tmp_path)
