"""Runs: train a spec into a run directory, verify a run against a spec, rebuild a run's model.

A run directory holds ``spec.yaml`` (the spec as given), ``config.json``, ``model.safetensors``,
``checkpoints/``, ``metrics.jsonl``, ``contract.json``, ``enforcement.json`` (with
``--enforce``), ``report.json`` and ``report.html``.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from headwise.analysis.contract import Contract
from headwise.analysis.verify import ContractResult, VerifyData, verify
from headwise.data import Batch
from headwise.errors import CheckpointError, SpecError
from headwise.pipeline.compile import Compiled, compile_spec
from headwise.pipeline.probes import spec_probes
from headwise.spec import Spec, load_spec
from headwise.train import TrainResult, train
from headwise.train.safetensors_io import write_bytes_atomic

RUN_FILES = ("spec.yaml", "config.json", "model.safetensors", "metrics.jsonl", "contract.json",
             "enforcement.json", "report.json", "report.html")


@dataclass
class RunOutcome:
    """What ``train_run`` produced."""

    run_dir: Path
    compiled: Compiled
    train: TrainResult
    contract: ContractResult | None
    enforcement: dict[str, Any] | None


def contract_of(spec: Spec) -> Contract:
    """The spec's contract as a ``Contract`` (already validated by ``load_spec``)."""
    return Contract.from_list(list(spec.contract), spec.n_layers, spec.n_heads,
                              list(spec.data.names))


def verify_data(compiled: Compiled) -> VerifyData:
    """Held-out data for verification: one batch per task, and probes for role scores.

    Probes: ``default`` (the held-out mixture), each task's name (its part of it),
    ``repeated`` (random halves repeated once, sized by the training data) and the spec's
    declared probes (``headwise.pipeline.probes``).
    """
    batch = compiled.eval_batch
    tasks: dict[str, Batch] = {}
    for i, name in enumerate(compiled.task_names):
        rows = (batch.task_ids == i).nonzero().flatten()
        if rows.numel():
            mask = batch.attention_mask[rows] if batch.attention_mask is not None else None
            tasks[name] = Batch(batch.tokens[rows], batch.targets[rows], mask,
                                batch.task_ids[rows])
    probes: dict[str, Any] = {"default": batch, **tasks, **spec_probes(compiled.spec)}
    return VerifyData(tasks=tasks, probes=probes)


def prepare_run_dir(out: Path, spec: Spec, resume: bool, overwrite: bool) -> None:
    """Create ``out`` and write ``spec.yaml``; refuse to clobber another run by accident.

    Raises:
        SpecError: ``out`` holds a run and neither ``resume`` nor ``overwrite`` was given, or
            ``resume`` with a spec that differs from the run's ``spec.yaml``.
    """
    saved = out / "spec.yaml"
    if resume:
        if saved.is_file() and saved.read_text() != spec.text:
            raise SpecError(f"{out}: --resume with a spec that differs from {saved}; expected "
                            "the same spec the run started with")
    elif any((out / name).exists() for name in (*RUN_FILES, "checkpoints")):
        if not overwrite:
            raise SpecError(f"{out}: already holds a run; pass --resume to continue it or "
                            "choose another --out")
        for name in RUN_FILES:
            (out / name).unlink(missing_ok=True)
        shutil.rmtree(out / "checkpoints", ignore_errors=True)
    try:
        out.mkdir(parents=True, exist_ok=True)
        write_bytes_atomic(saved, spec.text.encode())
    except OSError as e:
        raise SpecError(f"{out}: cannot write the run directory ({e.strerror or e})") from None


def write_json(path: Path, data: Any) -> None:
    """Write JSON atomically."""
    write_bytes_atomic(path, json.dumps(data, indent=1, default=str).encode())


def train_run(spec_source: str | Path, out: str | Path, *, resume: bool = False,
              enforce: bool = False, overwrite: bool = False,
              progress: bool = True, allow_unenforced: bool = False,
              enforce_budget: float = 1.0, forecast_every: int = 0,
              warn: Callable[[str], None] = print) -> RunOutcome:
    """Train a spec into ``out``, verify its contract and write the report.

    With ``enforce``, training stops at the first evaluation point where the contract holds and
    never runs past ``train.steps x enforce_budget`` (1 to 1.3; the schedule spans the budget).
    With ``forecast_every``, every that many steps (at evaluation points) the packaged
    forecaster predicts final roles and ``warn`` gets a line per contract clause forecast to
    fail (``headwise.analysis.forecast_contract``).

    Raises:
        SpecError: an invalid spec, ``--enforce`` or ``forecast_every`` without evaluation
            points, or (unless ``allow_unenforced``) a clause no lever can move under
            ``--enforce``.
        CheckpointError: ``resume`` from a corrupt checkpoint.
    """
    from headwise.enforce import Enforcer, plan, summary

    spec = load_spec(spec_source)
    if not (isinstance(enforce_budget, (int, float)) and 1.0 <= enforce_budget <= 1.3):
        raise SpecError(f"--enforce-budget: got {enforce_budget!r}, expected a number in "
                        "[1, 1.3] (a factor on train.steps)")
    if enforce_budget != 1.0 and not enforce:
        raise SpecError("--enforce-budget: given without --enforce; expected both or neither")
    if enforce and spec.train.eval_every == 0:
        raise SpecError("train.eval_every: got 0, expected an integer >= 1 with --enforce "
                        "(enforcement acts at evaluation points)")
    if enforce and not spec.contract:
        raise SpecError("contract: missing; --enforce needs a contract to enforce")
    if forecast_every and spec.train.eval_every == 0:
        raise SpecError("train.eval_every: got 0, expected an integer >= 1 with "
                        "--forecast-every (forecasts are made at evaluation points)")
    out = Path(out)
    compiled = compile_spec(spec)
    contract = contract_of(spec)
    data = verify_data(compiled)
    callbacks: list[Callable[[Any], None]] = []
    if enforce:
        levers = plan(compiled, contract)
        missing = [c for c in contract if levers.get(c.index) is None]
        if missing and not allow_unenforced:
            c = missing[0]
            raise SpecError(f"{c.path}: no lever can move this clause ({c.describe()}, "
                            f"{c.threshold_text()}); see `headwise plan`, or pass "
                            "--allow-unenforced to enforce the others")
        callbacks.append(Enforcer(contract, data, levers))
    if forecast_every:
        callbacks.append(_forecast_watch(compiled, data, contract, forecast_every, warn,
                                         math.ceil(spec.train.steps * enforce_budget)))
    main = is_main_process()
    if main:
        prepare_run_dir(out, spec, resume, overwrite)
    config = spec.train
    if enforce_budget != 1.0:
        config = dataclasses.replace(config, steps=math.ceil(config.steps * enforce_budget))
    result = train(compiled.model, compiled.data, config, out_dir=out,
                   objectives=compiled.objectives, callbacks=callbacks,
                   optimizer_hooks=compiled.optimizer_hooks, resume=resume,
                   eval_data=compiled.eval_data, progress=progress)
    compiled.model.to("cpu")  # DDP on GPU moves it; verification and reports run on CPU
    verdict = verify(compiled.model, contract, data) if spec.contract else None
    enforcement = None
    if enforce and verdict is not None:
        enforcement = summary(result.extra, verdict, result.step)
    if main and verdict is not None:
        write_json(out / "contract.json", verdict.to_dict())
    if main and enforcement is not None:
        write_json(out / "enforcement.json", enforcement)
    return RunOutcome(out, compiled, result, verdict, enforcement)


def _forecast_watch(compiled: Compiled, data: VerifyData, contract: Contract, every: int,
                    warn: Callable[[str], None], total_steps: int) -> Callable[[Any], None]:
    from headwise.analysis.forecast import load_forecaster
    from headwise.analysis.forecast_contract import ForecastWatch
    from headwise.pipeline.analyze import run_role_table

    return ForecastWatch(lambda m: run_role_table(m, data), total_steps, every,
                         contract if contract.clauses else None, load_forecaster(), warn)


def is_main_process() -> bool:
    """Rank 0 under ``torchrun`` (or a single process): the one that writes run files."""
    return int(os.environ.get("RANK", "0")) == 0


def load_run(run: str | Path, spec_source: str | Path | None = None) -> Compiled:
    """Rebuild a trained run's model with its levers from its (or the given) spec.

    Raises:
        CheckpointError: ``run`` is not a finished run directory.
        SpecError: the spec is invalid.
    """
    run = Path(run)
    if not run.is_dir():
        raise CheckpointError(f"{run}: no such run directory")
    spec_path = Path(spec_source) if spec_source is not None else run / "spec.yaml"
    if spec_source is None and not spec_path.is_file():
        raise CheckpointError(f"{run}: no spec.yaml; expected a run directory written by "
                              "`headwise train`")
    weights = run / "model.safetensors"
    if not weights.is_file():
        raise CheckpointError(f"{run}: no model.safetensors; has training finished? (resume "
                              "with `headwise train SPEC --out RUN --resume`)")
    compiled = compile_spec(load_spec(spec_path), weights=weights)
    compiled.model.eval()
    return compiled


def verify_run(spec_source: str | Path, run: str | Path) -> ContractResult:
    """Verify ``spec``'s contract on the trained ``run``; writes ``run/contract.json``.

    Raises:
        SpecError: the spec has no contract, or is invalid.
        CheckpointError: the run's weights do not fit the spec's model.
    """
    compiled = load_run(run, spec_source)
    if not compiled.spec.contract:
        raise SpecError("contract: missing; expected a list of clauses to verify")
    verdict = verify(compiled.model, contract_of(compiled.spec), verify_data(compiled))
    write_json(Path(run) / "contract.json", verdict.to_dict())
    return verdict
