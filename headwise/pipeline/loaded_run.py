"""``headwise.load_run``: a finished run in Python: its model, spec, tokenizer and verdict.

``load_run(RUN)`` checks the run's integrity manifest, rebuilds the model with every lever its
spec installs and loads the trained weights (``headwise.pipeline.finished.load_compiled``),
attaches the run's tokenizer (its own sealed copy, ``headwise.pipeline.run_tokenizer``; a
``ByteTokenizer`` for a text or pairs task read as bytes) as ``model.tokenizer`` and reads the
contract verdict from the sealed ``contract.json`` (JSON, checked field by field; nothing is
unpickled or re-measured).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from headwise.contract import ContractResult
from headwise.data import TASKS
from headwise.errors import CheckpointError
from headwise.interop.tokenizer import load_model_tokenizer
from headwise.jsonfile import read_json_object
from headwise.model import Transformer
from headwise.model.byte_tokenizer import ByteTokenizer
from headwise.model.tokenizer import ModelTokenizer
from headwise.pipeline.finished import load_compiled
from headwise.pipeline.run_tokenizer import tokenizer_source
from headwise.runspec import Spec
from headwise.training.manifest import check_sealed

MAX_CONTRACT_BYTES = 64 << 20  # a verdict is kilobytes per clause


@dataclass(frozen=True)
class LoadedRun:
    """A finished run.

    Attributes:
        path: the run directory.
        model: the trained model in eval mode, its levers (adapters, masks, gates) installed;
            ``model.tokenizer`` is ``tokenizer``.
        spec: the spec it was trained from (``spec.yaml``).
        tokenizer: the run's tokenizer (``model.to_tokens`` uses it), or ``None``.
        contract: the verdict recorded in ``contract.json``, or ``None`` when the spec has no
            contract (or the run was not verified).
    """

    path: Path
    model: Transformer
    spec: Spec
    tokenizer: ModelTokenizer | None
    contract: ContractResult | None


def load_run(run: str | Path, device: str = "cpu") -> LoadedRun:
    """Load a finished run (``headwise train``'s ``--out``).

    Args:
        run: the run directory.
        device: where to put the model (auto, cpu, cuda, cuda:N).

    Raises:
        CheckpointError: not a finished run, a file that differs from the run's manifest, a
            ``contract.json`` that is not the verdict of the run's contract, or an unreadable
            tokenizer.
        SpecError: the run's spec is invalid.
        ConfigError: an unknown or unavailable device.
    """
    run = Path(run)
    compiled = load_compiled(run, device=device)
    model = compiled.model
    assert isinstance(model, Transformer)  # compile_spec builds or loads one
    source = tokenizer_source(compiled.spec)  # a run without its own copy (load_compiled)
    if model.tokenizer is None and source is not None and (
            source.is_file() or (source / "tokenizer.json").is_file()):
        model.tokenizer = load_model_tokenizer(source)
    if model.tokenizer is None and not all(TASKS[t.task].starts_with_bos
                                           for t in compiled.spec.data.tasks):
        model.tokenizer = ByteTokenizer()  # a text or pairs task read as bytes
    return LoadedRun(run, model, compiled.spec, model.tokenizer,
                     _verdict(run, compiled.spec))


def _verdict(run: Path, spec: Spec) -> ContractResult | None:
    file = run / "contract.json"
    if not spec.contract or not file.exists():
        return None
    check_sealed(run, [file.name])  # the run's own verdict, unchanged since it was sealed
    data = read_json_object(file, CheckpointError, MAX_CONTRACT_BYTES)
    return ContractResult.from_dict(data, spec.contract, str(file))
