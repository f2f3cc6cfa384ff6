"""Memory estimates: the parameter count equals the built model's; over-large sizes are refused
with the estimate and the memory available, before anything is allocated."""

from __future__ import annotations

import itertools
import subprocess
import sys
from pathlib import Path

import pytest

import headwise.memory
from headwise.config import PRESETS, ModelConfig
from headwise.memory import ResourceError, check_memory, n_params
from headwise.model import build_model

VARIANTS = list(itertools.product(["relu", "swiglu"], [True, False], ["all", "none", "qkv"],
                                  [False, True], ["learned", "rope", "none"],
                                  ["layernorm", "rmsnorm"], ["pre", "post"]))


@pytest.mark.parametrize("variant", VARIANTS[::5])
def test_n_params_counts_the_built_model(variant: tuple) -> None:
    act, tie, bias, attn_only, pos, norm_type, norm = variant
    config = ModelConfig(n_layers=3, n_heads=4, n_kv_heads=2, d_model=20, d_head=6, d_ff=28,
                         vocab_size=23, max_seq_len=9, activation=act, tie_embeddings=tie,
                         bias=bias, attn_only=attn_only, positional=pos, norm_type=norm_type,
                         norm=norm, n_token_types=2, embed_norm=True)
    assert n_params(config) == sum(p.numel() for p in build_model(config).parameters())


def test_presets_counted() -> None:
    for config in PRESETS.values():
        assert n_params(config) == sum(p.numel() for p in build_model(config).parameters())


def test_a_model_too_big_for_memory_is_refused_before_allocation() -> None:
    huge = ModelConfig(n_layers=1024, n_heads=64, d_model=65536, vocab_size=12, max_seq_len=8)
    with pytest.raises(ResourceError, match=r"^model: needs about [0-9.e+]+ GiB, but only "
                                            r"[0-9.]+ GiB is available"):
        build_model(huge)
    check_memory("small", 1 << 20)  # a megabyte is fine


def test_the_address_space_limit_counts() -> None:
    # In a child limited to 2 GiB of address space, 1.5 GiB more than it holds is refused. The
    # child imports headwise.memory (and headwise.errors) alone, not the package's public API.
    package = Path(headwise.memory.__file__).parent
    code = ("import resource, sys, types; pkg = types.ModuleType('headwise'); "
            f"pkg.__path__ = [{str(package)!r}]; sys.modules['headwise'] = pkg; "
            "from headwise.memory import available_bytes as a; "
            "resource.setrlimit(resource.RLIMIT_AS, (2 << 30, 2 << 30)); print(a())")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=60, check=True).stdout
    assert 0 < int(out) < 2 << 30
