"""``headwise export``: bad input exits 2 with one line naming the option as the user typed it
(``--peft``, ``--tokenizer``), while the library's own messages name its keyword arguments."""

from __future__ import annotations

from pathlib import Path

import pytest

from headwise import export_hf
from headwise.cli import main
from headwise.errors import HeadwiseError

SPEC = """
model: {n_layers: 1, n_heads: 2, d_model: 16, vocab_size: 12, max_seq_len: 10}
data: {tasks: {copy: {length: 3}}, eval_examples: 16}
train: {steps: 2, batch_size: 4}
"""
FILES = ("['tokenizer.json', 'tokenizer_config.json', 'special_tokens_map.json', 'vocab.txt', "
         "'merges.txt', 'vocab.json']")


@pytest.fixture(scope="module")
def inputs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A directory holding ``run`` (a finished run without adapters) and bad tokenizers."""
    root = tmp_path_factory.mktemp("export")
    (root / "spec.yaml").write_text(SPEC)
    assert main(["train", str(root / "spec.yaml"), "--out", str(root / "run"), "--quiet"]) == 0
    (root / "empty").mkdir()
    (root / "vocab.bin").write_text("{}")
    (root / "linked").mkdir()
    (root / "secret.txt").write_text("password")
    (root / "linked" / "tokenizer.json").symlink_to("../secret.txt")
    return root


# (options after ``export run --hf out``, the user's name of the field, the rest of the line)
BAD = [
    (["--peft", "adapter"], "the model has no LoRA adapters to export; leave it unset"),
    (["--tokenizer", "empty"], f"empty holds none of {FILES}"),
    (["--tokenizer", "nowhere"], f"nowhere holds none of {FILES}"),
    (["--tokenizer", "vocab.bin"], f"vocab.bin is not one of {FILES}"),
    (["--tokenizer", "linked"], "linked/tokenizer.json is a link to {root}/secret.txt, outside "
                                "{root}/linked; expected the checkpoint's own file (headwise "
                                "does not copy what links elsewhere point to)"),
]


@pytest.mark.parametrize("options,rest", BAD, ids=[" ".join(b[0]) for b in BAD])
def test_bad_input_names_the_option_typed(inputs: Path, monkeypatch: pytest.MonkeyPatch,
                                          capsys: pytest.CaptureFixture[str],
                                          options: list[str], rest: str) -> None:
    monkeypatch.chdir(inputs)
    capsys.readouterr()
    assert main(["export", "run", "--hf", "out", *options]) == 2
    root = inputs.resolve()
    assert capsys.readouterr().err == (f"headwise export: error: {options[0]}: "
                                       f"{rest.format(root=root)}\n")
    assert not (inputs / "out").exists()


@pytest.mark.parametrize("keyword,value,rest", [
    ("peft", "adapter", "the model has no LoRA adapters to export; leave it unset"),
    ("tokenizer", "vocab.bin", f"vocab.bin is not one of {FILES}"),
])
def test_the_library_names_its_keyword_arguments(inputs: Path, monkeypatch: pytest.MonkeyPatch,
                                                 keyword: str, value: str, rest: str) -> None:
    monkeypatch.chdir(inputs)
    with pytest.raises(HeadwiseError) as info:
        export_hf("run", "out", **{keyword: value})
    assert str(info.value) == f"{keyword}: {rest}"
