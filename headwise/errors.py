"""Exception types: every user-facing error names the field or tensor and what was expected."""

from __future__ import annotations

from collections.abc import Iterable
from difflib import get_close_matches


class HeadwiseError(Exception):
    """Base class for errors caused by user input (CLI exit code 2)."""


class ConfigError(HeadwiseError, ValueError):
    """An invalid configuration value; the message names the field, value and what is allowed."""


class SelectorError(HeadwiseError, ValueError):
    """A malformed or out-of-range head selector; the message names the selector and model shape."""


class SpecError(HeadwiseError, ValueError):
    """An invalid YAML spec; the message starts with the field path (e.g. ``heads.L1.H9``)."""


class CheckpointError(HeadwiseError, ValueError):
    """A corrupt, truncated or mismatched checkpoint; the message names the file and key."""


def field_error(path: str, value: object, expected: str) -> ConfigError:
    """Build a ConfigError with the standard ``path: got VALUE, expected ...`` message."""
    return ConfigError(f"{path}: got {show(value)}, expected {expected}")


def did_you_mean(word: object, choices: Iterable[str]) -> str:
    """`` (did you mean 'x'?)`` naming the closest of ``choices`` to ``word``, or ``""``."""
    hint = get_close_matches(str(word), list(choices), n=1)
    return f" (did you mean {hint[0]!r}?)" if hint else ""


class StorageError(HeadwiseError, OSError):
    """A file could not be written (disk full, permissions); the message names the file."""


class TrainingDiverged(FloatingPointError):
    """The training loss became NaN or infinite (CLI exit code 1: the run failed, input was
    valid); the message names the step and the likely cause, and earlier checkpoints are kept.
    """


def show(value: object, limit: int = 200) -> str:
    """``repr(value)`` cut to ``limit`` characters, so a huge value never floods a message."""
    text = repr(value)
    return text if len(text) <= limit else f"{text[:limit - 3]}..."
