"""Public path of ``run_with_cache`` and ``ActivationCache``, defined in ``headwise.model.cache``.

``Transformer.run_with_cache`` is a method of the model, so the definitions sit in the model
layer; this module keeps ``headwise.hooks.cache`` importable.
"""

from headwise.model.cache import ActivationCache, run_with_cache
from headwise.model.hook_point import attach_hooks

__all__ = ["ActivationCache", "attach_hooks", "run_with_cache"]
