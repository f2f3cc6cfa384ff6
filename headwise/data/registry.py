"""TASKS: the built-in task classes by name, and ``build_task`` to make one from keyword args."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import MISSING, fields
from typing import Any

from headwise.config import construct
from headwise.data.algorithmic import BracketDepthTask, KVRetrievalTask, ModularAdditionTask
from headwise.data.mlm import MLMTask
from headwise.data.pairs import PairsTask
from headwise.data.sequences import CopyTask, InductionTask, ReverseTask, SortTask
from headwise.data.task import Task
from headwise.data.text import TextTask
from headwise.errors import ConfigError, did_you_mean

TASKS: dict[str, type[Task]] = {
    cls.name: cls
    for cls in (CopyTask, ReverseTask, SortTask, InductionTask, ModularAdditionTask,
                BracketDepthTask, KVRetrievalTask, TextTask, PairsTask, MLMTask)
}


def task_arguments(name: str) -> list[str]:
    """The keyword arguments the task ``name`` accepts.

    Raises:
        ConfigError: unknown task name.
    """
    return [f.name for f in fields(_task_class(name)) if f.init]  # type: ignore[arg-type]


def build_task(name: str, kwargs: Mapping[str, Any] | None = None, path: str = "") -> Task:
    """Build the registered task ``name`` with keyword arguments.

    Args:
        name: a key of ``TASKS``.
        kwargs: the task's arguments (see each class).
        path: prefix for error messages (e.g. ``data.tasks.copy``).

    Raises:
        ConfigError: unknown name (listing the known ones), unknown argument (with the closest
            valid one), or an invalid value (naming the argument).
    """
    prefix = f"{path}: " if path else ""
    cls = _task_class(name, prefix)
    kwargs = dict(kwargs or {})
    allowed = task_arguments(name)
    for key in kwargs:
        if key not in allowed:
            extra = did_you_mean(str(key), allowed)
            raise ConfigError(f"{prefix}{name}.{key}: unknown argument{extra}; "
                              f"expected one of {allowed}")
    missing = [f.name for f in fields(cls)  # type: ignore[arg-type]
               if f.init and f.name not in kwargs
               and f.default is MISSING and f.default_factory is MISSING]
    if missing:
        raise ConfigError(f"{prefix}{name}.{missing[0]}: missing, this argument is required")
    return construct(cls, kwargs, prefix, f"{prefix}{name}")


def _task_class(name: str, prefix: str = "") -> type[Task]:
    if name not in TASKS:
        extra = did_you_mean(str(name), list(TASKS))
        raise ConfigError(f"{prefix}task: got {name!r}{extra}, expected one of {sorted(TASKS)}")
    return TASKS[name]
