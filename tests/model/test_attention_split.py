"""Some heads explicit, the others fused (``Attention._split``): outputs, gradients and patterns.

The split path gathers q/k/v into (fused heads, explicit heads) order, runs the fused kernel on
the first group only and the explicit path on the second, and gathers back. References: the
no-hook fused forward (outputs, parameter gradients), the all-heads explicit forward (patterns
the hooks see), both of the same model; explicit sets change between calls on the same fixed
mask object, so a stale memo (masks or index tensors of the previous set) would show here.
"""

from __future__ import annotations

import itertools

import pytest
import torch
from ref_attention import fused_from
from test_attention_paths import TOL, B, config, head_mask, padding_mask, set_head_mask
from torch import Tensor, nn

from headwise.hooks import Hook
from headwise.model import build_model

SETS: list[tuple[int, ...]] = [(1,), (0, 2), (3,), (1,), (0, 1, 2)]
CASES = list(itertools.product(["mha", "rope", "gqa", "gqa_rope"],
                               ["none", "per_head", "per_head_batch"], [False, True]))


def _step(model: nn.Module, tokens: Tensor, am: Tensor | None,
          heads: tuple[int, ...] | None | bool) -> tuple[Tensor, list[Tensor], dict[str, Tensor]]:
    """Logits, the layer-0 patterns a hook saw, and parameter gradients of a sum-of-squares loss.
    ``heads``: ``False`` = no hook (fused); ``None`` = all heads; a tuple = those heads."""
    seen: list[Tensor] = []
    hooks = [] if heads is False else [
        Hook("blocks.0.attn.hook_pattern", lambda p, ctx: seen.append(p.detach().clone()),
             heads if isinstance(heads, tuple) else None)]
    model.zero_grad()
    with model.hooks(hooks):
        logits = model(tokens, attention_mask=am)
    logits.square().mean().backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    return logits.detach(), seen, grads


@pytest.mark.parametrize("kind, hmask, use_padding", CASES,
                         ids=["-".join(map(str, c)) for c in CASES])
def test_split_matches_fused_and_all_explicit(kind: str, hmask: str, use_padding: bool) -> None:
    cfg = config(kind, causal=True)
    model = fused_from(build_model(cfg, seed=0))  # the split machinery at this short length
    tokens = torch.randint(0, cfg.vocab_size, (B, 5), generator=torch.Generator().manual_seed(1))
    am = padding_mask() if use_padding else None
    set_head_mask(model, head_mask(hmask, cfg.n_heads))  # one mask object for every call
    ref_logits, _, ref_grads = _step(model, tokens, am, False)
    _, all_patterns, _ = _step(model, tokens, am, None)
    for heads in [s for s in SETS if max(s) < cfg.n_heads]:  # mha: 3 heads, the others 4
        logits, seen, grads = _step(model, tokens, am, heads)
        torch.testing.assert_close(logits, ref_logits, atol=TOL, rtol=0)
        assert grads.keys() == ref_grads.keys()
        for name, g in grads.items():
            torch.testing.assert_close(g, ref_grads[name], atol=TOL, rtol=0, msg=name)
        torch.testing.assert_close(seen[0], all_patterns[0][:, list(heads)], atol=TOL, rtol=0)
