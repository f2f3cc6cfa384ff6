"""Hook points, context-managed hooks, activation caching and head-level interventions."""

from headwise.hooks.cache import ActivationCache, attach_hooks, run_with_cache
from headwise.hooks.hook_point import Hook, HookContext, HookPoint
from headwise.hooks.interventions import ablate, patch, scale, steer

__all__ = ["ActivationCache", "Hook", "HookContext", "HookPoint", "ablate", "attach_hooks",
           "patch", "run_with_cache", "scale", "steer"]
