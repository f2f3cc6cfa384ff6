"""Transformer: embeddings, a stack of blocks, final norm and unembedding, with hook points.

``model(tokens, attention_mask=None, token_type_ids=None, task_ids=None) -> logits (B, T, V)``;
``model.hidden(...)`` returns the final residual stream (after the final norm, if any). A model
given BERT's masked-LM head (``model.mlm_head``, ``headwise.model.mlm_head``) computes its
logits through it; without one (the default) the logits are ``unembed(hidden)``.
Hooks are attached with ``model.hooks(...)`` and activations cached with
``model.run_with_cache(...)`` (``headwise.model.hook_point``, ``headwise.model.cache``).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from contextlib import AbstractContextManager
from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor, nn

from headwise.errors import ConfigError, field_error
from headwise.model import head_params, mlp_params
from headwise.model.cache import ActivationCache, run_with_cache
from headwise.model.factored import FactoredMatrix
from headwise.model.hook_point import Hook, HookPoint, attach_hooks, name_hook_points
from headwise.model.hook_runs import add_hook, reset_hooks, run_with_hooks
from headwise.model.inputs import (
    check_host_ids,
    check_mask_type,
    check_shapes,
    check_tokens,
    gate_tasks,
)
from headwise.model.lm_loss import lm_cross_entropy_loss
from headwise.model.mask_plan import mask_plan
from headwise.model.tokenizer import ModelTokenizer, str_tokens_of

if TYPE_CHECKING:
    from headwise.config import ModelConfig
    from headwise.model.mlm_head import MLMHead

__all__ = ["Transformer", "check_tokens"]

RETURN_TYPES = ("logits", "loss", "both", None)


class Transformer(nn.Module):
    """The model. Build it with ``build_model(config)``; sub-modules are injected here.

    Args:
        config: kept for reference (shape, conversion, saving); never read by sub-modules.
        embed: token embedding (V, D).
        pos_embed: absolute positional module ``(T) -> (T, D)`` or ``None``.
        token_type_embed: segment embedding (BERT) or ``None``.
        embed_norm: norm after the embedding sum (BERT) or ``None``.
        blocks: the layers.
        ln_final: final norm (pre-norm models) or ``None``.
        unembed: Linear D -> V (weight shared with ``embed`` when tied).
        dropout: embedding dropout.

    Attributes:
        tokenizer: the model's ``ModelTokenizer`` (``to_tokens``, ``to_str_tokens``), or
            ``None``; set by ``load_hf`` from a checkpoint's ``tokenizer.json`` and by
            ``headwise.load_run``, or by assignment. Not part of the state dict.
        hook_dict: every hook point by its name (its module path), in module order, as
            TransformerLens's ``hook_dict``; built by ``setup()``.
        tree_memos: what other code read off the module tree (``hook_point.tree_memo``, e.g.
            the installed task gates' task count); emptied by ``setup()``.
    """

    mlm_head: MLMHead | None
    hook_dict: dict[str, HookPoint]
    tree_memos: dict[str, Any]

    def __init__(self, config: ModelConfig, *, embed: nn.Embedding, pos_embed: nn.Module | None,
                 token_type_embed: nn.Embedding | None, embed_norm: nn.Module | None,
                 blocks: Sequence[nn.Module], ln_final: nn.Module | None, unembed: nn.Linear,
                 dropout: float = 0.0) -> None:
        super().__init__()
        self.config = config
        self.embed = embed
        self.pos_embed = pos_embed
        self.token_type_embed = token_type_embed
        self.embed_norm = embed_norm
        self.embed_dropout = nn.Dropout(dropout)
        self.blocks = nn.ModuleList(blocks)
        self.ln_final = ln_final
        self.unembed = unembed
        self.register_module("mlm_head", None)  # set to a build_mlm_head() for masked LM
        self.hook_embed = HookPoint()
        self.hook_pos_embed = HookPoint()
        self.hook_logits = HookPoint()
        self.tokenizer: ModelTokenizer | None = None
        self.setup()

    def setup(self) -> None:
        """Map the module tree: name every hook point by its module path into ``hook_dict``
        and forget what was read off the old tree (``tree_memos``).

        Runs at construction, and is called by every headwise function that puts modules into
        the model or takes them out (LoRA adapters, task gates, the masked-LM head). After
        changing the tree yourself (assigning a module, ``ModuleList.append``, ``del``), call
        it as in TransformerLens; until then hooks attach to the points of the old tree.
        """
        self.tree_memos = {}
        self.hook_dict = name_hook_points(self)

    def hidden(self, tokens: Tensor, attention_mask: Tensor | None = None,
               token_type_ids: Tensor | None = None, task_ids: Tensor | None = None,
               stop_at_layer: int | None = None) -> Tensor:
        """Final residual stream (B, T, D).

        Args:
            tokens: (B, T) long token ids.
            attention_mask: (B, T), 1/True for real tokens and 0/False for padding (HF style).
            token_type_ids: (B, T) segment ids (models with ``n_token_types`` > 0).
            task_ids: (B,) task index per example (task masks and gates).
            stop_at_layer: run only the blocks before this one (negative: from the end, as a
                slice) and return the residual stream there, before any final norm
                (TransformerLens's ``stop_at_layer``; 0 runs the embeddings only).

        Token ids are not range-checked here (that would read them on the host at every
        call, a synchronisation and a graph break); data enters through ``check_tokens``
        (data mixtures, ``run_with_cache``, the CLI). Task and segment ids on the host are
        (``check_host_ids``: no synchronisation), outside a compiled graph. ``task_ids``
        given to a model without task gates or masks change nothing (a mixture's batches
        carry them for every model; ``headwise.model.inputs``).

        Raises:
            ValueError: naming the tensor whose shape or dtype is wrong, or whose ids on the
                host are out of range (task ids beyond the gates' tasks, or negative).
        """
        check_shapes(tokens, attention_mask, task_ids, token_type_ids)
        if not torch.compiler.is_compiling():
            types = self.token_type_embed
            check_host_ids(task_ids, gate_tasks(self), token_type_ids if types else None,
                           types.num_embeddings if types else 0)
        B, T = tokens.shape
        x = self.hook_embed(self.embed(tokens))  # (B, T, D)
        if self.pos_embed is not None:
            x = x + self.hook_pos_embed(self.pos_embed(T))
        if self.token_type_embed is not None:
            if token_type_ids is None:
                token_type_ids = torch.zeros_like(tokens)
            x = x + self.token_type_embed(token_type_ids)
        elif token_type_ids is not None:  # it would be ignored: say so instead
            raise ValueError("token_type_ids: given, but the model has no segment embedding "
                             "(n_token_types: 0); expected None")
        if self.embed_norm is not None:
            x = self.embed_norm(x)
        x = self.embed_dropout(x)
        key_padding = attention_mask.bool() if attention_mask is not None else None
        plan = mask_plan(T, self.config.causal, key_padding, device=tokens.device)  # one a forward
        if stop_at_layer is not None:
            for block in list(self.blocks)[:stop_at_layer]:
                x = block(x, plan, task_ids)
            return x
        for block in self.blocks:
            x = block(x, plan, task_ids)
        return self.ln_final(x) if self.ln_final is not None else x

    def forward(self, tokens: Tensor | str | list[str], attention_mask: Tensor | None = None,
                token_type_ids: Tensor | None = None, task_ids: Tensor | None = None, *,
                return_type: str | None = "logits", loss_per_token: bool = False,
                stop_at_layer: int | None = None) -> Any:
        """Logits (B, T, V); arguments as in ``hidden``, with TransformerLens's options.

        Args:
            tokens: (B, T) ids, or text (a string or a list), encoded by ``to_tokens`` (a
                padded batch with its attention mask).
            return_type: ``"logits"``, ``"loss"`` (the mean next-token cross-entropy,
                ``headwise.model.lm_loss``), ``"both"`` (``(logits, loss)``) or ``None``.
            loss_per_token: the loss as (B, T - 1) instead of its mean.
            stop_at_layer: return the residual stream before this block (see ``hidden``).

        Unlike TransformerLens's, the second positional argument is ``attention_mask``: pass
        ``return_type`` and the other options by keyword (a string there is refused).

        Raises:
            ValueError: another ``return_type``, a loss of a bidirectional model, or an
                ``attention_mask`` that is not a tensor.
        """
        if isinstance(tokens, (str, list)):  # ids are checked by ``check_shapes``, once
            check_mask_type(attention_mask)
            tokens, attention_mask = self._encode(tokens, attention_mask)
        if return_type not in RETURN_TYPES:
            raise ValueError(f"return_type: got {return_type!r}, expected 'logits', 'loss', "
                             "'both' or None")
        if stop_at_layer is not None:
            return self.hidden(tokens, attention_mask, token_type_ids, task_ids, stop_at_layer)
        hidden = self.hidden(tokens, attention_mask, token_type_ids, task_ids)
        if self.mlm_head is None:
            logits = self.hook_logits(self.unembed(hidden))
        else:
            logits = self.hook_logits(self.mlm_head(hidden, self.unembed))
        if return_type == "logits" or return_type is None:
            return logits if return_type else None
        if not self.config.causal:
            raise ValueError(f"return_type: {return_type!r} is the next-token loss, expected "
                             "'logits' for a bidirectional model")
        loss = lm_cross_entropy_loss(logits, tokens, attention_mask, loss_per_token)
        return loss if return_type == "loss" else (logits, loss)

    def _encode(self, text: str | list[str], attention_mask: Tensor | None
                ) -> tuple[Tensor, Tensor | None]:
        """Ids of text, with the attention mask of a padded batch (``None`` when unpadded)."""
        if attention_mask is not None:
            raise ValueError("attention_mask: got a mask with text; expected token ids with a "
                             "mask, or text alone (its padding mask is made here)")
        tokens, mask = self.to_tokens(text, return_mask=True)
        return tokens, (None if bool(mask.all()) else mask)

    def hook_points(self) -> dict[str, HookPoint]:
        """Every hook point of the model by name, in module order (a copy of ``hook_dict``)."""
        return dict(self.hook_dict)

    def hooks(self, *hooks: Hook | tuple[Any, ...] | Iterable[Hook]
              ) -> AbstractContextManager[None]:
        """Attach hooks for the duration of a ``with`` block (``attach_hooks``)."""
        return attach_hooks(self, *hooks)

    def run_with_cache(self, tokens: Any,
                       names_filter: str | Iterable[str] | Callable[[str], bool] | None = None,
                       heads: Any = None, detach: bool = True,
                       **kwargs: Any) -> tuple[Any, ActivationCache]:
        """Run forward and cache only the named points (``names_filter``: a name, names, a
        predicate or ``None`` for all; see ``headwise.model.cache``)."""
        return run_with_cache(self, tokens, names_filter, heads=heads, detach=detach, **kwargs)

    def run_with_hooks(self, *model_args: Any, fwd_hooks: Iterable[tuple[Any, ...]] = (),
                       bwd_hooks: Iterable[tuple[Any, ...]] = (), reset_hooks_end: bool = True,
                       **model_kwargs: Any) -> Any:
        """One forward with ``(name, fn)`` hooks attached (``hook_runs.run_with_hooks``)."""
        return run_with_hooks(self, *model_args, fwd_hooks=fwd_hooks, bwd_hooks=bwd_hooks,
                              reset_hooks_end=reset_hooks_end, **model_kwargs)

    def add_hook(self, name: str | Callable[[str], bool], hook: Callable[..., Any],
                 dir: str = "fwd", is_permanent: bool = False) -> None:
        """Attach a hook until ``reset_hooks`` (``hook_runs.add_hook``)."""
        add_hook(self, name, hook, dir=dir, is_permanent=is_permanent)

    def reset_hooks(self, direction: str = "both", including_permanent: bool = False) -> None:
        """Remove the hooks ``add_hook`` attached (``hook_runs.reset_hooks``)."""
        reset_hooks(self, direction=direction, including_permanent=including_permanent)

    def generate(self, input: Any = "", max_new_tokens: int = 10, **kwargs: Any) -> Any:
        """Continue ``input`` (text or ids) token by token (``headwise.model.generate``)."""
        from headwise.model.generate import generate

        return generate(self, input, max_new_tokens, **kwargs)

    def to_tokens(self, input: str | Sequence[str], prepend_bos: bool | None = None,
                  padding_side: str | None = None, truncate: bool = True,
                  return_mask: bool = False) -> Tensor | tuple[Tensor, Tensor]:
        """Token ids (B, T) of a string (B = 1) or a list of strings, on the model's device,
        as TransformerLens's ``to_tokens`` (``headwise.model.tokenizer.to_tokens``).

        Args:
            input: the text(s).
            prepend_bos: start with the BOS token (``None``: ``tokenizer.prepend_bos``).
            padding_side: ``"right"`` or ``"left"`` (``None``: ``tokenizer.padding_side``).
            truncate: keep at most ``config.max_seq_len`` ids per sequence.
            return_mask: also return the attention mask (B, T), 1 at real tokens.

        Raises:
            ConfigError: the model has no tokenizer, or see ``tokenizer.to_tokens``.
        """
        tokens, mask = self._tokenizer().to_tokens(
            input, prepend_bos=prepend_bos, padding_side=padding_side,
            max_len=self.config.max_seq_len if truncate else None)
        device = self.embed.weight.device
        return (tokens.to(device), mask.to(device)) if return_mask else tokens.to(device)

    def to_str_tokens(self, input: Any, prepend_bos: bool | None = None) -> list[Any]:
        """Each token as a string: of a string (encoded by ``to_tokens``), of the ids of one
        sequence ((T,) or (1, T)), or a list of either (a list per element).

        Raises:
            ConfigError: the model has no tokenizer, or an input of another kind.
        """
        return str_tokens_of(self._tokenizer(), input, prepend_bos, self.config.max_seq_len)

    def to_single_token(self, string: str) -> int:
        """The id of a string that is one token (no BOS), as TransformerLens's.

        Raises:
            ConfigError: the model has no tokenizer, or ``string`` is not exactly one token.
        """
        tokens = self._tokenizer().to_tokens(string, prepend_bos=False)[0][0]
        if tokens.numel() != 1:
            raise field_error("string", string, f"one token (it is {tokens.numel()}: "
                              f"{self._tokenizer().str_tokens(tokens.tolist())})")
        return int(tokens[0])

    def to_string(self, tokens: Tensor | Sequence[int]) -> str | list[str]:
        """The text of ids: (T,) gives a string, (B, T) a list (TransformerLens's
        ``to_string``).

        Raises:
            ConfigError: the model has no tokenizer.
        """
        ids = torch.as_tensor(tokens)
        if ids.dim() == 2:
            return [self._tokenizer().decode(row.tolist()) for row in ids]
        return self._tokenizer().decode(ids.reshape(-1).tolist())

    def _tokenizer(self) -> ModelTokenizer:
        if self.tokenizer is None:
            raise ConfigError("tokenizer: the model has none; expected a model loaded with its "
                              "tokenizer (load_hf of a directory with tokenizer.json, "
                              "headwise.load_run of a run with one) or model.tokenizer = "
                              "headwise.interop.load_model_tokenizer(DIR)")
        return self.tokenizer

    # Per-head weights in TransformerLens's shapes (``headwise.model.head_params``): fresh
    # stacks of the effective weights (adapters included), so gradients reach the parameters.
    @property
    def W_Q(self) -> Tensor:
        """(L, H, D, Dh) query weights: ``q_h = x @ W_Q[l, h] + b_Q[l, h]``."""
        return head_params.W_Q(self.blocks)

    @property
    def W_K(self) -> Tensor:
        """(L, H, D, Dh) key weights, GQA kv heads expanded to the query heads."""
        return head_params.W_K(self.blocks)

    @property
    def W_V(self) -> Tensor:
        """(L, H, D, Dh) value weights, GQA kv heads expanded to the query heads."""
        return head_params.W_V(self.blocks)

    @property
    def W_O(self) -> Tensor:
        """(L, H, Dh, D) output weights: head h writes ``z_h @ W_O[l, h]``."""
        return head_params.W_O(self.blocks)

    @property
    def b_Q(self) -> Tensor:
        """(L, H, Dh) query biases (zeros without biases)."""
        return head_params.b_Q(self.blocks)

    @property
    def b_K(self) -> Tensor:
        """(L, H, Dh) key biases, expanded under GQA."""
        return head_params.b_K(self.blocks)

    @property
    def b_V(self) -> Tensor:
        """(L, H, Dh) value biases, expanded under GQA."""
        return head_params.b_V(self.blocks)

    @property
    def b_O(self) -> Tensor:
        """(L, D) output biases."""
        return head_params.b_O(self.blocks)

    @property
    def OV(self) -> FactoredMatrix:
        """(L, H, D, D) OV circuits ``W_V @ W_O``, factored (``.AB`` for the dense product)."""
        return head_params.OV(self.blocks)

    @property
    def QK(self) -> FactoredMatrix:
        """(L, H, D, D) QK circuits ``W_Q @ W_K^T``, factored (biases and RoPE left out)."""
        return head_params.QK(self.blocks)

    @property
    def W_E(self) -> Tensor:
        """(V, D) token embedding."""
        return self.embed.weight

    @property
    def W_U(self) -> Tensor:
        """(D, V) unembedding: the logit of token t is ``resid_final @ W_U[:, t]``."""
        return self.unembed.weight.T

    @property
    def b_U(self) -> Tensor:
        """(V,) unembedding bias (zeros: the unembedding has none)."""
        bias = self.unembed.bias
        return bias if bias is not None else self.unembed.weight.new_zeros(self.W_U.shape[1])

    @property
    def W_pos(self) -> Tensor:
        """(max_seq_len, D) absolute position embeddings: the learned table, or the fixed
        sinusoidal one.

        Raises:
            ConfigError: rotary or no positions (nothing is added to the residual stream).
        """
        if self.pos_embed is None:
            raise ConfigError(f"W_pos: the model has {self.config.positional!r} positions, "
                              "expected learned or sinusoidal (a table added to the embeddings)")
        return self.pos_embed(self.config.max_seq_len)

    # MLP weights in TransformerLens's shapes (``headwise.model.mlp_params``).
    @property
    def W_in(self) -> Tensor:
        """(L, D, F) MLP input weights (a gated MLP's linear branch)."""
        return mlp_params.W_in(self.blocks)

    @property
    def W_gate(self) -> Tensor:
        """(L, D, F) a gated MLP's gate weights."""
        return mlp_params.W_gate(self.blocks)

    @property
    def W_out(self) -> Tensor:
        """(L, F, D) MLP output weights."""
        return mlp_params.W_out(self.blocks)

    @property
    def b_in(self) -> Tensor:
        """(L, F) MLP input biases (zeros without biases)."""
        return mlp_params.b_in(self.blocks)

    @property
    def b_out(self) -> Tensor:
        """(L, D) MLP output biases (zeros without biases)."""
        return mlp_params.b_out(self.blocks)
