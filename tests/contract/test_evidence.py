"""An enforced run's verification set sized from its enforcement set (a two-stage design):
the sample-size formula, the sizing rules, the verdict's level in simulation, and the run
that records and re-measures the size."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch

from headwise.cli import main
from headwise.confidence import binomial_p, examples_for_binomial
from headwise.contract import ClauseResult, ContractResult, parse_contract, verify
from headwise.contract.evidence import GROWTH, pilot_examples, powered
from headwise.contract.results import Bound
from headwise.errors import CheckpointError
from headwise.pipeline.finished import load_compiled
from headwise.pipeline.heldout import enforcement_data
from headwise.pipeline.resume import RUN_FORMAT, check_run_info

ALPHA = 0.05


def test_powered_is_the_one_sided_sample_size_formula() -> None:
    # n = n0 ((z_a + z_b) / z_a)^2 with z_0.95 = 1.6449, z_0.8 = 0.8416: a factor of 2.2861.
    assert powered(100, ALPHA) == math.ceil(100 * ((1.644854 + 0.841621) / 1.644854) ** 2) == 229
    assert powered(100, ALPHA, power=0.5) == 100  # z_0.5 = 0: the bound just clears it
    assert powered(100, ALPHA / 4) < 229  # a stricter level needs relatively fewer more


def _result(raw: dict, needed: int | None, examples: int, passed: bool = True) -> ClauseResult:
    (c,) = parse_contract([raw], 1, 2, ["copy", "sort"])
    bound = Bound("clopper-pearson", 0.95, lower=0.0, p_value=0.2, examples=examples,
                  needed=needed)
    return ClauseResult(c, passed, 0.5, c.threshold_text(), "the model", bound=bound)


FLOOR = {"task": "sort", "metric": "accuracy", "at_least": 0.9}


def test_the_set_grows_by_the_clause_share_and_at_most_growth_times() -> None:
    # sort holds 100 of the pilot's 400 examples; 100 of its examples would certify it: at
    # 80% power 229 of them, so 229 x 400 / 100 examples in all.
    pilot = ContractResult([_result(FLOOR, 100, examples=100)])
    assert pilot_examples(pilot, 512, 400, ["copy", "sort"]) == 916
    assert pilot_examples(pilot, 200, 400, ["copy", "sort"]) == GROWTH * 200  # capped
    small = ContractResult([_result(FLOOR, 10, examples=100)])  # far past its bound
    assert pilot_examples(small, 512, 400, ["copy", "sort"]) == 512  # never shrinks


def test_failing_unbounded_and_probe_clauses_do_not_size_the_set() -> None:
    probe = {"head": "L0.H0", "score": "previous_token", "at_least": 0.5, "on": "long"}
    pilot = ContractResult([_result(FLOOR, 100, 100, passed=False),
                            _result(FLOOR, None, 100),
                            _result(probe, 100, 100)])
    assert pilot_examples(pilot, 512, 400, ["copy", "sort"]) == 512


def _two_stage(rng: torch.Generator, t: float, base: int, pilot_n: int,
               reuse: bool) -> bool:
    """One contract's verdict when the true share is exactly the floor ``t``: a pilot of
    ``pilot_n`` examples sizes the set; certified when the exact test rejects on it (``reuse``:
    the pilot's examples are counted again, not drawn apart)."""
    k0 = int(torch.binomial(torch.tensor(float(pilot_n)), torch.tensor(t), generator=rng))
    needed = examples_for_binomial(k0 / pilot_n, t, "at_least", 1 - ALPHA)
    pilot = ContractResult([_result(FLOOR, needed, examples=pilot_n, passed=needed is not None)])
    n = pilot_examples(pilot, base, pilot_n, ["copy", "sort"])
    if reuse:  # test the pilot first, and on failing, again with more examples added to it
        if binomial_p(k0, pilot_n, t, "at_least") <= ALPHA:
            return True
        k = k0 + int(torch.binomial(torch.tensor(float(n - pilot_n)), torch.tensor(t),
                                    generator=rng))
        return binomial_p(k, n, t, "at_least") <= ALPHA
    k = int(torch.binomial(torch.tensor(float(n)), torch.tensor(t), generator=rng))
    return binomial_p(k, n, t, "at_least") <= ALPHA


def test_a_clause_on_its_bound_is_certified_at_most_alpha_of_the_time() -> None:
    """The size depends on the pilot, the test's examples do not: over 4000 draws with the
    true share on the floor, certification is wrong at most 5% of the time (2.5 standard
    errors of Monte Carlo slack). Counting the pilot's examples again (a second look at the
    same data) is not: it is wrong more often, which this simulation detects."""
    rng = torch.Generator().manual_seed(0)
    draws, t = 4000, 0.8
    slack = 2.5 * math.sqrt(ALPHA * (1 - ALPHA) / draws)
    apart = sum(_two_stage(rng, t, 256, 256, reuse=False) for _ in range(draws)) / draws
    again = sum(_two_stage(rng, t, 256, 256, reuse=True) for _ in range(draws)) / draws
    assert apart <= ALPHA + slack
    assert again > ALPHA + slack


SPEC = """
model: {n_layers: 1, n_heads: 2, d_model: 32, vocab_size: 14, max_seq_len: 11}
data: {tasks: {copy: {length: 4}, sort: {length: 4, weight: 0.25}}, eval_examples: 128%s}
train: {steps: 60, batch_size: 16, lr: 3.0e-3, eval_every: 20, seed: 0}
contract:
  - {name: sorted, task: sort, metric: accuracy, at_least: 0.3}
"""


def test_an_enforced_run_records_the_size_and_verify_measures_the_same_set(
        tmp_path: Path) -> None:
    spec = tmp_path / "spec.yaml"
    spec.write_text(SPEC % "")
    run = tmp_path / "run"
    assert main(["train", str(spec), "--out", str(run), "--quiet", "--enforce",
                 "--no-report"]) in (0, 1)
    size = json.loads((run / "run.json").read_text())["verify_examples"]
    compiled = load_compiled(run)
    pilot = verify(compiled.model, compiled.spec.contract, enforcement_data(compiled))
    assert pilot.results[0].passed and pilot.results[0].bound is not None
    assert size == pilot_examples(pilot, compiled.spec.data.verify_examples, 128,
                                  ["copy", "sort"])
    assert size > compiled.spec.data.verify_examples  # the floor is near: the set grew
    verdict = json.loads((run / "contract.json").read_text())
    sort_share = 0.25 / 1.25
    assert abs(verdict["clauses"][0]["bound"]["examples"] - size * sort_share) < 4 * math.sqrt(
        size * sort_share * (1 - sort_share))
    before = (run / "contract.json").read_bytes()
    assert main(["verify", str(run / "spec.yaml"), "--run", str(run)]) in (0, 1)
    assert (run / "contract.json").read_bytes() == before


def test_a_size_the_spec_sets_is_kept_and_plain_runs_are_not_sized(tmp_path: Path) -> None:
    for name, text, flags in (("given", SPEC % ", verify_examples: 96", ["--enforce"]),
                              ("plain", SPEC % "", [])):
        spec = tmp_path / f"{name}.yaml"
        spec.write_text(text)
        run = tmp_path / name
        assert main(["train", str(spec), "--out", str(run), "--quiet", "--no-report",
                     *flags]) in (0, 1)
        size = json.loads((run / "run.json").read_text())["verify_examples"]
        assert size == load_compiled(run).spec.data.verify_examples, name



@pytest.mark.parametrize("value", [0, -3, None, "512", True, 2.5])
def test_a_run_json_size_that_is_not_a_positive_integer_is_refused(value: object) -> None:
    info = {"format": RUN_FORMAT, "enforce": True, "spec_dir": None, "verify_examples": value}
    with pytest.raises(CheckpointError, match="'verify_examples' a positive integer"):
        check_run_info(info, "run.json")
    assert check_run_info({**info, "verify_examples": 640}, "run.json")["verify_examples"] == 640
