"""Hook points, context-managed hooks, activation caching and head-level interventions.

The primitives the model is built from (``HookPoint``, ``Hook``, ``attach_hooks``,
``run_with_cache``, TransformerLens's ``run_with_hooks`` / ``add_hook`` / ``reset_hooks`` and
``get_act_name``) are defined in ``headwise.model`` and re-exported here; the interventions
(``ablate``, ``patch``, ``scale``, ``steer``) are defined in ``headwise.hooks.interventions``;
the graph of paths (``headwise.hooks.graph``) and one forward with chosen edges ablated
(``headwise.hooks.path_run``) serve path patching and the path levers alike.
"""

from headwise.hooks.interventions import ablate, patch, scale, steer
from headwise.model.cache import ActivationCache, run_with_cache
from headwise.model.hook_names import get_act_name
from headwise.model.hook_point import Hook, HookContext, HookPoint, attach_hooks
from headwise.model.hook_runs import add_hook, reset_hooks, run_with_hooks

__all__ = ["ActivationCache", "Hook", "HookContext", "HookPoint", "ablate", "add_hook",
           "attach_hooks", "get_act_name", "patch", "reset_hooks", "run_with_cache",
           "run_with_hooks", "scale", "steer"]
