"""YAML specs: ``load_spec(path_or_text) -> Spec``, validated into frozen dataclasses.

A spec describes a whole run: ``model``, ``data``, ``probes``, ``train``, ``heads``,
``gates``, ``adapters``, ``ffn``, ``contract`` and ``enforce`` (reference: docs/spec.md). It is
read with a safe YAML loader and never names code to import. Every error is a ``SpecError``
whose message starts with the field path, e.g. ``heads.L1.H9: layer 1 has heads 0-3`` or
``train.steps: got -5, expected an integer >= 1``.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import headwise.validate as check
from headwise.contract import parse_contract
from headwise.errors import SpecError
from headwise.runspec.parse import (
    TOP_LEVEL,
    parse_adapters,
    parse_contract_section,
    parse_data,
    parse_enforce,
    parse_ffn,
    parse_gates,
    parse_heads,
    parse_model,
    parse_train,
)
from headwise.runspec.probes import parse_probes, probe_names
from headwise.runspec.schema import (
    AdapterSpec,
    DataSpec,
    EntropySpec,
    FFNSpec,
    GateSpec,
    HeadRule,
    MaskSpec,
    ModelSpec,
    ObjectiveSpec,
    PretrainedSpec,
    ProbeSpec,
    Spec,
    TaskSpec,
)
from headwise.runspec.yaml_io import parse_yaml, read_spec_text

__all__ = ["AdapterSpec", "DataSpec", "EntropySpec", "FFNSpec", "GateSpec", "HeadRule", "MaskSpec",
           "ModelSpec", "ObjectiveSpec", "PretrainedSpec", "ProbeSpec", "Spec", "SpecError",
           "TaskSpec", "load_spec", "spec_from_dict"]


def load_spec(source: str | Path) -> Spec:
    """Read and validate a spec.

    Args:
        source: a path to a ``.yaml``/``.yml`` file (relative paths inside the spec resolve
            against its directory), or the YAML text itself.

    Raises:
        SpecError: the first problem found, its message starting with the field path.
    """
    text, name = read_spec_text(source)
    data = parse_yaml(text, name)
    base = Path(name).parent if name != "<spec>" else None
    return spec_from_dict(data, base=base, text=text)


def spec_from_dict(data: dict, base: Path | None = None, text: str = "") -> Spec:
    """Validate an already-parsed spec mapping (see ``load_spec``).

    Raises:
        SpecError: the first problem found, its message starting with the field path.
    """
    data = check.mapping(data, "spec", "a mapping")
    check.keys(data, TOP_LEVEL, "", required=("model", "data"))
    for key in ("name", "description"):
        if key in data:
            check.string(data[key], key)
    model = parse_model(data["model"], base)
    config = model.config
    dataspec = parse_data(data["data"], config, base, gated=_gated(data),
                          tokenizer=_checkpoint_tokenizer(model))
    tasks = dataspec.names
    train = parse_train(data.get("train"))
    heads = parse_heads(data.get("heads"), config, tasks, dataspec.seq_len)
    gates = parse_gates(data.get("gates"), heads, config)
    adapters = parse_adapters(data.get("adapters"), config, heads)
    ffn = parse_ffn(data.get("ffn"), config)
    probes = parse_probes(data.get("probes"), config, dataspec, model.pretrained is not None)
    clauses, confidence = parse_contract_section(data.get("contract"))
    contract = replace(parse_contract(clauses, config.n_layers, config.n_heads, tasks,
                                      probe_names(dataspec, probes), config=config),
                       confidence=confidence)
    if "verify_examples" in data["data"]:
        dataspec = replace(dataspec, verify_given=True)
    else:
        dataspec = replace(dataspec, verify_examples=max(
            dataspec.verify_examples,
            contract.verification_examples(dataspec.weights)))
    return Spec(model, dataspec, train, contract, heads, gates, adapters, ffn, probes,
                parse_enforce(data.get("enforce")), text=text)


def _gated(data: dict) -> bool:
    """Whether the spec has task gates: a ``gates:`` section or a head rule with ``tasks``
    (fixed gates are implied then; ``parse_gates`` checks the details later)."""
    heads = data.get("heads")
    rules = heads.values() if isinstance(heads, dict) else ()
    return data.get("gates") is not None or any(isinstance(r, dict) and "tasks" in r
                                                for r in rules)


def _checkpoint_tokenizer(model: ModelSpec) -> str | None:
    """A pretrained checkpoint's directory when it holds a ``tokenizer.json``: the tokenizer
    file-backed tasks (``text``, ``mlm``, ``pairs``) read through unless they name their own."""
    if model.pretrained is None:
        return None
    path = Path(model.pretrained.path)
    return str(path) if (path / "tokenizer.json").is_file() else None
