"""A run's token names: its spec says the vocabulary (synthetic, bytes or a tokenizer).

``explain`` and the report spell a run's tokens through ``spec_token_names`` and hence through
``headwise.data.token_names``, the one spelling (docs/report.md#token-names).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from torch import Tensor

from headwise.data import TASKS
from headwise.data.token_names import token_names
from headwise.interop.tokenizer import load_tokenizer
from headwise.pipeline.run_tokenizer import stored_tokenizer
from headwise.runspec import Spec


def spec_token_names(spec: Spec, run: Path | None = None) -> Callable[[Tensor], list[str]]:
    """``names(tokens (T,)) -> T strings`` for the inputs of a run of ``spec``.

    The vocabulary: the run's own copy of its tokenizer (``headwise.pipeline.run_tokenizer``),
    else the pretrained checkpoint's ``tokenizer.json``, else a text task's ``tokenizer``, else
    bytes when a text task has none, else the synthetic tasks' layout (with the spec's task
    markers named after their tasks).

    Raises:
        CheckpointError: a tokenizer that cannot be read, or a run's copy that differs from
            its manifest.
    """
    directory = (stored_tokenizer(run) if run is not None else None) or _tokenizer_dir(spec)
    if directory is not None:
        tokenizer = load_tokenizer(directory)
        return lambda tokens: token_names(tokens, tokenizer=tokenizer)
    if any(not TASKS[t.task].starts_with_bos for t in spec.data.tasks):
        return lambda tokens: token_names(tokens, byte_level=True)
    markers = dict(zip(spec.data.markers, spec.data.names, strict=False))
    return lambda tokens: token_names(tokens, markers=markers)


def _tokenizer_dir(spec: Spec) -> Path | None:
    if spec.model.pretrained is not None:
        path = Path(spec.model.pretrained.path)
        if (path / "tokenizer.json").is_file():
            return path
    for task in spec.data.tasks:
        if task.kwargs.get("tokenizer"):
            path = Path(str(task.kwargs["tokenizer"]))
            return path.parent if path.is_file() else path
    return None
