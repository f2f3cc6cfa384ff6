"""``headwise.load_run``: a finished run's model (levers installed, trained weights), spec,
tokenizer and the verdict read from its sealed contract.json."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import transformers
from safetensors.torch import load_file
from tokenizers import Tokenizer, models, pre_tokenizers

import headwise as hw
from headwise.cli import main
from headwise.contract import ContractResult
from headwise.errors import CheckpointError, ConfigError
from headwise.pipeline.options import RunOptions
from headwise.pipeline.run import train_run

SPEC = """
model: {n_layers: 1, n_heads: 2, d_model: 16, vocab_size: 12, max_seq_len: 10}
data: {tasks: {copy: {length: 3}}, eval_examples: 16}
train: {steps: 3, batch_size: 8}
heads: {L0.H0: {mask: previous_token}}
contract:
  - {head: L0.H0, score: previous_token, at_least: 0.9}
  - {head: L0.H1, score: previous_token, at_most: 1.0}
"""


def _train(tmp_path: Path, text: str) -> Path:
    (tmp_path / "spec.yaml").write_text(text)
    run = tmp_path / "run"
    assert main(["train", str(tmp_path / "spec.yaml"), "--out", str(run), "--quiet"]) == 0
    return run


@pytest.fixture(scope="module")
def trained(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A finished run of ``SPEC`` (read-only: a test that edits it works on a copy)."""
    return _train(tmp_path_factory.mktemp("loaded"), SPEC)


def test_load_run_gives_the_trained_model_spec_and_recorded_verdict(trained, tmp_path):
    run = shutil.copytree(trained, tmp_path / "run")
    loaded = hw.load_run(run)
    assert isinstance(loaded, hw.LoadedRun) and loaded.path == run
    model = loaded.model
    assert not model.training and model.blocks[0].attn.head_mask is not None  # mask installed
    saved = load_file(run / "model.safetensors")
    state = model.state_dict()
    assert saved and all((state[k] == v).all() for k, v in saved.items())
    assert loaded.spec.text == (run / "spec.yaml").read_text()
    assert loaded.tokenizer is None and model.tokenizer is None
    with pytest.raises(ConfigError, match="tokenizer: the model has none"):
        model.to_tokens("text")
    recorded = json.loads((run / "contract.json").read_text())
    verdict = loaded.contract
    assert isinstance(verdict, ContractResult) and verdict.passed == recorded["passed"]
    assert [r.clause for r in verdict.results] == list(loaded.spec.contract)
    assert verdict.to_dict() == recorded  # every field read back as written

    # An edited verdict is refused by the manifest, naming the file.
    (run / "contract.json").write_text(json.dumps({**recorded, "passed": not recorded["passed"]}))
    with pytest.raises(CheckpointError, match=r"contract\.json: contents do not match"):
        hw.load_run(run)


def test_a_verdict_of_another_contract_or_a_mistyped_field_is_refused(trained):
    run = trained
    contract = hw.load_run(run).spec.contract
    recorded = json.loads((run / "contract.json").read_text())
    swapped = {**recorded, "clauses": recorded["clauses"][::-1]}
    with pytest.raises(CheckpointError, match=r"f: clauses\[0\]: expected the verdict of "
                                              r"contract\[0\] \(L0\.H0"):
        ContractResult.from_dict(swapped, contract, "f")
    for field, value, expected in (("measured", "0.5", "a number or null"),
                                   ("passed", 1, "true or false"),
                                   ("ci", [0.1], "a list of two numbers or null"),
                                   ("per_head", {"L0.H0": "x"}, "an object of numbers")):
        clauses = [dict(c) for c in recorded["clauses"]]
        clauses[1][field] = value
        with pytest.raises(CheckpointError, match=rf"f: clauses\[1\]\.{field}: expected "
                                                  rf"{expected}"):
            ContractResult.from_dict({"clauses": clauses}, contract, "f")
    with pytest.raises(CheckpointError, match="f: clauses: expected a list of the 2 clauses"):
        ContractResult.from_dict({"clauses": recorded["clauses"][:1]}, contract, "f")


def test_a_text_task_tokenizer_is_the_run_tokenizer(tmp_path):
    words = ["[UNK]", "<s>", "[PAD]", "the", "cat", "sat", "on", "mat"]
    tok = Tokenizer(models.WordLevel({w: i for i, w in enumerate(words)}, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    hf = transformers.PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="[UNK]",
                                              bos_token="<s>", pad_token="[PAD]")
    hf.save_pretrained(tmp_path / "tok")
    (tmp_path / "corpus.txt").write_text("the cat sat on the mat\n" * 80)
    run = _train(tmp_path, """
model: {n_layers: 1, n_heads: 2, d_model: 16, vocab_size: 8, max_seq_len: 8}
data: {tasks: {lm: {task: text, path: corpus.txt, seq_len: 8, tokenizer: tok}},
        eval_examples: 8}
train: {steps: 2, batch_size: 4}
""")
    loaded = hw.load_run(run)
    assert loaded.model.tokenizer is loaded.tokenizer and loaded.tokenizer.bos_token == "<s>"
    texts = ["the cat sat", "on the mat mat"]
    ref = hf(["<s> " + t for t in texts], padding=True)["input_ids"]  # BOS by default
    assert loaded.model.to_tokens(texts).tolist() == ref
    assert loaded.model.to_str_tokens("the cat") == ["<s>", "the", "cat"]


def test_a_pretrained_checkpoint_tokenizer_is_the_run_tokenizer(tmp_path, hf_model_dir):
    _, gpt2 = hf_model_dir("gpt2")
    src = shutil.copytree(gpt2, tmp_path / "gpt2")
    words = ["[UNK]", "<|endoftext|>", "the", "cat", "sat"]
    tok = Tokenizer(models.WordLevel({w: i for i, w in enumerate(words)}, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    hf = transformers.PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="[UNK]",
                                              bos_token="<|endoftext|>",
                                              eos_token="<|endoftext|>")
    hf.save_pretrained(src)
    (tmp_path / "spec.yaml").write_text(f"model: {{pretrained: {{path: {src}}}}}\n"
                                        "data: {tasks: {copy: {length: 3}}, eval_examples: 4}\n"
                                        "train: {steps: 1, batch_size: 2}\n")
    run = tmp_path / "run"
    train_run(tmp_path / "spec.yaml", run, RunOptions(progress=False))  # a finished run (no report)
    loaded = hw.load_run(run)
    assert loaded.tokenizer is loaded.model.tokenizer
    assert (loaded.tokenizer.bos_token, loaded.tokenizer.pad_token) == ("<|endoftext|>",) * 2
    texts = ["the cat sat", "cat"]  # BOS prepended, padded with EOS, as TransformerLens does
    ref = hf(["<|endoftext|> " + t for t in texts])["input_ids"]
    assert loaded.model.to_tokens(texts).tolist() == [ref[0], ref[1] + [1, 1]]
