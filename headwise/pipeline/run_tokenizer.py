"""A run's own tokenizer: copied into the run when it starts, sealed with it, read from there.

A run on a pretrained checkpoint or with a text, ``mlm`` or ``pairs`` task reads a tokenizer
the spec names by path. Training copies it into the run directory (``tokenizer.json`` and the
files beside it that name special tokens or vocabularies: ``TOKENIZER_FILES``), the finished
run's manifest seals the copy, and every later reader of the run (``load_run``, ``analyze``,
``explain``, ``verify``, ``report``, ``export``) reads the copy: replacing or editing the file
the spec names after training changes nothing the run says, and an edited copy is refused by
name. ``--resume`` reads the copy too (the run's data files likewise:
``headwise.pipeline.run_data``). A run written before runs stored their tokenizer has no copy;
its readers read the path its spec names.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from headwise.atomic import write_bytes_atomic
from headwise.errors import SpecError
from headwise.interop.load import MAX_TOKENIZER_FILE_BYTES, TOKENIZER_FILES
from headwise.interop.tokenizer import SPECIAL_FILES
from headwise.jsonfile import read_bounded
from headwise.runspec import Spec
from headwise.training.manifest import MANIFEST, check_sealed, read_listing

TOKENIZER_TASK_KEY = "tokenizer"  # the task field naming a tokenizer
FILE_TASKS = ("text", "pairs", "mlm")  # the tasks that read one


def tokenizer_source(spec: Spec) -> Path | None:
    """The tokenizer a run of ``spec`` reads: its pretrained checkpoint's directory (when it
    holds tokenizer files), else the first task's ``tokenizer`` (a directory or a file)."""
    if spec.model.pretrained is not None:
        path = Path(spec.model.pretrained.path)
        if any((path / name).is_file() for name in TOKENIZER_FILES):
            return path
    for task in spec.data.tasks:
        if task.kwargs.get(TOKENIZER_TASK_KEY):
            return Path(str(task.kwargs[TOKENIZER_TASK_KEY]))
    return None


def store_tokenizer(out: Path, spec: Spec) -> list[str]:
    """Copy the tokenizer of ``spec`` (``tokenizer_source``) into the run ``out``.

    Returns:
        The names written (none when the run reads no tokenizer file).

    Raises:
        SpecError: a tokenizer file that cannot be read or is larger than the tokenizer limit.
    """
    source = tokenizer_source(spec)
    if source is None or not source.exists():
        return []  # the task itself refuses a missing tokenizer, naming its field
    if source.is_file():
        names = {"tokenizer.json": source, **{n: source.parent / n for n in SPECIAL_FILES}}
    else:
        names = {n: source / n for n in TOKENIZER_FILES}
    written = []
    for name, file in names.items():
        if file.is_file():
            data = read_bounded(file.resolve(), MAX_TOKENIZER_FILE_BYTES, "tokenizer", SpecError)
            write_bytes_atomic(out / name, data)
            written.append(name)
    return written


def stored_tokenizer(run: Path) -> Path | None:
    """The run's sealed copy of its tokenizer (the run directory), or ``None`` for a run
    without one. A run still training (no manifest yet: ``--resume``) has its copy unsealed.

    Raises:
        CheckpointError: a tokenizer file in the run that differs from its manifest or that
            the manifest does not list (naming it).
    """
    if not (run / MANIFEST).is_file():
        return run if (run / "tokenizer.json").is_file() else None
    check_sealed(run, TOKENIZER_FILES)
    return run if "tokenizer.json" in read_listing(run).sha256 else None


def with_stored_tokenizer(tree: dict[str, Any], run: Path) -> dict[str, Any]:
    """A spec mapping whose tasks read the run's copy of the tokenizer (when it has one)
    instead of the path the spec names: a run has one vocabulary, the one it trained with.

    A task reads the copy where it names a tokenizer (not ``bytes``), or, on a pretrained
    checkpoint, where it is a file-backed task that names none (it reads the checkpoint's).
    """
    stored = stored_tokenizer(run)
    data, model = tree.get("data"), tree.get("model")
    tasks = data.get("tasks") if isinstance(data, dict) else None
    if stored is None or not isinstance(data, dict) or not isinstance(tasks, dict):
        return tree
    pretrained = isinstance(model, dict) and "pretrained" in model
    file = str((stored / "tokenizer.json").absolute())

    def reads_tokenizer(task: Any) -> bool:
        if not isinstance(task, dict):
            return False
        if TOKENIZER_TASK_KEY in task:
            return task[TOKENIZER_TASK_KEY] not in (None, "", "bytes")
        return pretrained and task.get("task") in FILE_TASKS

    new_tasks = {name: {**task, TOKENIZER_TASK_KEY: file} if reads_tokenizer(task) else task
                 for name, task in tasks.items()}
    return {**tree, "data": {**data, "tasks": new_tasks}}
