"""Re-verification on data no one saw: a finished run's contract measured on a fresh
verification set (``headwise verify SPEC --run RUN --fresh SEED``).

The fresh set is drawn like the run's own verification set (``data.verify_examples`` examples,
the declared probes) from ``SEED`` instead of ``data.verify_seed``: built-in generators and
probes are drawn anew; a file-backed task's examples are drawn again from its ``verify`` split,
the same rows (``fresh_notes`` says so). The verdict is written beside the run's own as
``contract.fresh-<SEED>.json`` (``contract.<sha12>.fresh-<SEED>.json`` for another spec),
atomically, never over ``contract.json``, and sealed in the run's manifest; the report
(``headwise report RUN``) shows every such verdict (``fresh_verdicts``).
"""

from __future__ import annotations

import hashlib
import re
from pathlib import Path
from typing import Any

from headwise.atomic import hold_lock
from headwise.contract import ContractResult, verify
from headwise.data import TASKS
from headwise.errors import CheckpointError, SpecError
from headwise.jsonfile import read_json_object
from headwise.pipeline.finished import load_compiled
from headwise.pipeline.heldout import verification_data
from headwise.pipeline.run_dir import write_json
from headwise.runspec import Spec
from headwise.runspec.schema import MAX_PROBES
from headwise.training.manifest import check_sealed, seal

FRESH = re.compile(r"^contract\.(?:[0-9a-f]{12}\.)?fresh-\d+\.json$")


def reverify_run(spec_source: str | Path, run: str | Path, seed: int,
                 device: str = "cpu") -> tuple[ContractResult, Path, list[str]]:
    """Verify ``spec``'s contract on ``run`` with a verification set drawn from ``seed``.

    Returns:
        The verdict, the file it was written to, and what the fresh set could not renew
        (``fresh_notes``).

    Raises:
        SpecError: ``seed`` would draw the run's own held-out sets (naming ``--fresh``), the
            spec has no contract, or is invalid.
        CheckpointError: the run's weights do not fit the spec's model.
        StorageError: another process is writing the run.
    """
    compiled = load_compiled(run, spec_source, device)
    spec = compiled.spec
    if not spec.contract:
        raise SpecError("contract: missing; expected a list of clauses to verify")
    check_fresh_seed(spec, seed)
    verdict = verify(compiled.model, spec.contract, verification_data(compiled, seed))
    run = Path(run)
    text = spec.text.encode()
    own = (run / "spec.yaml").read_bytes() == text
    name = (f"contract.fresh-{seed}.json" if own
            else f"contract.{hashlib.sha256(text).hexdigest()[:12]}.fresh-{seed}.json")
    with hold_lock(run):
        write_json(run / name, {**verdict.to_dict(), "fresh_seed": seed})
        seal(run, [name])
    return verdict, run / name, fresh_notes(spec)


def check_fresh_seed(spec: Spec, seed: int) -> None:
    """Refuse a seed whose draws (``seed + k``, ``k < MAX_PROBES + 2``) meet the enforcement or
    verification set's.

    Raises:
        SpecError: naming ``--fresh``, the seed and the run's seeds.
    """
    data = spec.data
    if seed < 0 or any(abs(seed - s) < MAX_PROBES + 2 for s in (data.eval_seed,
                                                                data.verify_seed)):
        raise SpecError(f"--fresh: got {seed}, expected a seed >= 0 at least {MAX_PROBES + 2} "
                        f"away from data.eval_seed={data.eval_seed} and data.verify_seed="
                        f"{data.verify_seed} (a fresh set shares no draw with the run's own)")


def fresh_notes(spec: Spec) -> list[str]:
    """What a fresh seed cannot renew: file-backed tasks, whose rows are their ``verify``
    split's again."""
    return [f"note: {t.name} reads a file: --fresh draws its examples again from the same "
            "verify split's rows" for t in spec.data.tasks if TASKS[t.task].splits]


def fresh_verdicts(run: Path) -> list[dict[str, Any]]:
    """Every fresh verdict written beside ``run``'s own (``{"file", "verdict"}``), by name.

    Raises:
        CheckpointError: such a file that the run's manifest does not seal as written.
    """
    names = sorted(p.name for p in Path(run).iterdir() if FRESH.match(p.name))
    check_sealed(Path(run), names)
    return [{"file": name, "verdict": read_json_object(Path(run) / name, CheckpointError)}
            for name in names]
