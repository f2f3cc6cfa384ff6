"""Hook points, context-managed hooks, activation caching and head-level interventions.

The primitives the model is built from (``HookPoint``, ``Hook``, ``attach_hooks``,
``run_with_cache``) are defined in ``headwise.model`` and re-exported here; the interventions
(``ablate``, ``patch``, ``scale``, ``steer``) are defined in ``headwise.hooks.interventions``.
"""

from headwise.hooks.interventions import ablate, patch, scale, steer
from headwise.model.cache import ActivationCache, run_with_cache
from headwise.model.hook_point import Hook, HookContext, HookPoint, attach_hooks

__all__ = ["ActivationCache", "Hook", "HookContext", "HookPoint", "ablate", "attach_hooks",
           "patch", "run_with_cache", "scale", "steer"]
