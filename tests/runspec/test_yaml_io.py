"""Spec YAML: YAML 1.2 booleans, bounded loading, duplicate keys named by their field path."""

from __future__ import annotations

import re
import time

import pytest

from headwise.errors import SpecError
from headwise.runspec import load_spec
from headwise.runspec.yaml_io import MAX_ALIASES, MAX_DEPTH, parse_yaml

SPEC = """
model: {n_layers: 1, n_heads: 2, d_model: 8, vocab_size: 12, max_seq_len: 8, causal: CAUSAL}
data: {tasks: {copy: {length: 3}}}
"""


@pytest.mark.parametrize("word", ["on", "off", "yes", "no", "On", "YES", "y", "n"])
def test_yaml_11_booleans_are_strings_as_keys_and_values(word: str) -> None:
    assert parse_yaml(f"{word}: {word}\nlist: [{word}]\n", "t") == {word: word, "list": [word]}


@pytest.mark.parametrize(("word", "value"), [("true", True), ("false", False), ("True", True),
                                             ("FALSE", False)])
def test_true_and_false_are_booleans(word: str, value: bool) -> None:
    assert parse_yaml(f"a: {word}\n", "t") == {"a": value}
    assert load_spec(SPEC.replace("CAUSAL", word)).model.config.causal is value


@pytest.mark.parametrize("word", ["yes", "no", "on", "off"])
def test_a_boolean_field_given_yes_says_expected_true_or_false(word: str) -> None:
    with pytest.raises(SpecError, match=f"model.causal: got '{word}', expected true or false"):
        load_spec(SPEC.replace("CAUSAL", word))


def test_numbers_as_people_write_them() -> None:
    assert parse_yaml("a: 3e-4\nb: 1.5e3\nc: 12\n", "t") == {"a": 3e-4, "b": 1500.0, "c": 12}


@pytest.mark.parametrize(("text", "value"), [
    ("10", 10), ("-3", -3), ("+5", 5), ("0", 0), ("3.0e-3", 3.0e-3), ("1e-3", 1e-3),
    (".5", 0.5), ("1.", 1.0), ("-2.5", -2.5), ("'010'", "010"), ('"1:00"', "1:00")])
def test_decimal_numbers_and_quoted_text_load(text: str, value: object) -> None:
    assert parse_yaml(f"a: {text}\n", "t") == {"a": value}


@pytest.mark.parametrize(("text", "kind"), [
    ("010", "octal"), ("1:00", "base-60"), ("0x4", "hexadecimal"), ("0b100", "binary"),
    ("3_0", "digit-separated"), ("1_000.5", "digit-separated"), ("1:30.5", "base-60"),
    ("-0x1F", "hexadecimal"), ("!!int '010'", "octal")])
def test_yaml_11_number_forms_are_refused_naming_the_field(text: str, kind: str) -> None:
    """YAML 1.1 reads ``010`` as 8 and ``1:00`` as 60: refused, never read silently."""
    shown = text.split("'")[1] if "'" in text else text
    with pytest.raises(SpecError, match=rf"^train\.steps: got {re.escape(shown)}, a YAML 1\.1 "
                                        rf"{kind}.* expected a decimal number"):
        parse_yaml(f"train:\n  steps: {text}\n", "t")
    with pytest.raises(SpecError, match=r"^contract\[0\]\.at_least: got"):
        parse_yaml(f"contract:\n  - {{at_least: {text}}}\n", "t")


def test_a_yaml_11_number_in_a_set_value_names_the_option() -> None:
    from headwise.runspec.overrides import apply_overrides

    with pytest.raises(SpecError, match=r"^--set train\.steps: got 010, a YAML 1\.1 octal"):
        apply_overrides({"train": {}}, ["train.steps=010"])
    with pytest.raises(SpecError, match=r"^--set train\.betas\[1\]: got 0\.9_99"):
        apply_overrides({"train": {}}, ["train.betas=[0.9, 0.9_99]"])


def test_duplicate_keys_name_the_field_path() -> None:
    with pytest.raises(SpecError, match=r"^train\.steps: duplicate key \(lines 3 and 4\)"):
        parse_yaml("model: {}\ntrain:\n  steps: 1\n  steps: 2\n", "t")
    with pytest.raises(SpecError, match=r"^data\.tasks\.copy: duplicate key"):
        parse_yaml("data:\n  tasks:\n    copy: {}\n    copy: {}\n", "t")


def _timed(text: str, match: str) -> None:
    t0 = time.perf_counter()
    with pytest.raises(SpecError, match=match) as info:
        parse_yaml(text, "t")
    assert time.perf_counter() - t0 < 10 and len(str(info.value)) < 300


def test_alias_bombs_are_refused_before_expansion() -> None:
    lines = ["a0: &a0 [x, x, x, x, x, x, x, x, x, x]"]
    lines += [f"a{i}: &a{i} [" + ", ".join([f"*a{i - 1}"] * 10) + "]" for i in range(1, 12)]
    _timed("\n".join(lines) + "\n", f"more than {MAX_ALIASES} uses of YAML aliases")
    # a handful of aliases is fine
    assert parse_yaml("a: &a [1, 2]\nb: *a\nc: *a\n", "t") == {"a": [1, 2], "b": [1, 2],
                                                               "c": [1, 2]}


@pytest.mark.parametrize("text", ["a: " + "[" * 5000 + "]" * 5000,
                                  "a: " + "{b: " * 5000 + "1" + "}" * 5000,
                                  "a: &a [*a]", "a: " + "[" * (MAX_DEPTH + 1) + "]" * (
                                      MAX_DEPTH + 1)])
def test_deep_nesting_is_refused(text: str) -> None:
    _timed(text + "\n", f"nested more than {MAX_DEPTH} levels deep")


def test_nesting_within_the_limit_loads() -> None:
    depth = MAX_DEPTH - 2
    assert parse_yaml("a: " + "[" * depth + "]" * depth + "\n", "t")["a"] is not None


def test_long_integers_are_refused_with_the_line() -> None:
    _timed("a: 1\nb: " + "7" * 5000 + "\n", "line 2: an integer with 5000 digits")
    assert parse_yaml("a: " + "9" * 30 + "\n", "t") == {"a": int("9" * 30)}


def test_unsafe_tags_are_refused() -> None:
    _timed("a: !!python/object/apply:os.system ['true']\n", "could not determine a constructor")
