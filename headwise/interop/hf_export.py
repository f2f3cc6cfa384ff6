"""Export a headwise model as a HuggingFace directory that ``transformers`` loads offline.

``export_hf(model, out)`` writes ``config.json``, ``model.safetensors`` and, when given, the
tokenizer files, so that ``AutoModelForCausalLM.from_pretrained(out)``
(decoders) or ``AutoModel.from_pretrained(out)`` (BERT-shaped encoders) gives the same outputs.
The family follows from the config: RoPE -> Llama (Qwen2 when the bias is on q/k/v only),
another causal model -> GPT-2, an encoder -> BERT. Every weight goes through the family's
key-map table of ``headwise.interop`` in reverse (``Rule.join``), so ``load_hf(out)`` returns
bitwise the same weights. A masked-LM head goes back only when it came from the checkpoint
(then as ``BertForMaskedLM``); a head added for training is dropped. A config field, lever or
installed mask/gate with no HF equivalent is refused with a ``ConfigError`` naming it; nothing
is approximated. LoRA adapters are merged into their base weights (``W + B A * alpha / r``),
or, with ``peft=DIR``, the base weights go to ``out`` and the adapters to ``DIR`` in PEFT's
format (``headwise.interop.export_peft``).
Exporting a run directory (its levers rebuilt from ``spec.yaml``) is
``headwise.pipeline.run_export.export_run``, a layer above; ``headwise.export_hf`` takes either.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from torch import Tensor, nn

from headwise.atomic import (
    ADAPTER,
    MODEL,
    check_empty_dir,
    check_output_dir,
    overwrite_switch,
    refuse_directories,
    remove_entries,
    write_bytes_atomic,
)
from headwise.config import ModelConfig
from headwise.control.lora import lora_modules
from headwise.errors import CheckpointError, ConfigError
from headwise.interop.converter import Converter, Rule
from headwise.interop.load import HF_FILES, TOKENIZER_FILES, read_tokenizer_files
from headwise.interop.mlm_head import split_mlm_head
from headwise.interop.peft_export import ADAPTER_FILES, export_peft
from headwise.interop.registry import get_converter
from headwise.interop.weights import SAFETENSORS
from headwise.training.safetensors_io import save_tensors


def export_model_type(config: ModelConfig) -> str:
    """The HF family ``config`` exports as: ``llama`` (RoPE), ``bert`` (encoder), else ``gpt2``."""
    if config.positional == "rope":
        return "llama"
    return "gpt2" if config.causal else "bert"


def merged_state_dict(model: nn.Module, merge: bool = True) -> dict[str, Tensor]:
    """The model's parameters under plain names, every LoRA adapter merged into its weight.

    ``blocks.0.attn.q_proj.base_layer.weight`` becomes ``blocks.0.attn.q_proj.weight`` holding
    ``LoRALinear.effective_weight()`` (with ``merge=False``: the base weight alone);
    ``lora_A`` / ``lora_B`` are dropped. Without adapters this is ``model.state_dict()``
    (detached).
    """
    adapters = lora_modules(model)
    out: dict[str, Tensor] = {}
    with torch.no_grad():
        for key, value in model.state_dict().items():
            owner, _, leaf = key.rpartition(".")
            if owner in adapters and leaf in ("lora_A", "lora_B"):
                continue
            name = key
            if owner.endswith(".base_layer") and owner[: -len(".base_layer")] in adapters:
                module = owner[: -len(".base_layer")]
                name = f"{module}.{leaf}"
                if leaf == "weight" and merge:
                    value = adapters[module].effective_weight()
            out[name] = value.detach()
    return out


def hf_state_dict(converter: Converter, config: ModelConfig,
                  state: dict[str, Tensor]) -> dict[str, Tensor]:
    """Our state dict under the HF keys of the converter's export class (its table reversed).

    Raises:
        ConfigError: a parameter the family's table has no HF key for.
    """
    groups: dict[str, list[tuple[Rule, Tensor]]] = {}
    for key, tensor in state.items():
        if key == "unembed.weight" and config.tie_embeddings:
            continue  # HF re-ties lm_head to the embedding (tie_word_embeddings)
        rule = converter.rule_for(key)
        if rule is None:
            raise ConfigError(f"{key}: the {converter.model_type[0]} export has no HuggingFace "
                              "key for this parameter")
        groups.setdefault(rule.hf, []).append((rule, tensor.cpu()))
    return {(k if k in converter.head_keys else converter.export_prefix + k): Rule.join(parts)
            for k, parts in groups.items()}


def check_exportable(model: nn.Module) -> ModelConfig:
    """The model's config, after refusing what changes its forward pass beyond the config.

    Raises:
        ConfigError: not a headwise ``Transformer``, or a structural mask or task gate is
            installed (HF models have neither), naming the attention module.
    """
    config = getattr(model, "config", None)
    if not isinstance(config, ModelConfig) or not hasattr(model, "blocks"):
        raise ConfigError(f"model: got {type(model).__name__}, expected a headwise Transformer "
                          "or a run directory")
    for layer, block in enumerate(model.blocks):  # type: ignore[arg-type]
        for slot, what in (("head_mask", "a structural head mask"),
                           ("head_gate", "a task gate")):
            if getattr(block.attn, slot, None) is not None:
                raise ConfigError(f"blocks.{layer}.attn.{slot}: {what} is installed; HuggingFace "
                                  "models have no equivalent (remove it to export)")
    return config


def export_hf(model: nn.Module, out: str | Path, *, tokenizer: str | Path | None = None,
              overwrite: bool = False, peft: str | Path | None = None,
              names: tuple[str, str, str] = ("out", "peft", "tokenizer")) -> Path:
    """Write ``model`` (a headwise ``Transformer``) as an HF directory.

    Args:
        model: the model (a run directory: ``headwise.export_hf`` or
            ``headwise.pipeline.run_export.export_run``).
        out: the directory to write (created if missing).
        tokenizer: a directory holding HF tokenizer files (``tokenizer.json``, ...) or a
            ``tokenizer.json`` to copy; ``None``: no tokenizer files.
        overwrite: replace the model (HF files) in ``out`` and the adapter in ``peft``; their
            earlier files are deleted first (links unlinked, never followed).
        peft: instead of merging the LoRA adapters, write the base weights to ``out`` and the
            adapters to this directory as a PEFT adapter (``export_peft``) for that base.
        names: how the user named ``out``, ``peft`` and ``tokenizer``, for messages (a command
            passes its options, ``("--hf", "--peft", "--tokenizer")``).

    Both destinations follow the output rule (``headwise.atomic.check_output_dir``), checked
    before anything is written or deleted: never a link, a file, a run, a checkpoint or inside
    one; ``out`` replaces only a model directory and ``peft`` only an adapter, with
    ``overwrite``; ``out`` otherwise non-empty needs ``overwrite`` too.

    Returns:
        ``out`` as a Path.

    Raises:
        ConfigError: a config field or installed mask/gate with no HF equivalent (named), a
            run directory instead of a model, or a destination the output rule refuses.
        CheckpointError: the tokenizer path holds no tokenizer file, or one that links
            outside it (``read_tokenizer_files``).
    """
    if not isinstance(model, nn.Module):
        raise ConfigError(f"model: got {model!r}, expected a headwise Transformer (export a run "
                          "directory with headwise.export_hf or headwise export RUN)")
    out = Path(out)
    out_name, peft_name, tokenizer_name = names
    check_destinations(out, peft, overwrite, (out_name, peft_name))
    copies = tokenizer_files(Path(tokenizer), tokenizer_name) if tokenizer is not None else {}
    config = check_exportable(model)
    converter = get_converter(export_model_type(config))
    assert converter.config_to_hf is not None  # every listed family can export
    hf_config = converter.config_to_hf(config)
    _check_peft(model, peft, peft_name)
    body, head = split_mlm_head(converter, model, merged_state_dict(model, merge=peft is None))
    tensors = hf_state_dict(converter, config, body)
    if head:  # the checkpoint's masked-LM head goes back, in its class's layout
        architecture, prefix = converter.mlm_export
        tensors = {**{prefix + k: v for k, v in tensors.items()}, **head}
        hf_config["architectures"] = [architecture]
    if overwrite:
        remove_entries(out, HF_FILES, keep=(SAFETENSORS, "config.json", *copies))
    out.mkdir(parents=True, exist_ok=True)
    if peft is not None:
        try:
            export_peft(model, peft, hf_config["model_type"], base_model_name_or_path=str(out),
                        overwrite=overwrite)
        except ValueError as e:
            raise ConfigError(f"{peft_name}: {e}") from None
    save_tensors(tensors, out / SAFETENSORS, {"format": "pt"})
    for name, data in copies.items():
        write_bytes_atomic(out / name, data)
    hf_config["dtype"] = str(next(iter(tensors.values())).dtype).removeprefix("torch.")
    # config.json last: a directory interrupted mid-export does not look loadable.
    write_bytes_atomic(out / "config.json", (json.dumps(hf_config, indent=2) + "\n").encode())
    return out


def _check_peft(model: nn.Module, peft: str | Path | None, name: str) -> None:
    """Refuse ``peft`` (named ``name`` in messages) for a model without adapters or with merged
    ones."""
    if peft is None:
        return
    adapters = lora_modules(model)
    if not adapters:
        raise ConfigError(f"{name}: the model has no LoRA adapters to export; leave it unset")
    if any(a.merged for a in adapters.values()):
        raise ConfigError(f"{name}: the adapters are merged into the weights; unmerge_lora "
                          "first")


def tokenizer_files(path: Path, option: str = "tokenizer") -> dict[str, bytes]:
    """``name -> bytes`` of the tokenizer file ``path`` or of those in the directory ``path``;
    ``option``: how the user named ``path``, for messages (``--tokenizer`` in a command)."""
    if path.is_file():
        if path.name not in TOKENIZER_FILES:
            raise CheckpointError(f"{option}: {path} is not one of {list(TOKENIZER_FILES)}")
        return read_tokenizer_files(path.parent, (path.name,), option)
    files = read_tokenizer_files(path, option=option)
    if not files:
        raise CheckpointError(f"{option}: {path} holds none of {list(TOKENIZER_FILES)}")
    return files


def check_destinations(out: Path, peft: str | Path | None, overwrite: bool,
                       names: tuple[str, str] = ("out", "peft")) -> None:
    """Refuse ``out`` and ``peft`` (the output rule) before anything is written or deleted.

    ``names``: how the user named the two destinations (a command passes its options,
    ``("--hf", "--peft")``), for the messages.
    """
    out_name, peft_name = names
    check_output_dir(out, out_name, overwrite=True, replaces=(MODEL,))  # the kind; then:
    check_empty_dir(out, out_name, overwrite)
    refuse_directories(out, HF_FILES)
    if peft is None:
        return
    if Path(peft).absolute() == out.absolute():
        raise ConfigError(f"{peft_name}: {peft} is the model directory ({out_name}) too; "
                          "expected another directory for the adapter")
    check_output_dir(peft, peft_name, overwrite=overwrite, replaces=(ADAPTER,))
    refuse_directories(Path(peft), ADAPTER_FILES)
    leftovers = [p.name for p in Path(peft).iterdir() if p.name not in ADAPTER_FILES] if Path(
        peft).is_dir() else []
    if leftovers and not overwrite:
        raise ConfigError(f"{peft_name}: {peft} is not empty ({leftovers[0]}); choose another "
                          f"directory or pass {overwrite_switch(peft_name)}")
