"""Sentence-transformers files in an export: what makes an exported folder a
sentence-transformers model again.

A sentence-transformers checkpoint is an HF model directory plus ``modules.json`` (the
pipeline: ``[{"idx", "name", "path", "type"}, ...]``, e.g. Transformer at ``""``, Pooling at
``1_Pooling``, Normalize at ``2_Normalize``), ``sentence_bert_config.json`` (the Transformer
module's ``max_seq_length``, ``do_lower_case``), ``config_sentence_transformers.json`` (versions,
prompts, similarity function) and one directory per later module holding its config (and
weights, for a ``Dense`` module). headwise changes only the Transformer module's weights, which
the export writes at the folder's root, so every other file is copied byte for byte: the
pooling, normalisation and dense layers after the Transformer stay what they were. A module
without files (``Normalize``) has no directory, as sentence-transformers saves it.

``sentence_transformers_files(source)`` reads them (refusing anything that would copy the
source's own transformer weights or a file from outside it) before an export writes anything;
``write_sentence_transformers_files(files, out)`` writes them after.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Any

from headwise.atomic import remove_entries, write_bytes_atomic
from headwise.errors import CheckpointError, show
from headwise.jsonfile import read_bounded

MODULES = "modules.json"
ROOT_FILES = (MODULES, "config_sentence_transformers.json", "sentence_bert_config.json")
MAX_FILE_BYTES = 1 << 30  # a Dense module's weights are megabytes
MAX_MODULES_BYTES = 1 << 20
_MODULE_DIR = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,99}")


def sentence_transformers_files(source: Path) -> dict[str, bytes]:
    """``relative path -> bytes`` of the sentence-transformers files of the HF directory
    ``source``; empty when it has no ``modules.json`` (not a sentence-transformers model).

    Raises:
        CheckpointError: a malformed ``modules.json`` (naming the entry and field), a
            Transformer module outside the root (its weights would not be the exported ones),
            a module directory holding a sub-directory, or a file that links outside
            ``source`` or is too large.
    """
    if not (source / MODULES).is_file():
        return {}
    root = _root(source)
    files = {name: _read(source / name, root) for name in ROOT_FILES if (source / name).exists()}
    for directory in _module_dirs(source, files[MODULES]):
        entries = sorted((source / directory).iterdir()) if (source / directory).is_dir() else []
        for entry in entries:
            if entry.is_dir() and not entry.is_symlink():
                raise CheckpointError(f"{entry}: a sub-directory of a sentence-transformers "
                                      "module; headwise exports modules of plain files only")
            files[f"{directory}/{entry.name}"] = _read(entry, root)
    return files


def write_sentence_transformers_files(files: dict[str, bytes], out: Path) -> None:
    """Write ``files`` (from ``sentence_transformers_files``) into ``out``, each atomically;
    earlier sentence-transformers files there are deleted first (an export replaces them)."""
    modules = {name.split("/", 1)[0] for name in files if "/" in name}
    remove_entries(out, [*ROOT_FILES, *sorted(modules)], keep=[n for n in files if "/" not in n],
                   directories=modules)
    for name, data in files.items():
        (out / name).parent.mkdir(parents=True, exist_ok=True)
        write_bytes_atomic(out / name, data)


def _module_dirs(source: Path, data: bytes) -> list[str]:
    """The directories of the modules after the Transformer, checked."""
    where = source / MODULES
    try:
        modules: Any = json.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError) as e:
        raise CheckpointError(f"{where}: not valid JSON ({str(e)[:200]})") from None
    if not isinstance(modules, list) or not all(isinstance(m, dict) for m in modules):
        raise CheckpointError(f"{where}: expected a list of module objects")
    out = []
    for i, module in enumerate(modules):
        path, kind = module.get("path"), module.get("type")
        if not isinstance(path, str) or not isinstance(kind, str):
            raise CheckpointError(f"{where}: [{i}]: expected string 'path' and 'type' fields")
        if kind.rpartition(".")[2] == "Transformer":
            if path != "":
                raise CheckpointError(f"{where}: [{i}].path: got {show(path)}, expected '' "
                                      "(the Transformer module at the root, whose weights "
                                      "headwise loads and exports)")
        elif path:
            if not _MODULE_DIR.fullmatch(path) or path in (".", ".."):
                raise CheckpointError(f"{where}: [{i}].path: got {show(path)}, expected a "
                                      "module directory name inside the checkpoint")
            out.append(path)
    return out


def _root(source: Path) -> Path:
    """What links may point into: ``source``, or for a snapshot of the HF cache, that model's
    cache folder (snapshots link to ``blobs/``)."""
    root = source.parent.parent if source.parent.name == "snapshots" else source
    return root.resolve()


def _read(file: Path, root: Path) -> bytes:
    real = file.resolve()
    if file.is_symlink() and not real.is_relative_to(root):
        raise CheckpointError(f"{file}: is a link to {real}, outside {root}; expected the "
                              "checkpoint's own file (headwise does not copy what links "
                              "elsewhere point to)")
    if not os.path.isfile(real):
        raise CheckpointError(f"{file}: not a regular file")
    limit = MAX_MODULES_BYTES if file.name == MODULES else MAX_FILE_BYTES
    return read_bounded(real, limit, "sentence-transformers file", CheckpointError)
