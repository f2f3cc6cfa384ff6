"""Export a finished run as a HuggingFace directory: the run's model, its levers checked.

``export_run(run, out)`` rebuilds the run's model with its levers from ``spec.yaml``, refuses
spec levers a HuggingFace model cannot express (task gates, structural masks; named by their
spec field), picks the run's tokenizer (its own sealed copy; for a run written before runs
stored one, its pretrained checkpoint's, else its text task's),
hands the model to ``headwise.interop.hf_export.export_hf`` and, for a run on a
sentence-transformers checkpoint, adds that checkpoint's sentence-transformers files
(``headwise.interop.st_export``), so the export is a sentence-transformers model too.
``export_hf`` here is the public ``headwise.export_hf``: a run directory or a model.
"""

from __future__ import annotations

from pathlib import Path

from torch import nn

from headwise.errors import ConfigError
from headwise.interop.hf_export import check_destinations, tokenizer_files
from headwise.interop.hf_export import export_hf as export_model
from headwise.interop.st_export import (
    sentence_transformers_files,
    write_sentence_transformers_files,
)
from headwise.pipeline.finished import load_compiled
from headwise.pipeline.run_tokenizer import stored_tokenizer, tokenizer_source
from headwise.runspec import Spec


def export_hf(source: str | Path | nn.Module, out: str | Path, *,
              tokenizer: str | Path | None = None, overwrite: bool = False,
              peft: str | Path | None = None) -> Path:
    """Write ``source`` (a run directory or a headwise ``Transformer``) as an HF directory.

    A model goes to ``headwise.interop.hf_export.export_hf``; a run to ``export_run`` (same
    arguments, same errors).
    """
    if isinstance(source, nn.Module):
        return export_model(source, out, tokenizer=tokenizer, overwrite=overwrite, peft=peft)
    return export_run(source, out, tokenizer=tokenizer, overwrite=overwrite, peft=peft)


def export_run(run: str | Path, out: str | Path, *, tokenizer: str | Path | None = None,
               overwrite: bool = False, peft: str | Path | None = None,
               names: tuple[str, str, str] = ("out", "peft", "tokenizer")) -> Path:
    """Write a finished run's model (levers rebuilt from its ``spec.yaml``) as an HF directory.

    Args:
        run: a finished run (``headwise train``'s ``--out``).
        out: the directory to write (created if missing).
        tokenizer: tokenizer directory or ``tokenizer.json`` to copy; default: the run's
            pretrained checkpoint's, else its text tasks' tokenizer, if any.
        overwrite: replace the HF files of a non-empty ``out``.
        peft: write the LoRA adapters to this directory as a PEFT adapter instead of merging.
        names: how the user named ``out``, ``peft`` and ``tokenizer``, for messages
            (``headwise export`` passes ``("--hf", "--peft", "--tokenizer")``).

    A run on a sentence-transformers checkpoint also gets its ``modules.json``, module
    directories (``1_Pooling/``, ...) and configs in ``out`` (``headwise.interop.st_export``);
    with ``peft`` they describe the base model in ``out``.

    Returns:
        ``out`` as a Path.

    Raises:
        ConfigError: a config field, spec lever or installed mask/gate with no HF equivalent
            (named), ``out`` not empty without ``overwrite``, or ``out`` is the run itself.
        CheckpointError: not a finished run, the tokenizer path holds no tokenizer file, or
            the checkpoint's sentence-transformers files cannot be exported (named).
        SpecError: the run's spec is invalid.
    """
    run, out = Path(run), Path(out)
    out_name, peft_name, tokenizer_name = names
    if out.resolve() == run.resolve():
        raise ConfigError(f"{out_name}: {out} is the run directory itself; expected another "
                          "directory (the run's own config.json would be overwritten)")
    check_destinations(out, peft, overwrite, (out_name, peft_name))  # before any work
    if tokenizer is not None:  # refuses a missing one, or links leaving it
        tokenizer_files(Path(tokenizer), tokenizer_name)
    model, spec = _load_run(run)
    # Read before anything is written: a malformed file refuses the export.
    st_files = (sentence_transformers_files(Path(spec.model.pretrained.path))
                if spec.model.pretrained is not None else {})
    if tokenizer is None:  # the run's own: the user named none, so the library's name
        tokenizer, tokenizer_name = stored_tokenizer(run) or tokenizer_source(spec), "tokenizer"
    export_model(model, out, tokenizer=tokenizer, overwrite=overwrite, peft=peft,
                 names=(out_name, peft_name, tokenizer_name))
    write_sentence_transformers_files(st_files, out)
    return out


def _load_run(run: Path) -> tuple[nn.Module, Spec]:
    """The run's model with its levers, after refusing spec levers HF cannot express; and its
    spec."""
    compiled = load_compiled(run)
    spec = compiled.spec
    if spec.gates is not None:
        raise ConfigError("gates: the run routes tasks through task gates; a HuggingFace model "
                          "has no equivalent (export a run without gates)")
    for rule in spec.heads:
        if rule.mask is not None:
            raise ConfigError(f"heads.{rule.selector}.mask: {rule.mask.name!r} is a structural "
                              "mask; a HuggingFace model has no per-head masks (export a run "
                              "without masks)")
    return compiled.model, spec
