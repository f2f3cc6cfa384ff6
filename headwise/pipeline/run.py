"""Runs: train a spec into a run directory, verify a run against a spec, rebuild a run's model.

A run directory holds ``spec.yaml`` (the spec as trained: the file, with any ``--set`` /
``--seed`` overrides applied), ``run.json`` (where the spec came from, so relative paths in it
keep resolving, the flags that shape the training (``headwise.pipeline.resume``) and, once
finished, the step its weights are from),
``config.json``, ``model.safetensors``, ``manifest.json`` (size and sha256 of the files that
define the model and of those commands quote, written last: a run without it did not finish),
``checkpoints/``, ``metrics.jsonl``, ``contract.json``, ``enforcement.json`` (with
``--enforce``), ``report.json``, ``report.html`` and ``.headwise.lock`` (the writer's lock,
``headwise.atomic.hold_lock``: one process writes a run at a time).

Lifecycle: ``--resume`` continues the same run (its recorded flags) from the latest checkpoint
or refuses (exit 2) when there is none; it never retrains over a run. A directory left by a run
interrupted before its first checkpoint holds no work and can be trained into again.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import math
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from headwise.atomic import (
    RUN,
    check_output_dir,
    hold_lock,
    linked_entries,
    remove_entries,
    write_bytes_atomic,
)
from headwise.contract import (
    Contract,
    ContractResult,
    EnforceConfig,
    Enforcer,
    ForecastWatch,
    VerifyData,
    plan,
    summary,
    verify,
)
from headwise.errors import CheckpointError, SpecError
from headwise.forecast.roles import Forecaster, load_forecaster
from headwise.memory import check_memory, training_bytes
from headwise.pipeline.compile import Compiled, compile_spec
from headwise.pipeline.heldout import probe_sampler, verify_data
from headwise.pipeline.resume import (
    RUN_ENTRY,
    RunFlags,
    check_resume,
    read_run_info,
    recorded_info,
    resume_flags,
    run_info,
)
from headwise.pipeline.run_analysis import role_heatmap_png, run_role_table
from headwise.runspec import Spec, load_spec, spec_from_dict
from headwise.runspec.overrides import load_spec_with, overrides_of
from headwise.runspec.yaml_io import parse_yaml, read_spec_text
from headwise.training import TrainConfig, TrainResult, list_checkpoints, train
from headwise.training.device import check_device_name, model_device, place, resolve_device
from headwise.training.manifest import MANIFEST, seal, verify_manifest, write_manifest
from headwise.training.progress import EvalLines

RUN_FILES = ("spec.yaml", "run.json", "config.json", "model.safetensors", MANIFEST,
             "metrics.jsonl", "contract.json", "enforcement.json", "report.json", "report.html")
# The files that define a finished run's model, covered by its manifest.
MODEL_FILES = ("spec.yaml", "run.json", "config.json", "model.safetensors")
# What commands read or quote besides the model, sealed by the manifest too when present.
SEALED_FILES = ("metrics.jsonl", "contract.json", "enforcement.json")
MAX_STEPS = 10**9
FIGURES = {"roles/heatmap": role_heatmap_png}  # logged at checkpoints with log: [tensorboard]


@dataclass
class RunOutcome:
    """What ``train_run`` produced."""

    run_dir: Path
    compiled: Compiled
    train: TrainResult
    contract: ContractResult | None
    enforcement: dict[str, Any] | None


def holds_work(out: Path) -> bool:
    """Whether ``out`` holds something a new run must not silently replace.

    A directory with ``run.json`` but neither weights nor a checkpoint is what a run
    interrupted during set-up leaves: no work, so it may be trained into again.
    """
    if not any((out / name).exists() for name in (*RUN_FILES, "checkpoints")):
        return False
    if not (out / "run.json").is_file():
        return True
    return (out / "model.safetensors").exists() or bool(list_checkpoints(out))


def prepare_run_dir(out: Path, spec: Spec, resume: bool, overwrite: bool,
                    flags: RunFlags | None = None, spec_dir: Path | None = None) -> int | None:
    """Create ``out`` and write ``spec.yaml`` and ``run.json``; refuse to clobber a run.

    Returns:
        With ``resume``, the step the run continues from; else ``None``.

    Raises:
        SpecError: ``resume`` and ``overwrite`` together; ``out`` holds a run and neither
            flag was given; or a resume that ``check_resume`` refuses.
    """
    if resume and overwrite:
        raise SpecError("--resume and --overwrite: conflicting options; expected one of them "
                        "(--resume continues the run, --overwrite replaces it)")
    linked = linked_entries(out, (*RUN_FILES, "checkpoints"))
    if resume:
        if linked:
            raise SpecError(f"{out / linked[0]}: is a symbolic link; expected the run's own "
                            "files (a resume never continues another run's)")
        return check_resume(out, spec)
    if holds_work(out) and not overwrite:
        raise SpecError(f"{out}: already holds a run; pass --resume to continue it, "
                        "--overwrite to replace it, or choose another --out")
    remove_entries(out, (*RUN_FILES, "checkpoints"))  # links unlinked, never followed
    try:
        out.mkdir(parents=True, exist_ok=True)
        write_bytes_atomic(out / "spec.yaml", spec.text.encode())
        write_json(out / "run.json", run_info(flags or RunFlags().filled(), spec, spec_dir))
    except OSError as e:
        raise SpecError(f"{out}: cannot write the run directory ({e.strerror or e})") from None
    return None


def write_json(path: Path, data: Any) -> None:
    """Write JSON atomically."""
    write_bytes_atomic(path, json.dumps(data, indent=1, default=str).encode())


def train_run(spec_source: str | Path, out: str | Path, *, resume: bool = False,
              enforce: bool | None = None, overwrite: bool = False,
              progress: bool = True, allow_unenforced: bool | None = None,
              enforce_budget: float | None = None, steps: int | None = None,
              seed: int | None = None, overrides: Sequence[str] | None = None,
              device: str | None = None, forecast_every: int = 0,
              forecaster: str | Path | None = None,
              enforce_config: EnforceConfig | None = None,
              enforcer: type[Enforcer] = Enforcer,
              warn: Callable[[str], None] = print) -> RunOutcome:
    """Train a spec into ``out``, verify its contract and write the report.

    With ``enforce``, training stops at the first evaluation point where the contract holds and
    never runs past ``train.steps x enforce_budget`` (1 to 1.3; the schedule spans the budget).
    ``device`` overrides the spec's ``train.device`` (``--device``), ``steps`` its
    ``train.steps`` (``headwise train --steps N``), ``seed`` its ``train.seed`` and each
    ``overrides`` item ``path.to.key=value`` a key (``--set``; ``headwise.runspec.overrides``).

    With ``resume``, the flags left ``None`` (``enforce``, ``enforce_budget``,
    ``allow_unenforced``, ``steps``, ``seed`` and ``overrides`` together) are the run's own;
    a flag given must equal the run's, except a larger ``steps`` (``headwise.pipeline.resume``).

    With ``forecast_every``, every that many steps (at evaluation points) the packaged
    forecaster (or the one in the JSON file ``forecaster``, e.g. from
    ``headwise fit-forecaster``) predicts final roles and ``warn`` gets a line per contract
    clause forecast to fail (``headwise.contract.forecast``). With ``progress``, a line per
    evaluation point (held-out accuracy, clauses held, ETA) goes to stdout.

    ``enforce_config`` sets enforcement (default: the spec's ``enforce:`` section); ``enforcer``
    is the callback class that applies it (a subclass may instrument it, as the benchmarks do).

    Raises:
        SpecError: an invalid spec or override, ``--enforce`` or ``forecast_every`` without
            evaluation points, ``forecaster`` without ``forecast_every`` or not a forecaster
            file, (unless ``allow_unenforced``) a clause no lever can move under ``--enforce``,
            or a resume with a flag that differs from the run's.
        ConfigError: an unknown or unavailable device.
        CheckpointError: ``resume`` from a corrupt checkpoint.
    """
    out = Path(out)
    if is_main_process():  # a run replaces only a run (with --overwrite, checked under the lock)
        check_output_dir(out, "--out", overwrite=True, replaces=(RUN,))
    flags = _flags(out, resume and not overwrite, RunFlags(
        enforce, enforce_budget, allow_unenforced, None if steps is None else check_steps(steps),
        None if overrides is None and seed is None else overrides_of(overrides, seed)))
    spec = _run_spec(load_spec_with(spec_source, flags.overrides or ()), flags, device=device,
                     forecast_every=forecast_every)
    if forecaster is not None and not forecast_every:
        raise SpecError("--forecaster: only used with --forecast-every")
    watch_with = read_forecaster(forecaster) if forecast_every else None
    compiled = compile_spec(spec)
    place(compiled.model, spec.train.device, "--device" if device is not None else "train.device")
    contract = spec.contract
    data = verify_data(compiled)  # on the training device: enforcement verifies mid-run
    callbacks = _enforcer(compiled, contract, data, flags, enforce_config or spec.enforce,
                          enforcer)
    train_config = _budgeted(spec.train, flags.enforce_budget or 1.0)
    if watch_with is not None:
        callbacks.append(_forecast_watch(compiled, data, contract, forecast_every, warn,
                                         train_config.steps, watch_with))
    main = is_main_process()
    with hold_lock(out) if main else contextlib.nullcontext():  # one writer per run
        info = _prepare(out, spec, spec_source, resume, overwrite, flags) if main else {}
        if progress and main:
            callbacks.append(EvalLines(train_config.steps, _clauses_held))
        result = train(compiled.model, compiled.data, train_config, out_dir=out,
                       objectives=compiled.objectives, callbacks=callbacks,
                       optimizer_hooks=compiled.optimizer_hooks, resume=resume,
                       eval_data=compiled.eval_data, progress=progress, figures=FIGURES,
                       extra={RUN_ENTRY: info} if main else None)
        verdict = _verify_trained(compiled, contract, data)
        enforcement = (summary(result.extra, verdict, result.step)
                       if flags.enforce and verdict is not None else None)
        if main:
            write_json(out / "run.json", {**info, "step": result.step})
            _write_outcome(out, verdict, enforcement)
    return RunOutcome(out, compiled, result, verdict, enforcement)


def _flags(out: Path, resume: bool, given: RunFlags) -> RunFlags:
    """The flags the run trains with: the run's own on resume (checked), else those given."""
    return resume_flags(recorded_info(out), given, out) if resume else given.filled()


def _enforcer(compiled: Compiled, contract: Contract, data: VerifyData, flags: RunFlags,
              config: EnforceConfig, enforcer: type[Enforcer]) -> list[Callable[[Any], None]]:
    """``[enforcer]`` with ``--enforce`` (else ``[]``), after checking every clause has a lever.

    Raises:
        SpecError: a clause no lever can move, without ``--allow-unenforced``.
    """
    if not flags.enforce:
        return []
    levers = plan(compiled, contract, probe_sampler(compiled.spec), config)
    missing = [c for c in contract if levers.get(c.index) is None]
    if missing and not flags.allow_unenforced:
        c = missing[0]
        raise SpecError(f"{c.path}: no lever can move this clause ({c.describe()}, "
                        f"{c.threshold_text()}); see `headwise plan`, or pass "
                        "--allow-unenforced to enforce the others")
    return [enforcer(contract, data, levers, config)]


def _run_spec(spec: Spec, flags: RunFlags, *, device: str | None,
              forecast_every: int) -> Spec:
    """``spec`` with the command line's overrides, after checking the options fit it (and
    that its training fits in memory).

    Raises:
        SpecError: a bad ``--enforce-budget`` or ``--forecast-every``, ``--enforce`` or
            ``--forecast-every`` without evaluation points, ``--enforce`` without a contract, a
            bad ``--steps``.
        ConfigError: an unknown ``--device``.
        ResourceError: the training step or evaluation set cannot fit in memory.
    """
    enforce, enforce_budget = bool(flags.enforce), flags.enforce_budget
    if isinstance(enforce_budget, bool) or not (
            isinstance(enforce_budget, (int, float)) and 1.0 <= enforce_budget <= 1.3):
        raise SpecError(f"--enforce-budget: got {enforce_budget!r}, expected a number in "
                        "[1, 1.3] (a factor on train.steps)")
    if enforce_budget != 1.0 and not enforce:
        raise SpecError("--enforce-budget: given without --enforce; expected both or neither")
    if flags.steps is not None:
        spec = with_steps(spec, flags.steps)
    if device is not None:
        spec = dataclasses.replace(spec, train=dataclasses.replace(
            spec.train, device=check_device_name(device, "--device")))
    if enforce and spec.train.eval_every == 0:
        raise SpecError("train.eval_every: got 0, expected an integer >= 1 with --enforce "
                        "(enforcement acts at evaluation points)")
    if enforce and not spec.contract:
        raise SpecError("contract: missing; --enforce needs a contract to enforce")
    if isinstance(forecast_every, bool) or not isinstance(forecast_every, int) \
            or forecast_every < 0:
        raise SpecError(f"--forecast-every: got {forecast_every!r}, expected an integer >= 1 "
                        "(or 0: no forecasts)")
    if forecast_every and spec.train.eval_every == 0:
        raise SpecError("train.eval_every: got 0, expected an integer >= 1 with "
                        "--forecast-every (forecasts are made at evaluation points)")
    check_training_memory(spec)
    return spec


def _budgeted(config: TrainConfig, enforce_budget: float) -> TrainConfig:
    """``config`` with ``steps`` scaled by the enforcement budget (the schedule spans it)."""
    if enforce_budget == 1.0:
        return config
    return dataclasses.replace(config, steps=math.ceil(config.steps * enforce_budget))


def _prepare(out: Path, spec: Spec, spec_source: str | Path, resume: bool, overwrite: bool,
             flags: RunFlags) -> dict[str, Any]:
    """``prepare_run_dir`` with the spec's directory (for relative paths); says a resume.

    Returns:
        The run's ``run.json`` content (on resume: rewritten when lost or extended).
    """
    spec_dir = Path(spec_source).parent if isinstance(spec_source, Path) or (
        "\n" not in spec_source and spec_source.endswith((".yaml", ".yml"))) else None
    step = prepare_run_dir(out, spec, resume, overwrite, flags, spec_dir)
    if step is None:
        return read_run_info(out)
    print(f"resuming from step {step}", flush=True)
    old = read_run_info(out)
    info = run_info(flags, spec, Path(old["spec_dir"]) if old.get("spec_dir") else spec_dir)
    if {k: v for k, v in old.items() if k != "step"} != info:
        write_json(out / "run.json", info)  # lost, written by an older version, or extended
    return info


def _clauses_held(extra: dict[str, Any]) -> str | None:
    """``contract 1/2 held`` at the latest enforcement point (``None`` without enforcement)."""
    history = extra.get("enforce", {}).get("history")
    if not history:
        return None
    clauses = history[-1]["clauses"].values()
    return f"contract {sum(bool(c['passed']) for c in clauses)}/{len(clauses)} held"


def _verify_trained(compiled: Compiled, contract: Contract,
                    data: VerifyData) -> ContractResult | None:
    """The trained model's verdict (``None`` without a contract), measured on the CPU."""
    if model_device(compiled.model).type != "cpu":  # verification and reports run on CPU
        compiled.model.to("cpu")
        data = verify_data(compiled)
    return verify(compiled.model, contract, data) if contract else None


def _write_outcome(out: Path, verdict: ContractResult | None,
                   enforcement: dict[str, Any] | None) -> None:
    """``contract.json`` and ``enforcement.json``, then the manifest (the run is finished)
    sealing them with the model's files and ``metrics.jsonl``."""
    if verdict is not None:
        write_json(out / "contract.json", verdict.to_dict())
    if enforcement is not None:
        write_json(out / "enforcement.json", enforcement)
    write_manifest(out, [*MODEL_FILES, *(n for n in SEALED_FILES if (out / n).is_file())])


def check_steps(steps: int) -> int:
    """``steps`` if it is a valid ``--steps``.

    Raises:
        SpecError: not an integer in [1, ``MAX_STEPS``].
    """
    if isinstance(steps, bool) or not isinstance(steps, int) or not 1 <= steps <= MAX_STEPS:
        raise SpecError(f"--steps: got {steps}, expected an integer in [1, {MAX_STEPS}]")
    return steps


def with_steps(spec: Spec, steps: int) -> Spec:
    """``spec`` with ``train.steps`` replaced.

    Raises:
        SpecError: ``steps`` < 1 or fewer than ``train.warmup_steps``.
    """
    check_steps(steps)
    if steps < spec.train.warmup_steps:
        raise SpecError(f"--steps: got {steps}, expected at least train.warmup_steps="
                        f"{spec.train.warmup_steps}")
    return dataclasses.replace(spec, train=dataclasses.replace(spec.train, steps=steps))


def check_training_memory(spec: Spec) -> None:
    """Refuse a spec whose training step or evaluation set cannot fit in memory.

    Raises:
        ResourceError: naming the estimate and the memory available.
    """
    config, train_config = spec.model.config, spec.train
    seq = max(spec.data.seq_len, 1)
    examples = spec.data.eval_examples + train_config.eval_batches * train_config.batch_size
    check_memory(f"train.batch_size={train_config.batch_size} with sequences of {seq} tokens "
                 f"on this model (training step and {examples} evaluation examples)",
                 training_bytes(config, train_config.batch_size, seq) + examples * seq * 24)


def _forecast_watch(compiled: Compiled, data: VerifyData, contract: Contract, every: int,
                    warn: Callable[[str], None], total_steps: int,
                    forecaster: Forecaster) -> Callable[[Any], None]:
    return ForecastWatch(lambda m: run_role_table(m, data), total_steps, every,
                         contract if contract else None, forecaster, warn)


def read_forecaster(path: str | Path | None, option: str = "--forecaster") -> Forecaster:
    """The forecaster in the JSON file ``path`` (``None``: the packaged one).

    Raises:
        SpecError: the file cannot be read or is not a forecaster of this version (naming
            ``option`` and what was expected).
    """
    try:
        return load_forecaster(path)
    except ValueError as e:  # every message starts with the file
        raise SpecError(f"{option}: {e}") from None


def is_main_process() -> bool:
    """Rank 0 under ``torchrun`` (or a single process): the one that writes run files."""
    return int(os.environ.get("RANK", "0")) == 0


def load_run(run: str | Path, spec_source: str | Path | None = None,
             device: str = "cpu") -> Compiled:
    """Rebuild a trained run's model with its levers from its (or the given) spec.

    Args:
        device: where to put the model (``--device``: auto, cpu, cuda, cuda:N); the weights
            load on any device.

    Raises:
        CheckpointError: ``run`` is not a finished run directory.
        SpecError: the spec is invalid.
        ConfigError: an unknown or unavailable device.
    """
    resolve_device(device, "--device")  # an unavailable device fails before any work
    run = Path(run)
    if not run.is_dir():
        raise CheckpointError(f"{run}: no such run directory")
    if spec_source is None and not (run / "spec.yaml").is_file():
        raise CheckpointError(f"{run}: no spec.yaml; expected a run directory written by "
                              "`headwise train`")
    weights = run / "model.safetensors"
    if not weights.is_file() or not (run / MANIFEST).is_file():
        missing = "model.safetensors" if not weights.is_file() else MANIFEST
        raise CheckpointError(f"{run}: no {missing}; has training finished? (resume with "
                              "`headwise train SPEC --out RUN --resume`)")
    verify_manifest(run, ("spec.yaml", "model.safetensors"))
    if spec_source is not None:
        spec = load_spec(spec_source)
    else:  # relative paths in the run's spec resolve against the spec's original directory
        text, name = read_spec_text(run / "spec.yaml")
        spec_dir = read_run_info(run).get("spec_dir")
        spec = spec_from_dict(parse_yaml(text, name),
                              base=Path(spec_dir) if spec_dir else run, text=text)
    compiled = compile_spec(spec, weights=weights)
    place(compiled.model, device, "--device")
    compiled.model.eval()
    return compiled


def verify_run(spec_source: str | Path, run: str | Path,
               device: str = "cpu") -> tuple[ContractResult, Path]:
    """Verify ``spec``'s contract on the trained ``run``; write the verdict into the run.

    The verdict of the run's own spec (byte for byte its ``spec.yaml``) goes to
    ``run/contract.json``; another spec's goes beside it to ``run/contract.<sha12>.json``
    (the first 12 hex digits of the spec's sha256), never over the run's own. Either is sealed
    in the run's manifest.

    Returns:
        The verdict and the file it was written to.

    Raises:
        SpecError: the spec has no contract, or is invalid.
        CheckpointError: the run's weights do not fit the spec's model.
        StorageError: another process is writing the run.
    """
    compiled = load_run(run, spec_source, device)
    if not compiled.spec.contract:
        raise SpecError("contract: missing; expected a list of clauses to verify")
    verdict = verify(compiled.model, compiled.spec.contract, verify_data(compiled))
    run = Path(run)
    text = compiled.spec.text.encode()
    name = ("contract.json" if (run / "spec.yaml").read_bytes() == text
            else f"contract.{hashlib.sha256(text).hexdigest()[:12]}.json")
    with hold_lock(run):
        write_json(run / name, verdict.to_dict())
        seal(run, [name])
    return verdict, run / name
