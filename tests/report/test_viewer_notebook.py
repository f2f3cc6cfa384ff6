"""Notebook rendering: ``_repr_html_`` of RoleTable, ContractResult and AttentionViewer, parsed
back into cells and compared with the objects they render."""

from __future__ import annotations

import json
import math
from html.parser import HTMLParser

import torch

from headwise import ModelConfig, build_model
from headwise.analysis.probe_inputs import induction_probe
from headwise.analysis.role_table import SHOWN_MIN_SCORE, RoleTable
from headwise.contract import VerifyData, parse_contract, verify
from headwise.heads import Head
from headwise.report.viewer import attention_viewer


class _Tables(HTMLParser):
    """Rows of every table (cell text), the styles of cells, and script bodies."""

    def __init__(self) -> None:
        super().__init__()
        self.rows: list[list[str]] = []
        self.styles: list[list[str | None]] = []
        self.scripts: list[tuple[dict[str, str | None], str]] = []
        self._cell: list[str] | None = None
        self._script: dict[str, str | None] | None = None
        self._stack: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self._stack.append(tag)
        if tag == "tr":
            self.rows.append([])
            self.styles.append([])
        elif tag in ("td", "th"):
            self._cell = []
            self.styles[-1].append(dict(attrs).get("style"))
        elif tag == "script":
            self._script = dict(attrs)
            self.scripts.append((self._script, ""))

    def handle_endtag(self, tag: str) -> None:
        assert self._stack and self._stack.pop() == tag, f"unbalanced </{tag}>"
        if tag in ("td", "th") and self._cell is not None:
            self.rows[-1].append("".join(self._cell).strip())
            self._cell = None
        elif tag == "script":
            self._script = None

    def handle_data(self, data: str) -> None:
        if self._cell is not None:
            self._cell.append(data)
        if self._script is not None:
            attrs, text = self.scripts[-1]
            self.scripts[-1] = (attrs, text + data)


def _parse(fragment: str) -> _Tables:
    p = _Tables()
    p.feed(fragment)
    p.close()
    assert p._stack == [], f"unclosed tags {p._stack}"
    return p


def _model() -> torch.nn.Module:
    cfg = ModelConfig(n_layers=2, n_heads=2, d_model=16, vocab_size=20, max_seq_len=16,
                      attn_only=True)
    return build_model(cfg, seed=0).eval()


def test_role_table_html_cells_are_the_scores() -> None:
    heads = [Head(0, 0), Head(0, 1), Head(1, 0)]
    values = torch.tensor([[0.9, 0.05, float("nan")], [0.1, 0.2, 0.3], [0.0, 1.0, 0.5]])
    table = RoleTable(heads, ["previous_token", "induction", "entropy"], values)
    p = _parse(table._repr_html_())
    assert p.rows[0] == ["head", "previous_token", "induction", "entropy", "top role"]
    assert [r[0] for r in p.rows[1:]] == ["L0.H0", "L0.H1", "L1.H0"]
    for row, h, vals in zip(p.rows[1:], heads, values.tolist(), strict=True):
        shown = ["-" if math.isnan(v) else f"{v:.3f}" for v in vals]
        assert row[1:4] == shown
        assert row[4] == table.top_role(h, SHOWN_MIN_SCORE)
    assert p.rows[1][4] == "previous_token" and p.rows[2][4] == "none"
    # shading follows the score: 0.9 darker than 0.05, NaN unshaded
    assert "rgba(37,99,235,0.90)" in (p.styles[1][1] or "")
    assert "rgba(37,99,235,0.05)" in (p.styles[1][2] or "")
    assert "rgba(37,99,235,0.00)" in (p.styles[1][3] or "")


def test_contract_result_html_rows_are_the_verdicts() -> None:
    model = _model()
    g = torch.Generator().manual_seed(0)
    probe = induction_probe(20, 4, 5, g)
    contract = parse_contract([{"any_of": "L1.*", "score": "induction", "at_least": 0.9},
                                   {"head": "L0.H0", "score": "entropy", "at_most": 1.0}],
                                  2, 2, [])
    result = verify(model, contract, VerifyData({}, {"p": probe}))
    p = _parse(result._repr_html_())
    assert p.rows[0] == ["clause", "description", "measured", "bound", "threshold",
                         "decided by", "verdict"]
    assert len(p.rows) == 1 + len(result.results)
    for row, r in zip(p.rows[1:], result.results, strict=True):
        assert row[0] == r.clause.path
        assert row[2] == ("-" if r.measured is None else f"{r.measured:.3f}")
        assert row[4] == r.threshold
        assert row[6] == (r.state if r.passed else "FAIL")
    assert [row[6] for row in p.rows[1:]][0] == "FAIL"
    assert [r.state for r in result.results][1] in ("certified", "holds")


def test_viewer_html_carries_its_data_and_code() -> None:
    model = _model()
    tokens = torch.tensor([4, 9, 2, 4, 9, 2, 7])
    viewer = attention_viewer(model, tokens, heads="L1.*")
    p = _parse(viewer._repr_html_())
    (data_attrs, data), (code_attrs, code) = p.scripts
    assert data_attrs == {"type": "application/json", "class": "hw-data"} and code_attrs == {}
    payload = json.loads(data)
    assert payload["heads"] == ["L1.H0", "L1.H1"] and payload["labels"] == [
        str(t) for t in tokens.tolist()]
    for got, want in zip(payload["patterns"], viewer.patterns, strict=True):
        assert got == [[round(w * 1000) for w in row] for row in want]
    assert "querySelectorAll('div.hw-viewer')" in code and "http" not in code
