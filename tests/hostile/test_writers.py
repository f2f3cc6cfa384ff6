"""Hostile scenarios whose outcome is more than exit 2 (inputs from ``cases.py``): links and
finished work under ``--overwrite``, two writers, another spec's verdict, forged sealed files,
adapter files with regular expressions and bad alphas, byte-level text read exactly."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
import yaml
from cli_runs import write_spec
from lora_models import lora_model

from headwise.cli import main
from headwise.config import ModelConfig
from headwise.control.lora import apply_lora
from headwise.data.corpus import read_corpus
from headwise.data.text import TextTask
from headwise.errors import CheckpointError, ConfigError
from headwise.interop.hf_export import export_hf
from headwise.interop.load import convert
from headwise.interop.peft_export import ADAPTER_CONFIG, export_peft, import_peft
from headwise.model import build_model
from headwise.training.manifest import seal

from .cases import (
    BACKTRACKING_PATTERN,
    BAD_ALPHAS,
    BASE,
    LAXER_CONTRACT,
    MALFORMED_ENFORCEMENT,
    RAW_CORPUS,
    SECRET,
)

ROOT = Path(__file__).resolve().parents[2]
CFG = ModelConfig(n_layers=1, n_heads=2, d_model=8, d_ff=12, vocab_size=12, max_seq_len=8)


def _digests(d: Path) -> dict[str, str]:
    return {str(p.relative_to(d)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(d.rglob("*")) if p.is_file()}


@pytest.fixture(scope="module")
def trained(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    root = tmp_path_factory.mktemp("writers")
    spec = write_spec(BASE, root)
    assert main(["train", str(spec), "--out", str(root / "run"), "--quiet"]) == 0
    return spec, root / "run"


def test_overwrite_unlinks_a_symlinked_checkpoints_and_never_writes_through_it(
        trained: tuple[Path, Path], tmp_path: Path) -> None:
    spec, run = trained
    other = tmp_path / "other"
    shutil.copytree(run, other)
    before = _digests(other)
    mine = tmp_path / "mine"
    shutil.copytree(run, mine)
    shutil.rmtree(mine / "checkpoints")
    (mine / "checkpoints").symlink_to(other / "checkpoints")
    reseeded = write_spec(BASE, tmp_path, seed=7)  # other weights: a write through the link shows
    assert main(["train", str(reseeded), "--out", str(mine), "--overwrite", "--quiet"]) == 0
    assert not (mine / "checkpoints").is_symlink() and (mine / "checkpoints").is_dir()
    assert _digests(other) == before  # the other run is untouched
    assert main(["analyze", str(mine)]) == 0


def test_two_writers_one_refused_and_a_killed_writers_lock_is_taken_over(
        trained: tuple[Path, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    spec, _ = trained
    out = tmp_path / "run"
    holder = subprocess.Popen([sys.executable, "-c", (
        "import sys, time; from pathlib import Path; from headwise.atomic import hold_lock\n"
        "with hold_lock(Path(sys.argv[1])):\n    print('held', flush=True); time.sleep(60)"),
        str(out)], stdout=subprocess.PIPE, text=True, cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)})
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
        assert main(["train", str(spec), "--out", str(out), "--quiet"]) == 2
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1
        assert f"another headwise process (pid {holder.pid}) is writing this run" in err
        assert not (out / "spec.yaml").exists()  # refused before touching the directory
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.wait()
    assert (out / ".headwise.lock").read_text().strip() == str(holder.pid)  # left behind
    assert main(["train", str(spec), "--out", str(out), "--quiet"]) == 0
    assert main(["train", str(spec), "--out", str(tmp_path / "none"), "--resume"]) == 2
    assert not (tmp_path / "none").exists()  # a refused writer leaves no directory


@pytest.mark.slow
def test_two_trains_started_together_leave_one_run(trained: tuple[Path, Path],
                                                   tmp_path: Path) -> None:
    spec, _ = trained
    out = tmp_path / "run"
    argv = [sys.executable, "-c", "import sys; from headwise.cli import main; "
            "sys.exit(main(sys.argv[1:]))", "train", str(spec), "--out", str(out), "--quiet",
            "--overwrite"]
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    procs = [subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True) for _ in range(2)]
    results = sorted((p.wait(timeout=300), p.stderr.read() if p.stderr else "") for p in procs)
    if results[1][0] != 0:  # they overlapped: the second writer was refused with one line
        assert [code for code, _ in results] == [0, 2]
        assert "another headwise process" in results[1][1]
        assert len(results[1][1].strip().splitlines()) == 1
    # Overlapping or one after the other (--overwrite), the directory holds exactly one run.
    records = [(r["kind"], r["step"]) for r in map(json.loads, (
        out / "metrics.jsonl").read_text().splitlines())]
    assert records and len(records) == len(set(records))  # one run's lines, once each
    assert main(["analyze", str(out)]) == 0


def test_export_refuses_a_checkpoint_and_checks_peft_before_deleting(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    spec = tmp_path / "plain.yaml"  # no mask: a run that exports
    spec.write_text(yaml.safe_dump({**BASE, "heads": {}}, sort_keys=False))
    run = tmp_path / "run"
    assert main(["train", str(spec), "--out", str(run), "--quiet"]) in (0, 1)  # contract
    step = run / "checkpoints" / "step_0000002"
    before = _digests(run)
    assert main(["export", str(run), "--hf", str(step), "--overwrite"]) == 2
    assert "holds a training checkpoint" in capsys.readouterr().err
    hf = tmp_path / "hf"
    assert main(["export", str(run), "--hf", str(hf)]) == 0
    exported = _digests(hf)
    (tmp_path / "a.txt").write_text("x")
    assert main(["export", str(run), "--hf", str(hf), "--peft", str(tmp_path / "a.txt"),
                 "--overwrite"]) == 2
    assert "a.txt is a file; expected a directory" in capsys.readouterr().err
    assert _digests(hf) == exported and _digests(run) == before


def test_verify_with_another_spec_writes_beside_the_runs_own_verdict(
        trained: tuple[Path, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    spec, run = trained
    run = Path(shutil.copytree(run, tmp_path / "run"))
    own = (run / "contract.json").read_bytes()
    lax = tmp_path / "lax.yaml"
    lax.write_text(yaml.safe_dump({**BASE, "contract": LAXER_CONTRACT}, sort_keys=False))
    capsys.readouterr()
    assert main(["verify", str(lax), "--run", str(run)]) == 0
    out = capsys.readouterr().out
    digest = hashlib.sha256(lax.read_bytes()).hexdigest()[:12]
    assert "differs from the run's own spec" in out and f"contract.{digest}.json" in out
    assert (run / "contract.json").read_bytes() == own
    assert json.loads((run / f"contract.{digest}.json").read_text())["passed"] is True
    assert main(["verify", str(spec), "--run", str(run)]) in (0, 1)  # its own: contract.json
    assert "differs" not in capsys.readouterr().out
    (run / f"contract.{digest}.json").write_text("{}")  # sealed: an edit is refused
    assert main(["analyze", str(run)]) == 2
    assert f"contract.{digest}.json: contents do not match" in capsys.readouterr().err


def test_report_refuses_a_malformed_enforcement_history_even_under_a_forged_manifest(
        trained: tuple[Path, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    _, run = trained
    run = Path(shutil.copytree(run, tmp_path / "run"))
    (run / "enforcement.json").write_text(json.dumps(MALFORMED_ENFORCEMENT))
    seal(run, ["enforcement.json"])
    capsys.readouterr()
    assert main(["report", str(run)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "enforcement.json: clauses[0].index: expected" in err


@pytest.mark.parametrize(("attempts", "field"), [
    ([{"dir": 3, "lr": 0.001, "kept_as": None}], "attempts"),
    ([{"dir": ".", "lr": True, "kept_as": None}], "attempts"),
    ("twice", "attempts"),
    ([{"dir": ".", "lr": 0.001, "kept_as": None}], "attempt"),  # attempt 2 of 1
])
def test_report_refuses_malformed_attempts_even_under_a_forged_manifest(
        trained: tuple[Path, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str],
        attempts: object, field: str) -> None:
    _, run = trained
    run = Path(shutil.copytree(run, tmp_path / "run"))
    e = {"steps": 20, "held_at_step": None, "clauses": [], "history": []}  # well formed
    (run / "enforcement.json").write_text(json.dumps({**e, "attempts": attempts, "attempt": 2}))
    seal(run, ["enforcement.json"])
    capsys.readouterr()
    assert main(["report", str(run)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and f"enforcement.json: {field}: expected" in err


def test_export_never_replaces_an_adapter_or_deletes_before_checking(tmp_path: Path) -> None:
    adapter, hf = tmp_path / "adapter", tmp_path / "hf"
    export_hf(lora_model(CFG, 0), hf, peft=adapter)
    adapter_before, hf_before = _digests(adapter), _digests(hf)
    with pytest.raises(ConfigError, match="holds an adapter"):
        export_hf(lora_model(CFG, 1), tmp_path / "hf2", peft=adapter)
    (tmp_path / "a.txt").write_text("x")
    with pytest.raises(ConfigError, match="a.txt is a file; expected a directory"):
        export_hf(lora_model(CFG, 1), hf, peft=tmp_path / "a.txt", overwrite=True)
    with pytest.raises(ConfigError, match="holds an adapter"):
        export_peft(lora_model(CFG, 1), adapter, "gpt2")
    assert _digests(adapter) == adapter_before and _digests(hf) == hf_before
    export_hf(lora_model(CFG, 1), hf, peft=adapter, overwrite=True)
    assert _digests(adapter) != adapter_before


@pytest.mark.parametrize("edit", ["pattern", *[f"alpha {a!r}" for a in BAD_ALPHAS]])
def test_import_peft_refuses_patterns_and_alphas_from_the_file(tmp_path: Path,
                                                               edit: str) -> None:
    adapter = export_peft(lora_model(CFG, 0), tmp_path / "adapter", "gpt2")
    config = json.loads((adapter / ADAPTER_CONFIG).read_text())
    if edit == "pattern":
        config["alpha_pattern"] = {BACKTRACKING_PATTERN: 4}
        match = "is not a module name"
    else:
        config["lora_alpha"] = BAD_ALPHAS[[f"alpha {a!r}" for a in BAD_ALPHAS].index(edit)]
        match = "lora_alpha: got .*, expected a finite number > 0"
    (adapter / ADAPTER_CONFIG).write_text(json.dumps(config))
    start = time.perf_counter()
    with pytest.raises(CheckpointError, match=match):
        import_peft(build_model(CFG, seed=0), adapter, "gpt2")
    assert time.perf_counter() - start < 5


def test_byte_level_text_is_the_files_bytes(tmp_path: Path) -> None:
    path = tmp_path / "corpus.bin"
    path.write_bytes(RAW_CORPUS)
    assert read_corpus(str(path), None, "text").ids.tolist() == list(RAW_CORPUS)
    parts = [TextTask(path=str(path), seq_len=2, split=s, eval_fraction=0.25)
             for s in ("train", "eval", "verify")]
    assert sorted(torch.cat([p._ids for p in parts]).tolist()) == sorted(RAW_CORPUS)


def test_convert_overwrite_unlinks_links_and_never_copies_through_them(tmp_path: Path) -> None:
    hf, out = tmp_path / "hf", tmp_path / "out"
    export_hf(build_model(CFG, seed=0), hf)
    convert(hf, out)
    secret = tmp_path / "secret.txt"
    secret.write_bytes(SECRET)
    (out / "vocab.txt").symlink_to(secret)  # a stale file that is a link
    (out / "config.json").rename(out / "real.json")
    (out / "config.json").symlink_to(out / "real.json")  # a file to replace that is a link
    with pytest.raises(ConfigError, match="pass overwrite=True"):
        convert(hf, out)
    convert(hf, out, overwrite=True)
    assert not (out / "vocab.txt").exists() and not (out / "config.json").is_symlink()
    assert secret.read_bytes() == SECRET and (out / "real.json").is_file()
    (hf / "vocab.txt").symlink_to(secret)
    with pytest.raises(CheckpointError, match="is a link to .*secret.txt, outside"):
        convert(hf, tmp_path / "out2")
    assert not (tmp_path / "out2").exists()


def test_save_lora_replaces_an_adapter_only_with_overwrite_and_never_a_run(tmp_path: Path) -> None:
    from headwise import ModelConfig, build_model
    from headwise.control.lora import save_lora
    from headwise.errors import ConfigError

    model = build_model(ModelConfig(n_layers=1, n_heads=2, d_model=8, vocab_size=8,
                                    max_seq_len=6), seed=0)
    apply_lora(model, targets=["q_proj"], rank=2)
    first = save_lora(model, tmp_path / "adapter")
    before = (first / "adapter.safetensors").read_bytes()
    with pytest.raises(ConfigError, match="adapter"):
        save_lora(model, tmp_path / "adapter")
    assert (first / "adapter.safetensors").read_bytes() == before
    save_lora(model, tmp_path / "adapter", overwrite=True)
    run = tmp_path / "run"
    run.mkdir()
    (run / "run.json").write_text("{}")
    with pytest.raises(ConfigError, match="run"):
        save_lora(model, run, overwrite=True)
    assert sorted(p.name for p in run.iterdir()) == ["run.json"]
