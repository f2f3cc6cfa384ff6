"""A run's own data files: copied into the run when it starts, sealed with it, read from there.

A ``text``, ``mlm`` or ``pairs`` task reads a file the spec names by path, and the run reads it
again after training: ``--resume`` draws the training split, ``verify``, ``report``,
``analyze``, ``explain``, ``export`` and ``load_run`` the held-out splits. Training copies each
such file into the run directory when it starts (``data.<i>.<name>``: the file of the spec's
``i``-th task, under its own name), the finished run's manifest seals the copies, and every
later reader of the run with its own spec reads them: replacing or editing the file the spec
names after training changes nothing the run says, and an edited copy is refused by name. A run
written before runs stored their data has no copies; its readers read the paths its spec names,
as does ``verify`` with another spec.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from headwise.atomic import copy_file_atomic
from headwise.pipeline.run_tokenizer import FILE_TASKS
from headwise.runspec import Spec
from headwise.training.manifest import MANIFEST, check_sealed

PATH_KEY = "path"  # the task field naming its data file
_COPY = re.compile(r"^data\.\d+\..+$")
MAX_NAME = 200  # of the original name kept in a copy's (a name has at most 255 bytes)


def data_name(index: int, path: str) -> str:
    """The name of the run's copy of the ``index``-th task's file ``path``."""
    return f"data.{index}.{Path(path).name[-MAX_NAME:]}"


def data_files(spec: Spec) -> dict[int, str]:
    """``task index -> path`` of every file-backed task of ``spec``."""
    return {i: str(t.kwargs[PATH_KEY]) for i, t in enumerate(spec.data.tasks)
            if t.task in FILE_TASKS and isinstance(t.kwargs.get(PATH_KEY), str)}


def store_data(out: Path, spec: Spec) -> list[str]:
    """Copy the data files of ``spec`` into the run ``out`` (streamed, atomically).

    Returns:
        The names written (a missing file is skipped: its task refuses it, naming its field).

    Raises:
        StorageError: a copy cannot be written (a full disk), naming it.
    """
    written = []
    for index, path in data_files(spec).items():
        if Path(path).is_file():
            name = data_name(index, path)
            copy_file_atomic(Path(path), out / name)
            written.append(name)
    return written


def stored_data_names(run: Path) -> list[str]:
    """The data copies ``run`` holds (the names ``data_name`` gives), sorted."""
    if not run.is_dir():
        return []
    return sorted(p.name for p in run.iterdir() if _COPY.match(p.name))


def with_stored_data(tree: dict[str, Any], run: Path) -> dict[str, Any]:
    """A spec mapping (parsed, not yet validated: validating reads the files) whose
    file-backed tasks read the run's copies of their files, where the run holds them; a
    finished run's copies are checked against its manifest first.

    ``tree`` must be the run's own spec (its ``spec.yaml``): a copy is found by the task's
    position and the file's name.

    Raises:
        CheckpointError: a copy that differs from the manifest, that it lists but is missing,
            or that it does not list.
    """
    data = tree.get("data")
    tasks = data.get("tasks") if isinstance(data, dict) else None
    if not isinstance(data, dict) or not isinstance(tasks, dict):
        return tree
    names = {i: data_name(i, task[PATH_KEY]) for i, (kind, task) in enumerate(tasks.items())
             if isinstance(task, dict) and task.get("task", kind) in FILE_TASKS
             and isinstance(task.get(PATH_KEY), str)}
    if (run / MANIFEST).is_file():  # listed but missing, edited, or not listed: refused
        check_sealed(run, names.values())
    copies = {i: str((run / name).absolute()) for i, name in names.items()
              if (run / name).is_file()}
    if not copies:
        return tree
    new_tasks = {name: {**task, PATH_KEY: copies[i]} if i in copies else task
                 for i, (name, task) in enumerate(tasks.items())}
    return {**tree, "data": {**data, "tasks": new_tasks}}
