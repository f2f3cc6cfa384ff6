"""MLMTask: BERT's masked language modelling on a local text file, for bidirectional models.

The file is read whole and its documents dealt to splits as for ``text``
(``headwise.data.corpus``). An example is a window of consecutive ids of one split, wrapped in
the tokenizer's own special tokens (its post-processor's, e.g. ``[CLS] ... [SEP]``; none for
bytes) to ``seq_len`` positions. Masking follows BERT (Devlin et al. 2019) as transformers'
``DataCollatorForLanguageModeling`` draws it: each position that is not a special token is
chosen independently with probability ``mask_prob``; of the chosen, 80% become the mask token,
10% a random token (uniform over the vocabulary) and 10% stay unchanged. Targets are the
original ids at the chosen positions and ``IGNORE`` elsewhere, so the loss and the metrics read
the chosen positions only. Every draw comes from the task's generator (reproducible).

Bytes (no tokenizer) use ids 0-255 and the mask id 256 (vocabulary 257). A tokenizer needs a
special ``[MASK]`` or ``<mask>`` token. A model trained on this task needs BERT's MLM head
(``add_mlm_head``); a checkpoint that has one brings it (``headwise.interop.load_hf``).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import ClassVar

import torch
from torch import Tensor, nn

from headwise.data.batch import IGNORE, Batch
from headwise.data.corpus import check_split, local_tokenizer, read_corpus
from headwise.data.task import Task, check_int, make_batch
from headwise.errors import ConfigError, field_error

BYTE_MASK = 256  # the mask id of byte-level masked LM
MASK_TOKENS = ("[MASK]", "<mask>")  # BERT's and RoBERTa's spelling
MASK, RANDOM = 0.8, 0.1  # shares of the chosen positions masked and randomised (rest kept)


@dataclass(frozen=True, kw_only=True)
class MLMTask(Task):
    """Masked language modelling over a local text file.

    Args:
        path: the text file (UTF-8).
        seq_len: T, special tokens included.
        mask_prob: probability that a position (not a special token) is chosen.
        tokenizer: ``None`` for bytes, or a directory holding ``tokenizer.json`` (or that file).
        split: ``"train"``, ``"eval"`` or ``"verify"``.
        eval_fraction: share of the ids held out (whole documents), split in halves for
            ``"eval"`` and ``"verify"``.

    Raises:
        ConfigError: a missing file or tokenizer, a tokenizer without a mask token, a bad
            ``mask_prob`` or split, or a split shorter than one window.
    """

    name: ClassVar[str] = "mlm"
    starts_with_bos: ClassVar[bool] = False
    splits: ClassVar[tuple[str, ...]] = ("train", "eval", "verify")
    needs_mlm_head: ClassVar[bool] = True
    path: str
    seq_len: int = 64
    mask_prob: float = 0.15
    tokenizer: str | None = None
    split: str = "train"
    eval_fraction: float = 0.1
    _ids: Tensor = field(init=False, repr=False, compare=False)
    _vocab: int = field(init=False, repr=False, compare=False)
    _mask_id: int = field(init=False, repr=False, compare=False)
    _wrap: tuple[Tensor, Tensor] = field(init=False, repr=False, compare=False)
    _special: Tensor = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        check_int(self.name, "seq_len", self.seq_len, 1)
        p = self.mask_prob
        if isinstance(p, bool) or not isinstance(p, (int, float)) or not 0 < p < 1:
            raise field_error(f"{self.name}.mask_prob", p, "a number in (0, 1)")
        check_split(self.name, self.split, self.eval_fraction)
        corpus = read_corpus(self.path, self.tokenizer, self.name)
        prefix: list[int] = []
        suffix: list[int] = []
        if self.tokenizer is None:
            vocab, mask_id, special = 257, BYTE_MASK, [BYTE_MASK]
        else:
            vocab = corpus.vocab_size
            mask_id, prefix, suffix, special = _specials(self.tokenizer, self.name)
        content = self.seq_len - len(prefix) - len(suffix)
        if content < 1:
            raise field_error(f"{self.name}.seq_len", self.seq_len,
                              f"an integer > {len(prefix) + len(suffix)} (the tokenizer's "
                              "special tokens around each window)")
        part = corpus.split(self.split, self.eval_fraction)
        if len(part) < content:
            raise ConfigError(
                f"{self.name}.path: the {self.split!r} split of {self.path!r} has {len(part)} "
                f"ids, expected at least {content} for one window (documents are dealt whole: "
                f"{len(corpus.lengths)} in the file)")
        object.__setattr__(self, "_ids", part)
        object.__setattr__(self, "_vocab", vocab)
        object.__setattr__(self, "_mask_id", mask_id)
        object.__setattr__(self, "_wrap", (torch.tensor(prefix, dtype=torch.long),
                                           torch.tensor(suffix, dtype=torch.long)))
        object.__setattr__(self, "_special", torch.tensor(sorted(set(special)),
                                                          dtype=torch.long))

    @property
    def vocab_size(self) -> int:
        return self._vocab

    @property
    def mask_id(self) -> int:
        """The id that replaces 80% of the chosen positions."""
        return self._mask_id

    @property
    def n_examples(self) -> int:
        """The consecutive windows that tile the split's ids once (a shorter tail is left
        out)."""
        return len(self._ids) // self._content

    def examples_at(self, index: Tensor, generator: torch.Generator) -> Batch:
        """The tiling windows at ``index``, wrapped and masked as ``sample`` does (the
        masking drawn from ``generator``)."""
        return self._masked(index * self._content, generator)

    @property
    def _content(self) -> int:
        """The ids of the text in one window (``seq_len`` less the wrapping specials)."""
        return self.seq_len - len(self._wrap[0]) - len(self._wrap[1])

    def sample(self, n: int, generator: torch.Generator) -> Batch:
        L = self._content
        starts = torch.randint(0, len(self._ids) - L + 1, (n,), generator=generator)
        return self._masked(starts, generator)

    def _masked(self, starts: Tensor, generator: torch.Generator) -> Batch:
        """The windows at ``starts`` (n,), wrapped and masked."""
        prefix, suffix = self._wrap
        n, L = starts.shape[0], self.seq_len - len(prefix) - len(suffix)
        window = self._ids[starts[:, None] + torch.arange(L)]  # (n, L)
        original = torch.cat([prefix.expand(n, -1), window, suffix.expand(n, -1)], 1)  # (n, T)
        tokens, targets = mask_tokens(original, self.mask_prob, self._mask_id,
                                      256 if self.tokenizer is None else self._vocab,
                                      self._special, generator)
        return make_batch(tokens, targets)


def mask_tokens(original: Tensor, mask_prob: float, mask_id: int, n_random: int,
                special: Tensor, generator: torch.Generator) -> tuple[Tensor, Tensor]:
    """BERT's 80/10/10 masking of ``original`` (B, T).

    Args:
        mask_prob: probability that a position is chosen.
        mask_id: the mask token's id.
        n_random: random replacements are drawn uniformly from ``[0, n_random)``.
        special: (S,) ids never chosen.

    Returns:
        ``(tokens, targets)`` (B, T): the masked input, and the original id at the chosen
        positions (``IGNORE`` elsewhere).
    """
    shape = original.shape
    chosen = (torch.rand(shape, generator=generator) < mask_prob) & ~torch.isin(original,
                                                                                special)
    u = torch.rand(shape, generator=generator)  # which of the three a chosen position gets
    random_ids = torch.randint(0, n_random, shape, generator=generator)
    tokens = torch.where(chosen & (u < MASK), torch.full_like(original, mask_id), original)
    tokens = torch.where(chosen & (u >= MASK) & (u < MASK + RANDOM), random_ids, tokens)
    targets = torch.where(chosen, original, torch.full_like(original, IGNORE))
    return tokens, targets


def _specials(tokenizer: str, task: str) -> tuple[int, list[int], list[int], list[int]]:
    """The mask id, the special ids the tokenizer puts before and after a text, and every
    special id (never chosen)."""
    tok = local_tokenizer(tokenizer, task)
    added = tok.get_added_tokens_decoder()
    special = [i for i, t in added.items() if t.special]
    masks = [i for i, t in added.items() if t.special and t.content in MASK_TOKENS]
    if not masks:
        raise ConfigError(f"{task}.tokenizer: {tokenizer} has no special mask token "
                          f"({' or '.join(MASK_TOKENS)}), expected a masked-LM tokenizer")
    enc = tok.encode("a", add_special_tokens=True)  # its post-processor's template
    plain = [k for k, s in enumerate(enc.special_tokens_mask) if not s]
    first, last = (plain[0], plain[-1]) if plain else (len(enc.ids), len(enc.ids) - 1)
    return masks[0], enc.ids[:first], enc.ids[last + 1:], special


def add_mlm_head(model: nn.Module, tasks: Iterable[type[Task] | Task], seed: int) -> None:
    """Give ``model`` BERT's masked-LM head when a task needs one and it has none
    (``headwise.model.build_mlm_head``: initialised as transformers does).

    Args:
        model: a headwise ``Transformer``.
        tasks: the tasks (or task classes) it will train on.
        seed: seeds the head's initialisation.
    """
    from headwise.model import build_mlm_head
    from headwise.model.hook_point import tree_changed

    if getattr(model, "mlm_head", "missing") is None and any(
            getattr(t, "needs_mlm_head", False) for t in tasks):
        model.mlm_head = build_mlm_head(model.config, seed=seed)  # type: ignore[arg-type]
        tree_changed(model)  # the head's hook point joins the model's map
