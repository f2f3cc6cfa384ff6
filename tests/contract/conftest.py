"""The contract tests' fixtures: tiny random HuggingFace models (``tests/hf_models.py``), and
``tasks_started`` for enforcement rules driven on an untrained model."""

import pytest
from hf_models import hf_model_dir  # noqa: F401  (a fixture, used by name)

from headwise.contract import task


@pytest.fixture
def tasks_started(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every task counts as having learned from its input (``task_learned`` says nothing), so
    a test of the multipliers' steps on an untrained model, whose tasks sit at the input-blind
    answers, is not also a test of the wait for a task to start (tested on its own in
    test_desaturation.py)."""
    monkeypatch.setattr(task, "task_learned", lambda result: None)
