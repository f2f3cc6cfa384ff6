"""Circuits on a model whose circuit is known by construction: faithfulness and discovery."""

from __future__ import annotations

import pytest

from headwise.analysis.circuit import circuit_edges, discover_circuit, edge_drop, faithfulness
from headwise.analysis.graph import parse_edge
from headwise.errors import SpecError
from tests.analysis.circuit_models import CIRCUIT, induction_model, repeated_batch


@pytest.fixture(scope="module")
def built() -> tuple:
    model, keep = induction_model()
    return model, keep, repeated_batch(64)


def test_the_built_circuit_keeps_the_task_and_each_edge_is_needed(built: tuple) -> None:
    model, _, batch = built
    f = faithfulness(model, batch, CIRCUIT)
    assert f.full == 1.0 and f.circuit == 1.0 and f.empty < 0.3 and f.kept == 1.0
    for edge in CIRCUIT:
        without = faithfulness(model, batch, [e for e in CIRCUIT if e != edge])
        assert without.kept < 0.5, edge
        assert edge_drop(model, batch, edge).drop > 0.5, edge
    # heads as a circuit: every edge among them, the embeddings and the logits
    assert faithfulness(model, batch, ["L0.H0", "L1.H1"]).kept == 1.0
    assert faithfulness(model, batch, ["L0.H1", "L1.H1"]).kept < 0.5


@pytest.mark.parametrize("method", ["eap", "eap-ig"])
def test_discovery_recovers_exactly_the_built_circuit(built: tuple, method: str) -> None:
    model, _, batch = built
    found = discover_circuit(model, batch, method=method, steps=3)
    assert sorted(map(str, found.edges)) == sorted(CIRCUIT)
    assert found.faithfulness.kept == 1.0 and found.threshold == 0.9
    assert [str(h) for h in found.heads()] == ["L0.H0", "L1.H1"]
    assert all(d > 0.5 for d in found.drops.values())


def test_circuit_items_are_checked(built: tuple) -> None:
    model, _, _ = built
    edges = circuit_edges(model, ["L0.H0 -> L1.H1 via k", "L1.H1"])
    assert parse_edge("L1.H1 -> logits", _shape(model)) in edges
    with pytest.raises(SpecError, match=r"circuit\[1\]"):
        circuit_edges(model, ["L0.H0", "L7.H0"])
    with pytest.raises(SpecError, match="below the receiver"):
        circuit_edges(model, ["L1.H1 -> L0.H0 via q"])


def _shape(model: object) -> object:
    from headwise.analysis.graph import model_shape

    return model_shape(model)  # type: ignore[arg-type]
