"""The 0.2 renames (``spec`` -> ``runspec``, ``train`` -> ``training``) keep old names working
with a DeprecationWarning that names the new home."""

import pytest

import headwise.runspec
import headwise.training


@pytest.mark.parametrize(("old", "new", "name"), [
    ("headwise.spec", headwise.runspec, "load_spec"),
    ("headwise.train", headwise.training, "TrainConfig"),
])
def test_old_package_names_warn_and_resolve(old: str, new: object, name: str) -> None:
    module = __import__(old, fromlist=[name])
    with pytest.warns(DeprecationWarning, match=f"use {new.__name__}.{name}"):  # type: ignore[attr-defined]
        value = getattr(module, name)
    assert value is getattr(new, name)
    with pytest.raises(AttributeError):
        module.no_such_name  # noqa: B018


def test_contract_from_list_warns_and_builds_the_same_contract() -> None:
    from headwise import Contract, contract_from_list
    clauses = [{"head": "L0.H1", "score": "previous_token", "at_least": 0.9}]
    with pytest.warns(DeprecationWarning, match="contract_from_list"):
        old = Contract.from_list(clauses, 1, 2, [])
    assert old.to_list() == contract_from_list(clauses, 1, 2, []).to_list()
    (clause,) = old.clauses  # what the clause says, independently of either code path
    assert (str(clause.heads), clause.score, clause.at_least) == ("L0.H1", "previous_token", 0.9)
