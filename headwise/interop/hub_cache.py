"""Resolve a HuggingFace model id (``gpt2``, ``org/name``) to its snapshot in the local HF cache.

Users point ``transformers`` at an id, not at a snapshot path; this module finds the directory
that ``from_pretrained(id, local_files_only=True)`` would read, without any network access and
without ``huggingface_hub``. The cache root is chosen as ``huggingface_hub`` chooses it:
``HF_HUB_CACHE`` (or its legacy name ``HUGGINGFACE_HUB_CACHE``), else ``$HF_HOME/hub``, else
``$XDG_CACHE_HOME/huggingface/hub``, else ``~/.cache/huggingface/hub``. Its layout::

    <root>/models--<org>--<name>/refs/<revision>        # a file holding the commit hash
    <root>/models--<org>--<name>/snapshots/<commit>/    # config.json, model.safetensors, ...

A revision is a branch or tag (``main`` by default; read from ``refs/``) or a commit hash (a
directory under ``snapshots/``). An existing local directory always wins over an id of the same
spelling, as in ``transformers``.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

from headwise.atomic import CHECKPOINT, RUN, work_in
from headwise.errors import CheckpointError, show

# An HF repo id: ``name`` or ``org/name`` (letters, digits, ``-_.``; no ``..`` or ``--``).
_REPO_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*(/[A-Za-z0-9][A-Za-z0-9._-]*)?")
_REVISION = re.compile(r"[A-Za-z0-9._/-]+")
_COMMIT = re.compile(r"[0-9a-f]{40}")
MAX_ID_CHARS = 2 * 96 + 1
MAX_REF_BYTES = 256  # a ref file holds a 40-hex commit hash


def hub_cache_dir() -> Path:
    """The HF hub cache root ``huggingface_hub`` would use (it need not exist)."""
    env = os.environ
    for name in ("HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE"):
        if env.get(name):
            return _expand(env[name])
    if env.get("HF_HOME"):
        return _expand(env["HF_HOME"]) / "hub"
    if env.get("XDG_CACHE_HOME"):
        return _expand(env["XDG_CACHE_HOME"]) / "huggingface" / "hub"
    return Path.home() / ".cache" / "huggingface" / "hub"


def _expand(value: str) -> Path:
    return Path(os.path.expandvars(os.path.expanduser(value)))


def is_repo_id(name: str) -> bool:
    """Whether ``name`` is spelled like an HF model id (``gpt2``, ``org/name``; the Hub allows
    at most 96 characters for each part)."""
    return (len(name) <= MAX_ID_CHARS and bool(_REPO_ID.fullmatch(name)) and ".." not in name
            and "--" not in name)


def snapshot_dir(repo_id: str, revision: str | None = None, *, field: str = "--hf",
                 revision_field: str = "--revision") -> Path:
    """The cached snapshot directory of ``repo_id`` at ``revision`` (default ``main``).

    Args:
        repo_id: ``name`` or ``org/name``.
        revision: a branch or tag name in ``refs/``, or a 40-hex commit hash.
        field: how the caller names the id in errors (``--hf``, ``model.pretrained.id``).
        revision_field: how the caller names the revision in errors.

    Raises:
        CheckpointError: a malformed id or revision, or the id/revision is not in the cache;
            the message names the directory (or ref file) that was looked for.
    """
    if not is_repo_id(repo_id):
        raise CheckpointError(f"{field}: got {show(repo_id, 120)}, expected a local directory "
                              "or a model id such as 'gpt2' or 'org/name'")
    rev = "main" if revision is None else revision
    if not _REVISION.fullmatch(rev) or ".." in rev.split("/"):
        raise CheckpointError(f"{revision_field}: got {rev!r}, expected a branch, tag or "
                              "commit hash")
    root = hub_cache_dir()
    repo = root / ("models--" + repo_id.replace("/", "--"))
    if not repo.is_dir():
        raise CheckpointError(f"{field}: {repo_id!r} is neither a local directory nor in the "
                              f"local HuggingFace cache (looked for {repo}; set HF_HUB_CACHE "
                              "or HF_HOME to use another cache; nothing is downloaded)")
    if _COMMIT.fullmatch(rev) and (repo / "snapshots" / rev).is_dir():
        return repo / "snapshots" / rev
    ref = repo / "refs" / rev
    if not ref.is_file():
        raise CheckpointError(f"{revision_field}: {rev!r} of {repo_id!r} is not in the local "
                              f"HuggingFace cache (looked for {ref} and "
                              f"{repo / 'snapshots' / rev})")
    raw = ref.read_bytes()[:MAX_REF_BYTES]
    commit = raw.decode("ascii", errors="replace").strip()
    if not _COMMIT.fullmatch(commit):
        raise CheckpointError(f"{field}: {ref} holds {show(commit, 60)}, expected a 40-hex "
                              "commit hash (a damaged cache?)")
    snapshot = repo / "snapshots" / commit
    if not snapshot.is_dir():
        raise CheckpointError(f"{field}: {ref} names commit {commit!r}, but {snapshot} does not "
                              "exist (an incomplete download?)")
    return snapshot


def resolve_model(path_or_id: str | Path, revision: str | None = None, *,
                  field: str = "--hf", revision_field: str = "--revision") -> Path:
    """A local HF model directory: ``path_or_id`` itself if it is a directory, else the cached
    snapshot of the model id it spells (see ``snapshot_dir``).

    Raises:
        CheckpointError: neither an existing directory nor a cached id (naming where it looked),
            or a ``revision`` given with a directory.
    """
    path = Path(path_or_id).expanduser()
    try:
        is_dir = path.is_dir()
    except OSError as e:  # a name longer than the system allows
        raise CheckpointError(f"{field}: {show(str(path_or_id), 120)} cannot be a directory "
                              f"({e.strerror}); expected a local directory or a model id "
                              "such as 'gpt2' or 'org/name'") from None
    if is_dir:
        if work_in(path) in (RUN, CHECKPOINT):
            raise CheckpointError(f"{field}: {path} is {work_in(path)}, not a HuggingFace "
                                  "checkpoint; expected a directory with config.json (analyze a "
                                  "run with `headwise analyze RUN`, export it with `headwise "
                                  "export RUN --hf DIR`)")
        if revision is not None:
            raise CheckpointError(f"{revision_field}: got {revision!r} with the local directory "
                                  f"{path}; a revision applies only to a model id")
        return path
    return snapshot_dir(str(path_or_id), revision, field=field, revision_field=revision_field)
