"""CLI: malformed specs give exit code 2 and one clear message; --help works on every command."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
import yaml

from headwise.cli import build_parser, main

# A small valid spec (2 layers x 4 heads, two tasks); each case below breaks one thing.
BASE: dict[str, Any] = {
    "model": {"n_layers": 2, "n_heads": 4, "d_model": 16, "vocab_size": 12, "max_seq_len": 10},
    "data": {"tasks": {"copy": {"length": 3}, "rev": {"task": "reverse", "length": 3}}},
    "train": {"steps": 2, "batch_size": 4},
    "heads": {"L0.H0": {"mask": "previous_token"}, "L1.H1": {"tasks": ["copy"]}},
    "contract": [{"head": "L0.H0", "score": "previous_token", "at_least": 0.9}],
}


def _with(path: str, value: Any) -> dict[str, Any]:
    """BASE with the dotted ``path`` set to ``value`` (``None`` deletes the key)."""
    out = copy.deepcopy(BASE)
    *parents, last = path.split("/")
    node = out
    for key in parents:
        node = node[key]
    if value is None:
        del node[last]
    else:
        node[last] = value
    return out


def _dump(spec: dict[str, Any]) -> str:
    return yaml.safe_dump(spec, sort_keys=False)


# (case id, YAML text, text the message must contain: the field path, then what was expected)
MALFORMED: list[tuple[str, str, list[str]]] = [
    ("empty file", "", ["spec.yaml", "empty"]),
    ("only comments", "# nothing here\n", ["spec.yaml", "empty"]),
    ("not yaml", "model: [1, 2\ndata: {", ["spec.yaml", "not valid YAML", "line"]),
    ("top level list", "- model\n- data\n", ["spec.yaml", "top level is a list", "mapping"]),
    ("duplicate key", _dump(BASE) + "train: {steps: 3}\n", ["train: duplicate key"]),
    ("unknown top key", _dump({**BASE, "modle": {}}), ["modle: unknown key", "'model'"]),
    ("missing data", _dump(_with("data", None)), ["data: missing"]),
    ("model not mapping", _dump(_with("model", 5)), ["model: got 5", "mapping"]),
    ("model wrong type", _dump(_with("model/n_layers", "two")),
     ["model.n_layers", "integer >= 1"]),
    ("model unknown field", _dump(_with("model/n_layer", 2)), ["model.n_layer", "'n_layers'"]),
    ("unknown preset", _dump(_with("model", {"preset": "huge"})), ["model.preset", "'tiny'"]),
    ("no tasks", _dump(_with("data/tasks", {})), ["data.tasks", "at least one task"]),
    ("unknown task", _dump(_with("data/tasks/rev/task", "reverce")),
     ["data.tasks.rev.task", "'reverse'"]),
    ("unnamed custom task", _dump(_with("data/tasks/mine", {"length": 3})),
     ["data.tasks.mine.task: missing", "copy"]),
    ("task unknown arg", _dump(_with("data/tasks/copy", {"lenght": 3})),
     ["data.tasks.copy.lenght", "'length'"]),
    ("task negative length", _dump(_with("data/tasks/copy", {"length": -2})),
     ["data.tasks.copy.length", "integer >= 1"]),
    ("task zero weight", _dump(_with("data/tasks/copy", {"length": 3, "weight": 0})),
     ["data.tasks.copy.weight", "> 0"]),
    ("task too long", _dump(_with("data/tasks/copy", {"length": 9})),
     ["data.tasks.copy", "max_seq_len=10"]),
    ("negative steps", _dump(_with("train/steps", -5)), ["train.steps: got -5", "integer"]),
    ("lr not a number", _dump(_with("train/lr", "fast")), ["train.lr", "number"]),
    ("train unknown key", _dump(_with("train/stpes", 3)), ["train.stpes", "'steps'"]),
    ("head out of range", _dump(_with("heads/L1.H9", {"mask": "self_only"})),
     ["heads.L1.H9", "heads 0-3"]),
    ("layer out of range", _dump(_with("heads/L5.*", {"freeze": True})),
     ["heads.L5.*", "layers 0-1"]),
    ("malformed selector", _dump(_with("heads/layer0", {"freeze": True})),
     ["heads.layer0", "L1.H2"]),
    ("unknown mask", _dump(_with("heads/L0.H0", {"mask": "previous"})),
     ["heads.L0.H0.mask", "'previous_token'"]),
    ("mask bad param", _dump(_with("heads/L0.H0", {"mask": {"local": {"window": 0}}})),
     ["heads.L0.H0.mask.local.window", "integer >= 1"]),
    ("matrix mask too small", _dump(_with("heads/L0.H1", {"mask": {"from_matrix": {
        "matrix": [[1, 0], [1, 1]]}}})), ["heads.L0.H1.mask.from_matrix.matrix", "covers 2"]),
    ("head unknown key", _dump(_with("heads/L0.H2", {"objectve": {"target": "self"}})),
     ["heads.L0.H2.objectve", "'objective'"]),
    ("unknown objective target", _dump(_with("heads/L0.H2", {"objective": {"target": "prev"}})),
     ["heads.L0.H2.objective.target", "previous_token"]),
    ("head unknown task", _dump(_with("heads/L1.H1", {"tasks": ["cpy"]})),
     ["heads.L1.H1.tasks[0]", "'copy'"]),
    ("two masks one head", _dump(_with("heads/L0.*", {"mask": "self_only"})),
     ["heads.L0.*.mask", "L0.H0 already has mask from heads.L0.H0"]),
    ("freeze and objective", _dump(_with(
        "heads", {"L0.H2": {"objective": {"target": "self"}}, "L0.*": {"freeze": True}})),
     ["heads.L0.*", "frozen head"]),
    ("learned gates with tasks", _dump(_with("gates", {"kind": "learned"})),
     ["heads.L1.H1.tasks", "contradicts gates.kind=learned"]),
    ("bad gate kind", _dump(_with("gates", {"kind": "soft"})), ["gates.kind", "'fixed'"]),
    ("adapter rank 0", _dump(_with("adapters", {"targets": ["q"], "rank": 0})),
     ["adapters.rank", "integer >= 1"]),
    ("adapter unknown target", _dump(_with("adapters", {"targets": ["qq"], "rank": 2})),
     ["adapters.targets[0]", "'q'"]),
    ("contract not list", _dump(_with("contract", {"head": "L0.H0"})),
     ["contract: got a mapping", "list of clauses"]),
    ("contract head out of range", _dump(_with("contract", [
        {"head": "L0.H7", "score": "previous_token", "at_least": 0.9}])),
     ["contract[0]", "heads 0-3"]),
    ("contradictory clauses", _dump(_with("contract", [
        {"head": "L0.H0", "score": "previous_token", "at_least": 0.9},
        {"head": "L0.H0", "score": "previous_token", "at_most": 0.5}])),
     ["contract[1]: contradicts contract[0]", ">= 0.9 and <= 0.5"]),
    ("contradictory bounds", _dump(_with("contract", [
        {"ablate": "L1.H1", "task": "copy", "metric": "accuracy", "drop_at_least": 0.5,
         "drop_at_most": 0.1}])),
     ["contract[0]", "drop_at_least 0.5 > drop_at_most 0.1"]),
    ("contract unknown task", _dump(_with("contract", [
        {"ablate": "L1.H1", "task": "cpy", "drop_at_least": 0.5}])),
     ["contract[0].task", "'copy'"]),
    ("pretrained without config", _dump(_with("model", {"pretrained": {"path": "nowhere"}})),
     ["model.pretrained.path", "config.json"]),
]


@pytest.mark.parametrize("text,expected", [c[1:] for c in MALFORMED],
                         ids=[c[0] for c in MALFORMED])
def test_malformed_spec_exits_2_with_one_clear_message(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], text: str,
        expected: list[str]) -> None:
    spec = tmp_path / "spec.yaml"
    spec.write_text(text)
    code = main(["train", str(spec), "--out", str(tmp_path / "run")])
    err = capsys.readouterr().err
    assert code == 2, err
    assert "Traceback" not in err
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith("headwise train: error: ")
    for part in expected:
        assert part in lines[0], (part, lines[0])
    assert not (tmp_path / "run").exists()


def test_table_has_at_least_20_cases() -> None:
    assert len(MALFORMED) >= 20


def test_base_spec_is_valid() -> None:
    from headwise.runspec import load_spec

    spec = load_spec(_dump(BASE))
    assert spec.data.names == ("copy", "rev")


def test_missing_spec_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["train", str(tmp_path / "absent.yaml")]) == 2
    assert "absent.yaml: no such spec file" in capsys.readouterr().err


@pytest.mark.parametrize("command", ["demo", "train", "verify", "analyze", "report", "explain",
                                     "plan", "convert", "export", "fit-forecaster"])
def test_help_exits_0(command: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main([command, "--help"]) == 0
    text = capsys.readouterr().out
    assert "usage: headwise " + command in text
    assert "%%" not in text  # a description is printed as written, help strings are %-formatted


def test_every_subcommand_is_registered() -> None:
    text = build_parser().format_help()
    for command in ("demo", "train", "verify", "analyze", "report", "explain"):
        assert command in text


def test_analyze_hf_prints_every_head_and_writes_one_record_per_head(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    import json

    import torch
    from transformers import GPT2Config, GPT2LMHeadModel

    from headwise.analysis.probe_inputs import induction_probe

    torch.manual_seed(0)
    hf = GPT2LMHeadModel(GPT2Config(n_layer=2, n_head=3, n_embd=24, vocab_size=50,
                                    n_positions=20, attn_implementation="eager")).eval()
    hf.save_pretrained(tmp_path / "gpt2")
    out = tmp_path / "roles.json"
    assert main(["analyze", "--hf", str(tmp_path / "gpt2"), "--json", str(out)]) == 0
    printed = capsys.readouterr().out
    records = json.loads(out.read_text())["roles"]
    assert [(r["layer"], r["head"]) for r in records] == [(l, h) for l in range(2)
                                                           for h in range(3)]
    assert all(f"L{l}.H{h}" in printed for l in range(2) for h in range(3))
    # Independent reference: HF's own attention weights on the same probe (16 repeated random
    # halves of 10 tokens, seed 0): previous-token score = mean attention on key q - 1.
    tokens = induction_probe(50, 16, 10, torch.Generator().manual_seed(0))
    with torch.no_grad():
        attentions = hf(tokens, output_attentions=True).attentions  # per layer (B, H, T, T)
    for r in records:
        a = attentions[r["layer"]][:, r["head"]]
        expected = a.diagonal(offset=-1, dim1=1, dim2=2).mean()
        assert r["previous_token"] == pytest.approx(float(expected), abs=1e-5)


def test_analyze_needs_exactly_one_source(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["analyze"]) == 2
    assert "expected either a run directory or --hf DIR" in capsys.readouterr().err


RUN_SPEC = """
model: {n_layers: 1, n_heads: 2, d_model: 16, vocab_size: 12, max_seq_len: 10}
data: {tasks: {copy: {length: 4}}, eval_examples: 32}
train: {steps: 6, batch_size: 8, eval_every: 3, checkpoint_every: 3}
heads: {L0.H0: {mask: previous_token}}
contract:
  - {head: L0.H0, score: previous_token, at_least: 0.99}
"""


def test_run_directory_resume_and_refusals(tmp_path: Path,
                                           capsys: pytest.CaptureFixture[str]) -> None:
    import json

    import torch
    from safetensors.torch import load_file

    spec = tmp_path / "spec.yaml"
    spec.write_text(RUN_SPEC)
    run = tmp_path / "run"
    assert main(["train", str(spec), "--out", str(run), "--quiet"]) == 0
    assert (run / "spec.yaml").read_text() == RUN_SPEC
    assert sorted(p.name for p in (run / "checkpoints").iterdir()) == [
        "step_0000003", "step_0000006"]
    weights = load_file(str(run / "model.safetensors"))
    capsys.readouterr()
    # Training into a finished run without --resume is refused, nothing touched.
    assert main(["train", str(spec), "--out", str(run)]) == 2
    assert "already holds a run; pass --resume" in capsys.readouterr().err
    # --resume from the last checkpoint: nothing left to train, same weights and verdict.
    assert main(["train", str(spec), "--out", str(run), "--resume", "--quiet"]) == 0
    resumed = load_file(str(run / "model.safetensors"))
    assert resumed.keys() == weights.keys()
    assert all(torch.equal(resumed[k], weights[k]) for k in weights)
    assert json.loads((run / "contract.json").read_text())["passed"]
    # --resume with another spec is refused.
    other = tmp_path / "other.yaml"
    other.write_text(RUN_SPEC.replace("steps: 6", "steps: 9"))
    capsys.readouterr()
    assert main(["train", str(other), "--out", str(run), "--resume"]) == 2
    assert "differs from" in capsys.readouterr().err


@pytest.mark.parametrize("argv,message", [
    (["verify", "{spec}", "--run", "{tmp}/nowhere"], "no such run directory"),
    (["report", "{tmp}/nowhere"], "no such run directory"),
    (["analyze", "{tmp}"], "no model.safetensors; has training finished?"),
    (["explain", "{tmp}/nowhere", "--head", "L0.H0", "--input", "copy"], "no such run"),
    (["analyze", "--hf", "{tmp}"], "config.json"),
])
def test_bad_run_arguments_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                  argv: list[str], message: str) -> None:
    spec = tmp_path / "spec.yaml"
    spec.write_text(RUN_SPEC)
    args = [a.format(spec=spec, tmp=tmp_path) for a in argv]
    assert main(args) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err and len(err.strip().splitlines()) == 1


def test_explain_bad_head_and_input(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    spec = tmp_path / "spec.yaml"
    spec.write_text(RUN_SPEC)
    run = tmp_path / "run"
    assert main(["train", str(spec), "--out", str(run), "--quiet"]) == 0
    capsys.readouterr()
    assert main(["explain", str(run), "--head", "L0.H5", "--input", "copy"]) == 2
    assert "--head: " in capsys.readouterr().err
    assert main(["explain", str(run), "--head", "L0.H0", "--input", "1 2 99"]) == 2
    assert "--input: token id 99 out of range" in capsys.readouterr().err
    assert main(["explain", str(run), "--head", "L0.H0", "--input", "1 4 5 2"]) == 0
    assert "<bos> s0 s1 <sep>" in capsys.readouterr().out  # headwise.data.token_names


def test_train_a_pretrained_hf_model_from_a_spec(tmp_path: Path) -> None:
    import torch
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    GPT2LMHeadModel(GPT2Config(n_layer=1, n_head=2, n_embd=16, vocab_size=30,
                               n_positions=16)).save_pretrained(tmp_path / "gpt2")
    spec = tmp_path / "spec.yaml"
    spec.write_text("model: {pretrained: {path: gpt2, format: hf}}\n"
                    "data: {tasks: {copy: {length: 3}}, eval_examples: 16}\n"
                    "train: {steps: 2, batch_size: 4}\n"
                    "heads: {L0.H1: {mask: previous_token}}\n"
                    "contract: [{head: L0.H1, score: previous_token, at_least: 0.99}]\n")
    assert main(["train", str(spec), "--out", str(tmp_path / "run"), "--quiet"]) == 0


@pytest.mark.slow
def test_train_under_torchrun_equals_one_process(tmp_path: Path) -> None:
    """`torchrun --nproc_per_node=2 headwise train` (DDP, gloo) matches a 1-process run."""
    import os
    import shutil
    import subprocess
    import sys

    import torch
    from safetensors.torch import load_file

    spec = tmp_path / "spec.yaml"
    spec.write_text(RUN_SPEC)
    headwise = shutil.which("headwise", path=os.path.dirname(sys.executable))
    torchrun = shutil.which("torchrun", path=os.path.dirname(sys.executable))
    assert headwise and torchrun
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    # the one-process run trains while torchrun starts its ranks
    one = subprocess.Popen([headwise, "train", str(spec), "--out", str(tmp_path / "one"),
                            "--quiet", "--threads", "1"], env=env, stdout=subprocess.PIPE,
                           stderr=subprocess.PIPE, text=True)
    two = subprocess.run([torchrun, "--nproc_per_node=2", headwise, "train", str(spec), "--out",
                          str(tmp_path / "two"), "--quiet", "--threads", "1"], env=env,
                         capture_output=True, text=True)
    _, err = one.communicate(timeout=300)
    assert one.returncode == 0, err
    assert two.returncode == 0, two.stderr
    assert two.stdout.count("contract HOLDS") == 1  # only rank 0 prints
    a = load_file(str(tmp_path / "one" / "model.safetensors"))
    b = load_file(str(tmp_path / "two" / "model.safetensors"))
    assert a.keys() == b.keys()
    for key in a:
        torch.testing.assert_close(a[key], b[key], rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("rank, lines", [("0", 1), ("1", 0)])
@pytest.mark.parametrize("stop", ["signal", "keyboard"])
def test_interrupt_line_printed_by_rank_0_only(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                               capsys: pytest.CaptureFixture[str], rank: str,
                                               lines: int, stop: str) -> None:
    """Under torchrun every rank stops at the same step: one "interrupted" line, from rank 0;
    every rank exits 130."""
    import signal

    import headwise.pipeline.run as pipeline_run
    from headwise.training.interrupt import Interrupted

    def stopped(*args: Any, **kwargs: Any) -> None:
        if stop == "signal":
            raise Interrupted(7, signal.SIGTERM, tmp_path / "run" / "checkpoints" / "step_7")
        raise KeyboardInterrupt

    monkeypatch.setattr(pipeline_run, "train_run", stopped)
    monkeypatch.setenv("RANK", rank)
    spec = tmp_path / "s.yaml"
    spec.write_text("unused: the training function is replaced\n")
    code = main(["train", str(spec), "--out", str(tmp_path / "run"), "--quiet"])
    err = capsys.readouterr().err
    assert code == 130
    assert len(err.strip().splitlines()) == lines, err
    if lines:
        assert ("interrupted at step 7; resume with" in err if stop == "signal"
                else "interrupted before the first checkpoint" in err)


def test_analyze_names_a_run_given_as_hf_and_a_spec_given_as_run(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    run = tmp_path / "run"
    run.mkdir()
    (run / "run.json").write_text("{}")
    (run / "spec.yaml").write_text("model: {}\n")
    assert main(["analyze", "--hf", str(run)]) == 2
    err = capsys.readouterr().err.strip()
    assert "is a headwise run, not a HuggingFace checkpoint" in err
    assert "headwise analyze RUN" in err
    spec = tmp_path / "spec.yaml"
    spec.write_text("model: {}\n")
    assert main(["analyze", str(spec)]) == 2
    err = capsys.readouterr().err.strip()
    assert "is a spec, expected a run directory" in err and f"headwise train {spec}" in err
