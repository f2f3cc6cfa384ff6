"""``headwise generate RUN --prompt TEXT`` on a byte-level text run: the printed text is the
model's greedy continuation (an argmax loop over the run's weights, computed here), stop
tokens end it, and bad options are one line with exit 2."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import yaml
from cli_runs import cli

from headwise import load_run


@pytest.fixture(scope="module")
def byte_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from headwise.cli import main

    root = tmp_path_factory.mktemp("gen")
    (root / "corpus.txt").write_text("the quick brown fox jumps over it.\n" * 40)
    spec = {"model": {"n_layers": 1, "n_heads": 2, "d_model": 8, "vocab_size": 256,
                      "max_seq_len": 24},
            "data": {"tasks": {"lm": {"task": "text", "path": str(root / "corpus.txt"),
                                      "seq_len": 12}}},
            "train": {"steps": 3, "batch_size": 4, "eval_batches": 1, "eval_every": 3}}
    (root / "lm.yaml").write_text(yaml.safe_dump(spec))
    assert main(["train", str(root / "lm.yaml"), "--out", str(root / "run"), "--quiet"]) == 0
    return root / "run"


def _greedy(run: Path, prompt: bytes, n: int) -> list[int]:
    model = load_run(run).model.eval()
    seq = torch.tensor([list(prompt)])
    with torch.no_grad():
        for _ in range(n):
            seq = torch.cat([seq, model(seq)[:, -1].argmax(-1, keepdim=True)], dim=1)
    return seq[0].tolist()


def test_prints_the_greedy_continuation(byte_run: Path,
                                        capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = cli(capsys, "generate", str(byte_run), "--prompt", "the q",
                         "--max-new-tokens", "6")
    assert code == 0, err
    want = bytes(_greedy(byte_run, b"the q", 6)).decode("utf-8", errors="replace")
    assert out == want + "\n"


def test_a_stop_token_ends_the_text(byte_run: Path, capsys: pytest.CaptureFixture[str]) -> None:
    ids = _greedy(byte_run, b"the q", 6)
    stop = next(b for b in ids[5:] if b < 128)  # a new byte that is one character
    code, out, err = cli(capsys, "generate", str(byte_run), "--prompt", "the q",
                         "--max-new-tokens", "6", "--stop", chr(stop))
    assert code == 0, err
    first = ids[5:].index(stop) + 5  # where that byte first appears among the new ones
    assert out == bytes(ids[: first + 1]).decode("utf-8", errors="replace") + "\n"


@pytest.mark.parametrize("argv, message", [
    (["--max-new-tokens", "40"], "--max-new-tokens: got 40"),
    (["--stop", "ab"], "--stop: string"),
    (["--top-k", "3"], "--top-k/--top-p: expected them with --sample"),
    (["--sample", "--seed", str(2**64)], f"--seed: got {2**64}, expected an integer in [0, 2^63)"),
    (["--sample", "--seed", "-1"], "--seed: got -1, expected an integer in [0, 2^63)"),
    (["--sample", "--temperature", "nan"], "--temperature: got nan, expected 0 (greedy) or a "
                                           "finite number >= 1e-4"),
    (["--sample", "--temperature", "inf"], "--temperature: got inf"),
    (["--sample", "--temperature", "1e-300"], "--temperature: got 1e-300"),
    (["--sample", "--top-k", "9" * 20], f"--top-k: got {'9' * 20}, expected an integer in "
                                       "[1, 256]"),
    (["--sample", "--top-k", "257"], "--top-k: got 257, expected an integer in [1, 256]"),
    (["--prompt", "a\udcffb"], "--prompt: character 2 is not UTF-8 (byte 0xff)"),
    (["--stop", "\udcff"], "--stop: character 1 is not UTF-8 (byte 0xff)"),
])
def test_bad_options_are_one_line(byte_run: Path, capsys: pytest.CaptureFixture[str],
                                  argv: list[str], message: str) -> None:
    code, out, err = cli(capsys, "generate", str(byte_run), "--prompt", "the q", *argv)
    assert code == 2 and out == ""
    assert message in err and len(err.strip().splitlines()) == 1, err


def test_the_smallest_temperature_samples(byte_run: Path,
                                         capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = cli(capsys, "generate", str(byte_run), "--prompt", "the q", "--sample",
                         "--temperature", "1e-4", "--top-k", "256", "--max-new-tokens", "3")
    assert code == 0 and out.startswith("the q"), err


def test_help_names_the_options(capsys: pytest.CaptureFixture[str]) -> None:
    from headwise.cli import build_parser, main

    assert "generate" in build_parser().format_help()
    assert main(["generate", "--help"]) == 0
    text = capsys.readouterr().out
    assert "usage: headwise generate" in text and "--max-new-tokens" in text
