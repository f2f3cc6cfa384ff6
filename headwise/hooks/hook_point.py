"""Public path of the hook-point primitives, defined in ``headwise.model.hook_point``.

The model is built from hook points (each component declares its own), so the definitions sit
in the model layer; this module keeps ``headwise.hooks.hook_point`` importable.
"""

from headwise.model.hook_point import Hook, HookContext, HookFn, HookPoint, attach_hooks

__all__ = ["Hook", "HookContext", "HookFn", "HookPoint", "attach_hooks"]
