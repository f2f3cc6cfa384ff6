"""MLMHead: BERT's masked-LM head, a transform of the final hidden state before the unembedding.

``logits = unembed(norm(act(dense(h)))) + bias``, as transformers' ``BertLMPredictionHead``
(``cls.predictions``: ``transform.dense``, the activation, ``transform.LayerNorm``, then the
decoder tied to the word embeddings, plus a bias). The decoder is the model's own ``unembed``
(tied to ``embed`` in BERT-shaped models), passed in at call time so that it stays one tensor.
A model without the head (``Transformer.mlm_head is None``) computes ``unembed(h)`` as ever.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from headwise.model.mlp import ACTIVATIONS


class MLMHead(nn.Module):
    """The head's transform and output bias.

    Args:
        dense: Linear D -> D.
        norm: the transform's norm over D.
        activation: a key of ``headwise.model.mlp.ACTIVATIONS`` (BERT: ``gelu``).
        vocab_size: V, the length of the output bias.
        added: the head was initialised here rather than read from the checkpoint the model
            came from; exports then drop it, so the exported model is the checkpoint's kind.
    """

    def __init__(self, dense: nn.Linear, norm: nn.Module, activation: str, vocab_size: int,
                 added: bool) -> None:
        super().__init__()
        self.dense = dense
        self.act = ACTIVATIONS[activation]
        self.norm = norm
        self.bias = nn.Parameter(torch.zeros(vocab_size))
        self.added = added

    def forward(self, hidden: Tensor, decoder: nn.Module) -> Tensor:
        """Logits (B, T, V) from the final hidden state (B, T, D) and the unembedding."""
        return decoder(self.norm(self.act(self.dense(hidden)))) + self.bias
