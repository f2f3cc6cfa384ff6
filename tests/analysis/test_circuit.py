"""Circuits on a model whose circuit is known by construction: faithfulness and discovery."""

from __future__ import annotations

import math

import pytest

from headwise.analysis.circuit import circuit_edges, discover_circuit, edge_drop, faithfulness
from headwise.analysis.paths import path_patch
from headwise.errors import SpecError
from headwise.hooks.graph import parse_edge
from tests.analysis.circuit_models import (
    CIRCUIT,
    COPY_CIRCUIT,
    induction_model,
    repeated_batch,
)


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
    # every example keeps the task under the circuit: the bootstrap interval is a point
    assert f.kept_ci == (1.0, 1.0) and f.outside_drop_ci == (0.0, 0.0)
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


def test_discovery_recovers_a_value_path_circuit() -> None:
    model, keep = induction_model(copy=True)
    batch = repeated_batch(64, copy=True)
    found = discover_circuit(model, batch)
    assert sorted(map(str, found.edges)) == sorted(COPY_CIRCUIT)
    assert found.faithfulness.full == 1.0 and found.faithfulness.kept == 1.0
    del keep


def test_edge_drop_is_path_patching_with_an_interval(built: tuple) -> None:
    model, _, batch = built
    for metric in ("accuracy", "loss"):
        d = edge_drop(model, batch, "L0.H0 -> L1.H1 via k", metric=metric)
        r = path_patch(model, batch, "L0.H0", "L1.H1", "k", metric=metric)
        assert d.drop == pytest.approx(r.drop, abs=1e-9) and d.clean == pytest.approx(r.clean)
        assert d.ci[0] < d.drop < d.ci[1]
    assert math.isnan(edge_drop(model, batch, "L1.H1 -> logits", n_boot=0).ci[0])
    f = faithfulness(model, batch, ["L0.H0 -> L1.H1 via k"], metric="loss")
    assert f.kept_ci[0] <= f.kept <= f.kept_ci[1] and f.kept_ci[0] < f.kept_ci[1]
    with pytest.raises(ValueError, match="metric"):
        edge_drop(model, batch, "L1.H1 -> logits", metric="logit_diff")


def test_circuit_items_are_checked(built: tuple) -> None:
    model, _, _ = built
    edges = circuit_edges(model, ["L0.H0 -> L1.H1 via k", "L1.H1"])
    assert parse_edge("L1.H1 -> logits", _shape(model)) in edges
    with pytest.raises(SpecError, match=r"circuit\[1\]"):
        circuit_edges(model, ["L0.H0", "L7.H0"])
    with pytest.raises(SpecError, match="below the receiver"):
        circuit_edges(model, ["L1.H1 -> L0.H0 via q"])


def _shape(model: object) -> object:
    from headwise.hooks.graph import model_shape

    return model_shape(model)  # type: ignore[arg-type]
