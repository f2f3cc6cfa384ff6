"""HTML pieces for the self-contained report and notebooks: page shell, tables, images."""

from __future__ import annotations

import html
from collections.abc import Mapping, Sequence
from typing import Any

from headwise.render.numbers import fixed

_CSS = """
body { font-family: system-ui, sans-serif; margin: 2em auto; max-width: 1100px; color: #222; }
h1 { font-size: 1.5em; } h2 { border-bottom: 1px solid #ccc; padding-bottom: .2em; }
table { border-collapse: collapse; margin: .6em 0; font-size: .85em; }
td, th { border: 1px solid #ddd; padding: .25em .5em; text-align: right; }
th { background: #f4f4f4; } td.l, th.l { text-align: left; }
.pass { color: #137333; font-weight: bold; } .fail { color: #b3261e; font-weight: bold; }
figure { display: inline-block; margin: .5em; vertical-align: top; max-width: 100%; }
img { max-width: 100%; height: auto; }
figcaption { font-size: .8em; color: #555; } pre { background: #f7f7f7; padding: .6em; }
nav a { margin-right: 1em; } .scroll { overflow-x: auto; max-width: 100%; }
"""


def esc(value: object) -> str:
    return html.escape(str(value), quote=True)


def img(uri: str, caption: str) -> str:
    """An embedded image with a caption (``uri`` is a data URI)."""
    return (f'<figure><img src="{uri}" alt="{esc(caption)}">'
            f"<figcaption>{esc(caption)}</figcaption></figure>")


def fmt(v: object) -> str:
    if v is None:
        return "-"
    if isinstance(v, float):
        return fixed(v)
    return str(v)


def table(headers: Sequence[str], rows: Sequence[Sequence[object]],
          raw_cols: Sequence[int] = ()) -> str:
    """An HTML table; cells are escaped except columns in ``raw_cols`` (trusted markup). A
    table wider than the page scrolls sideways inside its own box, never widening the page."""
    head = "".join(f'<th class="l">{esc(h)}</th>' if i == 0 else f"<th>{esc(h)}</th>"
                   for i, h in enumerate(headers))
    body = []
    for row in rows:
        cells = []
        for i, v in enumerate(row):
            text = str(v) if i in raw_cols else esc(fmt(v))
            numeric = isinstance(v, (int, float)) or v is None
            cells.append(f"<td>{text}</td>" if numeric and i else f'<td class="l">{text}</td>')
        body.append("<tr>" + "".join(cells) + "</tr>")
    return f'<div class="scroll"><table><tr>{head}</tr>{"".join(body)}</table></div>'


def verdict(passed: bool) -> str:
    """A pass/FAIL mark, styled inline so it reads the same outside the report (notebooks)."""
    return ('<span class="pass" style="color:#137333;font-weight:bold">pass</span>' if passed
            else '<span class="fail" style="color:#b3261e;font-weight:bold">FAIL</span>')


def contract_html(c: Mapping[str, Any]) -> str:
    """The contract table of ``ContractResult.to_dict()``: each clause, value, confidence bound,
    threshold and state (``certified``, ``holds`` or ``FAIL``; a verdict recorded without
    bounds shows ``pass``)."""
    rows = [(r["path"], esc(r["name"] or r["description"]), fmt(r["measured"]),
             esc(bound_text(r.get("bound"))), esc(r["threshold"]), esc(r["decided_by"] or ""),
             state_mark(r.get("state"), r["passed"]))
            for r in c["clauses"]]
    head = f"<p>Overall: {verdict(c['passed'])} ({c['n_failed']} of {c['n_clauses']} failed)"
    if "certified" in c:
        level = f"{100 * c['confidence']:g}%"
        head += (f"; every clause certified at family-wise {level} (Holm)" if c["certified"]
                 else f"; {c['n_certified']} of {c['n_clauses']} clauses certified at {level} "
                      f"each, every clause certified at family-wise {100 * c['family_level']:.1f}%"
                      " (Holm)")
    return head + "</p>" + table(["clause", "description", "measured", "bound", "threshold",
                                  "decided by", "verdict"], rows, raw_cols=(1, 3, 4, 5, 6))


def bound_text(bound: Mapping[str, Any] | None) -> str:
    """``>= 0.873 (clopper-pearson)`` from a ``Bound.to_dict()`` entry, ``-`` without one."""
    if not bound or (bound.get("lower") is None and bound.get("upper") is None):
        return "-"
    parts = [f"{op} {fixed(bound[k])}" for op, k in ((">=", "lower"), ("<=", "upper"))
             if bound.get(k) is not None]
    return f"{' and '.join(parts)} ({bound['method']})"


def state_mark(state: str | None, passed: bool) -> str:
    """A clause's state styled inline: ``certified``, ``holds`` or ``FAIL``."""
    if state is None or state == "fails":
        return verdict(passed)
    color = "#137333" if state == "certified" else "#8a6d00"
    return f'<span class="{state}" style="color:{color};font-weight:bold">{state}</span>'


def page(title: str, sections: Sequence[tuple[str, str, str]]) -> str:
    """A complete HTML document; ``sections`` are ``(anchor, heading, html body)``."""
    nav = "".join(f'<a href="#{esc(a)}">{esc(h)}</a>' for a, h, _ in sections)
    body = "".join(f'<section id="{esc(a)}"><h2>{esc(h)}</h2>{b}</section>'
                   for a, h, b in sections)
    return (f'<!DOCTYPE html><html lang="en"><head><meta charset="utf-8">'
            f"<title>{esc(title)}</title><style>{_CSS}</style></head><body>"
            f"<h1>{esc(title)}</h1><nav>{nav}</nav>{body}</body></html>")
