"""Validators for fields of user input (specs, contracts): each raises SpecError naming the field.

Message form (``headwise.errors``): ``<path>: got <value>, expected <what>``. Unknown keys are
reported with the closest valid key (``difflib``) and the list of valid keys.
"""

from __future__ import annotations

import dataclasses
import math
import types
import typing
from collections.abc import Iterable, Mapping
from typing import Any, Literal, TypeVar, Union, get_args, get_origin

from headwise.errors import HeadwiseError, SpecError, did_you_mean

T = TypeVar("T")
# Integers in specs are sizes, counts, steps and seeds: anything past 2**53 is a typo or an
# attack (and past float precision).
MAX_INT = 2**53
# Seeds seed ``torch.Generator.manual_seed`` (64 bits); below 2**63, the draws after a seed
# (``seed + k``) fit it too.
MAX_SEED = 2**63


def fail(path: str, value: object, expected: str) -> SpecError:
    """The standard error: ``path: got VALUE, expected EXPECTED``."""
    return SpecError(f"{path}: got {_show(value)}, expected {expected}")


def _show(value: object) -> str:
    if isinstance(value, Mapping):
        return "a mapping" if value else "an empty mapping"
    if isinstance(value, list):
        return "a list" if value else "an empty list"
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


MAX_NAME_CHARS = 200  # names head tables, plot axes and file lines: a label, not a text


def printable_name(value: object, path: str, what: str = "a name") -> str:
    """A non-empty string of at most ``MAX_NAME_CHARS`` printable characters: names are
    printed to terminals (where a control character, an escape sequence, would be obeyed, not
    shown) and drawn on plots (where a 500000-character label costs gigabytes)."""
    if (not isinstance(value, str) or not value or len(value) > MAX_NAME_CHARS
            or not value.isprintable()):
        raise fail(path, value, f"{what} of 1 to {MAX_NAME_CHARS} printable characters")
    return value


def mapping(value: object, path: str, what: str = "a mapping") -> dict[str, Any]:
    """``value`` as a dict with string keys."""
    if not isinstance(value, Mapping):
        raise fail(path, value, what)
    for key in value:
        if not isinstance(key, str):
            raise SpecError(f"{path}: key {key!r} is a {type(key).__name__}, expected a string")
    return dict(value)


def keys(data: Mapping[str, Any], allowed: Iterable[str], path: str,
         required: Iterable[str] = ()) -> None:
    """Reject unknown keys (suggesting the closest allowed one) and missing required keys."""
    allowed = list(allowed)
    for key in data:
        if key not in allowed:
            extra = did_you_mean(key, allowed)
            raise SpecError(f"{join(path, key)}: unknown key{extra}; expected one of "
                            f"{sorted(allowed)}")
    for key in required:
        if key not in data:
            raise SpecError(f"{join(path, key)}: missing; this key is required")


def join(path: str, key: str | int) -> str:
    """``join("data.tasks", "copy") == "data.tasks.copy"``; ints become ``[i]``."""
    if isinstance(key, int):
        return f"{path}[{key}]"
    if len(key) > 80:  # a hostile 10000-character key must not flood the message
        key = key[:77] + "..."
    return f"{path}.{key}" if path else key


def integer(value: object, path: str, minimum: int | None = None,
            maximum: int | None = None) -> int:
    """An int (not a bool) within the bounds."""
    bounds = _bounds(minimum, maximum)
    if isinstance(value, bool) or not isinstance(value, int):
        raise fail(path, value, f"an integer{bounds}")
    if abs(value) > MAX_INT:
        raise fail(path, value, f"an integer{bounds} of magnitude <= 2**53")
    if (minimum is not None and value < minimum) or (maximum is not None and value > maximum):
        raise fail(path, value, f"an integer{bounds}")
    return value


def seed(value: object, path: str) -> int:
    """A seed: an int (not a bool) in [0, ``MAX_SEED``), the one rule of every seed given on
    the command line (``--seed``, ``verify --fresh``)."""
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < MAX_SEED:
        raise fail(path, value, "an integer in [0, 2^63)")
    return value


def number(value: object, path: str, minimum: float | None = None,
           maximum: float | None = None, positive: bool = False) -> float:
    """A real number (int or float, not bool) within the bounds."""
    bounds = " > 0" if positive else _bounds(minimum, maximum)
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise fail(path, value, f"a number{bounds}")
    if isinstance(value, int) and abs(value) > MAX_INT or not math.isfinite(value):
        raise fail(path, value, f"a finite number{bounds}")
    if ((positive and value <= 0) or (minimum is not None and value < minimum)
            or (maximum is not None and value > maximum)):
        raise fail(path, value, f"a number{bounds}")
    return float(value)


def boolean(value: object, path: str) -> bool:
    """``true`` or ``false``."""
    if not isinstance(value, bool):
        raise fail(path, value, "true or false")
    return value


def string(value: object, path: str, choices: Iterable[str] | None = None) -> str:
    """A string, optionally one of ``choices`` (suggesting the closest on a miss)."""
    if choices is None:
        if not isinstance(value, str) or not value:
            raise fail(path, value, "a non-empty string")
        return value
    options = list(choices)
    if not isinstance(value, str) or value not in options:
        extra = did_you_mean(value, options)
        raise SpecError(f"{path}: got {_show(value)}, expected one of {options}{extra}")
    return value


def string_list(value: object, path: str, choices: Iterable[str] | None = None,
                allow_single: bool = True) -> tuple[str, ...]:
    """A non-empty list of strings (a single string is a one-item list)."""
    if allow_single and isinstance(value, str):
        value = [value]
    if not isinstance(value, list) or not value:
        raise fail(path, value, "a non-empty list of strings")
    return tuple(string(v, join(path, i), choices) for i, v in enumerate(value))


def _bounds(minimum: float | None, maximum: float | None) -> str:
    if minimum is not None and maximum is not None:
        return f" in [{minimum}, {maximum}]"
    if minimum is not None:
        return f" >= {minimum}"
    if maximum is not None:
        return f" <= {maximum}"
    return ""


def dataclass_from(cls: type[T], data: object, path: str, skip: Iterable[str] = (),
                   strip: str = "") -> T:
    """Build a frozen dataclass from a mapping, checking keys and simple field types.

    Field types ``int``, ``float``, ``bool``, ``str``, ``Literal[...]`` and optionals of them are
    checked here with the field path; the class's own validation runs afterwards and its
    errors are re-raised as SpecError under ``path`` (after removing a leading ``strip``, the
    class's own prefix such as ``"copy."``).

    Raises:
        SpecError: unknown key (with suggestion), wrong type, or a value the class rejects.
    """
    data = mapping(data, path)
    assert dataclasses.is_dataclass(cls)
    skip = set(skip)
    names = [f.name for f in dataclasses.fields(cls) if f.init and f.name not in skip]
    keys(data, names, path)
    for f in dataclasses.fields(cls):
        if (f.init and f.name not in data and f.default is dataclasses.MISSING
                and f.default_factory is dataclasses.MISSING):
            raise SpecError(f"{join(path, f.name)}: missing; this key is required")
    hints = typing.get_type_hints(cls)
    for key, value in data.items():
        _check_type(value, hints.get(key, Any), join(path, key))
    try:
        return cls(**data)
    except HeadwiseError as e:
        text = str(e)
        if strip and text.startswith(strip):
            text = text[len(strip):]
        raise SpecError(text if text.startswith(path) else f"{path}.{text}") from None
    except (TypeError, ValueError) as e:
        raise SpecError(f"{path}: {e}") from None


def _check_type(value: object, hint: Any, path: str) -> None:
    origin = get_origin(hint)
    if origin in (Union, types.UnionType):
        options = get_args(hint)
        if value is None and type(None) in options:
            return
        errors = []
        for option in options:
            if option is type(None):
                continue
            try:
                _check_type(value, option, path)
                return
            except SpecError as e:
                errors.append(str(e).split(", expected ", 1)[-1])
        raise fail(path, value, " or ".join(errors))
    if origin is Literal:
        string(value, path, [str(a) for a in get_args(hint)])
    elif hint is bool:
        boolean(value, path)
    elif hint is int:
        integer(value, path)
    elif hint is float:
        number(value, path)
    elif hint is str:
        string(value, path)
