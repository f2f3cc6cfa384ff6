"""Contracts: validation errors name the clause and field; verdicts follow measured values."""

from __future__ import annotations

import copy
import json
from dataclasses import dataclass

import pytest
import torch

from headwise import Hook, ModelConfig, SpecError, build_model
from headwise.analysis.importance import task_metrics
from headwise.analysis.probe_inputs import induction_probe
from headwise.contract import Contract, VerifyData, parse_contract, verify

TASKS = ["copy", "sort"]


def _c(clauses: list[dict]) -> Contract:
    return parse_contract(clauses, n_layers=2, n_heads=4, tasks=TASKS)


@pytest.mark.parametrize("clauses, message", [
    ([{1: 2}], r"^contract\[0\]: key 1 is a int, expected a string"),
    ([{"ablate": "L1.H1", "task": "copy", "drop_at_least": "x"}],
     r"^contract\[0\]\.drop_at_least: got 'x', expected a finite number"),
    ([{"ablate": "L1.H1", "task": "copy", "drop_at_least": float("nan")}],
     r"^contract\[0\]\.drop_at_least: got nan, expected a finite number"),
    ([{"task": "copy", "metric": "accuracy", "at_least": 1.5}],
     r"^contract\[0\]\.at_least: got 1\.5, expected a number in \[0, 1\] \(the range of accuracy"),
    ([{"task": "copy", "metric": "acc", "at_least": 0.5}], r"^contract\[0\]\.metric: got 'acc'"),
    ([{"task": "copy"}], r"^contract\[0\]: missing bound.*task floor"),
    ([{"task": "copy", "at_least": 0.5, "mode": "zero"}],
     r"^contract\[0\]\.mode: not allowed in a task clause"),
    ([{"task": "copy", "metric": "accuracy", "at_least": 0.9},
      {"task": "copy", "metric": "accuracy", "at_most": 0.5}],
     r"^contract\[1\]: contradicts contract\[0\]: copy accuracy must be >= 0\.9 and <= 0\.5"),
    ([{"task": "copy", "metric": "exact", "at_most": 0.3},
      {"heads": "L1.H0", "tasks": ["copy"], "exclusive": True, "metric": "exact",
       "drop_at_least": 0.5}],
     r"^contract\[1\]: contradicts contract\[0\]: a copy exact drop >= 0\.5 needs"),
    ([{"head": "L0.H0", "score": "previous_token", "at_least": 0.5},
      {"ablate": "L1.H1", "task": "copy", "metric": "accuracy", "drop_atleast": 0.3}],
     r"^contract\[1\]\.drop_atleast: unknown key \(did you mean 'drop_at_least'\?\); "
     r"expected one of \["),
    ([{"head": "L0.H0", "score": "previous_tokn", "at_least": 0.9}],
     r"^contract\[0\]\.score: got 'previous_tokn'.*did you mean 'previous_token'"),
    ([{"head": "L0.H9", "score": "previous_token", "at_least": 0.9}],
     r"^contract\[0\]\.head: .*L0\.H9"),
    ([{"head": "L1.*", "score": "induction", "at_least": 0.4}],
     r"^contract\[0\]\.head: got 'L1\.\*' \(4 heads\), expected one head; use any_of"),
    ([{"ablate": "L1.H1", "task": "cpy", "drop_at_least": 0.3}],
     r"^contract\[0\]\.task: got 'cpy'.*did you mean 'copy'"),
    ([{"ablate": "L1.H1", "task": "copy", "metric": "acc", "drop_at_least": 0.3}],
     r"^contract\[0\]\.metric: got 'acc'"),
    ([{"head": "L0.H0", "score": "previous_token", "at_least": 0.9, "at_most": 0.5}],
     r"^contract\[0\]: at_least 0\.9 > at_most 0\.5"),
    ([{"head": "L0.H0", "score": "previous_token", "at_least": 1.5}],
     r"^contract\[0\]\.at_least: got 1\.5, expected a number in \[0\.0, 1\.0\]"),
    ([{"head": "L0.H0", "score": "previous_token", "at_least": 0.9},
      {"all_of": "L0.H0-1", "score": "previous_token", "at_most": 0.3}],
     r"^contract\[1\]: contradicts contract\[0\]: L0\.H0 previous_token"),
    ([{"heads": "L1.H0-1", "tasks": ["sort"], "exclusive": True},
      {"heads": "L1.H1", "tasks": ["copy"], "exclusive": True}],
     r"^contract\[1\]: L1\.H1 is required exclusive to \['copy'\] here and to \['sort'\]"),
    ([{"heads": "L1.H0", "tasks": ["sort"], "exclusive": "yes"}],
     r"^contract\[0\]\.exclusive: got 'yes', expected true"),
    ([{"head": "L0.H0", "score": "self", "at_least": 0.1, "task": "copy"}],
     r"^contract\[0\]\.task: not allowed in a score clause"),
    ([{"head": "L0.H0", "score": "self"}], r"^contract\[0\]: missing bound"),
    ([{"ablate": "L0.H0", "any_of": "L1.*", "task": "copy", "drop_at_least": 0.1}],
     r"^contract\[0\]: got subject keys \['ablate', 'any_of'\]"),
    ({"head": "L0.H0"}, r"^contract: got a mapping, expected a list of clauses"),
    (["L0.H0"], r"^contract\[0\]: got 'L0.H0', expected a clause mapping"),
])
def test_malformed_clauses_name_clause_and_field(clauses: list, message: str) -> None:
    with pytest.raises(SpecError, match=message):
        _c(clauses)


def test_parsed_clauses_expose_their_fields() -> None:
    c = _c([{"head": "L0.H0", "score": "previous_token", "at_least": 0.9, "on": "p"},
            {"any_of": "L1.*", "score": "induction", "at_least": 0.45},
            {"ablate": "L1.H1-2", "task": "copy", "drop_at_least": 0.3}])
    assert c[0].kind == "score" and [str(h) for h in c[0].heads] == ["L0.H0"]
    assert str(c[0].head) == "L0.H0" and c[0].score == "previous_token"
    assert c[1].quantifier == "any_of" and len(c[1].heads) == 4 and c[1].head is None
    assert c[2].kind == "ablation" and c[2].metric == "accuracy" and c[2].mode == "zero"
    assert c.to_list()[2] == {"ablate": "L1.H1-2", "task": "copy", "drop_at_least": 0.3}


@dataclass
class B:
    tokens: torch.Tensor
    targets: torch.Tensor
    attention_mask: torch.Tensor | None
    task_ids: torch.Tensor


def _setup() -> tuple[torch.nn.Module, VerifyData]:
    cfg = ModelConfig(n_layers=2, n_heads=4, d_model=32, vocab_size=24, max_seq_len=20,
                      attn_only=True)
    model = build_model(cfg, seed=1).eval()
    g = torch.Generator().manual_seed(0)
    batches = {}
    for i, name in enumerate(TASKS):
        tok = torch.randint(0, 24, (16, 12), generator=g)
        tgt = tok.roll(-1, 1).clone()
        tgt[:, -1] = -100
        batches[name] = B(tok, tgt, None, torch.full((16,), i))
    return model, VerifyData(batches, {"rep": induction_probe(24, 8, 6, g)}, n_boot=100)


def _prev_token_hook(head: int) -> Hook:
    def fn(x: torch.Tensor, ctx: object) -> torch.Tensor:
        T = x.shape[-1]
        a = torch.zeros(T, T)
        a[0, 0] = 1.0
        a[torch.arange(1, T), torch.arange(T - 1)] = 1.0
        return a.expand_as(x).clone()
    return Hook("blocks.0.attn.hook_pattern", fn, heads=(head,))


def test_holding_clause_passes_and_failing_clause_reports_value() -> None:
    model, data = _setup()
    contract = _c([
        {"head": "L0.H2", "score": "previous_token", "at_least": 0.95, "on": "rep"},
        {"head": "L0.H1", "score": "previous_token", "at_least": 0.9, "on": "rep"},
        {"any_of": "L0.*", "score": "previous_token", "at_least": 0.95},
        {"all_of": "L0.*", "score": "previous_token", "at_least": 0.95},
    ])
    with model.hooks(_prev_token_hook(2)):
        result = verify(model, contract, data)
    r = result.results
    assert r[0].passed and r[0].measured == pytest.approx(1.0)
    assert not r[1].passed and r[1].measured is not None and r[1].measured < 0.9
    assert r[1].threshold == ">= 0.9"
    assert r[2].passed and r[2].decided_by == "L0.H2"
    assert not r[3].passed and r[3].decided_by != "L0.H2"
    assert not result.passed and result.exit_code == 1
    d = json.loads(json.dumps(result.to_dict()))
    assert d["n_failed"] == 2 and d["clauses"][1]["measured"] == pytest.approx(r[1].measured)


def test_ablation_clauses_measure_true_drop() -> None:
    model, data = _setup()
    # any_of: the best single-head drop decides; reference: zeroed output-projection columns
    sort = data.tasks["sort"]
    single = []
    for h in (0, 1):
        ablated = copy.deepcopy(model)
        with torch.no_grad():
            ablated.blocks[0].attn.o_proj.weight[:, h * 8:(h + 1) * 8] = 0
        single.append(task_metrics(ablated, sort)["loss"] - task_metrics(model, sort)["loss"])
    best = max(range(2), key=lambda h: single[h])
    assert abs(single[0] - single[1]) > 1e-4
    contract = _c([{"ablate": "L1.*", "task": "copy", "metric": "loss", "drop_at_least": 1e-6},
                   {"ablate": "L1.*", "task": "copy", "metric": "loss", "drop_at_most": 1e-6},
                   {"any_of": "L0.H0-1", "task": "sort", "metric": "loss",
                    "drop_at_least": (single[0] + single[1]) / 2},  # only the best head passes
                   {"any_of": "L0.H0-1", "task": "sort", "metric": "loss",
                    "drop_at_least": max(single) + 1e-3}])  # no head drops this much
    result = verify(model, contract, data)
    ref_model = copy.deepcopy(model)
    with torch.no_grad():
        ref_model.blocks[1].attn.o_proj.weight.zero_()
    batch = data.tasks["copy"]
    drop = task_metrics(ref_model, batch)["loss"] - task_metrics(model, batch)["loss"]
    r = result.results
    assert r[0].measured == pytest.approx(drop, abs=1e-5)
    assert r[0].passed == (drop >= 1e-6) and r[1].passed == (drop <= 1e-6)
    assert r[0].ci is not None and r[0].ci[0] <= r[0].measured <= r[0].ci[1]
    assert r[2].passed and r[2].decided_by == f"L0.H{best}"
    assert r[2].measured == pytest.approx(single[best], abs=1e-5)
    assert not r[3].passed and r[3].measured == pytest.approx(single[best], abs=1e-5)


def test_task_clauses_measure_the_tasks_own_metric_with_a_ci() -> None:
    model, data = _setup()
    clean = task_metrics(model, data.tasks["copy"])
    contract = _c([{"task": "copy", "metric": "loss", "at_most": clean["loss"] + 0.01},
                   {"task": "copy", "metric": "loss", "at_least": clean["loss"] + 0.01},
                   {"task": "sort", "metric": "accuracy", "at_least": 0.95},
                   {"task": "copy", "metric": "exact", "at_most": 0.0}])
    r = verify(model, contract, data).results
    assert r[0].passed and not r[1].passed
    assert r[0].measured == pytest.approx(clean["loss"], rel=1e-6)
    assert r[0].ci is not None and r[0].ci[0] < r[0].measured < r[0].ci[1]
    assert not r[2].passed and r[2].measured == pytest.approx(
        task_metrics(model, data.tasks["sort"])["accuracy"])  # an untrained model: near 0
    assert r[3].passed and r[3].measured == 0.0  # no random example is entirely right
    assert r[0].to_dict()["description"] == "task copy: loss"


def test_exclusive_clause_via_task_specific_ablation() -> None:
    """A head gated to contribute only on 'sort' examples is exclusive to sort."""
    model, data = _setup()
    sort_id = TASKS.index("sort")

    def gate(z: torch.Tensor, task_ids: torch.Tensor | None) -> torch.Tensor:
        keep = torch.ones(z.shape[0], 1, z.shape[2], 1)
        assert task_ids is not None
        keep[task_ids != sort_id, :, 1] = 0.0  # head 1 only serves sort
        return z * keep

    model.blocks[1].attn.head_gate = gate  # type: ignore[assignment]
    with torch.no_grad():  # make head L1.H1 matter: scale its output projection up
        model.blocks[1].attn.o_proj.weight[:, 8:16] *= 30
    sort = data.tasks["sort"]  # targets = the model's own predictions: clean accuracy 1.0
    with torch.no_grad():
        preds = model(sort.tokens, task_ids=sort.task_ids).argmax(-1)
    data.tasks["sort"] = B(sort.tokens, preds, None, sort.task_ids)  # type: ignore[index]
    contract = _c([{"heads": "L1.H1", "tasks": ["sort"], "exclusive": True,
                    "drop_at_least": 0.2, "others_drop_at_most": 0.0}])
    r = verify(model, contract, data).results[0]
    assert r.details["drops"]["copy"] == 0.0
    assert r.details["drops"]["sort"] > 0.2 and r.passed
    strict = _c([{"heads": "L1.H1", "tasks": ["sort"], "exclusive": True,
                  "drop_at_least": 0.999, "others_drop_at_most": 0.0}])
    assert not verify(model, strict, data).passed


def test_unknown_probe_at_verify_names_clause() -> None:
    model, data = _setup()
    contract = _c([{"head": "L0.H0", "score": "self", "at_least": 0.1, "on": "nope"}])
    with pytest.raises(SpecError, match=r"^contract\[0\]\.on: got 'nope'"):
        verify(model, contract, data)


def test_rich_table_renders() -> None:
    from rich.console import Console

    model, data = _setup()
    res = verify(model, _c([{"head": "L0.H0", "score": "entropy", "at_most": 1.0},
                            {"head": "L0.H1", "score": "previous_token", "at_least": 0.9}]),
                 data)
    console = Console(record=True, width=150)
    console.print(res.to_rich_table())
    lines = console.export_text().splitlines()
    ok, bad = res.results
    assert ok.passed and not bad.passed and ok.measured is not None and bad.measured is not None
    assert any("contract: FAIL" in line for line in lines)
    row0 = next(line for line in lines if "L0.H0" in line and "entropy" in line)
    row1 = next(line for line in lines if "L0.H1" in line and "previous_token" in line)
    assert f"{ok.measured:.3f}" in row0 and "<= 1" in row0 and ok.state in row0
    assert ok.bound is not None and ok.bound.text() in row0
    assert f"{bad.measured:.3f}" in row1 and ">= 0.9" in row1 and "FAIL" in row1
