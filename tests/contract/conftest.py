"""The contract tests' fixtures: tiny random HuggingFace models (``tests/hf_models.py``)."""

from hf_models import hf_model_dir  # noqa: F401  (a fixture, used by name)
