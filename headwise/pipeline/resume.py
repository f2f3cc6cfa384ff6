"""Resume as the same run: the flags that shape training, recorded, reused and checked.

A run records in ``run.json``, and in the callback state of every checkpoint (entry ``"run"``),
the flags that shape what it trains: ``--enforce``, ``--enforce-budget``,
``--allow-unenforced``, ``--steps`` (as the number of steps trained), and the ``--set`` /
``--seed`` overrides. ``--resume`` reuses them: a flag left out is the run's, a flag given
must equal the run's or the resume is refused naming it. The one extension: ``--steps N``
larger than the run's continues it to ``N`` steps (the learning-rate schedule then spans
``N``). When ``run.json`` is lost the flags come from the latest checkpoint; a checkpoint that
does not record them is refused rather than guessed. ``--device``, ``--threads``, ``--quiet``
and the forecast options may differ on resume: they say where the run trains and what it
prints, not what it learns (exact equality needs the same device).
"""

from __future__ import annotations

import dataclasses
import itertools
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from headwise.errors import CheckpointError, SpecError
from headwise.jsonfile import read_json_object
from headwise.runspec import Spec
from headwise.training import clean_checkpoints, list_checkpoints

RUN_FORMAT = "headwise-run/1"
RUN_ENTRY = "run"  # the checkpoints' callback-state entry holding run.json's content


@dataclass(frozen=True)
class RunFlags:
    """The flags that shape a run's training (``None``: not given on this command line).

    Attributes:
        enforce: ``--enforce``.
        enforce_budget: ``--enforce-budget`` (a factor in [1, 1.3] on the steps).
        allow_unenforced: ``--allow-unenforced``.
        steps: steps trained (``--steps``, or the spec's ``train.steps``), before the budget.
        overrides: ``--set`` items, ``--seed N`` last as ``train.seed=N``.
    """

    enforce: bool | None = None
    enforce_budget: float | None = None
    allow_unenforced: bool | None = None
    steps: int | None = None
    overrides: tuple[str, ...] | None = None

    def filled(self) -> RunFlags:
        """These flags with the defaults of a fresh run for those not given."""
        return RunFlags(bool(self.enforce), 1.0 if self.enforce_budget is None
                        else self.enforce_budget, bool(self.allow_unenforced), self.steps,
                        self.overrides or ())


def run_info(flags: RunFlags, spec: Spec, spec_dir: Path | None) -> dict[str, Any]:
    """``run.json``: the format, where the spec came from and the run's flags."""
    return {"format": RUN_FORMAT, "enforce": bool(flags.enforce),
            "spec_dir": str(spec_dir.resolve()) if spec_dir is not None else None,
            "enforce_budget": flags.enforce_budget, "allow_unenforced": flags.allow_unenforced,
            "steps": spec.train.steps, "set": list(flags.overrides or ())}


def check_run_info(info: Any, where: str) -> dict[str, Any]:
    """``info`` if it is a valid ``run.json`` object (the flags are optional: older runs).

    Raises:
        CheckpointError: naming ``where`` and what was expected.
    """
    def ok(key: str, kinds: tuple[type, ...]) -> bool:
        value = info.get(key)
        return value is None or (isinstance(value, kinds) and not (
            isinstance(value, bool) and bool not in kinds))

    if (not isinstance(info, dict) or info.get("format") != RUN_FORMAT
            or not isinstance(info.get("enforce", False), bool) or not ok("spec_dir", (str,))
            or not ok("enforce_budget", (int, float)) or not ok("allow_unenforced", (bool,))
            or not ok("steps", (int,)) or not ok("step", (int,)) or not ok("trained_steps", (int,))
            or not ok("set", (list,))
            or not all(isinstance(s, str) for s in info.get("set") or ())):
        raise CheckpointError(f"{where}: expected a {RUN_FORMAT!r} object with 'enforce' "
                              "(true/false), 'spec_dir' (a path or null) and the run's flags "
                              "('enforce_budget', 'allow_unenforced', 'steps', 'set')")
    return info


def read_run_info(run: Path) -> dict[str, Any]:
    """``run.json`` as a dict (empty for runs written before it existed).

    Raises:
        CheckpointError: ``run.json`` is unreadable or malformed.
    """
    path = Path(run) / "run.json"
    if not path.is_file():
        return {}
    try:
        info = json.loads(path.read_bytes())
    except (OSError, ValueError) as e:
        raise CheckpointError(f"{path}: not valid JSON ({str(e)[:100]})") from None
    return check_run_info(info, str(path))


def recorded_info(out: Path) -> dict[str, Any]:
    """The run's ``run.json``, or when it is lost the copy in the latest checkpoint.

    Raises:
        SpecError: no ``spec.yaml`` (no run), or ``run.json`` lost and no checkpoint records
            the run's flags.
        CheckpointError: a malformed ``run.json`` or checkpoint record.
    """
    if not (out / "spec.yaml").is_file():
        raise SpecError(f"{out}: no run to resume (no spec.yaml); start one without --resume")
    if (out / "run.json").is_file():
        return read_run_info(out)
    clean_checkpoints(out)
    found = list_checkpoints(out)
    if not found:
        return {}  # check_resume refuses: nothing to resume from
    path = found[-1][1] / "trainer.json"
    extra = read_json_object(path, CheckpointError).get("extra")
    if not isinstance(extra, dict) or RUN_ENTRY not in extra:
        raise SpecError(f"{out / 'run.json'}: missing, and {path} does not record the run's "
                        "flags (--enforce, --steps, ...); expected run.json back, or start "
                        "again with --overwrite")
    return check_run_info(extra[RUN_ENTRY], f"{path} (entry extra.{RUN_ENTRY})")


def resume_flags(info: dict[str, Any], given: RunFlags, out: Path) -> RunFlags:
    """The flags a resume trains with: the run's, with those given checked against them.

    Raises:
        SpecError: a given flag differs from the run's (naming it), or ``--steps`` smaller
            than the run's.
    """
    run = RunFlags(info.get("enforce", False), info.get("enforce_budget"),
                   info.get("allow_unenforced"), info.get("steps"),
                   None if info.get("set") is None else tuple(info["set"]))
    for name, flag in (("enforce", "--enforce"), ("allow_unenforced", "--allow-unenforced"),
                       ("enforce_budget", "--enforce-budget")):
        mine, theirs = getattr(given, name), getattr(run, name)
        if mine is not None and theirs is not None and mine != theirs:
            was = (f"{'with' if theirs else 'without'} {flag}" if isinstance(theirs, bool)
                   else f"with {flag} {theirs:g}")
            raise SpecError(f"{flag}: the run in {out} was trained {was}; a resume continues "
                            "the same training: leave the flag out (--resume reuses the run's "
                            "flags)")
    if given.overrides is not None and run.overrides is not None \
            and given.overrides != run.overrides:
        raise SpecError(_override_error(given.overrides, run.overrides, out))
    if given.steps is not None and run.steps is not None and given.steps < run.steps:
        raise SpecError(f"--steps: got {given.steps}, but the run in {out} trains "
                        f"{run.steps} steps; a resume may extend a run (a larger --steps), "
                        "not shorten it: leave --steps out to finish it")
    merged = {f.name: getattr(given, f.name) if getattr(given, f.name) is not None
              else getattr(run, f.name) for f in dataclasses.fields(RunFlags)}
    return RunFlags(**merged).filled()


def _override_error(given: tuple[str, ...], run: tuple[str, ...], out: Path) -> str:
    """Name the first override that differs, as the user wrote it (``--seed`` or ``--set``)."""
    def name(item: str) -> str:
        key = item.partition("=")[0]
        return "--seed" if key == "train.seed" else f"--set {key}"

    def show(items: tuple[str, ...]) -> str:
        return " ".join(f"--seed {i.partition('=')[2]}" if i.startswith("train.seed=")
                        else f"--set {i}" for i in items) or "no --set/--seed"

    first = next(a or b for a, b in itertools.zip_longest(given, run, fillvalue="") if a != b)
    return (f"{name(first)}: the run in {out} was trained with "
            f"{show(run)}, got {show(given)}; a resume continues the same training: leave "
            "--set/--seed out (--resume reuses the run's)")


def check_resume(out: Path, spec: Spec) -> int:
    """The step ``--resume`` continues from; refuse when there is nothing valid to resume.

    Raises:
        SpecError: no run in ``out``, a spec that differs from the run's ``spec.yaml``, or no
            checkpoint.
    """
    saved = out / "spec.yaml"
    if not saved.is_file():
        raise SpecError(f"{out}: no run to resume (no spec.yaml); start one without --resume")
    if saved.read_text(encoding="utf-8", errors="replace") != spec.text:
        raise SpecError(f"{out}: --resume with a spec that differs from {saved}; expected "
                        "the same spec the run started with")
    clean_checkpoints(out)
    found = list_checkpoints(out)
    if not found:
        raise SpecError(f"{out}: no checkpoint to resume from (train.checkpoint_every: 0, or "
                        "stopped before the first one); expected a run with checkpoints, or "
                        "start again with --overwrite")
    return found[-1][0]
