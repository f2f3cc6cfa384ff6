"""The interop tests' fixtures: tiny random HuggingFace models (``tests/hf_models.py``)."""

from hf_models import batch, hf_model_dir  # noqa: F401  (fixtures, used by name)
