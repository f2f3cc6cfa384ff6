"""Reading spec YAML safely and as people write it: bounded, YAML 1.2 booleans, no duplicates.

- Safe loader only; nothing names code to import.
- YAML 1.2 booleans: only ``true``/``false`` (any case form PyYAML accepts for them) are
  booleans; ``yes``, ``no``, ``on``, ``off`` stay strings, as keys and as values (YAML 1.1 would
  turn the clause key ``on:`` into ``True``).
- ``3e-4`` (no dot) is a float, as people expect (YAML 1.1 reads it as a string).
- Numbers are decimal: YAML 1.1's other integer and float forms, which read as something else
  than they look (``010`` is 8, octal; ``1:00`` is 60, base 60) or than YAML 1.2 reads
  (``0x4``, ``0b100``, ``3_0``, ``1_000.5``), are refused naming their field
  (``decimal_only``); quoted, they are text.
- Bounded: the text is at most ``MAX_BYTES``; before any value is built, the node graph is
  walked with aliases expanded, and more than ``MAX_ALIASES`` alias uses, ``MAX_NODES`` expanded
  nodes or ``MAX_DEPTH`` levels of nesting are refused, so an alias bomb or a 20000-deep list
  costs milliseconds, not gigabytes. Integers longer than ``MAX_INT_DIGITS`` digits are refused.
- Duplicate keys are refused with the field path (``train.steps: duplicate key (line 9)``).
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import yaml

from headwise.errors import SpecError, show

MAX_BYTES = 1 << 20
MAX_ALIASES = 1000
MAX_NODES = 100_000
MAX_DEPTH = 64
MAX_INT_DIGITS = 30
_BOOL = "tag:yaml.org,2002:bool"
_INT, _FLOAT = "tag:yaml.org,2002:int", "tag:yaml.org,2002:float"
_DECIMAL = {_INT: re.compile(r"[-+]?(?:0|[1-9][0-9]*)"),
            _FLOAT: re.compile(r"[-+]?(?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:[eE][-+]?[0-9]+)?"
                               r"|[-+]?\.(?:inf|Inf|INF)|\.(?:nan|NaN|NAN)")}


class SpecLoader(yaml.SafeLoader):
    """``yaml.SafeLoader`` with YAML 1.2 booleans, ``1e-3`` floats, bounded integers and no
    duplicate keys."""


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
            raise SpecError(f"{show(key, 80)}: duplicate key (line "
                            f"{key_node.start_mark.line + 1}); expected each key once")
        seen[key] = loader.construct_object(value_node, deep=deep)
    return seen


def _bounded_int(loader: SpecLoader, node: yaml.ScalarNode) -> int:
    digits = sum(c.isdigit() for c in str(node.value))
    if digits > MAX_INT_DIGITS:
        raise SpecError(f"line {node.start_mark.line + 1}: an integer with {digits} digits; "
                        f"expected at most {MAX_INT_DIGITS} digits")
    return int(loader.construct_yaml_int(node))


SpecLoader.add_constructor(
    yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _mapping_no_duplicates)
SpecLoader.add_constructor("tag:yaml.org,2002:int", _bounded_int)
SpecLoader.yaml_implicit_resolvers = {  # YAML 1.1's yes/no/on/off are not booleans
    first: [(tag, rx) for tag, rx in resolvers if tag != _BOOL]
    for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()}
SpecLoader.add_implicit_resolver(
    _BOOL, re.compile(r"^(?:true|True|TRUE|false|False|FALSE)$"), list("tTfF"))
SpecLoader.add_implicit_resolver(
    "tag:yaml.org,2002:float",
    re.compile(r"^[-+]?(?:[0-9][0-9_]*)(?:\.[0-9_]*)?[eE][-+]?[0-9]+$"),
    list("-+0123456789"),
)


def decimal_only(node: yaml.Node, field: str) -> None:
    """Refuse a number YAML 1.1 reads in a form other than decimal: octal (``010`` is 8),
    hexadecimal (``0x4``), binary (``0b100``), base 60 (``1:00`` is 60) or with digit
    separators (``3_0``, ``1_000.5``). Decimal integers (``10``, ``-3``) and floats
    (``3.0e-3``, ``1e-3``, ``.5``, ``.inf``) pass.

    Raises:
        SpecError: naming ``field``, the form, and that a decimal number was expected.
    """
    pattern = _DECIMAL.get(node.tag) if isinstance(node, yaml.ScalarNode) else None
    if pattern is None or pattern.fullmatch(node.value):
        return
    text = str(node.value)
    low = text.lower().lstrip("+-")
    kind = ("base-60 (sexagesimal)" if ":" in text else "digit-separated" if "_" in text
            else "hexadecimal" if low.startswith("0x") else "binary" if low.startswith("0b")
            else "octal" if low.startswith("0") else "non-decimal")
    raise SpecError(f"{field}: got {_printable(text, 40)}, a YAML 1.1 {kind} number; expected "
                    "a decimal number (e.g. 10, -3, 0.5, 1e-3), or quoted text")


def read_spec_text(source: str | Path) -> tuple[str, str]:
    """The YAML text of a spec and a name for messages.

    ``source`` is a path (``Path``, or a string without newlines naming a file) or YAML text.

    Raises:
        SpecError: the file is missing, unreadable, larger than ``MAX_BYTES`` or not UTF-8.
    """
    if isinstance(source, Path) or ("\n" not in source and source.endswith((".yaml", ".yml"))):
        path = Path(source)
        if path.is_dir():
            raise SpecError(f"{path}: is a directory, expected a YAML spec file")
        if not path.is_file():
            raise SpecError(f"{path}: no such spec file")
        try:
            if path.stat().st_size > MAX_BYTES:
                raise SpecError(f"{path}: {path.stat().st_size} bytes, expected a spec of at "
                                f"most {MAX_BYTES} bytes")
            return path.read_text(encoding="utf-8"), str(path)
        except (OSError, UnicodeDecodeError) as e:
            raise SpecError(f"{path}: cannot read the spec ({str(e)[:200]})") from None
    if len(source) > MAX_BYTES:
        raise SpecError(f"<spec>: {len(source)} characters, expected at most {MAX_BYTES}")
    return source, "<spec>"


def check_bounds(root: yaml.Node, name: str, prefix: str = "") -> None:
    """Walk the composed node graph (aliases expanded) and refuse what is too big to build.

    Also refuses duplicate scalar keys and numbers that are not decimal (``decimal_only``),
    naming the field path (below ``prefix``, the root's: a ``--set`` value's name).

    Raises:
        SpecError: too many alias uses, expanded nodes or levels, a duplicate key, or a
            number in a YAML 1.1 form other than decimal.
    """
    seen: set[int] = set()
    aliases = nodes = 0
    stack: list[tuple[yaml.Node, str, int]] = [(root, prefix, 1)]
    while stack:
        node, path, depth = stack.pop()
        nodes += 1
        if id(node) in seen and isinstance(node, (yaml.MappingNode, yaml.SequenceNode)):
            aliases += 1
            if aliases > MAX_ALIASES:
                raise SpecError(f"{name}: more than {MAX_ALIASES} uses of YAML aliases "
                                "(*name); expected a spec without alias expansion bombs")
        seen.add(id(node))
        if nodes > MAX_NODES:
            raise SpecError(f"{name}: more than {MAX_NODES} values once aliases are expanded; "
                            "expected a smaller spec")
        if depth > MAX_DEPTH:
            raise SpecError(f"{(path or name)[:120]}: nested more than {MAX_DEPTH} levels deep; "
                            "expected a flatter spec")
        if isinstance(node, yaml.ScalarNode):
            decimal_only(node, show(path, 120)[1:-1] if path else name)
        elif isinstance(node, yaml.SequenceNode):
            stack.extend((child, f"{path}[{i}]", depth + 1)
                         for i, child in enumerate(node.value))
        elif isinstance(node, yaml.MappingNode):
            keys: dict[str, int] = {}
            for key, value in node.value:
                if isinstance(key, yaml.ScalarNode) and key.tag != "tag:yaml.org,2002:merge":
                    field = f"{path}.{key.value}" if path else str(key.value)
                    line = key.start_mark.line + 1
                    if key.value in keys:
                        raise SpecError(f"{show(field, 120)[1:-1]}: duplicate key (lines "
                                        f"{keys[key.value]} and {line}); expected each key "
                                        "once")
                    keys[key.value] = line
                else:
                    field = path
                stack.append((key, path, depth + 1))
                stack.append((value, field, depth + 1))


def parse_yaml(text: str, name: str) -> dict[str, Any]:
    """Parse YAML text into a top-level mapping (bounded; see the module docstring).

    Raises:
        SpecError: empty text, invalid YAML (with line and column), a spec over the bounds,
            or not a mapping.
    """
    if not text.strip() or all(not line.strip() or line.lstrip().startswith("#")
                                for line in text.splitlines()):
        raise SpecError(f"{name}: the spec is empty; expected a mapping with keys "
                        "model, data, train, heads, gates, adapters, contract")
    data = parse_value(text, name)
    if data is None:
        raise SpecError(f"{name}: the spec is empty; expected a mapping")
    if not isinstance(data, dict):
        raise SpecError(f"{name}: the top level is a {type(data).__name__}, expected a mapping "
                        "with keys model, data, train, heads, gates, adapters, contract")
    return data


def _printable(text: str, limit: int) -> str:
    """``text`` cut to ``limit`` characters, control characters escaped (a terminal obeys
    them)."""
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in text[:limit])


def parse_value(text: str, name: str, prefix: str = "") -> Any:
    """Parse one YAML document (a spec, or a ``--set`` value) with the same bounds; field
    paths in messages start with ``prefix`` (``check_bounds``).

    Raises:
        SpecError: invalid YAML (with line and column), a document over the bounds, or a
            value YAML cannot represent (an impossible date), the message starting with
            ``name``.
    """
    loader = None
    try:
        loader = SpecLoader(text)
        node = loader.get_single_node()
        if node is None:
            return None
        check_bounds(node, name, prefix)
        return loader.construct_document(node)
    except yaml.MarkedYAMLError as e:
        mark = e.problem_mark
        where = f"line {mark.line + 1}, column {mark.column + 1}: " if mark else ""
        line = text.splitlines()[mark.line] if mark and mark.line < len(text.splitlines()) else ""
        hint = ("; a head selector starting with '*' must be quoted, e.g. \"*.H0\""
                if line.strip().startswith("*") else "")
        raise SpecError(f"{name}: not valid YAML ({where}{_printable(str(e.problem), 120)}){hint}"
                        ) from None
    except yaml.YAMLError as e:
        raise SpecError(f"{name}: not valid YAML ({_printable(str(e), 200)})") from None
    except RecursionError:
        raise SpecError(f"{name}: nested more than {MAX_DEPTH} levels deep; expected a "
                        "flatter spec") from None
    except (ValueError, OverflowError) as e:  # e.g. a timestamp or number out of range
        if isinstance(e, SpecError):
            raise
        raise SpecError(f"{name}: a value YAML cannot represent ({str(e)[:200]})") from None
    finally:
        if loader is not None:
            loader.dispose()
