"""Walk through one head's computation on one input, step by step, with cross-checks.

Steps (shapes for one sequence of T tokens)::

    Q (T, Dh), K (T, Dh), V (T, Dh)          hook_q / hook_k / hook_v (after RoPE: hook_rot_*)
    raw scores  Q K^T              (T, T)
    scaled      Q K^T / sqrt(Dh)   (T, T)
    masked      scaled, -inf where the key is not allowed (causal, padding, head masks)
    pattern     softmax(masked)    (T, T)   hook_pattern
    z           pattern V          (T, Dh)  hook_z
    result      z W_O^h^T          (T, D)   hook_result (the head's contribution to the residual)

Every derived step is recomputed from the previous ones and compared with the model's own
hook values (``checks``: max absolute difference), so the walkthrough proves itself.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor, nn

from headwise.heads import Head, kv_head, select_heads
from headwise.model.eval_mode import in_eval_mode

TOL = 1e-4


@dataclass
class Step:
    """One stage: name, the hook it comes from (or ``None`` if derived), value and meaning."""

    name: str
    hook: str | None
    value: Tensor
    description: str

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(self.value.shape)


@dataclass
class Walkthrough:
    """All steps of ``head`` on one input, and the consistency checks between them."""

    head: Head
    tokens: list[int]
    labels: list[str]
    steps: list[Step]
    checks: dict[str, float] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        """Whether every check is within ``TOL``."""
        return all(v <= TOL for v in self.checks.values())

    def step(self, name: str) -> Step:
        for s in self.steps:
            if s.name == name:
                return s
        raise KeyError(f"no step {name!r}; steps: {[s.name for s in self.steps]}")

    def to_text(self, max_positions: int = 12) -> str:
        """Terminal rendering: each step with its shape; small matrices printed in full."""
        out = [f"head {self.head} on {len(self.tokens)} tokens: {' '.join(self.labels)}"]
        for i, s in enumerate(self.steps, 1):
            src = f"[{s.hook}]" if s.hook else "[derived]"
            out.append(f"\n{i}. {s.name} {s.shape} {src}\n   {s.description}")
            v = s.value
            if v.shape[0] <= max_positions:
                cols = min(v.shape[1], max_positions)
                for r in range(v.shape[0]):
                    cells = " ".join("  -inf" if math.isinf(float(x)) and float(x) < 0
                                     else f"{float(x):6.2f}" for x in v[r, :cols])
                    more = " ..." if v.shape[1] > cols else ""
                    out.append(f"   {self.labels[r]:>6} | {cells}{more}")
        out.append("\nchecks (max |difference| between recomputed and hooked values):")
        for k, d in self.checks.items():
            out.append(f"   {k}: {d:.2e} {'ok' if d <= TOL else 'MISMATCH'}")
        return "\n".join(out)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready, including every step's values (for report pages)."""
        return {"head": str(self.head), "tokens": self.tokens, "labels": self.labels,
                "checks": self.checks, "ok": self.ok,
                "steps": [{"name": s.name, "hook": s.hook, "shape": list(s.shape),
                           "description": s.description,
                           "value": [[None if not math.isfinite(float(x)) else float(x)
                                      for x in row] for row in s.value]}
                          for s in self.steps]}

    def to_html(self) -> str:
        """HTML fragment with a heatmap per step (images embedded as data URIs)."""
        return walkthrough_html(self.to_dict())


def walkthrough_html(d: dict[str, Any]) -> str:
    """Render a ``Walkthrough.to_dict()`` as an HTML fragment (used by the report too)."""
    from headwise.render.figures import data_uri, heatmap, symmetric_limit
    from headwise.render.html import esc, img, table

    labels = d["labels"]
    parts = [f"<p>Head <b>{esc(d['head'])}</b> on: <code>{esc(' '.join(labels))}</code></p>"]
    for i, s in enumerate(d["steps"], 1):
        square = s["shape"][1] == len(labels)
        pattern = s["name"] == "pattern"
        limit = symmetric_limit(s["value"])  # diverging values: 0 is white
        png = heatmap(s["value"], f"{i}. {s['name']} {tuple(s['shape'])}",
                      xlabels=labels if square else None, ylabels=labels,
                      cmap="Blues" if pattern else "RdBu_r",
                      vmin=None if pattern else -limit, vmax=None if pattern else limit)
        parts.append(img(data_uri(png), f"{i}. {s['name']} {tuple(s['shape'])} "
                                        f"[{s['hook'] or 'derived'}]: {s['description']}"))
    parts.append(table(["check", "max |difference|", "verdict"],
                       [(k, f"{v:.2e}", "ok" if v <= TOL else "MISMATCH")
                        for k, v in d["checks"].items()]))
    return "".join(parts)


def _maxdiff(a: Tensor, b: Tensor) -> float:
    """Max |a - b| treating equal infinities as equal (and unequal ones as inf)."""
    both_inf = torch.isinf(a) & torch.isinf(b) & (a == b)
    diff = (a - b).abs().masked_fill(both_inf, 0.0)
    return float(diff.max()) if diff.numel() else 0.0


@in_eval_mode
@torch.no_grad()
def explain_head(model: nn.Module, tokens: Tensor, head: Head | str,
                 attention_mask: Tensor | None = None, labels: Sequence[str] | None = None,
                 **forward_kwargs: Any) -> Walkthrough:
    """Every step of ``head`` on one input sequence.

    Args:
        model: a headwise Transformer.
        tokens: (T,) or (1, T) long.
        head: ``Head`` or selector of one head (``"L1.H2"``).
        attention_mask: (T,) or (1, T), 1 for real tokens.
        labels: a string per position (default the token ids).
        forward_kwargs: e.g. ``task_ids`` (1,).

    Raises:
        ValueError: more than one sequence, or labels of the wrong length.
    """
    m: Any = model  # nn.Module.__getattr__ hides the Transformer's attributes from mypy
    cfg = m.config
    if not isinstance(head, Head):
        head = Head.parse(head, cfg.n_layers, cfg.n_heads)
    tokens, attention_mask, labels = one_sequence(tokens, attention_mask, labels)
    attn = m.blocks[head.layer].attn
    hooked = _Hooked(model, attn, head, tokens, attention_mask, forward_kwargs)
    allowed = _allowed(attn, head.head, tokens.shape[1], attention_mask,
                       forward_kwargs.get("task_ids"))
    steps, checks = _steps(hooked, allowed, attn.head_weights(head.head).o.double().cpu())
    return Walkthrough(head, [int(t) for t in tokens[0]], labels, steps, checks)


def one_sequence(tokens: Tensor, attention_mask: Tensor | None,
                 labels: Sequence[str] | None) -> tuple[Tensor, Tensor | None, list[str]]:
    """``(tokens (1, T), attention_mask (1, T) | None, a label per position)`` of one input.

    Raises:
        ValueError: more than one sequence, or labels of the wrong length.
    """
    tokens = tokens[None] if tokens.dim() == 1 else tokens
    if tokens.shape[0] != 1:
        raise ValueError(f"tokens: got {tuple(tokens.shape)}, expected one sequence (T,) or (1, T)")
    if attention_mask is not None and attention_mask.dim() == 1:
        attention_mask = attention_mask[None]
    T = tokens.shape[1]
    labels = [str(int(t)) for t in tokens[0]] if labels is None else list(labels)
    if len(labels) != T:
        raise ValueError(f"labels: got {len(labels)} labels, expected {T} (one per position)")
    return tokens, attention_mask, labels


class _Hooked:
    """The hooked values of one head on one sequence (a cache of its layer's attention)."""

    def __init__(self, model: nn.Module, attn: Any, head: Head, tokens: Tensor,
                 attention_mask: Tensor | None, forward_kwargs: dict[str, Any]) -> None:
        self.pre = f"blocks.{head.layer}.attn."
        self.rope = attn.rotary is not None
        self.head, self.d_head = head.head, attn.d_head
        self.kv = kv_head(head.head, attn.n_heads, attn.n_kv_heads)
        leaves = ["hook_q", "hook_k", "hook_v", "hook_attn_scores", "hook_pattern", "hook_z",
                  "hook_result"] + (["hook_rot_q", "hook_rot_k"] if self.rope else [])
        m: Any = model
        _, self.cache = m.run_with_cache(tokens, names=[self.pre + n for n in leaves],
                                         heads=select_heads(model, head),
                                         attention_mask=attention_mask, **forward_kwargs)

    def get(self, leaf: str) -> Tensor:
        """(T, ...) value of ``leaf`` for this head (its kv head's on k/v), float64 on the
        CPU."""
        return self.cache.head(self.pre + leaf, self.head)[0].double().cpu()


def _steps(h: _Hooked, allowed: Tensor, w_o: Tensor) -> tuple[list[Step], dict[str, float]]:
    """Recompute each step from the hooked Q, K, V and compare with the hooked values."""
    rope, pre, kv, Dh = h.rope, h.pre, h.kv, h.d_head
    q_name, k_name = ("hook_rot_q", "hook_rot_k") if rope else ("hook_q", "hook_k")
    q, k, v = h.get(q_name), h.get(k_name), h.get("hook_v")  # (T, Dh)
    raw = q @ k.T  # (T, T)
    scaled = raw / math.sqrt(Dh)
    masked = scaled.masked_fill(~allowed, float("-inf"))
    row_ok = allowed.any(-1, keepdim=True)
    pattern = torch.softmax(masked.masked_fill(~row_ok, 0.0), -1) * row_ok
    z = pattern @ v  # (T, Dh)
    result = z @ w_o.T  # (T, D)
    steps = [Step("Q" + (" after RoPE" if rope else ""), pre + q_name, q,
                  "queries: x W_Q^h (+ rotary)"),
             Step("K" + (" after RoPE" if rope else ""), pre + k_name, k,
                  f"keys of kv head {kv}: x W_K (+ rotary)"),
             Step("V", pre + "hook_v", v, f"values of kv head {kv}: x W_V"),
             Step("raw scores", None, raw, "Q K^T: query-key dot products"),
             Step("scaled scores", None, scaled, f"Q K^T / sqrt(Dh), Dh = {Dh}"),
             Step("masked scores", pre + "hook_attn_scores", masked,
                  "-inf where the key may not be attended (causal, padding, head masks)"),
             Step("pattern", pre + "hook_pattern", pattern,
                  "softmax over keys: how much each query reads each key"),
             Step("z", pre + "hook_z", z, "pattern V: the weighted sum of values"),
             Step("result", pre + "hook_result", result,
                  "z W_O^h^T: this head's contribution to the residual stream (no bias)")]
    checks = {
        "masked scores == hooked attn_scores": _maxdiff(masked, h.get("hook_attn_scores")),
        "pattern == softmax(masked scores)": _maxdiff(pattern, h.get("hook_pattern")),
        "z == pattern @ V": _maxdiff(z, h.get("hook_z")),
        "result == z @ W_O^h^T": _maxdiff(result, h.get("hook_result")),
        "pattern rows sum to 1": float((pattern.sum(-1) - row_ok[:, 0].double()).abs().max()),
    }
    return steps, checks


def _allowed(attn: Any, head: int, T: int, attention_mask: Tensor | None,
             task_ids: Tensor | None) -> Tensor:
    """(T, T) bool: the keys ``head`` may attend, from the attention module's own mask."""
    device = attn.q_proj.weight.device
    padding = None if attention_mask is None else attention_mask.to(device).bool()
    allowed = attn.allowed_keys(T, padding, task_ids, device)  # (B|1, H|1, T, T)
    return allowed[0, head if allowed.shape[1] > 1 else 0].cpu()
