"""Resume as the same run: the options that shape training, recorded, reused and checked.

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
import hashlib
import itertools
import json
from pathlib import Path
from typing import Any

from headwise.errors import CheckpointError, SpecError
from headwise.jsonfile import read_json_object
from headwise.pipeline.options import SHAPING, RunOptions
from headwise.runspec import Spec
from headwise.training import clean_checkpoints, linked_checkpoints, list_checkpoints
from headwise.training.manifest import MANIFEST, check_sealed

RUN_FORMAT = "headwise-run/1"
RUN_ENTRY = "run"  # the checkpoints' callback-state entry holding run.json's content


def run_info(options: RunOptions, spec: Spec, spec_dir: Path | None) -> dict[str, Any]:
    """``run.json``: the format, where the spec came from and the run's shaping options."""
    return {"format": RUN_FORMAT, "enforce": bool(options.enforce),
            "spec_dir": str(spec_dir.resolve()) if spec_dir is not None else None,
            "enforce_budget": options.enforce_budget,
            "allow_unenforced": options.allow_unenforced,
            "steps": spec.train.steps, "set": list(options.overrides or ()),
            "spec_sha256": hashlib.sha256(spec.text.encode()).hexdigest()}


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
            or not _positive(info.get("verify_examples", 1))
            or not ok("set", (list,))
            or not all(isinstance(s, str) for s in info.get("set") or ())
            or not ok("checkpoints", (dict,)) or not ok("spec_sha256", (str,))
            or not all(isinstance(k, str) and isinstance(v, str)
                       for k, v in (info.get("checkpoints") or {}).items())):
        raise CheckpointError(f"{where}: expected a {RUN_FORMAT!r} object with 'enforce' "
                              "(true/false), 'spec_dir' (a path or null) and the run's flags "
                              "('enforce_budget', 'allow_unenforced', 'steps', 'set'; "
                              "'verify_examples' a positive integer; 'checkpoints' names "
                              "and digests)")
    return info


def _positive(value: Any) -> bool:
    """Whether ``value`` is an integer >= 1 (not a bool)."""
    return isinstance(value, int) and not isinstance(value, bool) and value >= 1


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
        SpecError: no ``spec.yaml`` (no run), ``run.json`` lost and no checkpoint records the
            run's flags, a ``spec.yaml`` other than the one the latest checkpoint trained on,
            ``run.json`` flags other than its, or a checkpoint that is a link.
        CheckpointError: a malformed ``run.json`` or checkpoint record; a finished run's
            ``spec.yaml`` or ``run.json`` not matching its manifest.
    """
    if not (out / "spec.yaml").is_file():
        raise SpecError(f"{out}: no run to resume (no spec.yaml); start one without --resume")
    if (out / MANIFEST).exists():  # a finished run: its spec and record are sealed
        check_sealed(out, ["spec.yaml", "run.json"])
    links = linked_checkpoints(out)
    if links:
        raise SpecError(f"{links[0]}: is a symbolic link; expected the run's own checkpoints "
                        "(a resume never continues another run's)")
    clean_checkpoints(out)
    found = list_checkpoints(out)
    kept = None
    if found:
        path = found[-1][1] / "trainer.json"
        extra = read_json_object(path, CheckpointError).get("extra")
        if isinstance(extra, dict) and RUN_ENTRY in extra:
            kept = check_run_info(extra[RUN_ENTRY], f"{path} (entry extra.{RUN_ENTRY})")
    trained = None if kept is None else kept.get("spec_sha256")  # what the checkpoints read
    if trained is not None and hashlib.sha256(
            (out / "spec.yaml").read_bytes()).hexdigest() != trained:
        raise SpecError(f"{out / 'spec.yaml'}: differs from the spec {path} trained on; "
                        "expected the run's own spec (edited after the run started?), or "
                        "start again with --overwrite")
    if not (out / "run.json").is_file():
        if not found:
            return {}  # check_resume refuses: nothing to resume from
        if kept is None:
            raise SpecError(f"{out / 'run.json'}: missing, and {path} does not record the "
                            "run's flags (--enforce, --steps, ...); expected run.json back, or "
                            "start again with --overwrite")
        return kept
    info = read_run_info(out)
    if kept is not None:
        _same_flags(recorded_options(info), recorded_options(kept), out / "run.json", path)
    return info


def _same_flags(run: RunOptions, checkpoint: RunOptions, record: Path, path: Path) -> None:
    """Refuse a ``run.json`` whose shaping flags differ from those the latest checkpoint
    trained with (its ``--steps`` may be larger: a resume that extends the run rewrites
    ``run.json`` before its next checkpoint).

    Raises:
        SpecError: naming ``record``, the flag and the checkpoint.
    """
    for name in SHAPING:
        mine, theirs = getattr(run, name), getattr(checkpoint, name)
        if mine == theirs or (name == "steps" and None not in (mine, theirs)
                              and mine >= theirs):
            continue
        raise SpecError(f"{record}: records {name} {mine!r}, but {path} trained with "
                        f"{theirs!r}; expected the run's own record (edited after the run?), "
                        "or start again with --overwrite")


def recorded_options(info: dict[str, Any]) -> RunOptions:
    """The shaping options a run recorded (``run.json``; ``None`` where it recorded none)."""
    return RunOptions(info.get("enforce", False), info.get("enforce_budget"),
                      info.get("allow_unenforced"), info.get("steps"),
                      None if info.get("set") is None else tuple(info["set"]))


def resume_options(run: RunOptions, given: RunOptions, out: Path) -> RunOptions:
    """The options a resume trains with: ``given``, its shaping options left out taken from
    ``run`` (the run's recorded ones), those given checked against them.

    Raises:
        SpecError: a given shaping option differs from the run's (naming the flag), or
            ``--steps`` smaller than the run's.
    """
    given = given.given()
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
    merged = {name: getattr(given, name) if getattr(given, name) is not None
              else getattr(run, name) for name in SHAPING}
    return dataclasses.replace(given, **merged).filled()


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
