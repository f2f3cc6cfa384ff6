"""Report: JSON round trip, self-contained HTML, and rendering in a real headless Chromium."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest
import torch

from headwise import Head, ModelConfig, build_model
from headwise.analysis.explain import explain_head
from headwise.analysis.importance import ablation_importance
from headwise.analysis.probe_inputs import induction_probe
from headwise.analysis.role_table import RoleTable
from headwise.analysis.roles import role_scores
from headwise.analysis.trajectories import Trajectory
from headwise.contract import VerifyData, parse_contract, verify
from headwise.control.masks import apply_masks, first_token, local, previous_token, self_only
from headwise.report.build import (
    build_report,
    expected_vs_observed,
    print_report,
    render_html,
    write_report,
)


class _B:
    def __init__(self, tokens: torch.Tensor) -> None:
        self.tokens = tokens
        self.targets = tokens.roll(-1, 1)
        self.targets[:, -1] = -100
        self.attention_mask = None
        self.task_ids = None


@pytest.fixture(scope="module")
def written(report: dict, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """The report written once (rendering the figures is the slow part)."""
    return write_report(report, tmp_path_factory.mktemp("report"))


@pytest.fixture(scope="module")
def report() -> dict:
    cfg = ModelConfig(n_layers=2, n_heads=2, d_model=16, vocab_size=20, max_seq_len=16,
                      attn_only=True)
    model = build_model(cfg, seed=0).eval()
    g = torch.Generator().manual_seed(0)
    probe = induction_probe(20, 4, 5, g)
    roles = role_scores(model, probe, roles=["previous_token", "induction", "entropy", "self"])
    tasks = {"copy": _B(torch.randint(0, 20, (8, 10), generator=g))}
    imp = ablation_importance(model, tasks, n_boot=50)
    contract = parse_contract([{"any_of": "L1.*", "score": "induction", "at_least": 0.9},
                                   {"head": "L0.H0", "score": "entropy", "at_most": 1.0}],
                                  2, 2, ["copy"])
    result = verify(model, contract, VerifyData(tasks, {"p": probe}, n_boot=20))
    traj = Trajectory([(s, RoleTable(roles.heads, roles.roles, roles.values * (s / 300)))
                       for s in (100, 200, 300)])
    sup = [expected_vs_observed(model, probe[0], "L0.H1", "previous_token")]
    walk = [explain_head(model, probe[0], Head(1, 0))]
    return build_report(title="test <report>", model_config=cfg, roles=roles, importance=imp,
                        contract=result.to_dict(), trajectory=traj, supervised=sup,
                        walkthroughs=walk,
                        meta={"run": "unit"})


def test_report_is_plain_json(report: dict, written: dict[str, Path]) -> None:
    paths = written
    loaded = json.loads(paths["json"].read_text())
    assert loaded == report
    assert {"roles", "importance", "contract", "trajectories", "supervised",
            "walkthroughs"} <= set(loaded)
    assert loaded["contract"]["passed"] is False  # an induction head >= 0.9 at init: no


def test_html_self_contained(written: dict[str, Path]) -> None:
    html = written["html"].read_text()
    srcs = re.findall(r'src="([^"]*)"', html)
    assert len(srcs) >= 5 and all(s.startswith("data:image/png;base64,") for s in srcs)
    assert html.count("<svg ") == 1  # the trajectories: one small-multiples figure, inline
    assert "http://" not in html and "https://" not in html and "<link" not in html
    assert "test &lt;report&gt;" in html  # escaped


def test_run_table_prints_numbers_as_written(written: dict[str, Path]) -> None:
    html = written["html"].read_text()
    assert "<td class=\"l\">model.norm_eps</td><td class=\"l\">1e-05</td>" in html


def test_report_rebuilds_from_json_alone(written: dict[str, Path]) -> None:
    loaded = json.loads(written["json"].read_text())
    assert render_html(loaded) == written["html"].read_text()


def test_print_report(report: dict) -> None:
    from rich.console import Console

    console = Console(record=True, width=160)
    print_report(report, console)
    text = console.export_text()
    assert "contract: FAIL" in text and "L1.H1" in text


@pytest.mark.parametrize("mask, role", [(previous_token(), "previous_token"),
                                        (self_only(), "self"), (first_token(), "first_token"),
                                        (local(2), "local")])
def test_a_head_masked_to_a_role_shows_similarity_one(mask, role) -> None:  # type: ignore[no-untyped-def]
    """The mask is the role's support, so the report's expected pattern and the masked head's
    observed one agree on every row where the role is defined (row 0 has no previous token)."""
    model = build_model(ModelConfig(n_layers=1, n_heads=2, d_model=16, vocab_size=12,
                                    max_seq_len=8), seed=0)
    apply_masks(model, {"L0.H0": mask})
    tokens = torch.tensor([3, 4, 5, 3, 4, 5])
    sup = expected_vs_observed(model, tokens, "L0.H0", role, window=2)
    assert sup["similarity"] == pytest.approx(1.0, abs=1e-6)


_CHECK = """<script>
window.addEventListener('load', function () {
  var imgs = document.images, broken = 0, wide = 0;
  var column = document.body.getBoundingClientRect().width;
  for (var i = 0; i < imgs.length; i++) {
    if (!imgs[i].complete || imgs[i].naturalWidth === 0) broken++;
    if (imgs[i].getBoundingClientRect().width > column + 0.5) wide++;
  }
  var d = document.createElement('div');
  d.id = 'img-check';
  d.textContent = 'images=' + imgs.length + ' broken=' + broken + ' wide=' + wide;
  document.body.appendChild(d);
});
</script>"""


def test_renders_in_headless_chromium(written: dict[str, Path], tmp_path: Path) -> None:
    exe = shutil.which("chromium") or shutil.which("chromium-browser")
    if exe is None:
        pytest.skip("Chromium is not installed (Debian: apt-get install -y chromium)")
    html = written["html"].read_text()
    page = tmp_path / "check.html"
    page.write_text(html.replace("</body>", _CHECK + "</body>"))
    bad = tmp_path / "bad.html"  # a deliberately broken image proves the check can fail
    bad.write_text(html.replace("</body>", '<img src="data:image/png;base64,AAAA">' + _CHECK
                                + "</body>"))

    def run(path: Path) -> str:
        out = subprocess.run(
            [exe, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic",
             "--no-first-run", "--disable-background-networking", "--disable-component-update",
             "--disable-sync", f"--user-data-dir={tmp_path / 'profile'}",
             "--virtual-time-budget=10000", "--dump-dom", path.as_uri()],
            capture_output=True, text=True, timeout=120)
        m = re.search(r"images=(\d+) broken=(\d+) wide=(\d+)", out.stdout)
        assert m, f"no image check in the DOM; stderr: {out.stderr[-2000:]}"
        return m.group(0)

    n_imgs = html.count("<img")
    assert run(page) == f"images={n_imgs} broken=0 wide=0"  # no figure wider than its column
    # A 3000-px image without the stylesheet's max-width would be wider: the check can fail.
    huge = tmp_path / "huge.html"
    huge.write_text(html.replace("img { max-width: 100%; height: auto; }", "").replace(
        "</body>", '<img style="width:3000px" src="' + re.search(
            r'src="(data:image/png;base64,[^"]+)"', html).group(1) + '">' + _CHECK + "</body>"))
    assert run(huge).endswith(" wide=1")
    assert run(bad) == f"images={n_imgs + 1} broken=1 wide=0"


def test_extra_figures_and_minimal_report(tmp_path: Path) -> None:
    from headwise.render.figures import heatmap

    png = heatmap([[0.0, 1.0], [1.0, 0.0]], "extra")
    assert png[:8] == b"\x89PNG\r\n\x1a\n"
    paths = write_report(build_report(title="minimal"), tmp_path, figures={"my figure": png})
    html = paths["html"].read_text()
    assert "More figures" in html and "my figure" in html and html.count("<img") == 1


def test_importance_heatmap_titles(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each importance heatmap is titled method, mode if any, ``(estimates)`` if so, metric,
    single-spaced: gradient importance has no mode."""
    import headwise.render.figures as figures
    from headwise.analysis.attribution import attribution_importance
    from headwise.analysis.importance import gradient_importance

    titles: list[str] = []
    drawn = figures.heatmap_figure

    def spy(*args, **kwargs):  # type: ignore[no-untyped-def]
        figure = drawn(*args, **kwargs)
        titles.append(figure.axes[0].get_title())
        return figure

    monkeypatch.setattr(figures, "heatmap_figure", spy)
    cfg = ModelConfig(n_layers=1, n_heads=2, d_model=8, vocab_size=20, max_seq_len=16)
    model = build_model(cfg, seed=0).eval()
    tasks = {"copy": _B(torch.randint(0, 20, (4, 6), generator=torch.Generator().manual_seed(0)))}
    render_html(build_report(importance=[
        ablation_importance(model, tasks, n_boot=10),
        attribution_importance(model, tasks),
        gradient_importance(model, tasks, n_boot=10)]))
    assert titles == ["ablation zero - loss", "ablation zero - accuracy", "ablation zero - exact",
                      "attribution zero (estimates) - loss",
                      "gradient (Michel et al. 2019) - gradient"]
