"""The hostile corpus (``cases.py``): every case exits 2 with one line on stderr, within 20 s,
in a process limited to a 4 GiB address space (``RLIMIT_AS``). The cases run in two runner
processes in parallel (``runner.py``); the counts are in docs/robustness.md. A case may also
name text its line must hold (``expect``) or must not (``absent``)."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from headwise.cli import main

from .cases import BASE, all_cases

RUNNER = Path(__file__).with_name("runner.py")
LIMIT = 4 << 30
CASE_SECONDS = 20
WORKERS = 2


@pytest.fixture(scope="module")
def trained_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("hostile-run")
    (root / "spec.yaml").write_text(yaml.safe_dump(BASE, sort_keys=False))
    assert main(["train", str(root / "spec.yaml"), "--out", str(root / "run"), "--quiet"]) == 0
    return root / "run"


@pytest.fixture(scope="module")
def sharded_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A run of ``BASE`` trained with ``train.parallel: fsdp`` on one rank (as
    ``torchrun --nproc-per-node 1`` starts it): its checkpoints are shards."""
    root = tmp_path_factory.mktemp("hostile-sharded")
    spec = {**BASE, "train": {**BASE["train"], "parallel": "fsdp"}}
    (root / "spec.yaml").write_text(yaml.safe_dump(spec, sort_keys=False))
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with pytest.MonkeyPatch.context() as env:
        for key, value in {"WORLD_SIZE": "1", "RANK": "0", "LOCAL_RANK": "0",
                           "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)}.items():
            env.setenv(key, value)
        assert main(["train", str(root / "spec.yaml"), "--out", str(root / "run"),
                     "--quiet"]) == 0
    return root / "run"


def run_corpus(cases: list[dict], tmp_path: Path, run: Path, sharded: Path) -> list[dict]:
    """Run ``cases`` in ``WORKERS`` limited processes; one result dict per case."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HOSTILE_RUN": str(run),
           "HOSTILE_SHARDED": str(sharded)}
    procs = []
    for w in range(WORKERS):
        (tmp_path / f"cases{w}.json").write_text(json.dumps(cases[w::WORKERS]))
        procs.append(subprocess.Popen(
            [sys.executable, str(RUNNER), str(tmp_path / f"cases{w}.json"),
             str(tmp_path / f"results{w}.jsonl"), str(LIMIT)], env=env,
            stdout=subprocess.PIPE, stderr=subprocess.PIPE))
    for p in procs:
        try:
            p.communicate(timeout=CASE_SECONDS * len(cases))
        except subprocess.TimeoutExpired:
            p.kill()
    results = []
    for w in range(WORKERS):
        path = tmp_path / f"results{w}.jsonl"
        results += [json.loads(x) for x in path.read_text().splitlines()] if path.exists() else []
    return results


def test_every_hostile_input_exits_2_with_one_line(tmp_path: Path, trained_run: Path,
                                                   sharded_run: Path) -> None:
    cases = all_cases()
    by_id = {c["id"]: c for c in cases}
    results = {r["id"]: r for r in run_corpus(cases, tmp_path, trained_run, sharded_run)}
    missing = [c["id"] for c in cases if c["id"] not in results]
    assert not missing, f"never finished (killed or hung): {missing[:5]}"
    bad = []
    for r in results.values():
        lines = r["stderr"].strip().splitlines()
        raw_control = any(not ch.isprintable() for line in lines for ch in line)
        case = by_id[r["id"]]
        said = (case.get("expect", "") in r["stderr"]
                and ("absent" not in case or case["absent"] not in r["stderr"]))
        if (r["code"] != 2 or len(lines) != 1 or r["seconds"] > CASE_SECONDS or raw_control
                or not said):
            bad.append(f"{r['id']}: exit {r['code']}, {r['seconds']:.1f}s, "
                       f"{len(lines)} lines: {r['stderr'].strip()[-300:]}")
    assert not bad, f"{len(bad)} of {len(cases)} cases failed:\n" + "\n".join(bad)
