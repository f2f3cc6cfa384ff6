"""A finished run: rebuild its model with its levers, verify it against a spec."""

from __future__ import annotations

import hashlib
from pathlib import Path

from headwise.atomic import hold_lock
from headwise.contract import ContractResult, verify
from headwise.errors import CheckpointError, SpecError
from headwise.interop.tokenizer import load_model_tokenizer
from headwise.model import Transformer
from headwise.pipeline.compile import Compiled, compile_spec
from headwise.pipeline.heldout import verification_data
from headwise.pipeline.resume import read_run_info
from headwise.pipeline.run_data import with_stored_data
from headwise.pipeline.run_dir import write_json
from headwise.pipeline.run_tokenizer import stored_tokenizer, with_stored_tokenizer
from headwise.runspec import spec_from_dict
from headwise.runspec.yaml_io import parse_yaml, read_spec_text
from headwise.training import linked_checkpoints, list_checkpoints
from headwise.training.device import place, resolve_device
from headwise.training.manifest import MANIFEST, check_sealed, seal, verify_manifest
from headwise.training.safetensors_io import sha256_file


def load_compiled(run: str | Path, spec_source: str | Path | None = None,
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
    if run.is_file() and run.suffix in (".yaml", ".yml"):
        raise CheckpointError(f"{run}: is a spec, expected a run directory (train it first: "
                              f"`headwise train {run} --out RUN`)")
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
        text, name = read_spec_text(spec_source)
        base: Path | None = Path(name).parent if name != "<spec>" else None
    else:  # relative paths in the run's spec resolve against the spec's original directory
        text, name = read_spec_text(run / "spec.yaml")
        spec_dir = read_run_info(run).get("spec_dir")
        base = Path(spec_dir) if spec_dir else run
    tree = with_stored_tokenizer(parse_yaml(text, name), run)  # the one it trained with
    if text == (run / "spec.yaml").read_text(encoding="utf-8", errors="replace"):
        tree = with_stored_data(tree, run)  # its own spec: the data it trained on, its copies
    spec = spec_from_dict(tree, base=base, text=text)
    compiled = compile_spec(spec, weights=weights)
    stored = stored_tokenizer(run)
    if stored is not None and isinstance(compiled.model, Transformer):
        compiled.model.tokenizer = load_model_tokenizer(stored)
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
    compiled = load_compiled(run, spec_source, device)
    if not compiled.spec.contract:
        raise SpecError("contract: missing; expected a list of clauses to verify")
    run = Path(run)
    verdict = verify(compiled.model, compiled.spec.contract,
                     verification_data(compiled, examples=verdict_examples(run, compiled)))
    text = compiled.spec.text.encode()
    name = ("contract.json" if (run / "spec.yaml").read_bytes() == text
            else f"contract.{hashlib.sha256(text).hexdigest()[:12]}.json")
    with hold_lock(run):
        write_json(run / name, verdict.to_dict())
        seal(run, [name])
    return verdict, run / name


def checkpoint_seals(run: Path) -> dict[str, str]:
    """What a finished run's ``run.json`` records of its checkpoints (entry ``checkpoints``):
    each one's name and the sha256 of its ``manifest.json``, which lists its files'."""
    return {p.name: sha256_file(p / MANIFEST) for _, p in list_checkpoints(run)
            if (p / MANIFEST).is_file()}


def run_checkpoints(run: Path) -> list[tuple[int, Path]]:
    """The run's checkpoints, as ``list_checkpoints``, for a command that reads them: none may
    be a link (nor ``checkpoints/``), and a run whose sealed ``run.json`` records its
    checkpoints (``checkpoint_seals``) reads only those, unchanged. A checkpoint it deleted is
    just absent (that forges nothing).

    Raises:
        CheckpointError: a link; a checkpoint ``run.json`` does not list (added or renamed
            after the run finished, or written by a resume since) or whose manifest differs
            from the recorded digest (replaced); ``run.json`` not matching the run's manifest.
    """
    links = linked_checkpoints(run)
    if links:
        raise CheckpointError(f"{links[0]}: is a symbolic link; expected the run's own "
                              "checkpoints")
    found = list_checkpoints(run)
    if (run / MANIFEST).exists():
        check_sealed(run, ["run.json"])
    seals = read_run_info(run).get("checkpoints")
    if seals is None:  # an unfinished run, or one finished before runs recorded them
        return found
    for _, path in found:
        if path.name not in seals:
            raise CheckpointError(f"{path}: not listed in {run / 'run.json'}; expected a "
                                  "checkpoint of the finished run (it was added or renamed "
                                  "afterwards, or a resume wrote it since)")
        if not (path / MANIFEST).is_file() or sha256_file(path / MANIFEST) != seals[path.name]:
            raise CheckpointError(f"{path / MANIFEST}: missing, or differs from the digest "
                                  f"{run / 'run.json'} records for it; expected the run's own "
                                  "checkpoint (it was replaced afterwards)")
    return found


def verdict_examples(run: Path, compiled: Compiled) -> int | None:
    """How many examples the run's own verdict drew (``run.json``: an enforced run may draw
    more than its spec's ``data.verify_examples``, ``headwise.contract.evidence``), so that
    verifying the run again with its own spec measures the same set; ``None`` (the spec's
    size) for another spec or a run that did not record it.

    Raises:
        CheckpointError: ``run.json`` differs from the run's manifest.
    """
    if compiled.spec.text.encode() != (run / "spec.yaml").read_bytes():
        return None
    check_sealed(run, ["run.json"])
    return read_run_info(run).get("verify_examples")  # checked: a positive integer
