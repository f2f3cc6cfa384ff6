"""Training a spec into a run directory (``train_run``): the command line's flags and overrides
checked against the spec, enforcement and forecasts attached, the outcome written.

What a run directory holds and its lifecycle: ``headwise.pipeline.run_dir``; a finished run's
model and verification: ``headwise.pipeline.finished``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from headwise.atomic import (
    RUN,
    check_output_dir,
    hold_lock,
)
from headwise.contract import (
    Contract,
    ContractResult,
    EnforceConfig,
    EnforcementRecord,
    Enforcer,
    ForecastWatch,
    Plan,
    VerifyData,
    check_possible,
    plan,
    summary,
    verify,
)
from headwise.contract.clause_watch import ClauseWatch
from headwise.contract.evidence import GROWTH, pilot_examples
from headwise.contract.retry import (
    RETRY_LR_FACTOR,
    attempt_tier_name,
    best_attempt,
    retry_due,
)
from headwise.errors import SpecError
from headwise.forecast.clauses import load_clause_forecasters
from headwise.forecast.roles import Forecaster, load_forecaster
from headwise.memory import check_memory, training_bytes
from headwise.pipeline.compile import Compiled, compile_spec
from headwise.pipeline.finished import checkpoint_seals
from headwise.pipeline.heldout import enforcement_data, probe_sampler, verification_data
from headwise.pipeline.options import ENFORCE_BUDGET_MAX, RunOptions
from headwise.pipeline.resume import (
    RUN_ENTRY,
    read_run_info,
    recorded_info,
    recorded_options,
    resume_options,
    run_info,
)
from headwise.pipeline.run_analysis import (
    CheckpointRoleTables,
    role_heatmap_png,
    run_role_table,
)
from headwise.pipeline.run_data import with_stored_data
from headwise.pipeline.run_dir import (
    RETRIES,
    holds_work,
    is_main_process,
    prepare_run_dir,
    write_json,
    write_outcome,
)
from headwise.pipeline.run_tokenizer import with_stored_tokenizer
from headwise.runspec import Spec
from headwise.runspec.overrides import load_spec_with, text_with_overrides
from headwise.training import TrainConfig, TrainResult, train
from headwise.training.device import check_device_name, model_device, place
from headwise.training.progress import EvalLines
from headwise.training.safetensors_io import save_weights

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


def train_run(spec_source: str | Path, out: str | Path,
              options: RunOptions | None = None) -> RunOutcome:
    """Train a spec into ``out`` and verify its contract (the report is written apart:
    ``headwise.pipeline.run_report``).

    With ``options.enforce``, training runs ``train.steps x enforce_budget`` steps (1 to 1.3;
    the schedule spans the budget) with the contract's constraints, measured on the
    enforcement set, and keeps the model of the last evaluation point at which the whole
    contract held there (``enforce.stop: first_hold``: it stops at the first). The verdict
    written to ``contract.json`` (and returned) is measured once, after training, on the
    verification set (``headwise.pipeline.heldout``), with or without enforcement.
    ``options.device`` overrides the spec's ``train.device`` (``--device``), ``steps`` its
    ``train.steps`` (``--steps N``), ``seed`` its ``train.seed`` and each ``overrides`` item
    ``path.to.key=value`` a key (``--set``; ``headwise.runspec.overrides``).

    With ``options.resume``, the shaping options left ``None`` are the run's own; one given
    must equal the run's, except a larger ``steps`` (``headwise.pipeline.resume``).

    With ``options.forecast_every``, every that many steps (at evaluation points) the packaged
    forecaster (or the one in the JSON file ``options.forecaster``, e.g. from
    ``headwise fit-forecaster``) predicts final roles and ``options.warn`` gets a line per
    contract clause forecast to fail (``headwise.contract.forecast``). With
    ``options.progress``, a line per evaluation point (eval-batch accuracy, clauses held, ETA)
    goes to stdout.

    Raises:
        SpecError: an invalid spec or override, ``--enforce`` or ``forecast_every`` without
            evaluation points, ``forecaster`` without ``forecast_every`` or not a forecaster
            file, (unless ``allow_unenforced``) a clause no lever can move under ``--enforce``,
            or a resume with a shaping option that differs from the run's.
        ConfigError: an unknown or unavailable device.
        CheckpointError: ``resume`` from a corrupt checkpoint.
    """
    out = Path(out)
    given = options or RunOptions()
    if is_main_process():  # a run replaces only a run (with --overwrite, checked under the lock)
        check_output_dir(out, "--out", overwrite=True, replaces=(RUN,))
    resume = given.resume
    if given.steps is not None:
        check_steps(given.steps)
    opts = (resume_options(recorded_options(recorded_info(out)), given, out)
            if resume and not given.overwrite else given.filled())
    spec = _run_spec(load_spec_with(spec_source, opts.overrides or (),
                                    _run_copies(out) if resume else None), opts)
    if opts.forecaster is not None and not opts.forecast_every:
        raise SpecError("--forecaster: only used with --forecast-every")
    watch_with = read_forecaster(opts.forecaster) if opts.forecast_every else None
    contract, config = spec.contract, opts.enforce_config or spec.enforce
    setup = _set_up(spec, opts, config, watch_with)
    main = is_main_process()
    with hold_lock(out) if main else contextlib.nullcontext():  # one writer per run
        info = _prepare(out, spec, spec_source, resume, opts) if main else {}
        attempts = [_train_attempt(setup, out, resume, opts, info, main)]
        while setup.enforcing is not None and _one_process(spec) and retry_due(
                [a.record for a in attempts], config):
            again = _retry_spec(spec, len(attempts))
            where = out / RETRIES / str(len(attempts))
            go_on = resume and holds_work(where)
            if opts.progress and main:
                print(f"the contract is not certified on the enforcement set: training "
                      f"again from the initial weights at train.lr={again.train.lr:g} "
                      f"({where})", flush=True)
            child = _prepare(where, again, spec_source, go_on, opts) if main else {}
            attempts.append(_train_attempt(_set_up(again, opts, config, watch_with), where,
                                           go_on, opts, child, main))
        chosen = attempts[best_attempt([a.record for a in attempts])]
        if main and chosen.out != out:  # the run's weights are the chosen attempt's
            save_weights(chosen.compiled.model, out / "model.safetensors")
        verdict, examples = _verify_trained(chosen.compiled, contract,
                                            setup.enforcing is not None)
        enforcement = None
        if setup.enforcing is not None and verdict is not None:
            enforcement = summary(chosen.record, verdict, chosen.result.step, chosen.step)
            if len(attempts) > 1:
                enforcement["attempts"] = [_attempt_entry(a, out) for a in attempts]
                enforcement["attempt"] = attempts.index(chosen) + 1
        if main:
            write_json(out / "run.json", {**info, "step": chosen.step,
                                          "trained_steps": chosen.result.step,
                                          "verify_examples": examples,
                                          "checkpoints": checkpoint_seals(out)})
            write_outcome(out, verdict, enforcement)
    return RunOutcome(out, chosen.compiled, chosen.result, verdict, enforcement)


@dataclass
class _SetUp:
    """One attempt's model, levers and training settings, before it trains."""

    compiled: Compiled
    planned: Plan | None
    enforcing: Enforcer | None
    train_config: TrainConfig
    callbacks: list[Callable[[Any], None]]


@dataclass
class _Attempt:
    """One trained attempt: its directory, its model (the kept weights restored), the step
    those weights are from and its enforcement record."""

    out: Path
    compiled: Compiled
    result: TrainResult
    step: int
    record: EnforcementRecord


def _set_up(spec: Spec, opts: RunOptions, config: EnforceConfig,
            watch_with: Forecaster | None) -> _SetUp:
    """Compile ``spec``, plan its contract and attach enforcement and the forecast watches.

    Raises:
        SpecError: as ``_plan``; ``enforce.stop: end`` on sharded training.
    """
    compiled = compile_spec(spec)
    place(compiled.model, spec.train.device,
          "--device" if opts.device is not None else "train.device")
    contract = spec.contract
    data = enforcement_data(compiled)  # on the training device: enforcement measures mid-run
    planned = _plan(compiled, contract, data, opts, config)
    train_config = _budgeted(spec.train, opts.enforce_budget or 1.0)
    enforcing = (Enforcer(contract, data, planned.levers, config,
                          call_every=config.cadence(train_config.steps, train_config.eval_every))
                 if planned is not None and opts.enforce else None)
    callbacks: list[Callable[[Any], None]] = [enforcing] if enforcing is not None else []
    if enforcing is not None and config.stop == "end" and train_config.parallel == "fsdp":
        raise SpecError("enforce.stop: got 'end' with train.parallel: fsdp, expected "
                        "'first_hold' (keeping the model of an evaluation point is not "
                        "supported on sharded training)")
    if watch_with is not None:
        callbacks += _forecast_watch(compiled, data, contract, opts, train_config.steps,
                                     watch_with, enforcing is not None, planned)
    return _SetUp(compiled, planned, enforcing, train_config, callbacks)


def _train_attempt(setup: _SetUp, out: Path, resume: bool, opts: RunOptions,
                   info: dict[str, Any], main: bool) -> _Attempt:
    """Train one attempt into ``out`` (resuming it from its latest checkpoint with
    ``resume``) and put its kept model back."""
    compiled, enforcing, train_config = setup.compiled, setup.enforcing, setup.train_config
    levers = setup.planned.objectives if enforcing is not None and setup.planned else []
    objectives = [*compiled.objectives, *levers]
    callbacks = list(setup.callbacks)
    if opts.progress and main:
        callbacks.append(EvalLines(train_config.steps, _clauses_held))
    if train_config.checkpoint_every and train_config.eval_every:  # the report's trajectory
        callbacks.append(CheckpointRoleTables(verification_data(compiled)))
    result = train(compiled.model, compiled.data, train_config, out_dir=out,
                   objectives=objectives, callbacks=callbacks,
                   optimizer_hooks=compiled.optimizer_hooks, resume=resume,
                   eval_data=compiled.eval_data, progress=opts.progress, figures=FIGURES,
                   extra={RUN_ENTRY: info} if main else None)
    step = result.step
    record = EnforcementRecord.of(result.extra)
    if enforcing is not None:
        step = enforcing.restore_kept(compiled.model, out, record, result.step)
        if main and step != result.step:  # the run's weights are the kept model's
            save_weights(compiled.model, out / "model.safetensors")
    return _Attempt(out, compiled, result, step, record)


def _one_process(spec: Spec) -> bool:
    """Whether the run trains in one process with no process group (not under ``torchrun``,
    not ``train.parallel: fsdp``): only such a run trains again (``train`` sets the group up
    and tears it down once per process)."""
    return (int(os.environ.get("WORLD_SIZE", "1")) <= 1
            and spec.train.parallel in (None, "none"))


def _retry_spec(spec: Spec, done: int) -> Spec:
    """The spec of the attempt after ``done`` attempts: ``train.lr`` halved for each
    (``headwise.contract.retry``), the rest as the run's own."""
    lr = spec.train.lr * RETRY_LR_FACTOR ** done
    return dataclasses.replace(
        spec, train=dataclasses.replace(spec.train, lr=lr),
        text=text_with_overrides(spec.text, "spec.yaml", [f"train.lr={lr!r}"]))


def _attempt_entry(attempt: _Attempt, out: Path) -> dict[str, Any]:
    """One attempt's line in ``enforcement.json``: where it trained, at which rate, its steps
    and the tier of its kept model on the enforcement set."""
    return {"dir": str(attempt.out.relative_to(out)),
            "lr": attempt.compiled.spec.train.lr, "steps": attempt.result.step,
            "kept_step": attempt.step, "kept_as": attempt_tier_name(attempt.record)}


def _plan(compiled: Compiled, contract: Contract, data: VerifyData, opts: RunOptions,
          config: EnforceConfig) -> Plan | None:
    """The contract's plan (``None`` without a contract), after refusing impossible clauses
    (plain runs too); under ``--enforce``, after checking every clause has a lever. A plain
    run trains without the plan's objectives (the forecast watch words its advice from it).

    Raises:
        SpecError: an impossible clause; under ``--enforce``, a clause no lever can move,
            without ``--allow-unenforced``.
    """
    if not contract:
        return None
    if not opts.enforce:
        check_possible(compiled.model, contract, compiled.structure, data, config)
        if not opts.forecast_every:
            return None
    planned = plan(compiled.model, contract, compiled.structure,
                   probes=probe_sampler(compiled.spec, compiled.data), config=config,
                   data=data if opts.enforce else None)
    missing = [c for c in contract if planned.levers.get(c.index) is None]
    if opts.enforce and missing and not opts.allow_unenforced:
        c = missing[0]
        raise SpecError(f"{c.path}: no lever can move this clause ({c.describe()}, "
                        f"{c.threshold_text()}); see `headwise plan`, or pass "
                        "--allow-unenforced to enforce the others")
    return planned


def _run_spec(spec: Spec, opts: RunOptions) -> Spec:
    """``spec`` with the command line's overrides, after checking the options fit it (and
    that its training fits in memory).

    Raises:
        SpecError: a bad ``--enforce-budget`` or ``--forecast-every``, ``--enforce`` or
            ``--forecast-every`` without evaluation points, ``--enforce`` without a contract, a
            bad ``--steps``.
        ConfigError: an unknown ``--device``.
        ResourceError: the training step or evaluation set cannot fit in memory.
    """
    enforce, enforce_budget = bool(opts.enforce), opts.enforce_budget
    device, forecast_every = opts.device, opts.forecast_every
    if isinstance(enforce_budget, bool) or not (
            isinstance(enforce_budget, (int, float))
            and 1.0 <= enforce_budget <= ENFORCE_BUDGET_MAX):
        raise SpecError(f"--enforce-budget: got {enforce_budget!r}, expected a number in "
                        f"[1, {ENFORCE_BUDGET_MAX:g}] (a factor on train.steps)")
    if enforce_budget != 1.0 and not enforce:
        raise SpecError("--enforce-budget: given without --enforce; expected both or neither")
    if opts.steps is not None:
        spec = with_steps(spec, opts.steps)
    if device is not None:
        spec = dataclasses.replace(spec, train=dataclasses.replace(
            spec.train, device=check_device_name(device, "--device")))
    if enforce and spec.train.eval_every == 0:
        raise SpecError("train.eval_every: got 0, expected an integer >= 1 with --enforce "
                        "(enforcement acts at evaluation points)")
    unsharded = next((c for c in spec.contract if not c.entry.sharded), None)
    if unsharded is not None and spec.train.parallel == "fsdp":
        raise SpecError(f"{unsharded.path}: a {unsharded.kind} clause is measured on the whole "
                        "model's weights, which train.parallel: fsdp shards; expected "
                        "train.parallel: none or ddp for this contract")
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


def _prepare(out: Path, spec: Spec, spec_source: str | Path, resume: bool,
             opts: RunOptions) -> dict[str, Any]:
    """``prepare_run_dir`` with the spec's directory (for relative paths); says a resume.

    Returns:
        The run's ``run.json`` content (on resume: rewritten when lost or extended).
    """
    spec_dir = Path(spec_source).parent if isinstance(spec_source, Path) or (
        "\n" not in spec_source and spec_source.endswith((".yaml", ".yml"))) else None
    step = prepare_run_dir(out, spec, resume, opts.overwrite, opts, spec_dir)
    if step is None:
        return read_run_info(out)
    print(f"resuming from step {step}", flush=True)
    old = read_run_info(out)
    info = run_info(opts, spec, Path(old["spec_dir"]) if old.get("spec_dir") else spec_dir)
    if {k: v for k, v in old.items() if k not in ("step", "trained_steps")} != info:
        write_json(out / "run.json", info)  # lost, written by an older version, or extended
    return info


def _run_copies(out: Path) -> Callable[[dict[str, Any]], dict[str, Any]]:
    """What a resumed run reads: the tokenizer and data files it started with, its copies
    (``headwise.pipeline.run_tokenizer``, ``headwise.pipeline.run_data``)."""
    return lambda tree: with_stored_data(with_stored_tokenizer(tree, out), out)


def _clauses_held(extra: dict[str, Any]) -> str | None:
    """``contract 1/2 held`` at the latest enforcement point (``None`` without enforcement)."""
    history = EnforcementRecord.of(extra).history
    if not history:
        return None
    clauses = history[-1].clauses.values()
    return f"contract {sum(c.passed for c in clauses)}/{len(clauses)} held"


def _verify_trained(compiled: Compiled, contract: Contract,
                    enforced: bool) -> tuple[ContractResult | None, int]:
    """The trained model's verdict on the verification set, read here once, after training
    (``None`` without a contract), measured on the CPU, and the set's size: the spec's, or for
    an enforced run whose spec leaves it to headwise, the size the kept model's measurement on
    the enforcement set asks for (``headwise.contract.evidence``)."""
    spec = compiled.spec
    examples = spec.data.verify_examples
    if not contract:
        return None, examples
    if model_device(compiled.model).type != "cpu":  # verification and reports run on CPU
        compiled.model.to("cpu")
    if enforced and not spec.data.verify_given:
        pilot = verify(compiled.model, contract, enforcement_data(compiled))
        examples = pilot_examples(pilot, examples, int(compiled.eval_batch.tokens.shape[0]),
                                  spec.data.names)
    return verify(compiled.model, contract,
                  verification_data(compiled, examples=examples)), examples


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
    verify_at_most = spec.data.verify_examples * (1 if spec.data.verify_given else GROWTH)
    examples = (max(spec.data.eval_examples, verify_at_most)
                + train_config.eval_batches * train_config.batch_size)
    check_memory(f"train.batch_size={train_config.batch_size} with sequences of {seq} tokens "
                 f"on this model (training step and {examples} evaluation examples)",
                 training_bytes(config, train_config.batch_size, seq) + examples * seq * 24)


def _forecast_watch(compiled: Compiled, data: VerifyData, contract: Contract,
                    opts: RunOptions, total_steps: int, forecaster: Forecaster, enforced: bool,
                    planned: Plan | None) -> list[Callable[[Any], None]]:
    """The role forecast's watch and, with a contract, the clause-verdict watch: one warning
    line per clause forecast to fail, by either (in an enforced run the clause watch reads the
    enforcer's measurements, in a plain run it measures, and words its advice from the run's
    plan); the line names the heads the role forecast says will take another role."""
    every, warn = opts.forecast_every, opts.warn
    roles = ForecastWatch(lambda m: run_role_table(m, data), total_steps, every,
                          contract if contract else None, forecaster, None)
    if not contract:
        return [roles]
    levers = {} if planned is None else planned.levers
    advice = {i: lever.description for i, lever in levers.items() if lever is not None}
    measure = None if enforced else (lambda m: verify(m, contract, data, bounds=False))
    clauses = ClauseWatch(contract, measure,
                          total_steps, every, load_clause_forecasters(),
                          compiled.spec.forecast_context,
                          None if enforced else (lambda: advice), warn,
                          roles=lambda: roles.failing)
    return [roles, clauses]


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
