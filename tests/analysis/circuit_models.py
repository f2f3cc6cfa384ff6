"""Models whose circuit is known by construction, for path and circuit tests.

``induction_model()``: a 2-layer attention-only model (RMSNorm, no positions) with hand-set
weights. The residual stream has four subspaces: E (token one-hot, from the embeddings), P
(previous token), O (output, the only part the unembedding reads) and J (junk). L0.H0 has a
previous-token mask and copies E into P; L0.H1 (a self-only mask) writes a random map of E
into J; a task gate switches L1.H0 off; L1.H1 is an induction head: its query reads E, its key
P, its value E, and it writes into O. Every other weight is zero. On a repeated sequence the
built circuit is exactly::

    embed -> L0.H0 via v,  L0.H0 -> L1.H1 via k,  embed -> L1.H1 via q,
    embed -> L1.H1 via v,  L1.H1 -> logits

Every other edge changes at most the norms' scale (RMSNorm is a positive scale per position),
which moves no argmax: it cannot change accuracy. L0.H0's query and key cannot matter (one
allowed key per row).

``copy_model()``: the same layer 0, but L1.H1 has a self-only mask and its value reads P: the
model outputs the previous token, through the value path only::

    embed -> L0.H0 via v,  L0.H0 -> L1.H1 via v,  L1.H1 -> logits
"""

from __future__ import annotations

import torch

import headwise as hw
from headwise.control.masks import previous_token, self_only
from headwise.data import Batch

V, HALF = 8, 5
CIRCUIT = ["embed -> L0.H0 via v", "L0.H0 -> L1.H1 via k", "embed -> L1.H1 via q",
           "embed -> L1.H1 via v", "L1.H1 -> logits"]


COPY_CIRCUIT = ["embed -> L0.H0 via v", "L0.H0 -> L1.H1 via v", "L1.H1 -> logits"]


def induction_model(copy: bool = False) -> tuple[torch.nn.Module, list[object]]:
    """The model and the handles of its masks and gates (keep them alive); ``copy``: the
    previous-token copy model instead."""
    E, P, O, J = (slice(0, V), slice(V, 2 * V), slice(2 * V, 3 * V), slice(3 * V, 3 * V + 2))
    cfg = hw.ModelConfig(n_layers=2, n_heads=2, d_model=3 * V + 2, d_head=V, vocab_size=V,
                         max_seq_len=2 * HALF, norm_type="rmsnorm", positional="none",
                         attn_only=True, bias="none")
    model = hw.build_model(cfg).double()
    eye = torch.eye(V, dtype=torch.float64)
    gen = torch.Generator().manual_seed(3)
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() > 1:
                p.zero_()
        model.embed.weight[:, E] = eye
        a0, a1 = model.blocks[0].attn, model.blocks[1].attn
        a0.v_proj.weight[0:V, E] = eye                       # L0.H0 value: the token
        a0.o_proj.weight[P, 0:V] = eye                       # ... written into P
        a0.v_proj.weight[V:2 * V, E] = eye                   # L0.H1 value: the token
        a0.o_proj.weight[J, V:2 * V] = torch.randn(2, V, generator=gen, dtype=torch.float64)
        if copy:
            a1.v_proj.weight[V:2 * V, P] = eye               # L1.H1 value: the previous token
        else:
            a1.q_proj.weight[V:2 * V, E] = 10 * eye          # L1.H1 query: the current token
            a1.k_proj.weight[V:2 * V, P] = eye               # key: the key's previous token
            a1.v_proj.weight[V:2 * V, E] = eye               # value: the key's own token
        a1.o_proj.weight[O, V:2 * V] = eye                   # ... written into O
        model.unembed.weight[:, O] = eye
    masks = hw.apply_masks(model, {"L0.H0": previous_token(), "L0.H1": self_only(),
                                   **({"L1.H1": self_only()} if copy else {})})
    gates = hw.FixedGates(model, {0: "L0.H0,L0.H1,L1.H1"})
    return model.eval(), [masks, gates]


def repeated_batch(n: int, seed: int = 0, copy: bool = False) -> Batch:
    """``n`` sequences of HALF distinct tokens, repeated; the second copy is scored (the next
    token; ``copy``: the previous one)."""
    gen = torch.Generator().manual_seed(seed)
    first = torch.stack([torch.randperm(V, generator=gen)[:HALF] for _ in range(n)])
    tokens = torch.cat([first, first], 1)
    targets = torch.full_like(tokens, -100)
    if copy:
        targets[:, HALF:] = tokens[:, HALF - 1:-1]
    else:
        targets[:, HALF:-1] = tokens[:, HALF + 1:]
    return Batch(tokens, targets, None, torch.zeros(n, dtype=torch.long))
