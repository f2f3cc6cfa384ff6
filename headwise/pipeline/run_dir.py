"""Run directories: what a run directory holds, creating one, and writing its outcome files.

A run directory holds ``spec.yaml`` (the spec as trained: the file, with any ``--set`` /
``--seed`` overrides applied), ``run.json`` (where the spec came from, so relative paths in it
keep resolving, the flags that shape the training (``headwise.pipeline.resume``) and, once
finished, the step its weights are from),
``config.json``, ``model.safetensors``, ``manifest.json`` (size and sha256 of the files that
define the model and of those commands quote, written last: a run without it did not finish),
``checkpoints/``, ``metrics.jsonl``, ``contract.json``, ``enforcement.json`` and
``kept.safetensors`` (with ``--enforce``: the model of the last evaluation point at which the
contract held, ``headwise.contract.kept``), the tokenizer it reads (``tokenizer.json`` and the
files beside it: ``headwise.pipeline.run_tokenizer``), its data files
(``data.<i>.<name>``: ``headwise.pipeline.run_data``), ``report.json``, ``report.html`` and
``.headwise.lock`` (the writer's lock, ``headwise.atomic.hold_lock``: one process writes a run
at a time), and ``retries/<n>/`` where an enforced run trained again (``headwise.contract.retry``):
that attempt's own ``spec.yaml``, ``run.json``, checkpoints, ``metrics.jsonl`` and weights (the
run directory's model, verdict and ``enforcement.json`` are those of the attempt kept).

Lifecycle: ``--resume`` continues the same run (its recorded flags) from the latest checkpoint
or refuses (exit 2) when there is none; it never retrains over a run. A directory left by a run
interrupted before its first checkpoint holds no work and can be trained into again.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from headwise.atomic import RUN, linked_entries, remove_entries, work_in, write_bytes_atomic
from headwise.contract import ContractResult
from headwise.contract.kept import KEPT
from headwise.errors import SpecError
from headwise.interop.load import TOKENIZER_FILES
from headwise.pipeline.options import RunOptions
from headwise.pipeline.resume import check_resume, run_info
from headwise.pipeline.run_data import store_data, stored_data_names
from headwise.pipeline.run_tokenizer import store_tokenizer
from headwise.runspec import Spec
from headwise.training import list_checkpoints
from headwise.training.manifest import MANIFEST, write_manifest

RUN_FILES = ("spec.yaml", "run.json", "config.json", "model.safetensors", MANIFEST,
             "metrics.jsonl", "contract.json", "enforcement.json", "report.json", "report.html",
             KEPT)
RETRIES = "retries"  # the directory of an enforced run's further attempts, one per attempt
# Every file a run writes (its tokenizer copy too: a directory holding only such a file is no
# run, but replacing a run replaces it).
OWN_FILES = (*RUN_FILES, *TOKENIZER_FILES)
# The files that define a finished run's model, covered by its manifest.
MODEL_FILES = ("spec.yaml", "run.json", "config.json", "model.safetensors")
# What commands read or quote besides the model, sealed by the manifest too when present.
SEALED_FILES = ("metrics.jsonl", "contract.json", "enforcement.json", *TOKENIZER_FILES)

def holds_work(out: Path) -> bool:
    """Whether ``out``, a run directory (``work_in``), holds work a new run must not silently
    replace. One with ``run.json`` but neither weights nor a checkpoint is what a run
    interrupted during set-up leaves: no work, so it may be trained into again."""
    return (out / "model.safetensors").exists() or bool(list_checkpoints(out))


def prepare_run_dir(out: Path, spec: Spec, resume: bool, overwrite: bool,
                    flags: RunOptions | None = None, spec_dir: Path | None = None) -> int | None:
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
    own = (*OWN_FILES, *stored_data_names(out), "checkpoints", RETRIES)
    linked = linked_entries(out, own)
    if resume:
        if linked:
            raise SpecError(f"{out / linked[0]}: is a symbolic link; expected the run's own "
                            "files (a resume never continues another run's)")
        return check_resume(out, spec)
    if work_in(out) != RUN:  # nothing here is a run's: --overwrite replaces none of it
        clash = next((n for n in own if os.path.lexists(out / n)), None)
        if clash is not None:
            raise SpecError(f"{out / clash}: exists and belongs to no run; expected a new or "
                            "empty --out, or one without the files a run writes (--overwrite "
                            "replaces a run, never other files)")
    elif holds_work(out) and not overwrite:
        raise SpecError(f"{out}: already holds a run; pass --resume to continue it, "
                        "--overwrite to replace it, or choose another --out")
    remove_entries(out, own,  # links unlinked, never followed
                   directories=("checkpoints", RETRIES))
    try:
        out.mkdir(parents=True, exist_ok=True)
        # run.json first: a directory left with it alone is an interrupted run's (no work)
        write_json(out / "run.json", run_info(flags or RunOptions().filled(), spec, spec_dir))
        write_bytes_atomic(out / "spec.yaml", spec.text.encode())
        store_tokenizer(out, spec)  # the run reads its own copies from now on
        store_data(out, spec)
    except OSError as e:
        raise SpecError(f"{out}: cannot write the run directory ({e.strerror or e})") from None
    return None


def write_json(path: Path, data: Any) -> None:
    """Write JSON atomically."""
    write_bytes_atomic(path, json.dumps(data, indent=1, default=str).encode())


def write_outcome(out: Path, verdict: ContractResult | None,
                   enforcement: dict[str, Any] | None) -> None:
    """``contract.json`` and ``enforcement.json``, then the manifest (the run is finished)
    sealing them with the model's files, ``metrics.jsonl`` and the run's tokenizer and data
    copies."""
    if verdict is not None:
        write_json(out / "contract.json", verdict.to_dict())
    if enforcement is not None:
        write_json(out / "enforcement.json", enforcement)
    write_manifest(out, [*MODEL_FILES, *(n for n in SEALED_FILES if (out / n).is_file()),
                         *stored_data_names(out)])


def is_main_process() -> bool:
    """Rank 0 under ``torchrun`` (or a single process): the one that writes run files."""
    return int(os.environ.get("RANK", "0")) == 0
