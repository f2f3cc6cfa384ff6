"""AttentionViewer: interactive attention patterns as one self-contained HTML fragment.

The fragment carries its data (token labels, one (T, T) pattern per head, weights as integers
in [0, 1000]), its CSS and its JavaScript inline: no CDN, no network, no other file. It shows
a head picker (grouped by layer), the picked head's pattern as a grid with the tokens along
both axes (queries down, keys across), and one token strip per head. Hovering a query token
(a row label, a grid cell, or a token in a strip) highlights that query's row in the grid and
shades every strip's tokens by the attention the query pays them in that head, so all heads
can be compared at once. The report embeds one for the run's heads (those its contract names,
or ``headwise report --heads``), its supervised heads and its walkthroughs; in Jupyter the
object renders itself (``_repr_html_``).

Size (docs/report.md): ``VIEWER_FIXED_BYTES`` for the script and style, plus at most
``5 * T * T + 24`` bytes per head and the escaped labels.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn

from headwise.analysis.explain import one_sequence
from headwise.heads import select_heads
from headwise.model.eval_mode import in_eval_mode
from headwise.render.html import esc

SCALE = 1000  # weights are embedded as round(w * SCALE)
MAX_TOKENS = 64  # the report's viewers show at most this many positions
MAX_VIEWER_HEADS = 96  # the report's attention viewer shows at most this many heads
VIEWER_FIXED_BYTES = 6000  # budget for the inline script, style and markup around the data

_CSS = """
.hw-viewer { font: 12px system-ui, sans-serif; margin: .6em 0; }
.hw-viewer .hw-bar { margin-bottom: .4em; }
.hw-viewer table.hw-grid { border-collapse: collapse; font-size: 10px; }
.hw-viewer table.hw-grid td { width: 14px; height: 14px; padding: 0; border: 1px solid #eee; }
.hw-viewer table.hw-grid th { font-weight: normal; padding: 0 3px; color: #444; }
.hw-viewer th.hw-key { writing-mode: vertical-rl; transform: rotate(180deg); }
.hw-viewer .hw-hl { outline: 2px solid #d9480f; }
.hw-viewer .hw-scroll { overflow-x: auto; max-width: 100%; }
.hw-viewer .hw-strip { white-space: nowrap; margin: 2px 0; }
.hw-viewer .hw-name { display: inline-block; min-width: 12em; color: #444; }
.hw-viewer .hw-tok { display: inline-block; padding: 1px 3px; margin: 0 1px;
  border: 1px solid #ddd; border-radius: 2px; cursor: default; }
.hw-viewer .hw-src { border-color: #d9480f; }
"""

_JS = """
(function () {
  function el(tag, cls, text) {
    var e = document.createElement(tag);
    if (cls) e.className = cls;
    if (text !== undefined) e.textContent = text;
    return e;
  }
  function shade(w) { return 'rgba(37,99,235,' + (w / 1000).toFixed(3) + ')'; }
  function init(root) {
    if (root.getAttribute('data-ready')) return;
    root.setAttribute('data-ready', '1');
    var d = JSON.parse(root.querySelector('script.hw-data').textContent);
    var T = d.labels.length, current = 0, query = -1;
    var pick = root.querySelector('select.hw-pick');
    var grid = root.querySelector('table.hw-grid');
    var strips = root.querySelector('div.hw-strips');
    var groups = {};
    d.heads.forEach(function (name, i) {
      var m = /^L(\\d+)\\./.exec(name), g = m ? 'layer ' + m[1] : 'other';
      if (!groups[g]) {
        groups[g] = el('optgroup');
        groups[g].label = g;
        pick.appendChild(groups[g]);
      }
      var o = el('option', null, name);
      o.value = String(i);
      groups[g].appendChild(o);
    });
    function highlight() {
      var old = root.querySelectorAll('.hw-hl');
      for (var i = 0; i < old.length; i++) old[i].classList.remove('hw-hl');
      if (query < 0) return;
      var cells = grid.rows[query + 1].cells;
      for (var j = 1; j < cells.length; j++) cells[j].classList.add('hw-hl');
    }
    function drawGrid() {
      grid.textContent = '';
      var p = d.patterns[current], top = el('tr');
      top.appendChild(el('th', null, 'q \\\\ k'));
      for (var k = 0; k < T; k++) top.appendChild(el('th', 'hw-key', d.labels[k]));
      grid.appendChild(top);
      for (var q = 0; q < T; q++) {
        var tr = el('tr'), th = el('th', 'hw-q', d.labels[q]);
        th.setAttribute('data-q', q);
        tr.appendChild(th);
        for (var k2 = 0; k2 < T; k2++) {
          var td = el('td'), w = p[q][k2];
          td.style.background = shade(w);
          td.title = d.labels[q] + ' -> ' + d.labels[k2] + ': ' + (w / 1000).toFixed(3);
          td.setAttribute('data-q', q);
          td.setAttribute('data-w', w);
          tr.appendChild(td);
        }
        grid.appendChild(tr);
      }
      highlight();
    }
    function drawStrips() {
      strips.textContent = '';
      d.heads.forEach(function (name, i) {
        var row = el('div', 'hw-strip');
        row.appendChild(el('span', 'hw-name', name));
        for (var k = 0; k < T; k++) {
          var tok = el('span', 'hw-tok', d.labels[k]);
          tok.setAttribute('data-q', k);
          if (query >= 0) {
            var w = d.patterns[i][query][k];
            tok.style.background = shade(w);
            tok.setAttribute('data-w', w);
            tok.title = (w / 1000).toFixed(3);
            if (k === query) tok.classList.add('hw-src');
          }
          row.appendChild(tok);
        }
        strips.appendChild(row);
      });
    }
    root.addEventListener('mouseover', function (ev) {
      var t = ev.target.closest ? ev.target.closest('[data-q]') : null;
      if (!t || !root.contains(t)) return;
      var q = parseInt(t.getAttribute('data-q'), 10);
      if (q !== query) { query = q; highlight(); drawStrips(); }
    });
    pick.addEventListener('change', function () {
      current = parseInt(pick.value, 10);
      drawGrid();
    });
    drawGrid();
    drawStrips();
  }
  var roots = document.querySelectorAll('div.hw-viewer');
  for (var i = 0; i < roots.length; i++) init(roots[i]);
})();
"""


@dataclass
class AttentionViewer:
    """Attention patterns of several heads on one sequence, rendered as interactive HTML.

    Args:
        labels: one label per position (T,).
        heads: one name per pattern (``"L1.H0"``; names starting ``L<layer>.`` are grouped by
            layer in the picker).
        patterns: (n_heads, T, T) weights in [0, 1], rows are queries.
        title: a caption above the viewer.

    Raises:
        ValueError: shapes that do not match the labels and heads.
    """

    labels: list[str]
    heads: list[str]
    patterns: list[list[list[float]]]
    title: str = ""

    def __post_init__(self) -> None:
        T = len(self.labels)
        if len(self.patterns) != len(self.heads) or not self.heads:
            raise ValueError(f"patterns: got {len(self.patterns)} for {len(self.heads)} heads, "
                             "expected one (T, T) pattern per head and at least one head")
        for name, p in zip(self.heads, self.patterns, strict=True):
            if len(p) != T or any(len(row) != T for row in p):
                raise ValueError(f"patterns[{name}]: expected ({T}, {T}) for {T} labels")

    def to_html(self) -> str:
        """The self-contained fragment (see the module docstring)."""
        data = {"labels": [str(x) for x in self.labels], "heads": [str(h) for h in self.heads],
                "patterns": [[[_q(w) for w in row] for row in p] for p in self.patterns]}
        text = json.dumps(data, separators=(",", ":")).replace("</", "<\\/")
        title = f'<div class="hw-title">{esc(self.title)}</div>' if self.title else ""
        return (f'<div class="hw-viewer"><style>{_CSS}</style>{title}'
                f'<div class="hw-bar">head <select class="hw-pick"></select> '
                f"hover a query token to see where it attends, in every head</div>"
                f'<div class="hw-scroll"><table class="hw-grid"></table></div>'
                f'<div class="hw-strips hw-scroll"></div>'
                f'<script type="application/json" class="hw-data">{text}</script>'
                f"<script>{_JS}</script></div>")

    def _repr_html_(self) -> str:
        return self.to_html()


def _q(w: float | None) -> int:
    """A weight as an integer in [0, SCALE] (``None``/NaN, e.g. a fully masked row: 0)."""
    if w is None or w != w:
        return 0
    return max(0, min(SCALE, round(float(w) * SCALE)))


@in_eval_mode
@torch.no_grad()
def attention_viewer(model: nn.Module, tokens: Tensor, heads: Any = None,
                     labels: Sequence[str] | None = None, attention_mask: Tensor | None = None,
                     title: str = "", **forward_kwargs: Any) -> AttentionViewer:
    """Patterns of ``heads`` (default: every head) of ``model`` on one sequence.

    Args:
        model: a headwise Transformer.
        tokens: (T,) or (1, T) long.
        heads: selector or HeadSet (``"L1.*"``); ``None``: every head.
        labels: a string per position (default the token ids).
        attention_mask: (T,) or (1, T), 1 for real tokens.
        title: caption.
        forward_kwargs: extra model inputs (e.g. ``task_ids`` (1,)).

    Raises:
        ValueError: more than one sequence, or labels of the wrong length.
        SelectorError: a bad head selector.
    """
    hs = select_heads(model, heads)
    tokens, attention_mask, labels = one_sequence(tokens, attention_mask, labels)
    names = sorted({f"blocks.{h.layer}.attn.hook_pattern" for h in hs})
    m: Any = model  # nn.Module.__getattr__ hides the Transformer's methods from mypy
    _, cache = m.run_with_cache(tokens, names=names, heads=hs, attention_mask=attention_mask,
                                **forward_kwargs)
    patterns = [cache.head(f"blocks.{h.layer}.attn.hook_pattern", h.head)[0].float().cpu()
                .nan_to_num(0.0).tolist() for h in hs]
    return AttentionViewer(labels, [str(h) for h in hs], patterns, title)


def report_viewers(report: Mapping[str, Any]) -> dict[str, str]:
    """Viewer fragments for a report dict: ``{"attention": html, "supervised": html,
    "walkthrough-I": html}`` (each where the report has that section).

    ``report["attention"]`` is an ``AttentionViewer``'s fields (``labels``, ``heads``,
    ``patterns``, ``title``); supervised heads on the same tokens share one viewer (observed
    patterns, then targets); each walkthrough gets one for its head. At most ``MAX_TOKENS``
    positions are shown.
    """
    out: dict[str, str] = {}
    if "attention" in report:
        a = report["attention"]
        n = min(len(a["labels"]), MAX_TOKENS)
        out["attention"] = AttentionViewer(a["labels"][:n], a["heads"],
                                           [_crop(p, n) for p in a["patterns"]],
                                           a.get("title", "")).to_html()
    parts = []
    groups: dict[tuple[int, ...], list[dict[str, Any]]] = {}
    for s in report.get("supervised", []):
        groups.setdefault(tuple(s["tokens"]), []).append(s)
    for tokens, entries in groups.items():
        n = min(len(tokens), MAX_TOKENS)
        heads = [e["head"] for e in entries] + [f"{e['head']} target ({e['target']})"
                                                for e in entries]
        pats = [_crop(e["observed"], n) for e in entries] + [_crop(_rows(e["expected"]), n)
                                                             for e in entries]
        labels = entries[0].get("labels") or [str(t) for t in tokens]
        parts.append(AttentionViewer(labels[:n], heads, pats,
                                     "supervised heads (observed, then their targets)"
                                     ).to_html())
    if parts:
        out["supervised"] = "".join(parts)
    for i, w in enumerate(report.get("walkthroughs", [])):
        pattern = next((s["value"] for s in w["steps"] if s["name"] == "pattern"), None)
        if pattern is None:
            continue
        n = min(len(w["labels"]), MAX_TOKENS)
        out[f"walkthrough-{i}"] = AttentionViewer(w["labels"][:n], [w["head"]],
                                                  [_crop(pattern, n)],
                                                  f"{w['head']} attention").to_html()
    return out


def _crop(p: Sequence[Sequence[float | None]], n: int) -> list[list[float]]:
    return [[0.0 if v is None else float(v) for v in row[:n]] for row in p[:n]]


def _rows(p: Sequence[Sequence[float]]) -> list[list[float]]:
    """Rows normalised to sum to 1 (targets may be unnormalised masks)."""
    return [[v / s for v in row] if (s := sum(row)) > 0 else list(row) for row in p]
