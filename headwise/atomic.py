"""Where and how headwise writes: atomic file writes, the output rule, and one writer per run.

**Atomic writes** (``write_bytes_atomic``): a file is written to a temporary sibling, flushed
and fsynced, then moved over the target with ``os.replace`` and the directory entry fsynced:
after a crash or a full disk either the whole new file is in place or the old one is untouched.
The target must be a regular file or absent: a symbolic link, a directory, a device, a FIFO or a
socket is refused, so a write never lands on what a link points to or turns a device into a
file.

**The output rule** (``check_output_file``, ``check_output_dir``, ``remove_entries``): every
command and library writer checks its destination before any work. An existing file of finished
work (a run, a checkpoint, a model export, an adapter) is never a file destination; a directory
holding finished work is replaced only when the caller allows that kind and the user passed
``--overwrite``; replacing deletes what it replaces, links included, never through them.

**One writer per run** (``hold_lock``): an advisory ``fcntl.flock`` on ``DIR/.headwise.lock``
held for the writer's life; a second writer is refused with one line naming the holder, and a
lock left by a killed process is free again (the kernel drops it with the process).

It sits in the foundation layer so that every package writes through it.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import shutil
import stat
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import BinaryIO

from headwise.errors import ConfigError, StorageError

LOCK_FILE = ".headwise.lock"
MAX_PATH_BYTES = 4096  # PATH_MAX on Linux
MAX_NAME_BYTES = 255  # NAME_MAX

# What marks a directory as finished work, in the order it is recognised (first match wins).
_WEIGHTS = ("model.safetensors", "model.safetensors.index.json", "pytorch_model.bin",
            "pytorch_model.bin.index.json")
RUN, CHECKPOINT, ADAPTER, MODEL = ("a headwise run", "a training checkpoint", "an adapter",
                                   "a model (config.json and weights)")


def fsync_dir(path: Path) -> None:
    """Flush a directory entry (after creating or renaming files in it)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def publish_dir(tmp: Path, final: Path) -> None:
    """Put the finished directory ``tmp`` at ``final`` in one rename (an existing ``final``, e.g.
    a step saved again after a resume, is moved aside first and removed after), then sync the
    parent so the rename is durable."""
    if final.exists():
        old = final.with_name(f".old-{final.name}-{os.getpid()}")
        os.replace(final, old)
        os.replace(tmp, final)
        shutil.rmtree(old)
    else:
        os.replace(tmp, final)
    fsync_dir(final.parent)


def write_bytes_atomic(path: Path, data: bytes) -> None:
    """Write ``data`` to ``path`` through a temporary file, fsync and ``os.replace``.

    Either the whole new file is in place afterwards or the old one is untouched.

    Raises:
        StorageError: ``path`` is a link, directory, device, FIFO or socket, or the file cannot
            be written (disk full, permissions), naming ``path``; the temporary file is removed.
    """
    _write_atomic(Path(path), lambda f: _write_all(f, data))


def copy_file_atomic(source: Path, path: Path) -> None:
    """Copy the file ``source`` to ``path`` as ``write_bytes_atomic`` writes, streamed (the
    file is never held in memory).

    Raises:
        StorageError: as ``write_bytes_atomic``, or ``source`` cannot be read, naming ``path``.
    """
    def copy(f: BinaryIO) -> None:
        with open(source, "rb") as src:
            shutil.copyfileobj(src, f, 1 << 20)

    _write_atomic(Path(path), copy)


def _write_atomic(path: Path, write: Callable[[BinaryIO], None]) -> None:
    kind = _special(path)
    if kind is not None:
        raise StorageError(f"{path}: is {kind}; expected a regular file path (headwise never "
                           "writes over or through it)")
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    try:
        with open(tmp, "wb") as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
        fsync_dir(path.parent)
    except (OSError, ValueError) as e:
        with contextlib.suppress(OSError, ValueError):
            tmp.unlink(missing_ok=True)
        reason = e.strerror if isinstance(e, OSError) and e.strerror else str(e)
        raise StorageError(f"{path}: cannot write ({reason}); files written before are "
                           "intact") from None


def _write_all(f: BinaryIO, data: bytes) -> None:
    """``f.write(data)`` (one place for tests to simulate a full disk)."""
    f.write(data)


def _special(path: Path) -> str | None:
    """What ``path`` is when it is not a regular file or absent: ``"a symbolic link"``, ..."""
    try:
        mode = os.lstat(path).st_mode
    except (FileNotFoundError, NotADirectoryError):
        return None
    except (OSError, ValueError) as e:
        return f"unusable ({e.strerror if isinstance(e, OSError) else e})"
    if stat.S_ISREG(mode):
        return None
    return ("a symbolic link" if stat.S_ISLNK(mode) else "a directory" if stat.S_ISDIR(mode)
            else "a FIFO" if stat.S_ISFIFO(mode) else "a socket" if stat.S_ISSOCK(mode)
            else "a device")


def check_path_text(path: str | Path, option: str) -> Path:
    """``path`` as a Path after refusing a NUL byte and names the system cannot hold.

    Raises:
        ConfigError: naming ``option``.
    """
    text = os.fspath(path)
    if "\x00" in text:
        raise ConfigError(f"{option}: the path contains a NUL byte; expected a file path")
    raw = os.fsencode(text)
    if len(raw) > MAX_PATH_BYTES or any(len(p) > MAX_NAME_BYTES for p in raw.split(b"/")):
        raise ConfigError(f"{option}: a path of {len(raw)} bytes; expected at most "
                          f"{MAX_PATH_BYTES} bytes with names of at most {MAX_NAME_BYTES}")
    return Path(text)


def work_in(directory: Path) -> str | None:
    """What finished work ``directory`` holds (``RUN``, ``CHECKPOINT``, ``ADAPTER``, ``MODEL``),
    or ``None``. Links count as present: a link named ``run.json`` marks a run too."""
    found = _work(Path(directory))
    return found[0] if found else None


def _work(d: Path) -> tuple[str, str] | None:
    """``(kind, the file that marks it)`` for ``work_in``."""
    def has(*names: str) -> str | None:
        return next((n for n in names if os.path.lexists(d / n)), None)

    if has("trainer.json"):
        return CHECKPOINT, "trainer.json"
    spec = has("spec.yaml")  # a spec.yaml alone is a user's spec, not a run
    if has("run.json") or spec and has("manifest.json", "checkpoints", "model.safetensors"):
        return RUN, spec or "run.json"
    if has("adapter_config.json"):
        return ADAPTER, "adapter_config.json"
    weights = has(*_WEIGHTS)
    if has("config.json") and weights:
        return MODEL, weights
    return None


def check_output_file(path: str | Path | None, option: str) -> Path | None:
    """Refuse, before any work, a file destination headwise must not write.

    Refused: a link (even a dangling one), a directory, a device, FIFO or socket, an existing
    file in a directory that holds finished work (``work_in``), a missing or unwritable
    directory. A new file beside finished work is allowed.

    Returns:
        ``path`` as a Path (``None`` for ``None``).

    Raises:
        ConfigError: naming ``option`` and the path.
    """
    if path is None:
        return None
    target = check_path_text(path, option)
    parent = target.parent
    kind = _special(target)
    if kind is not None:
        raise ConfigError(f"{option}: {target} is {kind}; expected a regular file path")
    work = work_in(parent) if parent.is_dir() else None
    if work is not None and target.exists():
        raise ConfigError(f"{option}: {target} is a file of {work} in {parent}; expected a "
                          "path outside it (or a new file name)")
    if not parent.is_dir():
        raise ConfigError(f"{option}: cannot write {target} (no directory {parent})")
    if not os.access(parent, os.W_OK) or (target.exists() and not os.access(target, os.W_OK)):
        raise ConfigError(f"{option}: cannot write {target} (permission denied)")
    return target


def overwrite_switch(option: str) -> str:
    """How the user who named a destination ``option`` asks to replace it: ``--overwrite``
    for a command's option (``--out``), ``overwrite=True`` for a Python argument (``out``)."""
    return "--overwrite" if option.startswith("--") else "overwrite=True"


def check_empty_dir(path: Path, option: str, overwrite: bool) -> None:
    """A directory destination that holds anything is written into only with ``overwrite``
    (whose writer then replaces its own files and leaves the rest).

    Raises:
        ConfigError: ``path`` is a non-empty directory and ``overwrite`` is false (the
            message names ``option`` and its ``overwrite_switch``).
    """
    if path.is_dir() and any(path.iterdir()) and not overwrite:
        raise ConfigError(f"{option}: {path} is not empty; choose another directory or pass "
                          f"{overwrite_switch(option)} to replace its HuggingFace files")


def check_output_dir(path: str | Path, option: str, *, overwrite: bool,
                     replaces: Iterable[str] = (), sources: Iterable[Path] = ()) -> str | None:
    """Refuse, before any work, a directory destination headwise must not write into.

    Args:
        path: the directory (created later by the caller if missing).
        option: the option that named it, for messages.
        overwrite: the user passed ``--overwrite`` (``overwrite=True``; messages name the one
            that matches ``option``: ``overwrite_switch``).
        replaces: the kinds of work (``work_in``) this writer may replace with ``overwrite``.
        sources: directories the command reads; the destination may not be one of them.

    Returns:
        The kind of work ``path`` holds (``None``: none, or missing).

    Raises:
        ConfigError: ``path`` is a link, a file or device, goes up (``..``) from a directory
            that does not exist, is one of ``sources``, is inside a run or a checkpoint, holds
            work of another kind, or holds work without ``overwrite``.
    """
    target = check_path_text(path, option)
    kind = _special(target) or ("a file" if target.exists() else None)
    if kind is not None and kind != "a directory":
        raise ConfigError(f"{option}: {target} is {kind}; expected a directory")
    parts = target.parts
    for i, part in enumerate(parts):  # creating a/b/.. would make the missing b first
        if part == ".." and i and not Path(*parts[:i]).is_dir():
            raise ConfigError(f"{option}: {target} goes up from {Path(*parts[:i])}, which is "
                              "not a directory; expected a path whose '..' follows an existing "
                              "directory")
    blocked = next((p for p in target.absolute().parents if os.path.lexists(p)), None)
    if blocked is not None and not blocked.is_dir():
        raise ConfigError(f"{option}: cannot create {target}: {blocked} is a file; expected "
                          "a path under a directory")
    for source in sources:
        if target.exists() and Path(source).exists() and target.resolve() == Path(
                source).resolve():
            raise ConfigError(f"{option}: {target} is the directory being read; expected "
                              "another directory")
    normal = Path(os.path.abspath(target))  # ``..`` resolved as the system will create it
    found = _work(normal) if normal.is_dir() else None
    if found is not None and found[0] not in replaces:
        raise ConfigError(f"{option}: {target} holds {found[0]} ({found[1]}); expected "
                          "another directory (this command never replaces it)")
    for above in normal.parents:  # at any depth: a run's checkpoints/ hold checkpoints
        outer = work_in(above)
        if outer in (RUN, CHECKPOINT):
            raise ConfigError(f"{option}: {target} is inside {outer} ({above}); expected a "
                              "directory outside it")
    if found is None:
        return None
    work, marker = found
    if not overwrite:
        raise ConfigError(f"{option}: {target} holds {work} ({marker}); pass "
                          f"{overwrite_switch(option)} to replace it, or choose another "
                          "directory")
    return work


def remove_entries(directory: Path, names: Iterable[str], keep: Iterable[str] = (),
                   directories: Iterable[str] = ()) -> None:
    """Delete ``directory/name`` for each name: files and links are unlinked (a link is never
    followed), the named ``directories`` removed with their contents.

    Args:
        directory: where the entries are.
        names: the entries to remove.
        keep: names the caller rewrites next with ``write_bytes_atomic``: kept when they are
            regular files, so a full disk during the rewrite leaves the old file in place.
        directories: the names among ``names`` that the writer makes as directories; any
            other name that is a directory is not the writer's and is refused (nothing is
            removed then).

    Raises:
        ConfigError: a directory where the writer puts a file (``refuse_directories``).
        StorageError: an entry cannot be removed, naming it.
    """
    names = list(names)
    allowed = set(directories)
    refuse_directories(directory, [n for n in names if n not in allowed])
    kept = set(keep)
    for name in names:
        entry = Path(directory) / name
        if name in kept and entry.is_file() and not entry.is_symlink():
            continue
        try:
            if entry.is_symlink() or not entry.is_dir():
                entry.unlink(missing_ok=True)
            else:
                shutil.rmtree(entry)
        except OSError as e:
            raise StorageError(f"{entry}: cannot remove ({e.strerror or e})") from None


def refuse_directories(directory: Path, files: Iterable[str]) -> None:
    """Refuse a directory (not a link to one) at a name where headwise writes a file:
    ``--overwrite`` replaces headwise's own files, never a directory and its contents.

    Raises:
        ConfigError: naming the first such directory.
    """
    for name in files:
        entry = Path(directory) / name
        if entry.is_dir() and not entry.is_symlink():
            raise ConfigError(f"{entry}: is a directory; expected the file headwise writes "
                              "there (--overwrite replaces its own files, never a directory: "
                              "move it away first)")


def linked_entries(directory: Path, names: Iterable[str]) -> list[str]:
    """The names among ``names`` that are symbolic links in ``directory``."""
    return [n for n in names if (Path(directory) / n).is_symlink()]


_HELD: dict[str, tuple[int, int]] = {}  # lock file -> (fd, depth): re-entrant in a process


@contextlib.contextmanager
def hold_lock(directory: Path, what: str = "this run") -> Iterator[None]:
    """Hold the writer's lock on ``directory`` (created if missing) for the ``with`` block.

    Re-entrant within one process. The lock file records the holder's process id, so a refusal
    names it; a process that was killed holds nothing (the kernel drops ``flock`` locks with
    the process), so its leftover lock file is taken over.

    Raises:
        StorageError: another process holds the lock (naming it and whether it still runs),
            or the lock file cannot be created.
    """
    directory = Path(directory)
    created = not directory.exists()
    try:
        directory.mkdir(parents=True, exist_ok=True)
        key = str((directory / LOCK_FILE).resolve())
    except OSError as e:
        raise StorageError(f"{directory}: cannot create the directory "
                           f"({e.strerror or e})") from None
    if key in _HELD:
        fd, depth = _HELD[key]
        _HELD[key] = (fd, depth + 1)
        try:
            yield
        finally:
            _HELD[key] = (fd, _HELD[key][1] - 1)
        return
    fresh = not os.path.lexists(directory / LOCK_FILE)
    fd = _acquire(directory / LOCK_FILE, what)
    _HELD[key] = (fd, 1)
    try:
        yield
    finally:
        del _HELD[key]
        with contextlib.suppress(OSError):  # a refused writer leaves nothing behind
            if created and [p.name for p in directory.iterdir()] == [LOCK_FILE]:
                (directory / LOCK_FILE).unlink()
                directory.rmdir()
            elif fresh and work_in(directory) is None:  # a user's directory, no work in it
                (directory / LOCK_FILE).unlink()
        os.close(fd)  # releases the flock; the file otherwise stays


def _acquire(lock: Path, what: str) -> int:
    if lock.is_symlink() or (lock.exists() and not lock.is_file()):
        raise StorageError(f"{lock}: is not a regular file; expected headwise's lock file")
    try:
        fd = os.open(lock, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o644)
    except OSError as e:
        raise StorageError(f"{lock}: cannot create the lock file ({e.strerror or e})") from None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = (os.pread(fd, 32, 0).decode("ascii", "replace").split() or [""])[0]
        os.close(fd)
        alive = holder.isdigit() and _running(int(holder))
        raise StorageError(
            f"{lock.parent}: another headwise process (pid {holder or 'unknown'}"
            f"{'' if alive else ', no longer running; a process it started still holds the lock'}"
            f") is writing {what}; wait for it to finish or choose another directory") from None
    os.ftruncate(fd, 0)
    os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
    return fd


def _running(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
