"""The next-token loss of ``model(..., return_type="loss")``, as TransformerLens's
``utils.lm_cross_entropy_loss``."""

from __future__ import annotations

from torch import Tensor


def lm_cross_entropy_loss(logits: Tensor, tokens: Tensor, attention_mask: Tensor | None = None,
                          per_token: bool = False) -> Tensor:
    """Cross-entropy of each next token: ``-log p(tokens[:, t + 1] | tokens[:, :t + 1])``.

    Args:
        logits: (B, T, V).
        tokens: (B, T) the input ids.
        attention_mask: (B, T), 1 at real tokens: positions whose token or next token is
            padding are left out (zero when ``per_token``).
        per_token: return (B, T - 1) losses instead of their mean.

    Returns:
        The mean loss over the counted positions, or (B, T - 1).
    """
    log_probs = logits.log_softmax(dim=-1)  # (B, T, V)
    predicted = log_probs[:, :-1].gather(-1, tokens[:, 1:, None])[..., 0]  # (B, T - 1)
    if attention_mask is not None:
        keep = attention_mask[:, :-1].bool() & attention_mask[:, 1:].bool()  # (B, T - 1)
        predicted = predicted * keep
        count = keep.sum()
    else:
        count = predicted.new_tensor(predicted.numel())
    return -predicted if per_token else -predicted.sum() / count
