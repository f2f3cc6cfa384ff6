"""Specialization report: one JSON-ready dict, written as report.json and a self-contained HTML.

``build_report`` gathers role scores, importance, contract verdicts, trajectories, supervised
heads' expected vs observed patterns and head walkthroughs into a dict of plain JSON values.
``write_report`` writes ``report.json`` and ``report.html``, whose figures (matplotlib PNGs) are
rendered from that dict and embedded as base64 data URIs, so the page needs no other file; the
supervised and walkthrough heads also get interactive viewers (``headwise.report.viewer``).
``print_report`` shows the main tables in the terminal (rich).
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import asdict, is_dataclass
from pathlib import Path
from typing import Any

import torch
from rich.console import Console
from rich.table import Table
from torch import Tensor, nn

import headwise.render.figures as fig
import headwise.render.html as H
from headwise.analysis.explain import Walkthrough, walkthrough_html
from headwise.analysis.importance_matrix import ImportanceMatrix
from headwise.analysis.role_table import SHOWN_MIN_SCORE, RoleTable
from headwise.analysis.trajectories import Trajectory
from headwise.atomic import write_bytes_atomic
from headwise.forecast.role_scores import measured_text_scores
from headwise.forecast.roles import measured_text
from headwise.heads import Head, HeadSet, select_heads
from headwise.model.eval_mode import in_eval_mode
from headwise.patterns import DEFAULT_WINDOW, role_target, score_sums, target_similarity_sums
from headwise.render.svg import small_multiples
from headwise.report.sections import attention_html, enforcement_html, training_html
from headwise.report.viewer import AttentionViewer, report_viewers

REPORT_VERSION = 1
IMPORTANCE_SCALE_FLOOR = 0.05  # effects under 0.05 (accuracy or nats) are drawn pale

def _jsonable(x: Any) -> Any:
    """Plain JSON values: tensors to lists, NaN/inf to None, dataclasses to dicts."""
    if isinstance(x, Tensor):
        return _jsonable(x.tolist())
    if isinstance(x, float):
        return x if math.isfinite(x) else None
    if isinstance(x, Mapping):
        return {str(k): _jsonable(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_jsonable(v) for v in x]
    if is_dataclass(x) and not isinstance(x, type):
        return _jsonable(asdict(x))
    if isinstance(x, (Head, HeadSet)):
        return str(x)
    return x


@in_eval_mode
@torch.no_grad()
def expected_vs_observed(model: nn.Module, tokens: Tensor, head: Head | str,
                         target: str | Tensor, window: int = DEFAULT_WINDOW,
                         labels: Sequence[str] | None = None,
                         **forward_kwargs: Any) -> dict[str, Any]:
    """A supervised head's target and actual pattern on one sequence ``tokens`` (T,).

    ``labels`` (one string per position, e.g. ``headwise.data.token_names``) name the tokens
    in the report's viewer; default the ids.

    Returns:
        ``{"head", "target", "tokens", "labels", "expected", "observed", "similarity"}``:
        ``expected`` is
        the role's target from ``headwise.patterns`` (or the given matrix); similarity is the
        head's role score on this sequence (attention mass on the role's target, the number
        contracts check) or, for a matrix, the mean over rows of ``1 - total variation``
        (``headwise.patterns.target_similarity_sums``, as ``target_similarity``).
    """
    m: Any = model  # nn.Module.__getattr__ hides the Transformer's attributes from mypy
    cfg = m.config
    h = head if isinstance(head, Head) else Head.parse(head, cfg.n_layers, cfg.n_heads)
    seq = tokens.cpu()[None]  # (1, T)
    role = role_target(target, seq, None, cfg.causal, window) if isinstance(target, str) else None
    expected = role.weights[0] if role is not None else target.float().cpu()  # type: ignore[union-attr]
    name = f"blocks.{h.layer}.attn.hook_pattern"
    _, cache = m.run_with_cache(tokens[None], names=[name], heads=select_heads(model, h),
                                **forward_kwargs)
    observed = cache.head(name, h.head)[0].float().cpu()  # (T, T)
    num, den = (score_sums(observed[None, None].double(), role) if role is not None else
                target_similarity_sums(observed[None, None], expected, seq, None, cfg.causal))
    sim = float(num[0] / den[0])
    return {"head": str(h), "target": target if isinstance(target, str) else "matrix",
            "tokens": tokens.cpu().tolist(),
            "labels": [str(t) for t in (labels if labels is not None else tokens.tolist())],
            "expected": expected.tolist(),
            "observed": observed.tolist(), "similarity": sim}


def build_report(*, title: str = "headwise report", model_config: Any = None,
                 roles: RoleTable | None = None,
                 importance: ImportanceMatrix | Sequence[ImportanceMatrix] | None = None,
                 contract: Mapping[str, Any] | None = None,
                 reverified: Sequence[Mapping[str, Any]] = (),
                 trajectory: Trajectory | None = None,
                 forecast: Mapping[str, Any] | None = None,
                 supervised: Sequence[dict[str, Any]] = (),
                 walkthroughs: Sequence[Walkthrough] = (),
                 attention: AttentionViewer | None = None, attention_note: str = "",
                 training: Mapping[str, Any] | None = None,
                 enforcement: Mapping[str, Any] | None = None,
                 meta: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """Collect the analysis results into one JSON-serialisable dict (sections may be absent).

    ``contract`` is a verdict as ``ContractResult.to_dict()`` gives it (``headwise.contract``);
    ``reverified`` the verdicts on fresh verification sets (``{"file", "verdict"}``, ``verify
    --fresh``);
    ``attention`` the viewer of the heads the report shows (``attention_note`` says how they
    were chosen); ``training`` the curves of ``headwise.report.sections.training_curves``;
    ``enforcement`` a run's ``enforcement.json``.
    """
    imps = ([importance] if isinstance(importance, ImportanceMatrix)
            else list(importance or []))
    report: dict[str, Any] = {"version": REPORT_VERSION, "title": title, "meta": dict(meta or {})}
    if model_config is not None:
        report["model"] = (asdict(model_config)
                           if is_dataclass(model_config) and not isinstance(model_config, type)
                           else dict(model_config))
    if roles is not None:
        report["roles"] = {"roles": roles.roles, "records": roles.to_records(),
                           "top_roles": {str(h): roles.top_role(h, SHOWN_MIN_SCORE)
                                         for h in roles.heads},
                           "info": roles.info}
    if imps:
        report["importance"] = [{"info": m.info, "tasks": m.tasks, "metrics": m.metrics,
                                 "units": m.labels, "clean": m.clean,
                                 "records": m.to_records()} for m in imps]
    if contract is not None:
        report["contract"] = dict(contract)
    if reverified:
        report["reverified"] = [dict(r) for r in reverified]
    if trajectory is not None:
        report["trajectories"] = trajectory.to_dict()
        if forecast is not None:  # forecast_summary(...): scored by the benchmark, not here
            report["trajectories"]["forecast"] = dict(forecast)
    if supervised:
        report["supervised"] = list(supervised)
    if walkthroughs:
        report["walkthroughs"] = [w.to_dict() for w in walkthroughs]
    if attention is not None:
        report["attention"] = {**asdict(attention), "selected": attention_note,  # 4 decimals:
                               "patterns": [[[round(w, 4) for w in row] for row in p]  # the
                                            for p in attention.patterns]}  # viewer shows 3
    if training is not None:
        report["training"] = dict(training)
    if enforcement is not None:
        report["enforcement"] = dict(enforcement)
    out = _jsonable(report)
    json.dumps(out, allow_nan=False)  # fails loudly if anything is not plain JSON
    return dict(out)


def write_report(report: Mapping[str, Any], out_dir: str | Path,
                 figures: Mapping[str, bytes] | None = None) -> dict[str, Path]:
    """Write ``report.json`` and a self-contained ``report.html`` into ``out_dir``.

    Args:
        report: a dict from ``build_report`` (or loaded back from report.json).
        out_dir: created if missing.
        figures: more ``{caption: PNG bytes}`` figures for an "extra figures" section.

    Returns:
        ``{"json": path, "html": path}``.
    """
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    paths = {"json": out / "report.json", "html": out / "report.html"}
    # atomic: a full disk or a kill never leaves a truncated report behind
    write_bytes_atomic(paths["json"], json.dumps(report, indent=1, allow_nan=False).encode())
    write_bytes_atomic(paths["html"], render_html(report, figures).encode("utf-8"))
    return paths


def render_html(report: Mapping[str, Any], figures: Mapping[str, bytes] | None = None
                ) -> str:
    """The report page (all images embedded as data URIs)."""
    sections: list[tuple[str, str, str]] = []
    viewers = report_viewers(report)
    if "contract" in report:
        sections.append(("contract", "Contract", H.contract_html(report["contract"])))
    if "reverified" in report:
        sections.append(("reverified", "Re-verification on fresh data", "".join(
            f"<h3>{H.esc(r['file'])}: fresh seed {H.esc(r['verdict'].get('fresh_seed'))}</h3>"
            + H.contract_html(r["verdict"]) for r in report["reverified"])))
    if "enforcement" in report:
        sections.append(("enforcement", "Enforcement", enforcement_html(report["enforcement"])))
    if "attention" in report:
        sections.append(("attention", "Attention", attention_html(report["attention"],
                                                                  viewers["attention"])))
    if "roles" in report:
        sections.append(("roles", "Role scores", _roles_html(report["roles"])))
    if "importance" in report:
        sections.append(("importance", "Importance",
                         "".join(_importance_html(m) for m in report["importance"])))
    if "supervised" in report:
        sections.append(("supervised", "Supervised heads: expected vs observed",
                         viewers.get("supervised", "")
                         + "".join(_supervised_html(s) for s in report["supervised"])))
    if "trajectories" in report:
        sections.append(("trajectories", "Trajectories", _traj_html(report["trajectories"])))
    if "training" in report:
        sections.append(("training", "Training", training_html(report["training"])))
    for i, w in enumerate(report.get("walkthroughs", [])):
        sections.append((f"walkthrough-{i}", f"Walkthrough {w['head']}",
                         viewers.get(f"walkthrough-{i}", "") + walkthrough_html(w)))
    if figures:
        sections.append(("extra", "More figures", "".join(
            H.img(fig.data_uri(png), cap) for cap, png in figures.items())))
    if report.get("model") or report.get("meta"):
        info = {**report.get("meta", {}), **{f"model.{k}": v
                                              for k, v in (report.get("model") or {}).items()}}
        # Values as written (repr of numbers): norm_eps 1e-05 must not print as 0.000.
        rows = [(k, v if isinstance(v, str) else json.dumps(v)) for k, v in sorted(info.items())]
        sections.append(("run", "Run", H.table(["field", "value"], rows)))
    return H.page(str(report.get("title", "headwise report")), sections)


def _roles_html(r: Mapping[str, Any]) -> str:
    roles, recs = r["roles"], r["records"]
    labels = [f"L{x['layer']}.H{x['head']}" for x in recs]
    png = fig.heatmap([[x[k] for k in roles] for x in recs], "role scores (heads x roles)",
                          roles, labels, vmin=0, vmax=1, annotate=True)
    rows = [(lab, *(x[k] for k in roles), r["top_roles"].get(lab, ""))
            for lab, x in zip(labels, recs, strict=True)]
    return H.img(fig.data_uri(png), "role scores") + H.table(["head", *roles, "top role"],
                                                                 rows)


def _importance_html(m: Mapping[str, Any]) -> str:
    parts = []
    if m["info"].get("estimate"):
        parts.append("<p>Estimates (attribution patching: every head's effect on the loss from "
                     "one backward, to first order), a screen for the exact ablations above: "
                     "not measured by ablation.</p>")
    for metric in m["metrics"]:
        cells = {(x["unit"], x["task"]): x["value"] for x in m["records"] if x["metric"] == metric}
        matrix = [[cells.get((u, t)) for t in m["tasks"]] for u in m["units"]]
        # a symmetric scale (red hurts, blue helps) at least IMPORTANCE_SCALE_FLOOR wide
        top = fig.symmetric_limit(matrix, IMPORTANCE_SCALE_FLOOR)
        # gradient importance has no mode: each optional part brings its own leading space
        mode = f" {m['info']['mode']}" if m["info"].get("mode") else ""
        kind = " (estimates)" if m["info"].get("estimate") else ""
        png = fig.heatmap(matrix, f"{m['info'].get('method')}{mode}{kind} - {metric}",
                          m["tasks"], m["units"],
                          cmap="RdBu_r" if metric != "gradient" else "Reds",
                          vmin=-top if metric != "gradient" else 0.0, vmax=top, annotate=True)
        parts.append(H.img(fig.data_uri(png), f"importance: {metric} (units x tasks)"))
    rows = [(x["unit"], x["task"], x["metric"], x["value"], x["ci_low"], x["ci_high"])
            for x in m["records"]]
    return "".join(parts) + H.table(["unit", "task", "metric", "value", "CI low", "CI high"],
                                    rows)


def _supervised_html(s: Mapping[str, Any]) -> str:
    png = fig.side_by_side(s["expected"], s["observed"], ("expected", "observed"),
                               f"{s['head']} target {s['target']} (similarity "
                               f"{s['similarity']:.2f})")
    return H.img(fig.data_uri(png), f"{s['head']}: expected vs observed pattern")


def _traj_html(t: Mapping[str, Any]) -> str:
    panels = [(f"L{h['layer']}.H{h['head']} (final: {h['final_role']})",
               {r: v for r, v in h["scores"].items() if r not in ("entropy",)})
              for h in t["heads"]]
    caption = (f"role scores over training, one panel per head (steps {t['steps'][0]} to "
               f"{t['steps'][-1]}, scores 0 to 1)")
    svg = small_multiples(t["steps"], panels, caption)
    rows = [(f"L{h['layer']}.H{h['head']}", h["final_role"], h["commitment_step"])
            for h in t["heads"]]
    html = (f'<figure class="scroll">{svg}<figcaption>{H.esc(caption)}</figcaption></figure>'
            + H.table(["head", "final role", "commitment step"], rows))
    f = t.get("forecast")
    if f:
        html += (f"<p>Forecast by forecaster v{H.esc(f['forecaster_version'])} from the first "
                 f"{f['fraction']:.0%} of checkpoints (steps {H.esc(f['from_steps'])}); "
                 f"{H.esc(measured_text(f['measured']))}.</p>")
        if f.get("score_forecaster_measured") is not None:
            html += f"<p>{H.esc(measured_text_scores(f['score_forecaster_measured']))}.</p>"
        html += H.table(["head", "forecast", "confidence", "committed at",
                         "final score, 90% interval", "final role"],
                        [(h["head"], h["role"], f"{h['confidence']:.0%}", h["committed_at"],
                          h.get("score_forecast", {}).get("text", "-"), h["final_role"])
                         for h in f["heads"]])
        if f.get("clauses"):
            html += H.table(["clause", "description", "forecast"],
                            [(c["clause"], c["description"], c["verdict"])
                             for c in f["clauses"]])
    return html


def print_report(report: Mapping[str, Any], console: Console | None = None) -> None:
    """Terminal summary: contract verdicts, role scores and importance (rich tables)."""
    console = console or Console()
    if "contract" in report:
        t = Table(title=f"contract: {'PASS' if report['contract']['passed'] else 'FAIL'}")
        for col in ("clause", "measured", "bound", "threshold", "verdict"):
            t.add_column(col)
        for r in report["contract"]["clauses"]:
            state = r.get("state") or ("pass" if r["passed"] else "fails")
            t.add_row(r["name"] or r["description"], H.fmt(r["measured"]),
                      H.bound_text(r.get("bound")), r["threshold"],
                      "[red]FAIL[/red]" if state == "fails" else f"[green]{state}[/green]")
        console.print(t)
    if "roles" in report:
        console.print(RoleTable.from_records(report["roles"]["records"]).to_rich_table())
    for m in report.get("importance", []):
        t = Table(title=f"importance ({m['info'].get('method')})")
        for col in ("unit", "task", "metric", "value", "95% CI"):
            t.add_column(col)
        for x in m["records"]:
            t.add_row(x["unit"], x["task"], x["metric"], H.fmt(x["value"]),
                      f"[{H.fmt(x['ci_low'])}, {H.fmt(x['ci_high'])}]")
        console.print(t)
