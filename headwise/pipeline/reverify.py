"""Re-verification on data no one saw: a finished run's contract measured on a fresh
verification set (``headwise verify SPEC --run RUN --fresh SEED``) or on new rows of its
file-backed tasks (``--data TASK=FILE``).

``--fresh SEED`` draws the verification set like the run's own (as many examples as its
verdict drew, the declared probes) from ``SEED`` instead of ``data.verify_seed``: built-in
generators and probes are drawn anew; a file-backed task's examples are drawn again from its
``verify`` split, without replacement: other rows of the same split where it holds more than
the set takes, else the same rows (``notes`` say so). ``--data TASK=FILE`` reads ``FILE`` whole as
``TASK``'s verification examples (every row, or consecutive windows of a text, once; the spec's
task settings, a task marker if the run has them): they replace ``TASK``'s examples in the task's
own set, in its probe and in the ``default`` mixture; every other task keeps the run's own (or
the fresh) examples. The verdict is written beside the run's own as
``contract[.<sha12>][.fresh-<SEED>][.data-<sha12>].json`` (the spec's hash when it is not the
run's; the files' hash), atomically, never over ``contract.json``, and sealed in the run's
manifest; the report (``headwise report RUN``) shows every such verdict (``fresh_verdicts``).
"""

from __future__ import annotations

import dataclasses
import hashlib
import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import torch

import headwise.validate as check
from headwise.atomic import hold_lock
from headwise.contract import ContractResult, VerifyData, verify
from headwise.data import IGNORE, PAD, TASKS, Batch, build_task
from headwise.data.corpus import WHOLE
from headwise.data.markers import insert_marker
from headwise.errors import CheckpointError, HeadwiseError, SpecError, show
from headwise.jsonfile import read_json_object
from headwise.pipeline.compile import Compiled
from headwise.pipeline.finished import load_compiled, verdict_examples
from headwise.pipeline.heldout import verification_data
from headwise.pipeline.run_dir import write_json
from headwise.runspec import Spec
from headwise.runspec.schema import MAX_PROBES
from headwise.training.device import model_device
from headwise.training.manifest import check_sealed, seal

FRESH = re.compile(r"^contract(\.[0-9a-f]{12})?(?=\.fresh-|\.data-)(\.fresh-\d+)?"
                   r"(\.data-[0-9a-f]{12})?\.json$")


def reverify_run(spec_source: str | Path, run: str | Path, seed: int | None = None,
                 files: Sequence[tuple[str, Path]] = (),
                 device: str = "cpu") -> tuple[ContractResult, Path, list[str]]:
    """Verify ``spec``'s contract on ``run`` with a verification set drawn from ``seed``
    and/or ``TASK``'s examples read whole from ``files`` (``(task, path)`` pairs).

    Returns:
        The verdict, the file it was written to, and what the new set could not renew.

    Raises:
        SpecError: neither a seed nor a file; a seed outside [0, 2^63) or one that would
            draw the run's own held-out sets (naming ``--fresh``); a ``--data`` task given
            twice, not a file-backed task of the spec, or a file it cannot read; the spec has
            no contract, or is invalid.
        CheckpointError: the run's weights do not fit the spec's model.
        StorageError: another process is writing the run.
    """
    if seed is None and not files:
        raise SpecError("--fresh/--data: got neither, expected a seed or TASK=FILE")
    if seed is not None:
        check.seed(seed, "--fresh")
    names = [name for name, _ in files]
    twice = next((n for i, n in enumerate(names) if n in names[:i]), None)
    if twice is not None:
        raise SpecError(f"--data: got task {show(twice, 80)} twice, expected each task once "
                        "(TASK=FILE reads one file per task)")
    compiled = load_compiled(run, spec_source, device)
    spec = compiled.spec
    if not spec.contract:
        raise SpecError("contract: missing; expected a list of clauses to verify")
    if seed is not None:
        check_fresh_seed(spec, seed)
    data = verification_data(compiled, seed, verdict_examples(Path(run), compiled))
    read = {name: Path(path) for name, path in files}
    if read:
        data = with_files(compiled, data, read)
    verdict = verify(compiled.model, spec.contract, data)
    run = Path(run)
    text = spec.text.encode()
    digest = hashlib.sha256()
    for name, path in sorted(read.items()):
        digest.update(name.encode() + b"\0" + path.read_bytes())
    parts = ["contract", *([] if (run / "spec.yaml").read_bytes() == text
                           else [hashlib.sha256(text).hexdigest()[:12]]),
             *([] if seed is None else [f"fresh-{seed}"]),
             *([f"data-{digest.hexdigest()[:12]}"] if read else [])]
    name = ".".join(parts) + ".json"
    record = {**verdict.to_dict(), "fresh_seed": seed,
              "data": {task: str(path) for task, path in sorted(read.items())}}
    with hold_lock(run):
        write_json(run / name, record)
        seal(run, [name])
    return verdict, run / name, [] if seed is None else fresh_notes(spec, set(read))


def check_fresh_seed(spec: Spec, seed: int) -> None:
    """Refuse a seed (already one ``validate.seed`` allows: ``reverify_run`` checks it before
    the run loads) whose draws (``seed + k``, ``k < MAX_PROBES + 2``) meet the enforcement or
    verification set's.

    Raises:
        SpecError: naming ``--fresh``, the seed and the run's seeds.
    """
    data = spec.data
    if any(abs(seed - s) < MAX_PROBES + 2 for s in (data.eval_seed, data.verify_seed)):
        raise SpecError(f"--fresh: got {seed}, expected a seed at least {MAX_PROBES + 2} "
                        f"away from data.eval_seed={data.eval_seed} and data.verify_seed="
                        f"{data.verify_seed} (a fresh set shares no draw with the run's own)")


def fresh_notes(spec: Spec, read: set[str]) -> list[str]:
    """What a fresh seed cannot renew: file-backed tasks (not read from ``--data``), whose rows
    are their ``verify`` split's again."""
    return [f"note: {t.name} reads a file: --fresh draws its examples again from the same "
            f"verify split (new rows: --data {t.name}=FILE)"
            for t in spec.data.tasks if TASKS[t.task].splits and t.name not in read]


def with_files(compiled: Compiled, data: VerifyData, files: Mapping[str, Path]) -> VerifyData:
    """``data`` with each ``task``'s examples replaced by its file read whole.

    Raises:
        SpecError: naming ``--data`` and the task or file.
    """
    spec = compiled.spec
    device = model_device(compiled.model)
    tasks = dict(data.tasks)
    from_files = [t.name for t in spec.data.tasks if TASKS[t.task].splits]
    for name, path in files.items():
        entry = next((t for t in spec.data.tasks if t.name == name), None)
        if entry is None or name not in from_files:
            raise SpecError(f"--data: got task {name!r}, expected one of the spec's tasks read "
                            f"from a file {from_files}")
        try:
            task = build_task(entry.task, {**entry.kwargs, "path": str(path), "split": WHOLE},
                              f"--data {name}")
            part = task.every_example(torch.Generator().manual_seed(spec.data.verify_seed))
        except HeadwiseError as e:
            raise SpecError(f"--data {name}={path}: {e}") from None
        if part.tokens.shape[0] == 0 or int(part.tokens.max()) >= spec.model.config.vocab_size:
            raise SpecError(f"--data {name}={path}: got {part.tokens.shape[0]} examples, "
                            f"expected at least one with ids below model.vocab_size="
                            f"{spec.model.config.vocab_size}")
        i = spec.data.names.index(name)
        if spec.data.markers:
            part = insert_marker(part, spec.data.markers[i], task.starts_with_bos)
        tasks[name] = Batch(part.tokens, part.targets, part.attention_mask,
                            torch.full((part.tokens.shape[0],), i, dtype=torch.long)).to(device)
    probes = {**data.probes, **{n: tasks[n] for n in files}, "default": _mixed(tasks.values())}
    return dataclasses.replace(data, tasks=tasks, probes=probes)


def _mixed(batches: Any) -> Batch:
    """Batches of different lengths as one, right-padded (``PAD``, no target, mask 0)."""
    batches = list(batches)
    T = max(b.tokens.shape[1] for b in batches)

    def pad(x: torch.Tensor, value: int) -> torch.Tensor:
        return torch.nn.functional.pad(x, (0, T - x.shape[1]), value=value)

    masks = [torch.ones_like(b.tokens) if b.attention_mask is None else b.attention_mask
             for b in batches]
    return Batch(torch.cat([pad(b.tokens, PAD) for b in batches]),
                 torch.cat([pad(b.targets, IGNORE) for b in batches]),
                 torch.cat([pad(m, 0) for m in masks]),
                 torch.cat([b.task_ids for b in batches]))


def fresh_verdicts(run: Path) -> list[dict[str, Any]]:
    """Every verdict on new data written beside ``run``'s own (``{"file", "verdict"}``), by
    name.

    Raises:
        CheckpointError: such a file that the run's manifest does not seal as written.
    """
    names = sorted(p.name for p in Path(run).iterdir() if FRESH.match(p.name))
    check_sealed(Path(run), names)
    return [{"file": name, "verdict": read_json_object(Path(run) / name, CheckpointError)}
            for name in names]
