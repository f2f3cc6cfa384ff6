"""AttentionViewer: its data against explicit attention maths, the size budget, the report's
viewers, and the interactive page in a real headless Chromium (renders, hover, no errors)."""

from __future__ import annotations

import html
import json
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import torch

from headwise import Head, ModelConfig, build_model
from headwise.analysis.explain import explain_head
from headwise.report.build import build_report, expected_vs_observed, render_html
from headwise.report.viewer import (
    MAX_TOKENS,
    SCALE,
    VIEWER_FIXED_BYTES,
    AttentionViewer,
    attention_viewer,
    report_viewers,
)

CFG = ModelConfig(n_layers=2, n_heads=3, d_model=24, vocab_size=20, max_seq_len=16)
TOKENS = torch.tensor([3, 7, 1, 9, 3, 7, 1, 12, 5])  # T = 9, distinct from every other dim


@pytest.fixture(scope="module")
def model() -> torch.nn.Module:
    return build_model(CFG, seed=0).eval()


def _data(fragment: str) -> dict[str, Any]:
    m = re.search(r'<script type="application/json" class="hw-data">(.*?)</script>', fragment,
                  re.S)
    assert m, "no data block"
    return dict(json.loads(m.group(1)))


def _reference(model: torch.nn.Module, head: Head) -> torch.Tensor:
    """softmax(mask(Q K^T / sqrt(Dh))) recomputed from Q and K (``explain_head``'s steps)."""
    return explain_head(model, TOKENS, head).step("pattern").value  # (T, T) float64


def test_viewer_data_is_the_attention_pattern(model: torch.nn.Module) -> None:
    viewer = attention_viewer(model, TOKENS, heads="L0.H2,L1.*", labels=list("abcdefghi"))
    assert viewer.heads == ["L0.H2", "L1.H0", "L1.H1", "L1.H2"]
    data = _data(viewer.to_html())
    assert data["labels"] == list("abcdefghi") and data["heads"] == viewer.heads
    for name, got in zip(data["heads"], data["patterns"], strict=True):
        want = (_reference(model, Head.parse(name, 2, 3)) * SCALE).round()
        assert torch.equal(torch.tensor(got, dtype=torch.float64), want), name
        assert all(v == 0 for q, row in enumerate(got) for v in row[q + 1:])  # causal


def test_labels_cannot_break_out_of_the_page() -> None:
    viewer = AttentionViewer(["</script><b>x", "&"], ["L0.H0"], [[[1, 0], [0.5, 0.5]]])
    fragment = viewer.to_html()
    assert fragment.count("</script>") == 2  # the data block's and the code's, nothing else
    assert _data(fragment)["labels"] == ["</script><b>x", "&"]
    assert _data(fragment)["patterns"] == [[[1000, 0], [500, 500]]]


def test_bad_shapes_are_refused() -> None:
    with pytest.raises(ValueError, match=r"patterns\[L0.H0\]: expected \(2, 2\)"):
        AttentionViewer(["a", "b"], ["L0.H0"], [[[1.0]]])
    with pytest.raises(ValueError, match="one .* pattern per head"):
        AttentionViewer(["a"], ["L0.H0", "L0.H1"], [[[1.0]]])


def test_size_budget() -> None:
    """docs/report.md: fixed part + (5 T^2 + 2 T + 40) bytes per head + (len + 3) per label."""
    T, n = MAX_TOKENS, 16
    labels = [f"tok{i:03d}" for i in range(T)]
    worst = AttentionViewer(labels, [f"L{i // 4}.H{i % 4} target (induction)" for i in range(n)],
                            [[[1.0] * T for _ in range(T)] for _ in range(n)])
    size = len(worst.to_html().encode())
    budget = (VIEWER_FIXED_BYTES + n * (5 * T * T + 2 * T + 40)
              + sum(len(x) + 3 for x in labels))
    assert size <= budget
    tiny = AttentionViewer(["a"], ["L0.H0"], [[[1.0]]])
    assert len(tiny.to_html().encode()) <= VIEWER_FIXED_BYTES
    assert size > 0.9 * budget  # the budget is tight, not a bound nothing reaches


@pytest.fixture(scope="module")
def report(model: torch.nn.Module) -> dict[str, Any]:
    sup = [expected_vs_observed(model, TOKENS, "L0.H1", "previous_token"),
           expected_vs_observed(model, TOKENS, "L1.H0", "induction")]
    walk = [explain_head(model, TOKENS, Head(1, 2), labels=list("abcdefghi"))]
    return build_report(title="viewer", model_config=CFG, supervised=sup, walkthroughs=walk)


def test_report_embeds_viewers_for_supervised_and_walkthrough_heads(
        report: dict[str, Any], model: torch.nn.Module) -> None:
    page = render_html(report)
    sections = dict(re.findall(r'<section id="([^"]+)">(.*?)</section>', page, re.S))
    sup = _data(sections["supervised"])
    assert sup["heads"] == ["L0.H1", "L1.H0", "L0.H1 target (previous_token)",
                            "L1.H0 target (induction)"]
    assert torch.equal(torch.tensor(sup["patterns"][1], dtype=torch.float64),
                       (_reference(model, Head(1, 0)) * SCALE).round())
    walk = _data(sections["walkthrough-0"])
    assert walk["heads"] == ["L1.H2"] and walk["labels"] == list("abcdefghi")
    assert torch.equal(torch.tensor(walk["patterns"][0], dtype=torch.float64),
                       (_reference(model, Head(1, 2)) * SCALE).round())
    assert "http://" not in page and "https://" not in page and "<link" not in page
    assert render_html(json.loads(json.dumps(report))) == page  # rebuilt from JSON alone


def test_report_viewers_crop_long_sequences() -> None:
    T = MAX_TOKENS + 6
    eye = torch.eye(T).tolist()
    rep = {"supervised": [{"head": "L0.H0", "target": "self", "tokens": list(range(T)),
                           "expected": eye, "observed": eye, "similarity": 1.0}]}
    data = _data(report_viewers(rep)["supervised"])
    assert len(data["labels"]) == MAX_TOKENS and len(data["patterns"][0]) == MAX_TOKENS


# --- headless Chromium ---------------------------------------------------------------------

_CAPTURE = """<script>
window.__errors = [];
window.addEventListener('error', function (e) { window.__errors.push(String(e.message)); });
var __ce = console.error;
console.error = function () {
  window.__errors.push(Array.prototype.join.call(arguments, ' ')); __ce.apply(console, arguments);
};
</script>"""

_PROBE = """<script>
window.addEventListener('load', function () {
  var out = {errors: window.__errors, viewers: []};
  function hl(root) {
    var cells = root.querySelectorAll('table.hw-grid td.hw-hl'), qs = [];
    for (var i = 0; i < cells.length; i++) qs.push(+cells[i].getAttribute('data-q'));
    return qs;
  }
  function strips(root) {
    var rows = root.querySelectorAll('.hw-strip'), ws = [];
    for (var i = 0; i < rows.length; i++) {
      var toks = rows[i].querySelectorAll('.hw-tok'), w = [];
      for (var j = 0; j < toks.length; j++) w.push(+toks[j].getAttribute('data-w'));
      ws.push(w);
    }
    return ws;
  }
  function hover(el) { el.dispatchEvent(new MouseEvent('mouseover', {bubbles: true})); }
  var roots = document.querySelectorAll('div.hw-viewer');
  for (var v = 0; v < roots.length; v++) {
    var root = roots[v], r = {ready: root.getAttribute('data-ready')};
    out.viewers.push(r);
    try { probe(root, r); } catch (e) { r.probe_error = String(e); }
  }
  function probe(root, r) {
    var g = root.querySelector('table.hw-grid');
    r.grid = [g.rows.length, g.rows[1] ? g.rows[1].cells.length : 0];
    r.options = root.querySelectorAll('select.hw-pick option').length;
    r.groups = root.querySelectorAll('select.hw-pick optgroup').length;
    r.before = hl(root);
    hover(root.querySelectorAll('.hw-strip')[0].querySelectorAll('.hw-tok')[3]);
    r.q3 = hl(root); r.strips3 = strips(root);
    hover(g.rows[6].cells[2]);
    r.q5 = hl(root);
    var pick = root.querySelector('select.hw-pick');
    pick.value = String(pick.options.length - 1);
    pick.dispatchEvent(new Event('change'));
    r.picked = [];
    var cells = g.rows[6].cells;
    for (var k = 1; k < cells.length; k++) r.picked.push(+cells[k].getAttribute('data-w'));
    r.q5_after_pick = hl(root);
  }
  var pre = document.createElement('pre');
  pre.id = 'probe';
  pre.textContent = JSON.stringify(out);
  document.body.appendChild(pre);
});
</script>"""


def _chromium(page: Path, profile: Path) -> tuple[dict[str, Any], str]:
    exe = shutil.which("chromium") or shutil.which("chromium-browser")
    if exe is None:
        pytest.skip("Chromium is not installed (Debian: apt-get install -y chromium)")
    out = subprocess.run(
        [exe, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic",
         "--no-first-run", "--disable-background-networking", "--disable-component-update",
         "--disable-sync", f"--user-data-dir={profile}", "--enable-logging=stderr", "--v=0",
         "--virtual-time-budget=10000", "--dump-dom", page.as_uri()],
        capture_output=True, text=True, timeout=120)
    m = re.search(r'<pre id="probe">(.*?)</pre>', out.stdout, re.S)
    assert m, f"no probe output in the DOM; stderr: {out.stderr[-2000:]}"
    return json.loads(html.unescape(m.group(1))), out.stderr


def _page(tmp_path: Path, body: str, name: str) -> Path:
    path = tmp_path / name
    doc = body if body.startswith("<!DOCTYPE") else (
        f'<!DOCTYPE html><html><head><meta charset="utf-8"></head><body>{body}</body></html>')
    path.write_text(doc.replace("<head>", "<head>" + _CAPTURE, 1)
                    .replace("</body>", _PROBE + "</body>"), encoding="utf-8")
    return path


def test_viewer_in_headless_chromium(model: torch.nn.Module, tmp_path: Path) -> None:
    viewer = attention_viewer(model, TOKENS)  # 6 heads in 2 layers
    result, stderr = _chromium(_page(tmp_path, viewer.to_html(), "viewer.html"),
                               tmp_path / "profile")
    assert result["errors"] == [] and "Uncaught" not in stderr
    (r,) = result["viewers"]
    T = len(TOKENS)
    assert r["ready"] == "1" and r["grid"] == [T + 1, T + 1]  # header row/col + T x T cells
    assert r["options"] == 6 and r["groups"] == 2
    assert r["before"] == []  # nothing highlighted before a hover
    assert r["q3"] == [3] * T and r["q5"] == [5] * T  # the hovered query's row, then the next
    for i, name in enumerate(viewer.heads):  # every head's strip: query 3's attention
        want = (_reference(model, Head.parse(name, 2, 3))[3] * SCALE).round().tolist()
        assert r["strips3"][i] == want, name
    last = _reference(model, Head(1, 2))  # picking the last head redraws the grid with it
    assert r["picked"] == (last[5] * SCALE).round().tolist() and r["q5_after_pick"] == [5] * T


def test_report_viewers_in_headless_chromium(report: dict[str, Any], tmp_path: Path) -> None:
    page = _page(tmp_path, render_html(report), "report.html")
    result, stderr = _chromium(page, tmp_path / "profile")
    assert result["errors"] == [] and "Uncaught" not in stderr
    assert [v["ready"] for v in result["viewers"]] == ["1", "1"]  # supervised, walkthrough
    assert [v["options"] for v in result["viewers"]] == [4, 1]
    for v in result["viewers"]:
        assert v["before"] == [] and v["q3"] == [3] * len(TOKENS)


def test_chromium_check_sees_script_errors(tmp_path: Path) -> None:
    """A viewer whose data is corrupt raises in the page, and the check reports it."""
    fragment = AttentionViewer(["a", "b"], ["L0.H0"], [[[1, 0], [0.5, 0.5]]]).to_html()
    broken = re.sub(r'(class="hw-data">).*?(</script>)', r"\1{not json\2", fragment, flags=re.S)
    result, stderr = _chromium(_page(tmp_path, broken, "broken.html"), tmp_path / "profile")
    assert result["errors"] and "JSON" in " ".join(result["errors"])
    assert "Uncaught SyntaxError" in stderr
    assert "probe_error" in result["viewers"][0]  # and the viewer never drew its grid
