"""Report sections about a run's life: its attention viewer, training curves and enforcement.

Each renders one part of a report dict (``headwise.report.build``) as HTML:

- ``report["attention"]``: an ``AttentionViewer``'s fields (``labels``, ``heads``,
  ``patterns``, ``title``, and ``selected``: how the heads were chosen);
- ``report["training"]``: ``{"train": {"steps", "loss", "task_loss"}, "eval": {"steps",
  "accuracy": {task: [...]}}}``, the ``train`` and ``eval`` lines of ``metrics.jsonl``;
- ``report["enforcement"]``: ``enforcement.json`` (``headwise.contract.enforce.summary``).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import headwise.render.figures as fig
import headwise.render.html as H
from headwise.training.tensorboard import clause_names


def attention_html(a: Mapping[str, Any], viewer: str) -> str:
    """The viewer of the run's heads, and which heads it shows."""
    return f"<p>{H.esc(a.get('selected', ''))}</p>" + viewer


def training_curves(records: Iterable[Mapping[str, Any]]) -> dict[str, Any] | None:
    """``report["training"]`` from the lines of a run's ``metrics.jsonl`` (``None``: no
    ``train`` or ``eval`` line)."""
    train: dict[str, list[Any]] = {"steps": [], "loss": [], "task_loss": []}
    evals: dict[str, Any] = {"steps": [], "accuracy": {}}
    for r in records:
        if r.get("kind") == "train":
            for key in train:
                train[key].append(r.get(key) if key != "steps" else r.get("step"))
        elif r.get("kind") == "eval":
            evals["steps"].append(r.get("step"))
            for name, m in (r.get("tasks") or {}).items():
                evals["accuracy"].setdefault(name, []).append(m.get("accuracy"))
    if not train["steps"] and not evals["steps"]:
        return None
    return {"train": train, "eval": evals}


def training_html(t: Mapping[str, Any]) -> str:
    """The training-loss curve (total and task loss) and the eval-batch accuracy per task."""
    parts = []
    train, evals = t["train"], t["eval"]
    if train["steps"]:
        png = fig.lines(train["steps"], {"loss (task + objectives)": train["loss"],
                                         "task loss": train["task_loss"]},
                        "training loss", ylabel="loss", ylim=None)
        parts.append(H.img(fig.data_uri(png), "training loss per logged step"))
    if evals["steps"] and evals["accuracy"]:
        png = fig.lines(evals["steps"], evals["accuracy"], "eval-batch accuracy",
                        ylabel="accuracy")
        parts.append(H.img(fig.data_uri(png), "eval-batch accuracy per task during training"))
    return "".join(parts)


def describe_attempts(summary: Mapping[str, Any]) -> str | None:
    """One sentence on an enforced run's attempts, from its ``enforcement.json`` (``None``:
    it trained once), for the terminal and the report."""
    attempts = summary.get("attempts")
    if not attempts:
        return None
    parts = [f"at train.lr={a['lr']:g} in {a['dir']} (kept model: "
             f"{a['kept_as'] or 'never held'} on the enforcement set)" for a in attempts]
    return (f"trained {len(attempts)} times from the same initial weights, "
            + "; ".join(parts) + f"; the run keeps attempt {summary.get('attempt')}")


def enforcement_html(e: Mapping[str, Any]) -> str:
    """What enforcement did: one row per clause (by its name), and each clause's violation and
    Lagrange multiplier at every evaluation point."""
    names = clause_names(e["clauses"])
    held, kept = e.get("held_at_step"), e.get("kept_step")
    html = (f"<p>{e['steps']} steps, measured on the enforcement set; "
            + (f"the contract held there first at step {held}; the model kept is that of "
               f"step {kept}, the last evaluation point at which it held"
               if held is not None
               else "the contract did not hold there at any evaluation point") +
            ". The verdict above is measured on the verification set, which enforcement "
            "never read.</p>")
    attempts = describe_attempts(e)
    if attempts is not None:
        html = (f"<p>{H.esc(attempts)}; what follows is that attempt's (the training curves "
                "above are the first attempt's; each later one's are in its directory)."
                "</p>" + html)
    failing = [(names[str(c["index"])], c.get("best_value"), c.get("best_step"),
                "yes" if c.get("saturated") else "no", c.get("advice"))
               for c in e["clauses"] if c.get("holds_at_end") is False and "advice" in c]
    if failing:
        html += H.table(["still failing", "best value (enforcement set)", "at step",
                         "lever saturated", "what would help"], failing)
    rows = [(names[str(c["index"])], c.get("lever") or "(no lever)", c.get("multiplier"),
             c["failed_evals"], c["first_failed_at"], c["held_at"]) for c in e["clauses"]]
    html += H.table(["clause", "lever", "multiplier", "failed evaluations", "first failed at",
                     "held from"], rows)
    history: Sequence[Mapping[str, Any]] = e.get("history") or []
    if not history:
        return html
    steps = [p["step"] for p in history]
    keys = sorted({k for p in history for k in p["clauses"]}, key=int)
    for field, label in (("violation", "violation (> 0: fails)"),
                         ("multiplier", "Lagrange multiplier")):
        series = {names.get(k, f"contract[{k}]"): [p["clauses"].get(k, {}).get(field)
                                                    for p in history] for k in keys}
        png = fig.lines(steps, series, f"enforcement: {label}", ylabel=field, ylim=None)
        html += H.img(fig.data_uri(png), f"each clause's {label} per evaluation point")
    return html
