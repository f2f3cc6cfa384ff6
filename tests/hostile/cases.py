"""The hostile corpus: specs, CLI arguments, HuggingFace directories and run directories that a
careless or malicious user could hand to headwise. Every case must end with exit code 2 and one
line on stderr, quickly and within a 4 GiB address space (``test_hostile.py``).

A case is ``{"id", "argv", "setup"}``; ``setup`` lists operations ``runner.py`` performs in a
fresh directory first (``$HOSTILE_RUN`` names a trained run to copy).
"""

from __future__ import annotations

import base64
import copy
import json
from pathlib import Path
from typing import Any

import yaml

BASE: dict[str, Any] = {
    "model": {"n_layers": 2, "n_heads": 2, "d_model": 8, "d_ff": 12, "vocab_size": 12,
              "max_seq_len": 10},
    "data": {"tasks": {"copy": {"length": 3}}},
    "train": {"steps": 2, "batch_size": 4, "eval_batches": 1, "checkpoint_every": 1,
              "eval_every": 2},
    "heads": {"L0.H0": {"mask": "previous_token"}},
    "contract": [{"head": "L0.H0", "score": "previous_token", "at_least": 0.5}],
}
GIB = 1 << 30


def _set(spec: dict[str, Any], path: str, value: Any) -> dict[str, Any]:
    out = copy.deepcopy(spec)
    *parents, last = path.split("/")
    node = out
    for key in parents:
        node = node.setdefault(key, {})
    node[last] = value
    return out


def _train(text: str, *extra: str) -> dict[str, Any]:
    return {"argv": ["train", "spec.yaml", "--out", "run", "--quiet", *extra],
            "setup": [["write", "spec.yaml", text]]}


def _spec(path: str, value: Any, base: dict[str, Any] = BASE) -> dict[str, Any]:
    return _train(yaml.safe_dump(_set(base, path, value), sort_keys=False))


def _raw(text: str) -> dict[str, Any]:
    return _train(text)


def _decimal(text: str, expect: str) -> dict[str, Any]:
    """A spec refused for a number that is not decimal; the line names the field."""
    return {**_raw(text), "expect": f"{expect}, a YAML 1.1 "}


def _bomb(levels: int, width: int) -> str:
    lines = ["a0: &a0 [" + ", ".join(["x"] * width) + "]"]
    for i in range(1, levels):
        lines.append(f"a{i}: &a{i} [" + ", ".join([f"*a{i - 1}"] * width) + "]")
    return "\n".join(lines) + "\nmodel: {preset: tiny}\n"


def yaml_cases() -> dict[str, dict[str, Any]]:
    base = yaml.safe_dump(BASE, sort_keys=False)
    forty = ", ".join(["*x"] * 40)
    return {
        "yaml alias bomb 9x9": _raw(_bomb(9, 9)),
        "yaml alias bomb 30x2": _raw(_bomb(30, 2)),
        "yaml alias bomb in a value": _raw(_bomb(8, 8).replace("a7: &a7", "b: &b").replace(
            "model: {preset: tiny}\n", "") + base.replace("steps: 2", "steps: *b")),
        "yaml merge-key bomb": _raw("x: &x {a: 1, b: 2}\n" + "".join(
            f"y{i}: &y{i} {{<<: [*{'x' if i == 0 else f'y{i - 1}'}], k{i}: [{forty}]}}\n"
            for i in range(60)) + "model: {preset: tiny}\n"),
        "yaml recursive anchor": _raw("model: &m {preset: tiny, x: *m}\n"),
        "yaml 20000-deep list": _raw("model: " + "[" * 20000 + "]" * 20000 + "\n"),
        "yaml 20000-deep map": _raw("model: " + "{a: " * 20000 + "1" + "}" * 20000 + "\n"),
        "yaml 5000-digit integer": _raw(base.replace("steps: 2", "steps: " + "9" * 5000)),
        "yaml 40-digit integer": _raw(base.replace("steps: 2", "steps: " + "9" * 40)),
        "yaml 2 MB spec": _raw(base + "# " + "x" * (2 << 20) + "\n"),
        "yaml long key": _raw(base + "k" * 300_000 + ": 1\n"),
        "yaml python tag": _raw("model: !!python/object/apply:os.system ['true']\n"),
        "yaml python name tag": _raw("model: !!python/name:os.system\n"),
        "yaml unknown tag": _raw("model: !custom {preset: tiny}\n"),
        "yaml binary value": _raw(base.replace("steps: 2", "steps: !!binary aGVsbG8=")),
        "yaml bad timestamp": _raw(base.replace("steps: 2", "steps: 2001-13-45")),
        "yaml two documents": _raw(base + "---\n" + base),
        "yaml tab indentation": _raw("model:\n\tpreset: tiny\n"),
        "yaml not utf-8": {"argv": ["train", "spec.yaml", "--out", "run"],
                           "setup": [["bytes", "spec.yaml",
                                      base64.b64encode(b"model: \xff\xfe\x00\x81\n").decode()]]},
        "yaml nul bytes": _raw("model:\x00 {preset: tiny}\n"),
        "yaml top-level scalar": _raw("42\n"),
        "yaml duplicate nested key": _raw(base.replace("  steps: 2\n", "  steps: 2\n  steps: 3\n")),
        "yaml yes as boolean": _spec("model/causal", "yes"),
        "yaml on as boolean": _raw(base.replace("n_layers: 2", "n_layers: 2\n  causal: on")),
        # YAML 1.1 numbers that are not decimal: 010 is 8, 1:00 is 60 (never read silently)
        "yaml octal integer": _decimal(base.replace("length: 3", "length: 010"),
                                       "data.tasks.copy.length: got 010"),
        "yaml sexagesimal integer": _decimal(base.replace("steps: 2", "steps: 1:00"),
                                             "train.steps: got 1:00"),
        "yaml hexadecimal integer": _decimal(base.replace("steps: 2", "steps: 0x4"),
                                             "train.steps: got 0x4"),
        "yaml binary integer": _decimal(base.replace("batch_size: 4", "batch_size: 0b100"),
                                        "train.batch_size: got 0b100"),
        "yaml digit-separated integer": _decimal(base.replace("d_ff: 12", "d_ff: 1_2"),
                                                 "model.d_ff: got 1_2"),
        "yaml digit-separated float": _decimal(base.replace("steps: 2", "steps: 2\n  lr: 3_0.0e-4"),
                                               "train.lr: got 3_0.0e-4"),
        "yaml empty": _raw(""),
    }


def _model_raw(line: str) -> dict[str, Any]:
    """BASE with one more raw YAML line under ``model`` (for .inf / .nan values)."""
    return _raw(yaml.safe_dump(BASE).replace("d_ff: 12", "d_ff: 12\n  " + line))


def model_cases() -> dict[str, dict[str, Any]]:
    m = "model/"
    return {
        "d_model 1e9 float": _spec(m + "d_model", 1e9),
        "d_model 10^9": _spec(m + "d_model", 10**9),
        "d_model 65536 x 1024 layers": _spec(m + "n_layers", 1024, _set(
            _set(BASE, m + "d_model", 65536), m + "n_heads", 64)),
        "d_model 60000 (memory)": _spec(m + "d_model", 60000, _set(BASE, m + "n_heads", 4)),
        "vocab_size 2^40": _spec(m + "vocab_size", 2**40),
        "vocab_size 2^24 x d_model 4096 (memory)": _spec(m + "vocab_size", 2**24, _set(
            _set(BASE, m + "d_model", 4096), m + "n_heads", 4)),
        "max_seq_len 10^9": _spec(m + "max_seq_len", 10**9),
        "max_seq_len 2^20 x d_model 4096 sinusoidal": _spec(m + "max_seq_len", 2**20, _set(
            _set(_set(BASE, m + "d_model", 4096), m + "n_heads", 4), m + "positional",
            "sinusoidal")),
        "d_ff 10^12": _spec(m + "d_ff", 10**12),
        "d_ff 2^20 x 64 layers (memory)": _spec(m + "d_ff", 2**20, _set(
            _set(_set(BASE, m + "n_layers", 64), m + "d_model", 1024), m + "n_heads", 4)),
        "n_layers 10^5": _spec(m + "n_layers", 10**5),
        "n_layers 2^70": _spec(m + "n_layers", 2**70),
        "n_layers float": _spec(m + "n_layers", 2.5),
        "n_layers string": _spec(m + "n_layers", "two"),
        "n_layers negative": _spec(m + "n_layers", -3),
        "n_heads 10^6": _spec(m + "n_heads", 10**6),
        "n_kv_heads not a divisor": _spec(m + "n_kv_heads", 3),
        "d_head 0": _spec(m + "d_head", 0),
        "norm_eps inf": _model_raw("norm_eps: .inf"),
        "norm_eps nan": _model_raw("norm_eps: .nan"),
        "norm_eps negative": _spec(m + "norm_eps", -1e-5),
        "rope_base inf": _raw(yaml.safe_dump(_set(BASE, m + "positional", "rope")).replace(
            "d_ff: 12", "d_ff: 12\n  rope_base: .inf")),
        "dropout nan": _model_raw("dropout: .nan"),
        "dropout 1": _spec(m + "dropout", 1.0),
        "activation list": _spec(m + "activation", ["relu", "gelu"]),
        "positional unknown": _spec(m + "positional", "alibi"),
        "bias maybe": _spec(m + "bias", "maybe"),
        "tie_embeddings string": _spec(m + "tie_embeddings", "on"),
        "model is a list": _spec("model", [1, 2]),
        "unknown preset": _spec("model", {"preset": "x" * 10000}),
    }


def train_cases() -> dict[str, dict[str, Any]]:
    t = "train/"
    return {
        "batch_size 1e9 float": _spec(t + "batch_size", 1e9),
        "batch_size 10^9": _spec(t + "batch_size", 10**9),
        "batch_size 10^7 (memory)": _spec(t + "batch_size", 10**7),
        "eval_batches 10^9": _spec(t + "eval_batches", 10**9),
        "steps 0": _spec(t + "steps", 0),
        "steps 2^70": _spec(t + "steps", 2**70),
        "seed 2^70": _spec(t + "seed", 2**70),
        "seed negative": _spec(t + "seed", -1),
        "lr inf": _raw(yaml.safe_dump(BASE).replace("steps: 2", "steps: 2\n  lr: .inf")),
        "lr nan": _raw(yaml.safe_dump(BASE).replace("steps: 2", "steps: 2\n  lr: .nan")),
        "lr zero": _spec(t + "lr", 0),
        "grad_clip -inf": _raw(yaml.safe_dump(BASE).replace("steps: 2",
                                                            "steps: 2\n  grad_clip: -.inf")),
        "betas out of range": _spec(t + "betas", [2, 3]),
        "warmup beyond steps": _spec(t + "warmup_steps", 50),
        "log_every 0": _spec(t + "log_every", 0),
        "bf16 yes": _spec(t + "bf16", "yes"),
        "unknown train key": _spec(t + "stepz", 3),
    }


def data_cases() -> dict[str, dict[str, Any]]:
    d = "data/tasks/"
    text = {"task": "text", "path": "corpus.txt", "seq_len": 6}
    byte_model = _set(BASE, "model/vocab_size", 256)
    huge = _spec(d + "copy", text, byte_model)
    huge["setup"].append(["sparse", "corpus.txt", 100 * GIB])
    big = _spec(d + "copy", text, byte_model)
    big["setup"].append(["sparse", "corpus.txt", 6 * GIB])
    tok = _spec(d + "copy", {**text, "tokenizer": "nowhere"}, byte_model)
    tok["setup"].append(["write", "corpus.txt", "some text to read " * 20])
    return {
        "text tokenizer missing": tok,
        "text corpus 100 GB": huge,
        "text corpus 6 GB (memory)": big,
        "text corpus missing": _spec(d + "copy", text, byte_model),
        "text corpus is a directory": {**_spec(d + "copy", {**text, "path": "."}, byte_model)},
        "unknown task": _spec(d + "copy", {"task": "copyy"}),
        "copy length 10^9": _spec(d + "copy", {"length": 10**9}),
        "copy length beyond max_seq_len": _spec(d + "copy", {"length": 50}),
        "copy length negative": _spec(d + "copy", {"length": -1}),
        "task weight inf": _raw(yaml.safe_dump(BASE).replace("length: 3",
                                                             "length: 3\n      weight: .inf")),
        "task weight negative": _spec(d + "copy", {"length": 3, "weight": -1}),
        "no tasks": _spec("data/tasks", {}),
        "kv_retrieval pairs 10^9": _spec(d + "copy", {"task": "kv_retrieval", "n_pairs": 10**9}),
        "eval_examples 10^9": _spec("data/eval_examples", 10**9),
        "eval_examples inf": _raw(yaml.safe_dump(BASE).replace(
            "tasks:", "eval_examples: .inf\n  tasks:")),
        "vocab too small for task": _spec("model/vocab_size", 3),
        "task name with a terminal escape": _spec(
            "data/tasks", {"\x1b[31mred": {"task": "copy", "length": 3}}),
    }


def head_cases() -> dict[str, dict[str, Any]]:
    h = "heads"
    return {
        "selector arabic digits": _spec(h, {"L٠.H١": {"mask": "previous_token"}}),
        "selector fullwidth digits": _spec(h, {"L０.H０": {"mask": "previous_token"}}),
        "selector out of range": _spec(h, {"L9.H0": {"mask": "previous_token"}}),
        "selector 10000 characters": _spec(h, {"L0.H" + "0" * 10000: {"mask": "self"}}),
        "selector huge range": _spec(h, {"L0-99999999.H0": {"mask": "self"}}),
        "local window 1e30": _spec(h, {"L0.H0": {"mask": {"local": {"window": 1e30}}}}),
        "local window 10^30": _spec(h, {"L0.H0": {"mask": {"local": {"window": 10**30}}}}),
        "from_graph n 10^9": _spec(h, {"L0.H0": {"mask": {"from_graph": {
            "edges": [[1, 0]], "n": 10**9}}}}),
        "from_matrix 2000x2000": _spec(h, {"L0.H0": {"mask": {"from_matrix": {
            "matrix": [[1] * 2000] * 2000}}}}),
        "objective weight inf": _raw(yaml.safe_dump(_set(BASE, h, {"L0.H1": {"objective": {
            "target": "previous_token", "weight": 1.0}}})).replace("weight: 1.0",
                                                                  "weight: .inf")),
        "objective weight negative": _spec(h, {"L0.H1": {"objective": {
            "target": "previous_token", "weight": -1}}}),
        "objective unknown target": _spec(h, {"L0.H1": {"objective": {"target": "everything"}}}),
        "adapter rank 10^9": _spec("adapters", {"targets": ["q"], "rank": 10**9, "alpha": 1},
                                   _set(BASE, "heads", {})),
        "adapter rank 0": _spec("adapters", {"targets": ["q"], "rank": 0, "alpha": 1},
                                _set(BASE, "heads", {})),
        "adapter alpha inf": _raw(yaml.safe_dump(_set(_set(BASE, "heads", {}), "adapters", {
            "targets": ["q"], "rank": 2, "alpha": 1.5})).replace("alpha: 1.5", "alpha: .inf")),
        "unknown mask": _spec(h, {"L0.H0": {"mask": "diagonal-ish"}}),
        "entropy at_most nan": _raw(yaml.safe_dump(_set(BASE, h, {"L0.H1": {"entropy": {
            "at_most": 1.0}}})).replace("at_most: 1.0", "at_most: .nan")),
    }


def contract_cases() -> dict[str, dict[str, Any]]:
    c = {"head": "L0.H0", "score": "previous_token"}
    return {
        "clause at_least nan": _raw(yaml.safe_dump(BASE).replace("at_least: 0.5",
                                                                  "at_least: .nan")),
        "clause at_least string": _spec("contract", [{**c, "at_least": "high"}]),
        "clause unknown score": _spec("contract", [{**c, "score": "wisdom", "at_least": 0.1}]),
        "clause head out of range": _spec("contract", [{**c, "head": "L7.H0", "at_least": 0.1}]),
        "contract not a list": _spec("contract", {"a": 1}),
        "clause name with a terminal escape": _spec(
            "contract", [{**c, "at_least": 0.1, "name": "\x1b]0;title\x07"}]),
        "200 preserve clauses": _spec(
            "contract", [{"preserve": "base", "metric": "kl", "at_most": 0.1}] * 200),
        "3000 ablation clauses": _spec(
            "contract", [{"ablate": "L0.H1", "task": "copy", "drop_at_most": 0.5}] * 3000),
        "probe name with a terminal escape": _spec(
            "probes", {"\x1b[2Jp": {"random": {"length": 4}}}),
        "probe examples 10^9": _spec("probes", {"p": {"random": {"length": 4},
                                                      "examples": 10**9}}),
        "probe half_len 10^9": _spec("probes", {"p": {"repeated": {"half_len": 10**9}}}),
        "probe examples 10^7": _spec("probes", {"p": {"random": {"length": 4},
                                                               "examples": 10**7}}),
        "enforce pace_max below 1": _spec("enforce/pace_max", 0.5),
        "enforce pace_max nan": _raw(yaml.safe_dump(BASE) + "enforce: {pace_max: .nan}\n"),
        "enforce every 0": _spec("enforce/every", 0),
        "enforce every a float": _spec("enforce/every", 2.5),
    }


def cli_cases() -> dict[str, dict[str, Any]]:
    ok = [["write", "spec.yaml", yaml.safe_dump(BASE)]]
    return {
        "threads 999999999": {"argv": ["train", "spec.yaml", "--threads", "999999999"],
                              "setup": ok},
        "threads 0": {"argv": ["train", "spec.yaml", "--threads", "0"], "setup": ok},
        "threads not a number": {"argv": ["train", "spec.yaml", "--threads", "many"]},
        "steps -1": {"argv": ["train", "spec.yaml", "--out", "r", "--steps", "-1"],
                     "setup": ok},
        "steps 10^30": {"argv": ["train", "spec.yaml", "--out", "r", "--steps", "1" + "0" * 30],
                        "setup": ok},
        "resume with overwrite": {"argv": ["train", "spec.yaml", "--out", "r", "--resume",
                                           "--overwrite"], "setup": ok},
        "resume nothing": {"argv": ["train", "spec.yaml", "--out", "r", "--resume"],
                           "setup": ok},
        "out is a file": {"argv": ["train", "spec.yaml", "--out", "spec.yaml"], "setup": ok},
        "spec missing": {"argv": ["train", "nope.yaml"]},
        "spec is a directory": {"argv": ["train", "d.yaml"], "setup": [["mkdir", "d.yaml"]]},
        "unknown command": {"argv": ["trian", "spec.yaml"]},
        "unknown option": {"argv": ["train", "spec.yaml", "--fast"]},
        "analyze missing run": {"argv": ["analyze", "nowhere"]},
        "analyze run and hf": {"argv": ["analyze", "a", "--hf", "b"]},
        "report of a non-run": {"argv": ["report", "."], "setup": ok},
        "verify without run": {"argv": ["verify", "spec.yaml", "--run", "nowhere"],
                               "setup": ok},
        "json into missing directory": {"argv": ["analyze", "$HOSTILE_RUN", "--json",
                                                 "no/such/dir/out.json"]},
        "html to a directory": {"argv": ["explain", "$HOSTILE_RUN", "--head", "L0.H0",
                                         "--input", "copy", "--html", "."]},
        "explain head out of range": {"argv": ["explain", "$HOSTILE_RUN", "--head", "L9.H9",
                                               "--input", "copy"]},
        "explain 10^6 token ids": {"argv": ["explain", "$HOSTILE_RUN", "--head", "L0.H0",
                                            "--input", " ".join(["1"] * 10**6)]},
        "demo out is a file": {"argv": ["demo", "--out", "spec.yaml"], "setup": ok},
        **option_cases(),
        **forecaster_cases(),
    }


def option_cases() -> dict[str, dict[str, Any]]:
    """Options out of range, or given twice, each refused naming the option itself."""
    ok = [["write", "spec.yaml", yaml.safe_dump(BASE)]]
    run = [*ok, ["copytree", "$HOSTILE_RUN", "run"]]
    verify = ["verify", "spec.yaml", "--run", "run"]
    return {
        "set octal integer": {"argv": ["train", "spec.yaml", "--out", "r", "--quiet", "--set",
                                       "train.steps=010"], "setup": ok,
                              "expect": "--set train.steps: got 010, a YAML 1.1 octal"},
        "generate seed 2^64": {"argv": ["generate", "$HOSTILE_RUN", "--prompt", "ab", "--sample",
                                        "--seed", str(2**64)],
                               "expect": f"--seed: got {2**64}, expected an integer in [0, 2^63)"},
        "verify fresh 2^64": {"argv": [*verify, "--fresh", str(2**64)], "setup": run,
                              "expect": f"--fresh: got {2**64}, expected an integer in [0, 2^63)"},
        "verify data task twice": {"argv": [*verify, "--data", "copy=a.jsonl", "--data",
                                            "copy=b.jsonl"], "setup": run,
                                   "expect": "--data: got task 'copy' twice"},
        "plan pilot 0": {"argv": ["plan", "spec.yaml", "--pilot", "0"], "setup": ok,
                         "expect": "--pilot: got 0, expected an integer in [1, "},
        "circuit eap-ig steps 1001": {"argv": ["circuit", "$HOSTILE_RUN", "--task", "copy",
                                               "--method", "eap-ig", "--steps", "1001"],
                                      "expect": "--steps: got 1001, expected an integer in "
                                                "[1, 1000]"},
        **{f"{argv[0]} a 300-byte name": {"argv": argv, "setup": ok,
                                           "expect": "longer than this system allows"}
           for argv in (["analyze", "a" * 300], ["report", "a" * 300],
                        ["plan", "a" * 300 + ".yaml"],
                        ["verify", "spec.yaml", "--run", "a" * 300])},
    }


def forecaster_cases() -> dict[str, dict[str, Any]]:
    """``--forecaster FILE`` (analyze, train) and ``fit-forecaster``."""
    def analyze(text: str | None) -> dict[str, Any]:
        setup = [] if text is None else [["write", "f.json", text]]
        return {"argv": ["analyze", "$HOSTILE_RUN", "--forecast", "--forecaster", "f.json"],
                "setup": setup}

    packaged = json.loads((Path(__file__).resolve().parents[2] / "headwise" / "data"
                           / "forecaster_v2.json").read_text())
    nan = {**packaged, "role_weight": [float("nan")] * len(packaged["role_weight"])}
    flat = {**packaged, "role_std": [0.0] * len(packaged["role_std"])}
    return {
        "forecaster missing": analyze(None),
        "forecaster not json": analyze("{]"),
        "forecaster a list": analyze("[1]"),
        "forecaster nested 10^5 deep": analyze("[" * 100_000 + "]" * 100_000),
        "forecaster other version": analyze(json.dumps({**packaged, "version": "9"})),
        "forecaster NaN weights": analyze(json.dumps(nan)),
        "forecaster zero scales": analyze(json.dumps(flat)),
        "forecaster measured not an object": analyze(json.dumps({**packaged, "measured": 5})),
        "forecaster measured incomplete": analyze(json.dumps(
            {**packaged, "measured": {"held_out_runs_accuracy": 0.5}})),
        "forecaster 2 MB": analyze(json.dumps({**packaged, "pad": "x" * (2 << 20)})),
        "forecaster is /dev/zero": {"argv": ["analyze", "$HOSTILE_RUN", "--forecast",
                                             "--forecaster", "/dev/zero"]},
        "fit-forecaster same run twice": {"argv": ["fit-forecaster", "$HOSTILE_RUN",
                                                   "$HOSTILE_RUN", "--out", "f.json"]},
        "forecaster is a directory": {"argv": ["analyze", "$HOSTILE_RUN", "--forecast",
                                               "--forecaster", "d"], "setup": [["mkdir", "d"]]},
        "forecaster without forecast-every": {
            "argv": ["train", "spec.yaml", "--out", "r", "--forecaster", "f.json"],
            "setup": [["write", "spec.yaml", yaml.safe_dump(BASE)],
                      ["write", "f.json", json.dumps(packaged)]]},
        "fit-forecaster one run": {"argv": ["fit-forecaster", "$HOSTILE_RUN", "--out", "f.json"]},
        "fit-forecaster missing run": {"argv": ["fit-forecaster", "$HOSTILE_RUN", "nowhere",
                                                "--out", "f.json"]},
        "fit-forecaster out exists": {"argv": ["fit-forecaster", "$HOSTILE_RUN", "run2",
                                               "--out", "f.json"],
                                      "setup": [["write", "f.json", "{}"]]},
        "fit-forecaster out into missing directory": {
            "argv": ["fit-forecaster", "$HOSTILE_RUN", "run2", "--out", "no/f.json"]},
        "fit-forecaster run with 2 checkpoints": {
            "argv": ["fit-forecaster", "$HOSTILE_RUN", "run2", "--out", "f.json"],
            "setup": [["copytree", "$HOSTILE_RUN", "run2"]]},
    }


def _gpt2(layers: int = 1, d: int = 8, vocab: int = 12, pos: int = 10) -> tuple[
        dict[str, Any], dict[str, list[Any]]]:
    config = {"model_type": "gpt2", "n_layer": layers, "n_head": 2, "n_embd": d,
              "vocab_size": vocab, "n_positions": pos, "layer_norm_epsilon": 1e-5,
              "activation_function": "gelu_new"}
    tensors: dict[str, list[Any]] = {"wte.weight": [[vocab, d], "float32"],
                                     "wpe.weight": [[pos, d], "float32"],
                                     "ln_f.weight": [[d], "float32"],
                                     "ln_f.bias": [[d], "float32"]}
    for i in range(layers):
        for name, shape in (("ln_1.weight", [d]), ("ln_1.bias", [d]),
                            ("attn.c_attn.weight", [d, 3 * d]), ("attn.c_attn.bias", [3 * d]),
                            ("attn.c_proj.weight", [d, d]), ("attn.c_proj.bias", [d]),
                            ("ln_2.weight", [d]), ("ln_2.bias", [d]),
                            ("mlp.c_fc.weight", [d, 4 * d]), ("mlp.c_fc.bias", [4 * d]),
                            ("mlp.c_proj.weight", [4 * d, d]), ("mlp.c_proj.bias", [d])):
            tensors[f"h.{i}.{name}"] = [shape, "float32"]
    return config, tensors


def _hf(config_changes: dict[str, Any] | None = None, tensor_changes: dict[str, Any] | None = None,
        raw_config: str | None = None, command: str = "analyze") -> dict[str, Any]:
    config, tensors = _gpt2()
    config.update(config_changes or {})
    tensors.update(tensor_changes or {})
    argv = (["analyze", "--hf", "hf"] if command == "analyze" else
            ["convert", "--hf", "hf", "--out", "converted"])
    return {"argv": argv, "setup": [
        ["write", "hf/config.json", raw_config if raw_config is not None else json.dumps(config)],
        ["tensors", "hf/model.safetensors", tensors]]}


def _pretrained(config_changes: dict[str, Any]) -> dict[str, Any]:
    """A spec whose model is a local HF checkpoint with a hostile config."""
    case = _hf(config_changes)
    spec = _set(BASE, "model", {"pretrained": {"path": "hf", "format": "hf"}})
    case["setup"].append(["write", "spec.yaml", yaml.safe_dump(spec, sort_keys=False)])
    return {**case, "argv": ["train", "spec.yaml", "--out", "run", "--quiet"]}


def hf_cases() -> dict[str, dict[str, Any]]:
    return {
        "hf n_layer 10^6": _hf({"n_layer": 1000000}),
        "hf n_embd 1e9 float": _hf({"n_embd": 1e9}),
        "hf n_embd 60000": _hf({"n_embd": 60000, "n_layer": 48}),
        "hf 100 x 16384 (memory)": _hf({"n_embd": 16384, "n_layer": 100, "n_head": 16}),
        "hf vocab_size -1": _hf({"vocab_size": -1}),
        "hf layer_norm_epsilon string": _hf({"layer_norm_epsilon": "abc"}),
        "hf layer_norm_epsilon list": _hf({"layer_norm_epsilon": [1e-5]}),
        "hf activation list": _hf({"activation_function": ["gelu"]}),
        "hf activation unknown": _hf({"activation_function": "tanhshrink"}),
        "hf tie_word_embeddings string": _hf({"tie_word_embeddings": "false"}),
        "hf model_type unknown": _hf({"model_type": "mamba"}),
        "hf model_type list": _hf({"model_type": ["gpt2"]}),
        "hf config not json": _hf(raw_config="{n_layer: 1"),
        "hf config a list": _hf(raw_config="[1, 2, 3]"),
        "hf config 5000-digit int": _hf(raw_config='{"model_type": "gpt2", "n_layer": '
                                        + "9" * 5000 + "}"),
        "hf config 100000-deep": _hf(raw_config="[" * 100000 + "]" * 100000),
        "hf config NaN epsilon": _hf(raw_config=json.dumps(_gpt2()[0]).replace(
            "1e-05", "NaN")),
        "hf int64 weight": _hf(tensor_changes={"h.0.attn.c_attn.weight": [[8, 24], "int64"]}),
        "hf bool weight": _hf(tensor_changes={"wte.weight": [[12, 8], "bool"]}),
        "hf wrong shape": _hf(tensor_changes={"wte.weight": [[13, 8], "float32"]}),
        "hf missing weights": {"argv": ["analyze", "--hf", "hf"], "setup": [
            ["write", "hf/config.json", json.dumps(_gpt2()[0])]]},
        "hf convert int64 weight": _hf(tensor_changes={"ln_f.weight": [[8], "int64"]},
                                       command="convert"),
        "hf convert n_layer string": _hf({"n_layer": "1"}, command="convert"),
        "hf pretrained spec n_layer 10^6": _pretrained({"n_layer": 1000000}),
        "hf pretrained spec epsilon string": _pretrained({"layer_norm_epsilon": "abc"}),
    }


def run_cases() -> dict[str, dict[str, Any]]:
    copy_run = ["copytree", "$HOSTILE_RUN", "run"]

    def case(*ops: list[Any], argv: list[str] | None = None) -> dict[str, Any]:
        return {"argv": argv or ["analyze", "run"], "setup": [copy_run, *ops]}

    return {
        "run weights flipped byte": case(["flip", "run/model.safetensors"]),
        "run weights truncated": case(["truncate", "run/model.safetensors"],
                                      argv=["report", "run"]),
        "run manifest missing": case(["delete", "run/manifest.json"]),
        "run manifest garbage": case(["write", "run/manifest.json", "{]"]),
        "run manifest lists ../": case(["write", "run/manifest.json", json.dumps(
            {"format": "headwise-manifest/1", "sha256": {"../x": "00"}})]),
        "run.json garbage": case(["write", "run/run.json", "[1]"]),
        "run spec edited": case(["write", "run/spec.yaml", "model: {preset: tiny}\n"]),
        "run checkpoint trainer.json step edited": case(
            ["json", "run/checkpoints/step_0000002/trainer.json", "step", 1],
            argv=["report", "run"]),
        "run checkpoint weights flipped (resume)": case(
            ["flip", "run/checkpoints/step_0000002/model.safetensors"],
            ["write", "spec.yaml", yaml.safe_dump(BASE, sort_keys=False)],
            argv=["train", "spec.yaml", "--out", "run", "--resume", "--quiet"]),
        "run resume with another spec": case(
            ["write", "spec.yaml", yaml.safe_dump(_set(BASE, "train/steps", 3))],
            argv=["train", "spec.yaml", "--out", "run", "--resume"]),
        "run retrain without flags": case(
            ["write", "spec.yaml", yaml.safe_dump(BASE, sort_keys=False)],
            argv=["train", "spec.yaml", "--out", "run"]),
        "run resume enforce mismatch": case(
            ["write", "spec.yaml", yaml.safe_dump(BASE, sort_keys=False)],
            argv=["train", "spec.yaml", "--out", "run", "--resume", "--enforce"]),
        "run weights missing": case(["delete", "run/model.safetensors"]),
        "run is a file": {"argv": ["analyze", "run"], "setup": [["write", "run", "x"]]},
    }


def output_cases() -> dict[str, dict[str, Any]]:
    """Destinations that are finished work, links, FIFOs or impossible paths; two writers."""
    run = ["copytree", "$HOSTILE_RUN", "run"]
    ok = ["write", "spec.yaml", yaml.safe_dump(BASE, sort_keys=False)]
    ckpt = "run/checkpoints/step_0000002"
    hf = _hf()["setup"]

    def analyze_json(target: str, *ops: list[Any]) -> dict[str, Any]:
        return {"argv": ["analyze", "run", "--json", target], "setup": [run, *ops]}

    def explain_html(target: str, *ops: list[Any]) -> dict[str, Any]:
        return {"argv": ["explain", "run", "--head", "L0.H0", "--input", "copy", "--html",
                         target], "setup": [run, *ops]}

    def train_out(out: str, *ops: list[Any], extra: tuple[str, ...] = ()) -> dict[str, Any]:
        return {"argv": ["train", "spec.yaml", "--out", out, "--quiet", *extra],
                "setup": [ok, *ops]}

    return {
        "json onto the run's weights": analyze_json("run/model.safetensors"),
        "json onto the run's manifest": analyze_json("run/manifest.json"),
        "json onto the run's spec": analyze_json("run/spec.yaml"),
        "json onto a checkpoint's trainer.json": analyze_json(f"{ckpt}/trainer.json"),
        "html onto the run's report": explain_html("run/report.html"),
        "html onto a checkpoint's weights": explain_html(f"{ckpt}/model.safetensors"),
        "json is a FIFO": analyze_json("pipe", ["fifo", "pipe"]),
        "json is a symlink": analyze_json("out.json", ["write", "elsewhere.txt", "keep"],
                                          ["symlink", "out.json", "elsewhere.txt"]),
        "json is a dangling symlink": analyze_json("out.json",
                                                   ["symlink", "out.json", "nowhere/x"]),
        "json path of 5000 characters": analyze_json("x" * 5000 + ".json"),
        "json path with a NUL": analyze_json("out\x00.json"),
        "train out of 5000 characters": train_out("r" * 5000),
        "train out with a NUL": train_out("r\x00un"),
        "train out is a dangling symlink": train_out("r", ["symlink", "r", "nowhere"]),
        "train out is a checkpoint": train_out(ckpt, run, extra=("--overwrite",)),
        "train out is an HF model": train_out("hf", *hf, extra=("--overwrite",)),
        "train out inside a run": train_out("run/checkpoints", run, extra=("--overwrite",)),
        "train out up from a missing directory in a run": train_out(
            "run/nope/..", run, extra=("--overwrite",)),
        "train resume through a symlinked checkpoints": {
            "argv": ["train", "spec.yaml", "--out", "run", "--resume", "--quiet"],
            "setup": [ok, ["copytree", "$HOSTILE_RUN", "other"], run,
                      ["delete", "run/checkpoints"],
                      ["symlink", "run/checkpoints", "../other/checkpoints"]]},
        "convert out into a finished run": {
            "argv": ["convert", "--hf", "hf", "--out", "run"], "setup": [run, *hf]},
        "convert out into a finished run (overwrite)": {
            "argv": ["convert", "--hf", "hf", "--out", "run", "--overwrite"],
            "setup": [run, *hf]},
        "convert out is the source": {"argv": ["convert", "--hf", "hf", "--out", "hf"],
                                      "setup": hf},
        "convert out is the source (overwrite)": {
            "argv": ["convert", "--hf", "hf", "--out", "hf", "--overwrite"], "setup": hf},
        "convert out is a dangling symlink": {
            "argv": ["convert", "--hf", "hf", "--out", "o"],
            "setup": [*hf, ["symlink", "o", "nowhere"]]},
        "convert out holds a model": {"argv": ["convert", "--hf", "hf", "--out", "hf2"],
                                      "setup": [*hf, ["copytree", "hf", "hf2"]]},
        "convert copies a tokenizer linked outside": {
            "argv": ["convert", "--hf", "hf", "--out", "out"],
            "setup": [*hf, ["write", "secret.txt", "password"],
                      ["symlink", "hf/tokenizer.json", "../secret.txt"]]},
        "export tokenizer linked outside": {
            "argv": ["export", "run", "--hf", "out", "--tokenizer", "tok"],
            "setup": [run, ["write", "secret.txt", "password"],
                      ["symlink", "tok/tokenizer.json", "../secret.txt"]],
            "expect": "error: --tokenizer: tok/tokenizer.json is a link to "},
        "export into a checkpoint (overwrite)": {
            "argv": ["export", "run", "--hf", ckpt, "--overwrite"], "setup": [run]},
        "export peft into the run (overwrite)": {
            "argv": ["export", "run", "--hf", "out", "--peft", "run", "--overwrite"],
            "setup": [run]},
        "export peft is a file (overwrite)": {
            "argv": ["export", "run", "--hf", "hf", "--peft", "a.txt", "--overwrite"],
            "setup": [run, *hf, ["write", "a.txt", "x"]]},
        "demo out holds an HF model": {"argv": ["demo", "--out", "hf"], "setup": hf},
        "demo out is a symlink": {"argv": ["demo", "--out", "d"],
                                  "setup": [["mkdir", "real"], ["symlink", "d", "real"]]},
        "second train writer (overwrite)": train_out(
            "run", run, ["lock", "run/.headwise.lock"], extra=("--overwrite",)),
        "second writer: verify": {"argv": ["verify", "spec.yaml", "--run", "run"],
                                  "setup": [ok, run, ["lock", "run/.headwise.lock"]]},
        "second writer: report": {"argv": ["report", "run"],
                                  "setup": [run, ["lock", "run/.headwise.lock"]]},
    }


def sealed_cases() -> dict[str, dict[str, Any]]:
    """Files a report quotes that the run's manifest does not seal; unbounded run files."""
    run = ["copytree", "$HOSTILE_RUN", "run"]
    forged = {"enforced": True, "evaluations": 1, "held_at_step": 20, "steps": 20,
              "contract_holds": True, "history": [], "clauses": [
                  {"index": 0, "description": "forged", "lever": None, "failed_evals": 0,
                   "first_failed_at": None, "held_at": 20, "multiplier": None}]}
    return {
        "run enforcement.json added": {"argv": ["report", "run"], "setup": [
            run, ["write", "run/enforcement.json", json.dumps(forged)]]},
        "run enforcement.json malformed": {"argv": ["report", "run"], "setup": [
            run, ["write", "run/enforcement.json", '{"clauses": 5}']]},
        "run metrics.jsonl edited": {"argv": ["report", "run"], "setup": [
            run, ["write", "run/metrics.jsonl", '{"step": 2, "tasks": {"copy": '
                                                '{"accuracy": 1.0}}}\n']]},
        "run contract.json edited": {"argv": ["analyze", "run"], "setup": [
            run, ["write", "run/contract.json", "{}"]]},
        "run report.html edited": {"argv": ["analyze", "run"], "setup": [
            run, ["write", "run/report.html", "<p>all heads verified</p>"]]},
        "run weights 100 GB (sparse)": {"argv": ["analyze", "run"], "setup": [
            run, ["delete", "run/model.safetensors"],
            ["sparse", "run/model.safetensors", 100 * GIB]]},
        "run manifest 100 GB (sparse)": {"argv": ["analyze", "run"], "setup": [
            run, ["delete", "run/manifest.json"], ["sparse", "run/manifest.json", 100 * GIB]]},
        "run metrics 100 GB (sparse)": {"argv": ["report", "run"], "setup": [
            run, ["delete", "run/metrics.jsonl"], ["sparse", "run/metrics.jsonl", 100 * GIB]]},
    }


def exact_cases() -> dict[str, dict[str, Any]]:
    """Inputs that were read loosely: huge or broken text and tokenizers, out-of-range weights,
    weight files with 500000 tensors."""
    hf = _hf()["setup"]
    tok = [*hf, ["added_tokens", "hf/tokenizer.json", 0]]  # a valid two-word tokenizer
    text_argv = ["analyze", "--hf", "hf", "--text", "t.txt"]
    big = _gpt2()[1]
    return {
        "text not utf-8": {"argv": text_argv, "setup": [
            *tok, ["bytes", "t.txt", base64.b64encode(b"ok line\n\xff\xfe bad\n").decode()]]},
        "text one 50 MB line": {"argv": text_argv, "setup": [*tok, ["sparse", "t.txt", 50 << 20]]},
        "text 100 GB (sparse)": {"argv": text_argv, "setup": [*tok, ["sparse", "t.txt",
                                                                      100 * GIB]]},
        "tokenizer 10^6 added tokens": {"argv": text_argv, "setup": [
            *hf, ["write", "t.txt", "a a a\n"], ["added_tokens", "hf/tokenizer.json", 10**6]]},
        "tokenizer 200000 added tokens": {"argv": text_argv, "setup": [
            *hf, ["write", "t.txt", "a a a\n"], ["added_tokens", "hf/tokenizer.json", 200_000]]},
        "hf float64 weights of 1e300": _hf(tensor_changes={
            "wte.weight": [big["wte.weight"][0], "float64", 1e300]}),
        "hf NaN weight": _hf(tensor_changes={"ln_f.bias": [[8], "float32", float("nan")]}),
        "hf 500000 empty tensors": {"argv": ["analyze", "--hf", "hf"], "setup": [
            hf[0], ["empty_tensors", "hf/model.safetensors", 500_000]]},
        "text task not utf-8 (tokenizer)": _text_task(b"the cat \xff sat on the mat\n" * 20),
        "text tokenizer beyond the model's vocabulary": {"argv": text_argv, "setup": [
            *hf, ["write", "t.txt", "a a a\n"], ["added_tokens", "hf/tokenizer.json", 50]]},
    }


def _text_task(corpus: bytes) -> dict[str, Any]:
    """Train on ``corpus`` through a small WordLevel tokenizer."""
    words = {"[UNK]": 0, "the": 1, "cat": 2, "sat": 3, "on": 4, "mat": 5}
    tokenizer = {"version": "1.0", "truncation": None, "padding": None, "added_tokens": [],
                 "normalizer": None, "pre_tokenizer": {"type": "Whitespace"},
                 "post_processor": None, "decoder": None,
                 "model": {"type": "WordLevel", "vocab": words, "unk_token": "[UNK]"}}
    spec = _set(_set(BASE, "data/tasks/copy", {"task": "text", "path": "corpus.txt",
                                               "seq_len": 6, "tokenizer": "tok"}),
                "model/vocab_size", 64)
    case = _train(yaml.safe_dump(spec, sort_keys=False))
    case["setup"] += [["bytes", "corpus.txt", base64.b64encode(corpus).decode()],
                      ["write", "tok/tokenizer.json", json.dumps(tokenizer)]]
    return case


def all_cases() -> list[dict[str, Any]]:
    """Every case with its ``id`` (category: name)."""
    from .cases_readers import reader_cases  # it builds on this module's functions

    out = []
    for group, cases in (("yaml", yaml_cases()), ("model", model_cases()),
                         ("train", train_cases()), ("data", data_cases()),
                         ("heads", head_cases()), ("contract", contract_cases()),
                         ("cli", cli_cases()), ("hf", hf_cases()), ("run", run_cases()),
                         ("output", output_cases()), ("sealed", sealed_cases()),
                         ("exact", exact_cases()), *reader_cases().items()):
        for name, case in cases.items():
            out.append({"id": f"{group}: {name}", **case})
    return out


# Hostile inputs of the scenario tests (test_writers.py), whose outcome is more than exit 2.
# A contract laxer than BASE's: ``verify`` with it must not rewrite the run's own verdict.
LAXER_CONTRACT = [{"head": "L0.H0", "score": "previous_token", "at_least": 0.01}]
# An adapter pattern that backtracks exponentially on any module name (a regular expression
# from a file), and alphas that are not finite positive numbers.
BACKTRACKING_PATTERN = "(" + ".*" * 12 + ")*x"
BAD_ALPHAS = [float("nan"), float("inf"), -4.0, 0, "8"]
# Bytes a byte-level corpus must be read as: CR LF, a lone CR, bytes that are not UTF-8.
RAW_CORPUS = b"ab\r\ncd\rE\xff\xfe\x00gh\n" * 6
# An enforcement history of the wrong shape, under a manifest forged to seal it.
MALFORMED_ENFORCEMENT = {"steps": 20, "held_at_step": 20, "clauses": [{"index": "zero"}],
                         "history": []}
# A tokenizer file elsewhere that a link in a model directory points to.
SECRET = b"api_key = 0123456789abcdef\n"
