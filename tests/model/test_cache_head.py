"""``ActivationCache.head`` takes query-head numbers on every point, GQA k/v included.

The reference is the projection itself: query head ``h`` reads kv head ``h // (H / Hkv)``
(HuggingFace's ``repeat_kv`` order), written out here as the expanded ``k_proj`` output.
"""

from __future__ import annotations

import pytest
import torch

from headwise.config import ModelConfig
from headwise.errors import SelectorError
from headwise.model import build_model

# 6 query heads read 2 kv heads (groups of 3); every dimension distinct.
CFG = ModelConfig(n_layers=2, n_heads=6, n_kv_heads=2, d_model=20, d_head=8, d_ff=28,
                  vocab_size=23, max_seq_len=9, positional="rope", norm_type="rmsnorm",
                  activation="swiglu", bias="none")
K, V, Q, ROT_K = (f"blocks.1.attn.hook_{leaf}" for leaf in ("k", "v", "q", "rot_k"))


@pytest.fixture()
def run() -> tuple[torch.nn.Module, torch.Tensor]:
    model = build_model(CFG, seed=0).eval()
    return model, torch.randint(0, CFG.vocab_size, (2, 7),
                                generator=torch.Generator().manual_seed(1))


def test_query_head_gets_its_kv_group_slice(run) -> None:
    model, tokens = run
    seen = {}
    attn = model.blocks[1].attn
    handle = attn.k_proj.register_forward_hook(lambda m, i, o: seen.update(k=o))
    _, cache = model.run_with_cache(tokens, [K, V, Q, ROT_K])
    handle.remove()
    k = seen["k"].view(2, 7, 2, 8).repeat_interleave(3, dim=2)  # (B, T, H, Dh), by query head
    for h in range(6):
        torch.testing.assert_close(cache.head(K, h), k[:, :, h], atol=0, rtol=0)
        assert torch.equal(cache.head(V, h), cache[V][:, :, h // 3])
        assert torch.equal(cache.head(ROT_K, h), cache[ROT_K][:, :, h // 3])
        assert torch.equal(cache.head(Q, h), cache[Q][:, :, h])  # q: one slot per query head


def test_restricted_cache_maps_query_heads_to_the_kv_heads_held(run) -> None:
    model, tokens = run
    _, full = model.run_with_cache(tokens, [K])
    _, cache = model.run_with_cache(tokens, [K], heads="L1.H4")  # reads kv head 1 only
    assert cache.heads_of(K) == (3, 4, 5) and cache[K].shape == (2, 7, 1, 8)  # query heads
    for h in (3, 4, 5):  # every query head of that group
        assert torch.equal(cache.head(K, h), full[K][:, :, 1])
    with pytest.raises(KeyError, match=r"head 0 not cached; cached query heads \(3, 4, 5\)"):
        cache.head(K, 0)


@pytest.mark.parametrize("name, head, expected", [
    (K, 6, r"^blocks\.1\.attn\.hook_k: head 6 out of range; expected a query head 0-5 "
           r"\(2 kv heads of 3 query heads each\), value shape \(2, 7, 2, 8\)$"),
    (K, -1, r"^blocks\.1\.attn\.hook_k: head -1 out of range; expected a query head 0-5"),
    (Q, 6, r"^blocks\.1\.attn\.hook_q: head 6 out of range; expected a query head 0-5, "
           r"value shape \(2, 7, 6, 8\)$"),
    (Q, "2", r"^blocks\.1\.attn\.hook_q: head '2' out of range"),
])
def test_bad_head_number_is_one_line_naming_head_and_shape(run, name, head, expected) -> None:
    model, tokens = run
    _, cache = model.run_with_cache(tokens, [name])
    with pytest.raises(SelectorError, match=expected) as err:
        cache.head(name, head)
    assert "\n" not in str(err.value)


def test_patching_gqa_keys_copies_the_kv_head_the_query_head_reads(run) -> None:
    from headwise.hooks import patch

    model, tokens = run
    other = torch.randint(0, CFG.vocab_size, (2, 7), generator=torch.Generator().manual_seed(9))
    _, source = model.run_with_cache(tokens, [K])
    with model.hooks(patch(model, source, "L1.H4", point="k")):  # query head 4 reads kv head 1
        _, out = model.run_with_cache(other, [K])
    assert torch.equal(out[K][:, :, 1], source[K][:, :, 1])
