"""Hostile cases for what headwise reads: files a checkpoint never wrote, data files read
loosely, contents quoted through links, directories where files belong, override bombs and
figures quoted unchecked. Each case may also name text its one line must hold (``expect``)
or must not (``absent``): a refusal has to say what was wrong, and never quote a secret.
"""

from __future__ import annotations

import base64
import json
from pathlib import Path
from typing import Any

import yaml

from .cases import BASE, GIB, SECRET, _gpt2, _hf, _set, _train

SHARDS = "run/checkpoints/step_0000002/shards"
SHARD = f"{SHARDS}/shard-00001-model-00001-of-00001.safetensors"


def _pairs(name: str, data: bytes | None, *ops: list[Any], **task: Any) -> dict[str, Any]:
    """Train on a ``pairs`` task reading ``name`` (written from ``data`` unless None)."""
    spec = _set(_set(BASE, "data/tasks/copy", {"task": "pairs", "path": name, "prompt": "q",
                                               "completion": "a", "seq_len": 8, **task}),
                "model/vocab_size", 256)
    case = _train(yaml.safe_dump(spec, sort_keys=False))
    if data is not None:
        case["setup"].append(["bytes", name, base64.b64encode(data).decode()])
    case["setup"] += list(ops)
    return case


def _expect(case: dict[str, Any], expect: str | None = None,
            absent: str | None = None) -> dict[str, Any]:
    return {**case, **({"expect": expect} if expect else {}),
            **({"absent": absent} if absent else {})}


def shard_cases() -> dict[str, dict[str, Any]]:
    """A sharded run (``$HOSTILE_SHARDED``) whose last checkpoint gained a file."""
    run = ["copytree", "$HOSTILE_SHARDED", "run"]
    forged = f"{SHARDS}/shard-00002-model-00001-of-00001.safetensors"
    return {
        "unlisted shard read by report": _expect(
            {"argv": ["report", "run"], "setup": [run, ["copy", SHARD, forged]]},
            "shard-00002-model-00001-of-00001.safetensors"),
        "unlisted shard of another name": _expect(
            {"argv": ["report", "run"], "setup": [run, ["copy", SHARD, f"{SHARDS}/a.safetensors"]]},
            "a.safetensors: not listed"),
    }


def data_file_cases() -> dict[str, dict[str, Any]]:
    row = b'{"q": "ab", "a": "cd"}\n' * 20  # enough rows for every split
    return {
        "jsonl nested 100000 deep": _expect(_pairs("d.jsonl", row + b'{"q": ' + b"[" * 100_000
                                                   + b"]" * 100_000 + b"}\n"), "line 21"),
        "jsonl duplicate key": _expect(_pairs("d.jsonl", row + b'{"q": "x", "a": "y", '
                                              b'"q": "z"}\n'), "line 21: key 'q' given twice"),
        "jsonl duplicate key nested": _expect(_pairs("d.jsonl", row + b'{"q": "x", "a": "y", '
                                                     b'"m": {"k": 1, "k": 2}}\n'),
                                              "line 21: key 'k' given twice"),
        "jsonl U+2028 before a bad line": _expect(_pairs("d.jsonl", row + '{"q": "a\u2028b", '
                                                         '"a": "c"}\n'.encode() + b"{]\n"),
                                                  "line 22: not JSON"),
        "csv duplicate header": _expect(_pairs("d.csv", b"q,a,q\n" + b"ab,cd,ef\n" * 20),
                                        "header name 'q' given twice"),
        "csv semicolon-delimited": _expect(_pairs("d.csv", b"q;a\n" + b"ab;cd\n" * 20),
                                           "delimited by ';'"),
        "csv tab-delimited": _expect(_pairs("d.csv", b"q\ta\n" + b"ab\tcd\n" * 20),
                                     "delimited by a tab"),
        "csv linked to a secret: wrong count": _expect(_pairs(
            "d.csv", None, ["bytes", "secret.txt", base64.b64encode(
                SECRET.strip() + b",x\n1,2,3\n").decode()], ["symlink", "d.csv", "secret.txt"]),
            "line 2", absent="0123456789abcdef"),
        "jsonl linked to a secret: a value": _expect(_pairs(
            "d.jsonl", None, ["bytes", "secret.jsonl", base64.b64encode(
                b'{"q": "ab", "a": {"api_key": "0123456789abcdef"}}\n').decode()],
            ["symlink", "d.jsonl", "secret.jsonl"]), "line 1", absent="0123456789abcdef"),
    }


def overwrite_cases() -> dict[str, dict[str, Any]]:
    """``--overwrite`` where a directory stands at a name headwise writes a file to."""
    run = ["copytree", "$HOSTILE_RUN", "run"]
    hf = _hf()["setup"]
    keep = ["write", "o/config.json/notes.txt", "precious"]
    return {
        "export overwrite: config.json a directory": _expect(
            {"argv": ["export", "run", "--hf", "o", "--overwrite"], "setup": [run, keep]},
            "config.json: is a directory"),
        "convert overwrite: model.safetensors a directory": _expect(
            {"argv": ["convert", "--hf", "hf", "--out", "o", "--overwrite"],
             "setup": [*hf, ["write", "o/model.safetensors/notes.txt", "precious"]]},
            "model.safetensors: is a directory"),
        "train overwrite: metrics.jsonl a directory": _expect(
            {"argv": ["train", "spec.yaml", "--out", "run", "--overwrite", "--quiet"],
             "setup": [run, ["delete", "run/metrics.jsonl"],
                       ["write", "run/metrics.jsonl/notes.txt", "precious"],
                       ["write", "spec.yaml", yaml.safe_dump(BASE, sort_keys=False)]]},
            "metrics.jsonl: is a directory"),
    }


def traceback_cases() -> dict[str, dict[str, Any]]:
    """Inputs that ended in a traceback."""
    ok = ["write", "spec.yaml", yaml.safe_dump(BASE, sort_keys=False)]
    run = ["copytree", "$HOSTILE_RUN", "run"]
    hf = _hf()["setup"]

    def sets(value: str) -> dict[str, Any]:
        return {"argv": ["train", "spec.yaml", "--out", "r", "--quiet", "--set", value],
                "setup": [ok]}

    def resume(metrics: bytes) -> dict[str, Any]:
        return {"argv": ["train", "spec.yaml", "--out", "run", "--resume", "--quiet"],
                "setup": [ok, run, ["delete", "run/model.safetensors"],
                          ["delete", "run/manifest.json"],
                          ["bytes", "run/metrics.jsonl", base64.b64encode(metrics).decode()]]}

    deep_spec = "model: " + "[" * 20000 + "]" * 20000 + "\n"
    return {
        "set an impossible date": sets("train.lr=2026-02-30"),
        "set 50000 deep": sets("train.lr=" + "[" * 50_000 + "]" * 50_000),
        "set a control character": _expect(sets("train.name=a\x85b"), "--set"),
        "set a key with a control character": _expect(sets("train.l\x07r=1"), "--set"),
        "set a key of 5000 dots": sets(".".join(["a"] * 5000) + "=1"),
        "set a key of 1000 dots": sets("train." + ".".join(["a"] * 1000) + "=1"),
        "resume metrics a bare number": resume(b'{"kind": "train", "step": 1}\n5\n'),
        "resume metrics not utf-8": resume(b'{"kind": "train", "step": 1}\n\xff\xfe\n'),
        "convert out under a file": {"argv": ["convert", "--hf", "hf", "--out", "f.txt/o"],
                                     "setup": [*hf, ["write", "f.txt", "x"]]},
        "export peft under a file": _expect(
            {"argv": ["export", "run", "--hf", "o", "--peft", "f.txt/p"],
             "setup": [run, ["write", "f.txt", "x"]]}, "f.txt is a file"),
        "demo out a run whose spec is 20000 deep": {
            "argv": ["demo", "--out", "run"],
            "setup": [run, ["write", "run/spec.yaml", deep_spec]]},
        "hub cache refs/main not utf-8": {
            "argv": ["analyze", "--hf", "org/model"],
            "setup": [["bytes", "hub/models--org--model/refs/main",
                       base64.b64encode(b"\xff\xfe\x00").decode()],
                      ["env", "HF_HUB_CACHE", "hub"]]},
        "hf id of 10000 characters": {"argv": ["analyze", "--hf", "org/" + "m" * 10_000]},
        "task name of 500000 characters": _spec_task_name("t" * 500_000),
        "safetensors 3 GiB tensor (sparse)": _expect(
            {"argv": ["analyze", "--hf", "hf"], "setup": [
                ["write", "hf/config.json", json.dumps(_gpt2()[0])],
                ["huge_tensor", "hf/model.safetensors", "wte.weight", [3 * GIB // 4]]]},
            "'wte.weight'"),
    }


def _spec_task_name(name: str) -> dict[str, Any]:
    return _train(yaml.safe_dump(_set(BASE, "data/tasks", {name: {"task": "copy", "length": 3}}),
                                 sort_keys=False))


def figure_cases() -> dict[str, dict[str, Any]]:
    """A forecaster file whose ``measured`` block a report would quote."""
    packaged = json.loads((Path(__file__).resolve().parents[2] / "headwise" / "data"
                           / "forecaster_v2.json").read_text())
    measured = packaged["measured"]
    share = next(k for k, v in measured.items() if isinstance(v, float) and 0 < v < 1)
    count = next(k for k, v in measured.items() if type(v) is int)

    def analyze(changes: dict[str, Any]) -> dict[str, Any]:
        text = json.dumps({**packaged, "measured": {**measured, **changes}})
        return {"argv": ["analyze", "$HOSTILE_RUN", "--forecast", "--forecaster", "f.json"],
                "setup": [["write", "f.json", text]]}

    weights = {**packaged, "role_weight": [True] * len(packaged["role_weight"])}
    return {
        "forecaster share 7.5": _expect(analyze({share: 7.5}), share),
        "forecaster share NaN": _expect(analyze({share: float("nan")}), share),
        "forecaster share a boolean": _expect(analyze({share: True}), share),
        "forecaster count -3": _expect(analyze({count: -3}), count),
        "forecaster count 2.5": _expect(analyze({count: 2.5}), count),
        "forecaster weights booleans": {
            "argv": ["analyze", "$HOSTILE_RUN", "--forecast", "--forecaster", "f.json"],
            "setup": [["write", "f.json", json.dumps(weights)]]},
    }


def reader_cases() -> dict[str, dict[str, dict[str, Any]]]:
    """The groups of this module, by name."""
    return {"shards": shard_cases(), "data files": data_file_cases(),
            "overwrite": overwrite_cases(), "tracebacks": traceback_cases(),
            "figures": figure_cases()}
