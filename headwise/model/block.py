"""Transformer blocks: attention and MLP sub-layers with residuals, in pre- or post-norm order."""

from __future__ import annotations

from torch import Tensor, nn

from headwise.model.attention import Attention
from headwise.model.hook_point import HookPoint
from headwise.model.mask_plan import MaskPlan


class _Block(nn.Module):
    """Shared parts of both block orders. ``mlp``/``ln2`` are ``None`` in attention-only models."""

    def __init__(self, attn: Attention, mlp: nn.Module | None, ln1: nn.Module,
                 ln2: nn.Module | None, dropout: float = 0.0) -> None:
        super().__init__()
        self.ln1 = ln1
        self.attn = attn
        self.ln2 = ln2
        self.mlp = mlp
        self.resid_dropout = nn.Dropout(dropout)
        self.hook_resid_pre = HookPoint()
        self.hook_attn_out = HookPoint()
        if mlp is not None:  # attention-only blocks have no mid-stream or MLP points
            self.hook_resid_mid = HookPoint()
            self.hook_mlp_out = HookPoint()
        self.hook_resid_post = HookPoint()


class PreNormBlock(_Block):
    """``x + attn(ln1(x))`` then ``x + mlp(ln2(x))`` (GPT-2, Llama)."""

    def forward(self, x: Tensor, plan: MaskPlan | None = None,
                task_ids: Tensor | None = None) -> Tensor:  # (B, T, D) -> (B, T, D)
        x = self.hook_resid_pre(x)
        attn_out = self.hook_attn_out(self.resid_dropout(
            self.attn(self.ln1(x), plan, task_ids)))
        x = attn_out + x
        if self.mlp is None:
            return self.hook_resid_post(x)
        assert self.ln2 is not None
        x = self.hook_resid_mid(x)
        mlp_out = self.hook_mlp_out(self.mlp(self.ln2(x)))
        return self.hook_resid_post(mlp_out + x)


class PostNormBlock(_Block):
    """``ln1(x + attn(x))`` then ``ln2(x + mlp(x))`` (original Transformer, BERT).

    As in TransformerLens's BERT block, ``hook_resid_mid`` and ``hook_resid_post`` hold the
    residual sums *before* their norm; the normalised values have points of their own,
    ``hook_normalized_resid_mid`` (the MLP's input) and ``hook_normalized_resid_post`` (the
    block's output: the next block's ``hook_resid_pre``). In an attention-only block the one
    sum is ``hook_resid_post``.
    """

    def __init__(self, attn: Attention, mlp: nn.Module | None, ln1: nn.Module,
                 ln2: nn.Module | None, dropout: float = 0.0) -> None:
        super().__init__(attn, mlp, ln1, ln2, dropout)
        if mlp is not None:
            self.hook_normalized_resid_mid = HookPoint()
        self.hook_normalized_resid_post = HookPoint()

    def forward(self, x: Tensor, plan: MaskPlan | None = None,
                task_ids: Tensor | None = None) -> Tensor:  # (B, T, D) -> (B, T, D)
        x = self.hook_resid_pre(x)
        attn_out = self.hook_attn_out(self.resid_dropout(self.attn(x, plan, task_ids)))
        if self.mlp is None:
            return self.hook_normalized_resid_post(self.ln1(self.hook_resid_post(x + attn_out)))
        assert self.ln2 is not None
        x = self.hook_normalized_resid_mid(self.ln1(self.hook_resid_mid(x + attn_out)))
        mlp_out = self.hook_mlp_out(self.mlp(x))
        return self.hook_normalized_resid_post(self.ln2(self.hook_resid_post(x + mlp_out)))
