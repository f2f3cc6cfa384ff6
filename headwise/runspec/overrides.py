"""Command-line overrides of a spec: ``--seed N`` and ``--set path.to.key=value``.

An override changes the parsed spec mapping before it is validated, so a bad value is refused
exactly as in the file (``train.lr: got -1, expected ...``). ``--seed N`` is
``--set train.seed=N``. The value is read as YAML, the way the file reads it (``3e-4`` a
float, ``true`` a boolean, ``[a, b]`` a list, ``yes`` a string). A key path walks mappings by
key and lists by index (``data.tasks.copy.length=5``, ``contract.0.at_least=0.8``); a key
that contains dots (a head selector such as ``L0.H1``) is matched whole where the spec has it.

The spec with overrides has text of its own (``spec_text``): the mapping written back as YAML
under a comment naming the overrides. A run stores that text as its ``spec.yaml``, so the run's
spec is what was trained, and a resume with other overrides is refused like another file.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import yaml

import headwise.validate as check
from headwise.errors import SpecError, show
from headwise.runspec import Spec, spec_from_dict
from headwise.runspec.yaml_io import MAX_BYTES, MAX_DEPTH, parse_value, parse_yaml, read_spec_text


def overrides_of(sets: Sequence[str] | None, seed: int | None) -> tuple[str, ...]:
    """The ``--set`` items with ``--seed N`` as ``train.seed=N`` last (it wins).

    Raises:
        SpecError: a ``--seed`` that is not an integer in [0, 2^63) (``validate.seed``).
    """
    items = tuple(sets or ())
    if seed is None:
        return items
    return (*items, f"train.seed={check.seed(seed, '--seed')}")


def apply_overrides(data: dict[str, Any], overrides: Sequence[str]) -> dict[str, Any]:
    """``data`` (a parsed spec mapping, changed in place) with each ``key=value`` applied.

    Raises:
        SpecError: an item without ``=`` or key, a value that is not YAML, or a path through
            something that is neither a mapping nor a list (naming the ``--set`` item).
    """
    for item in overrides:
        key, sep, raw = item.partition("=")
        if not sep or not key.strip(".") or len(item) > MAX_BYTES:
            raise SpecError(f"--set: got {show(item, 120)}, expected path.to.key=value "
                            "(e.g. train.lr=3e-4)")
        if not item.isprintable():  # a spec's text is printed back, and stored
            raise SpecError(f"--set: got {show(item, 120)}, which holds control characters; "
                            "expected printable text")
        if key.count(".") >= MAX_DEPTH:  # each part is matched against the keys on its way
            raise SpecError(f"--set: the key {show(key, 80)} has {key.count('.') + 1} parts, "
                            f"expected at most {MAX_DEPTH}")
        _assign(data, key, _value(key, raw))
    return data


def spec_text(data: dict[str, Any], overrides: Sequence[str]) -> str:
    """The YAML text of a spec mapping with ``overrides`` applied, under a comment naming them."""
    names = " ".join(f"--set {o}" for o in overrides)
    body = yaml.safe_dump(data, sort_keys=False, allow_unicode=True, width=100)
    return f"# the spec with {names} (headwise train/demo)\n{body}"


def text_with_overrides(text: str, name: str, overrides: Sequence[str]) -> str:
    """``text`` itself without overrides; else the spec's text with them applied.

    Raises:
        SpecError: the text is not a valid spec mapping, or an override is malformed.
    """
    if not overrides:
        return text
    return spec_text(apply_overrides(parse_yaml(text, name), overrides), overrides)


def load_spec_with(source: str | Path, overrides: Sequence[str],
                   reads: Callable[[dict[str, Any]], dict[str, Any]] | None = None) -> Spec:
    """``load_spec(source)`` with ``overrides`` applied (its ``text``: ``text_with_overrides``).

    Args:
        reads: maps the parsed mapping to the one validated, which reads the files it names
            (a resumed run's copies of its data: ``headwise.pipeline.run_data``); the text
            stays the spec's.

    Raises:
        SpecError: as ``load_spec``, or a malformed override; a value the spec refuses names
            its field, as in the file.
    """
    text, name = read_spec_text(source)
    base = Path(name).parent if name != "<spec>" else None
    new = text_with_overrides(text, name, overrides)
    tree = parse_yaml(new, name)
    return spec_from_dict(reads(tree) if reads else tree, base=base, text=new)


def _value(key: str, raw: str) -> Any:
    """The value of one ``--set`` item, read as the spec file is (``parse_value``: the same
    bounds on nesting, aliases and integers)."""
    if not raw.strip():
        return None
    name = f"--set {show(key, 80)[1:-1]}"
    return parse_value(raw, name, name)  # fields inside the value: "--set KEY[0]", "--set KEY.k"


def _assign(data: dict[str, Any], key: str, value: Any) -> None:
    """Set ``key`` (dotted path) in ``data``, creating mappings on the way."""
    parts = key.split(".")
    node: Any = data
    k: Any
    i = 0
    while True:
        where = ".".join(parts[:i]) or "the spec"
        if isinstance(node, list):
            index = parts[i]
            if not index.isdigit() or int(index) >= len(node):
                raise SpecError(f"--set {key}: {where} is a list of {len(node)}; expected an "
                                f"index in [0, {len(node) - 1}], got {show(index, 40)}")
            j, k = i + 1, int(index)
        elif isinstance(node, dict):
            j = next((j for j in range(len(parts), i, -1)
                      if ".".join(parts[i:j]) in node), i + 1)
            k = ".".join(parts[i:j])
        else:
            raise SpecError(f"--set {key}: {where} is {show(node, 40)}, expected a mapping or "
                            "a list to set a key in")
        if j == len(parts):
            node[k] = value
            return
        if isinstance(node, dict) and node.get(k) is None:
            node[k] = {}
        node, i = node[k], j
