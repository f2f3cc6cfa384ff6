"""Rows of named string fields from a JSONL or CSV file, read exactly and refused by position.

A file is streamed line by line (``file_lines``): memory holds one line at a time, never the
file. Lines end in ``\\n`` only; each is decoded as UTF-8 strictly (the first bad byte is named
by its offset in the file) and is at most ``MAX_LINE_BYTES`` long; a BOM before the first line
is dropped. JSONL is one JSON object per line (a ``\\r`` before the ``\\n`` is dropped);
nothing else ends a line, so a string holding U+2028, U+2029 or U+0085 (valid JSON, common in
scraped text) stays one value and line numbers count ``\\n`` exactly. An object's nesting is
bounded (``MAX_DEPTH``) before it is parsed, and a key given twice in one object is refused:
JSON readers disagree on which value wins. CSV has a header row naming the fields (``csv``
module, standard dialect: comma-delimited); a header name given twice is refused, and a header
read as one field holding ``;`` or a tab is named as a file with another delimiter.

A message quotes the file's contents (a header, a value) only when the path passes through no
symbolic link: a link may lead out of the user's tree to a file whose contents are not theirs
to print, so those messages name the file, the line and the field instead.
"""

from __future__ import annotations

import csv
import json
import os
import re
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any, BinaryIO

from headwise.data.corpus import MAX_LINE_BYTES
from headwise.errors import ConfigError

MAX_DEPTH = 64  # a row's fields are strings: deeper nesting is never a row
JSON_KINDS = {type(None): "null", bool: "a boolean", int: "a number", float: "a number",
              list: "an array", dict: "an object", str: "a string"}
_DELIMITERS = {";": "';'", "\t": "a tab", "|": "'|'"}
_CSV_LINE = re.compile(r"[^\r\n]*(?:\r\n|\r|\n)|[^\r\n]+")  # CSV lines may also end in \r


class _Duplicate(ValueError):
    """A key given twice in one JSON object."""

    def __init__(self, key: str) -> None:
        super().__init__(key)
        self.key = key


def quotable(path: Path) -> bool:
    """Whether messages may quote ``path``'s contents: no component of it is a link."""
    return os.path.realpath(path) == os.path.abspath(path)


def _object(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            raise _Duplicate(key)
        out[key] = value
    return out


def file_lines(file: BinaryIO, where: str) -> Iterator[tuple[int, str]]:
    """``(line number, line)`` of a UTF-8 file read line by line, each line with its ``\\n``
    (the last one may lack it).

    Raises:
        ConfigError: a line over ``MAX_LINE_BYTES`` or bytes that are not UTF-8, naming the
            line or the byte's offset.
    """
    offset, number = 0, 0
    while raw := file.readline(MAX_LINE_BYTES + 2):
        number += 1
        size = len(raw) - raw.endswith(b"\n")
        if size > MAX_LINE_BYTES:
            while not raw.endswith(b"\n") and (raw := file.readline(1 << 20)):
                size += len(raw) - raw.endswith(b"\n")  # the whole line, to name its size
            raise ConfigError(f"{where}: line {number} has {size} bytes, expected at most "
                              f"{MAX_LINE_BYTES} per line")
        try:
            line = raw.decode("utf-8")
        except UnicodeDecodeError as e:
            raise ConfigError(f"{where}: not UTF-8 text (byte {offset + e.start} is "
                              f"{raw[e.start]:#04x}); expected UTF-8") from None
        offset += len(raw)
        yield number, line.removeprefix("\ufeff") if number == 1 else line


def _depth(raw: str) -> int:
    """The deepest nesting of arrays and objects in one JSON text (strings skipped)."""
    if raw.count("[") + raw.count("{") <= MAX_DEPTH:
        return 0  # cannot be deeper: the common case costs two counts
    depth = deepest = 0
    in_string = escaped = False
    for ch in raw:
        if in_string:
            escaped, in_string = (False, True) if escaped else (ch == "\\", ch != '"')
        elif ch == '"':
            in_string = True
        elif ch in "[{":
            depth += 1
            deepest = max(deepest, depth)
        elif ch in "]}":
            depth -= 1
    return deepest


def jsonl_records(lines: Iterable[tuple[int, str]], where: str
                  ) -> Iterator[tuple[int, dict[str, Any]]]:
    """``(line number, object)`` for every non-blank line of a JSONL file (``file_lines``).

    Raises:
        ConfigError: a line that is not one JSON object, nests deeper than ``MAX_DEPTH`` or
            repeats a key (naming the line and the key).
    """
    decoder = json.JSONDecoder(object_pairs_hook=_object)
    for line, text in lines:
        raw = text.removesuffix("\n").removesuffix("\r")
        if not raw.strip(" \t"):
            continue
        if _depth(raw) > MAX_DEPTH:
            raise ConfigError(f"{where}: line {line}: nested deeper than {MAX_DEPTH} levels, "
                              "expected one JSON object of string fields per line")
        try:
            record = decoder.decode(raw)
        except _Duplicate as e:
            raise ConfigError(f"{where}: line {line}: key {e.key[:80]!r} given twice in one "
                              "object, expected each key once") from None
        except json.JSONDecodeError as e:
            raise ConfigError(f"{where}: line {line}: not JSON ({e.msg} at column "
                              f"{e.colno}), expected one JSON object per line") from None
        except ValueError as e:  # an integer over Python's digit limit
            raise ConfigError(f"{where}: line {line}: not JSON ({str(e)[:80]}), expected "
                              "one JSON object per line") from None
        if not isinstance(record, dict):
            raise ConfigError(f"{where}: line {line}: got {JSON_KINDS[type(record)]}, "
                              "expected a JSON object")
        yield line, record


def csv_records(lines: Iterable[tuple[int, str]], where: str, names: tuple[str, ...],
                quote: bool) -> Iterator[tuple[int, dict[str, str]]]:
    """``(line number, {header name: value})`` for every non-empty row after the header.

    Args:
        lines: the file's lines (``file_lines``).
        where: the start of every message (the field and the file).
        names: the fields the caller needs (to explain a header read as one field).
        quote: whether messages may quote the header.

    Raises:
        ConfigError: a header name given twice, a header of another delimiter, a row with
            another number of values, or text the ``csv`` module cannot read.
    """
    reader = csv.reader(_csv_lines(lines), strict=True)
    try:
        header = next(reader, None)
        if header is None:
            return
        _check_header(header, names, where, quote)
        shown = f"the header's {header}" if quote else "the header's, line 1"
        for row in reader:
            line = reader.line_num
            if not row:
                continue
            if len(row) != len(header):
                raise ConfigError(f"{where}: line {line}: {len(row)} values, expected "
                                  f"{len(header)} ({shown})")
            yield line, dict(zip(header, row, strict=True))
    except csv.Error as e:
        raise ConfigError(f"{where}: line {reader.line_num}: not CSV ({e})") from None


def _csv_lines(lines: Iterable[tuple[int, str]]) -> Iterator[str]:
    """The lines the ``csv`` module reads: a bare ``\\r`` ends one too (files saved with
    classic Mac line endings), as in ``open(..., newline="")``."""
    for _, text in lines:
        if "\r" in text.removesuffix("\r\n"):
            yield from _CSV_LINE.findall(text)
        else:
            yield text


def _check_header(header: list[str], names: tuple[str, ...], where: str, quote: bool) -> None:
    seen: dict[str, int] = {}
    for column, name in enumerate(header, 1):
        if name in seen:
            shown = (f"name {name[:80]!r}" if quote else
                     f"column {column} repeats the name of column {seen[name]}")
            raise ConfigError(f"{where}: line 1: header {shown} given twice, expected each "
                              "field named once")
        seen[name] = column
    if len(header) == 1 and not set(names) <= set(seen):
        for delimiter, spoken in _DELIMITERS.items():
            if delimiter in header[0]:
                raise ConfigError(f"{where}: line 1: the header was read as one field; the "
                                  f"file looks delimited by {spoken}, expected "
                                  "comma-separated values (save it as CSV with ',')")
