"""Reading spec YAML safely: safe loader only, duplicate keys rejected, ``1e-3`` read as a float.

PyYAML follows YAML 1.1, where ``3e-4`` (no dot) is a string; specs are written by people who
expect a number, so the loader also resolves that form as a float.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import yaml

from headwise.errors import SpecError


class SpecLoader(yaml.SafeLoader):
    """``yaml.SafeLoader`` that rejects duplicate keys and reads ``1e-3`` as a float."""


def _mapping_no_duplicates(loader: SpecLoader, node: yaml.MappingNode,
                           deep: bool = False) -> dict[Any, Any]:
    loader.flatten_mapping(node)
    seen: dict[Any, Any] = {}
    for key_node, value_node in node.value:
        key = loader.construct_object(key_node, deep=deep)
        try:
            duplicate = key in seen
        except TypeError:  # an unhashable key, e.g. a list
            raise SpecError(f"line {key_node.start_mark.line + 1}: a mapping key must be a "
                            f"string, got {type(key).__name__}") from None
        if duplicate:
            raise SpecError(f"{key}: duplicate key (line {key_node.start_mark.line + 1}); "
                            "expected each key once")
        seen[key] = loader.construct_object(value_node, deep=deep)
    return seen


SpecLoader.add_constructor(
    yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _mapping_no_duplicates)
SpecLoader.add_implicit_resolver(
    "tag:yaml.org,2002:float",
    re.compile(r"^[-+]?(?:[0-9][0-9_]*)(?:\.[0-9_]*)?[eE][-+]?[0-9]+$"),
    list("-+0123456789"),
)


def read_spec_text(source: str | Path) -> tuple[str, str]:
    """The YAML text of a spec and a name for messages.

    ``source`` is a path (``Path``, or a string without newlines naming a file) or YAML text.

    Raises:
        SpecError: the file is missing, unreadable or not UTF-8.
    """
    if isinstance(source, Path) or ("\n" not in source and source.endswith((".yaml", ".yml"))):
        path = Path(source)
        if path.is_dir():
            raise SpecError(f"{path}: is a directory, expected a YAML spec file")
        if not path.is_file():
            raise SpecError(f"{path}: no such spec file")
        try:
            return path.read_text(encoding="utf-8"), str(path)
        except (OSError, UnicodeDecodeError) as e:
            raise SpecError(f"{path}: cannot read the spec ({e})") from None
    return source, "<spec>"


def parse_yaml(text: str, name: str) -> dict[str, Any]:
    """Parse YAML text into a top-level mapping.

    Raises:
        SpecError: empty text, invalid YAML (with line and column), or not a mapping.
    """
    if not text.strip() or all(not line.strip() or line.lstrip().startswith("#")
                                for line in text.splitlines()):
        raise SpecError(f"{name}: the spec is empty; expected a mapping with keys "
                        "model, data, train, heads, gates, adapters, contract")
    try:
        data = yaml.load(text, Loader=SpecLoader)  # noqa: S506 - SafeLoader subclass
    except yaml.MarkedYAMLError as e:
        mark = e.problem_mark
        where = f"line {mark.line + 1}, column {mark.column + 1}: " if mark else ""
        line = text.splitlines()[mark.line] if mark and mark.line < len(text.splitlines()) else ""
        hint = ("; a head selector starting with '*' must be quoted, e.g. \"*.H0\""
                if line.strip().startswith("*") else "")
        raise SpecError(f"{name}: not valid YAML ({where}{e.problem}){hint}") from None
    except yaml.YAMLError as e:
        raise SpecError(f"{name}: not valid YAML ({e})") from None
    if data is None:
        raise SpecError(f"{name}: the spec is empty; expected a mapping")
    if not isinstance(data, dict):
        raise SpecError(f"{name}: the top level is a {type(data).__name__}, expected a mapping "
                        "with keys model, data, train, heads, gates, adapters, contract")
    return data
