"""Declared probes and the default repeated probe: sized by the data, framed like it, checked."""

from __future__ import annotations

import pytest
import torch

from headwise.data import BOS
from headwise.pipeline.spec_probes import spec_probes
from headwise.runspec import SpecError, load_spec

MODEL = "model: {n_layers: 2, n_heads: 2, d_model: 16, vocab_size: 24, max_seq_len: 48}\n"
INDUCTION = "data: {tasks: {induction: {seq_len: 40, period: [3, 8]}}}\n"


def test_default_repeated_probe_is_sized_by_the_training_data_with_its_bos() -> None:
    spec = load_spec(MODEL + INDUCTION)
    rep = spec_probes(spec, spec.data.eval_seed)["repeated"]
    # [BOS, r, r] within the 40 trained positions (not max_seq_len's 48): half = 19.
    assert rep.tokens.shape == (128, 39)
    assert (rep.tokens[:, 0] == BOS).all()
    assert torch.equal(rep.tokens[:, 1:20], rep.tokens[:, 20:])
    assert all(len(set(row.tolist())) == 19 for row in rep.tokens[:, 1:20])  # distinct halves


def test_declared_probes_of_every_kind() -> None:
    spec = load_spec(MODEL + INDUCTION + """
probes:
  unseen: {task: induction, period: [9, 12], examples: 16}
  halves: {repeated: {half_len: 10}}
  noise: {random: {length: 12}, examples: 8}
contract:
  - {any_of: L1.*, score: induction, at_least: 0.5, "on": unseen}
""")
    probes = spec_probes(spec, spec.data.eval_seed)
    unseen = probes["unseen"].tokens
    assert unseen.shape == (16, 40) and (unseen[:, 0] == BOS).all()
    content = unseen[:, 1:]
    periods = [next(p for p in range(1, 20) if torch.equal(r[p:], r[:-p])) for r in content]
    assert set(periods) <= set(range(9, 13))  # the override, not the training range 3-8
    assert probes["halves"].tokens.shape == (128, 21)
    assert probes["noise"].tokens.shape == (8, 13)


def test_a_probe_beyond_the_trained_positions_is_an_error_unless_allowed() -> None:
    long_probe = "probes: {long: {repeated: {half_len: 22}}}\n"
    with pytest.raises(SpecError, match="^probes.long: its sequences have T=45 positions, but "
                                        "the longest training sequence has 40"):
        load_spec(MODEL + INDUCTION + long_probe)
    allowed = "probes: {long: {repeated: {half_len: 22}, allow_untrained_positions: true}}\n"
    assert load_spec(MODEL + INDUCTION + allowed).probes[0].seq_len == 45
    rope = MODEL.replace("max_seq_len: 48", "max_seq_len: 48, positional: rope")
    assert load_spec(rope + INDUCTION + long_probe).probes[0].seq_len == 45
    with pytest.raises(SpecError, match="probes.long: its sequences have T=49 positions, more "
                                        "than model.max_seq_len=48"):
        load_spec(rope + INDUCTION + "probes: {long: {repeated: {half_len: 24}}}\n")


@pytest.mark.parametrize("probes, message", [
    ("{induction: {repeated: {half_len: 4}}}", "^probes.induction: the name is taken"),
    ("{p: {task: induct}}", "^probes.p.task: got 'induct'"),
    ("{p: {task: induction, periods: 3}}", "^probes.p: induction.periods: unknown argument"),
    ("{p: {repeated: {half_len: 4}, random: {length: 3}}}", "^probes.p: got keys"),
    ("{p: {repeated: {len: 4}}}", "^probes.p.repeated"),
    ("{p: {repeated: {half_len: 4}, as_task: nope}}", "^probes.p.as_task: got 'nope'"),
    ("{p: {repeated: {half_len: 4}, examples: 0}}", "^probes.p.examples: got 0"),
])
def test_bad_probes_name_the_probe_and_field(probes: str, message: str) -> None:
    with pytest.raises(SpecError, match=message):
        load_spec(MODEL + INDUCTION + f"probes: {probes}\n")


def test_a_score_clause_on_an_unknown_probe_is_refused_before_training() -> None:
    with pytest.raises(SpecError, match="^contract\\[0\\].on: got 'unseen', expected one of "
                                        "the probes \\['default', 'induction', 'repeated'\\]"):
        load_spec(MODEL + INDUCTION + "contract: [{head: L1.H0, score: induction, "
                  "at_least: 0.5, \"on\": unseen}]\n")
