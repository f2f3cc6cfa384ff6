"""Checkpoints: model weights, optimizer state, RNG states and step, saved atomically, no pickle.

Layout of ``out_dir/checkpoints/step_{N:07d}/`` (N = optimiser updates done):

- ``model.safetensors``: the model's weights (tied weights stored once, see ``safetensors_io``);
- ``trainer.safetensors``: AdamW state tensors ``optimizer.<param name>.<key>`` and RNG states
  ``rng.data`` (the data generator), ``rng.torch.<rank>``, ``rng.cuda.<device>``;
- ``trainer.json``: step, optimizer param groups (by parameter name), objective weights,
  callback state, the train config, the metric accumulators of the current logging window
  (``log``; their tensors are ``log.*`` in ``trainer.safetensors``), and the sha256 of both
  safetensors files;
- ``manifest.json`` (written last): the sha256 of the three files above (``train.manifest``).

A checkpoint is written into a temporary sibling directory, every file fsynced, then renamed
into place with ``os.replace``: a crash leaves either the whole checkpoint or none.
Loading checks the manifest first, then validates JSON, digests, keys and shapes, and raises
``CheckpointError`` naming the file (and key) on any mismatch, truncation or corruption.
"""

from __future__ import annotations

import json
import os
import re
import shutil
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from headwise.atomic import fsync_dir, publish_dir, write_bytes_atomic
from headwise.errors import CheckpointError, StorageError
from headwise.training.manifest import verify_manifest, write_manifest
from headwise.training.safetensors_io import load_tensors, load_weights, save_tensors, save_weights

FORMAT = "headwise-trainer/1"
_STEP_DIR = re.compile(r"^step_(\d{7,})$")


@dataclass
class CheckpointInfo:
    """What a checkpoint restores besides the model weights and optimizer state.

    Attributes:
        path: the checkpoint directory.
        step: optimiser updates done.
        data_rng: state of the data generator (``torch.Generator.set_state``) or ``None``.
        torch_rng: CPU RNG state per data-parallel rank (index = rank).
        cuda_rng: CUDA RNG state per device.
        objective_weights: objective name -> weight at save time.
        extra: JSON state saved by callbacks (``TrainState.extra``).
        config: the train config as a dict, or ``None``.
        stopped: a callback ended the run at this checkpoint (a resume does not continue it).
        log: JSON part of the metric accumulators of the logging window in progress.
        log_tensors: tensor part of those accumulators (``log.<name>`` in the file).
    """

    path: Path
    step: int
    data_rng: Tensor | None = None
    torch_rng: list[Tensor] = field(default_factory=list)
    cuda_rng: list[Tensor] = field(default_factory=list)
    objective_weights: dict[str, float] = field(default_factory=dict)
    extra: dict[str, Any] = field(default_factory=dict)
    config: dict[str, Any] | None = None
    stopped: bool = False
    log: dict[str, Any] = field(default_factory=dict)
    log_tensors: dict[str, Tensor] = field(default_factory=dict)


CHECKPOINT_FILES = ("model.safetensors", "trainer.safetensors", "trainer.json")
SHARDS = "shards"  # the shards' directory in a sharded checkpoint (``sharded_checkpoint``)


def _world_size(path: Path) -> str:
    """The world size in a sharded checkpoint's ``trainer.json`` (``?``: unreadable)."""
    try:
        return str(int(json.loads((Path(path) / "trainer.json").read_text())["world_size"]))
    except (OSError, ValueError, KeyError, TypeError):
        return "?"


def checkpoint_dir(out_dir: Path, step: int) -> Path:
    """``out_dir/checkpoints/step_{step:07d}``."""
    return Path(out_dir) / "checkpoints" / f"step_{step:07d}"


def list_checkpoints(out_dir: Path) -> list[tuple[int, Path]]:
    """Complete checkpoints under ``out_dir/checkpoints`` as ``(step, path)``, by step."""
    root = Path(out_dir) / "checkpoints"
    if not root.is_dir():
        return []
    found = []
    for p in root.iterdir():
        m = _STEP_DIR.match(p.name)
        if m and (p / "trainer.json").is_file():
            found.append((int(m.group(1)), p))
    return sorted(found)


def linked_checkpoints(out_dir: Path) -> list[Path]:
    """``out_dir/checkpoints`` when it is a symbolic link, else the links inside it: what a
    command that reads a run's checkpoints refuses (another run's, reached through a link)."""
    root = Path(out_dir) / "checkpoints"
    if root.is_symlink():
        return [root]
    return sorted(p for p in root.iterdir() if p.is_symlink()) if root.is_dir() else []


def latest_checkpoint(out_dir: Path) -> Path | None:
    """The directory of the highest-step complete checkpoint, or ``None``."""
    found = list_checkpoints(out_dir)
    return found[-1][1] if found else None


def clean_checkpoints(out_dir: Path) -> None:
    """Tidy what a crash during ``save_checkpoint`` can leave (call before resuming).

    Removes ``.tmp-*`` directories (incomplete writes). A ``.old-step_N-*`` directory is a
    complete checkpoint moved aside while ``step_N`` was being replaced: it is renamed back if
    ``step_N`` is missing, else removed.
    """
    root = Path(out_dir) / "checkpoints"
    if not root.is_dir():
        return
    for p in sorted(root.iterdir()):
        if p.name.startswith(".tmp-"):
            shutil.rmtree(p, ignore_errors=True)
        elif p.name.startswith(".old-"):
            final = root / p.name[len(".old-"):].rsplit("-", 1)[0]
            if final.exists():
                shutil.rmtree(p, ignore_errors=True)
            else:
                os.replace(p, final)


def save_checkpoint(out_dir: Path, step: int, model: nn.Module,
                    optimizer: torch.optim.Optimizer | None = None, *,
                    data_generator: torch.Generator | None = None,
                    torch_rng: list[Tensor] | None = None,
                    objective_weights: Mapping[str, float] | None = None,
                    extra: Mapping[str, Any] | None = None,
                    config: Mapping[str, Any] | None = None, stopped: bool = False,
                    log: Mapping[str, Any] | None = None,
                    log_tensors: Mapping[str, Tensor] | None = None) -> Path:
    """Write ``out_dir/checkpoints/step_{step:07d}`` atomically and return its path.

    Args:
        out_dir: the run directory.
        step: optimiser updates done.
        model: the (unwrapped) model.
        optimizer: its optimizer; state is stored by parameter name.
        data_generator: the training data generator.
        torch_rng: CPU RNG states per rank (default: this process's state).
        objective_weights: objective name -> current weight.
        extra: JSON-serialisable callback state.
        config: the train config as a dict.
        stopped: the run ends here because a callback stopped it.
        log: JSON part of the metric accumulators (so ``metrics.jsonl`` continues exactly).
        log_tensors: tensor part of the metric accumulators.
    """
    final = checkpoint_dir(out_dir, step)
    tmp = final.with_name(f".tmp-{final.name}-{os.getpid()}")
    try:
        return _save(final, tmp, step, model, optimizer, data_generator, torch_rng,
                     objective_weights, extra, config, stopped, log, log_tensors)
    except (OSError, StorageError) as e:
        shutil.rmtree(tmp, ignore_errors=True)  # earlier checkpoints stay as they were
        if isinstance(e, StorageError):
            raise
        raise StorageError(f"{e.filename or final}: cannot write the checkpoint "
                           f"({e.strerror or e})") from None


def _save(final: Path, tmp: Path, step: int, model: nn.Module,
          optimizer: torch.optim.Optimizer | None, data_generator: torch.Generator | None,
          torch_rng: list[Tensor] | None, objective_weights: Mapping[str, float] | None,
          extra: Mapping[str, Any] | None, config: Mapping[str, Any] | None, stopped: bool,
          log: Mapping[str, Any] | None, log_tensors: Mapping[str, Tensor] | None) -> Path:
    final.parent.mkdir(parents=True, exist_ok=True)
    if tmp.exists():
        shutil.rmtree(tmp)
    tmp.mkdir()
    tensors: dict[str, Tensor] = {}
    groups: list[dict[str, Any]] = []
    if optimizer is not None:
        groups = _optimizer_tensors(model, optimizer, tensors)
    if data_generator is not None:
        tensors["rng.data"] = data_generator.get_state()
    for rank, state in enumerate(torch_rng if torch_rng is not None else
                                 [torch.get_rng_state()]):
        tensors[f"rng.torch.{rank}"] = state
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        for i, state in enumerate(torch.cuda.get_rng_state_all()):
            tensors[f"rng.cuda.{i}"] = state
    for name, value in (log_tensors or {}).items():
        tensors[f"log.{name}"] = value
    files = {"model.safetensors": save_weights(model, tmp / "model.safetensors"),
             "trainer.safetensors": save_tensors(tensors, tmp / "trainer.safetensors")}
    meta = {"format": FORMAT, "step": step, "param_groups": groups,
            "objective_weights": dict(objective_weights or {}), "extra": dict(extra or {}),
            "config": dict(config) if config is not None else None, "stopped": stopped,
            "log": dict(log or {}), "sha256": files}
    write_bytes_atomic(tmp / "trainer.json", json.dumps(meta, indent=1).encode())
    write_manifest(tmp, CHECKPOINT_FILES)
    fsync_dir(tmp)
    publish_dir(tmp, final)  # re-saving a step (after a resume) replaces it
    return final


def load_checkpoint(path: Path, model: nn.Module,
                    optimizer: torch.optim.Optimizer | None = None) -> CheckpointInfo:
    """Load a checkpoint directory into ``model`` (and ``optimizer``); return the rest.

    Raises:
        CheckpointError: naming the file (and key) that is missing, truncated, corrupt or does
            not match the model or optimizer (or a checkpoint of sharded training).
    """
    path = Path(path)
    if (path / SHARDS).is_dir():  # ``headwise.training.sharded_checkpoint`` reads these
        raise CheckpointError(f"{path}: written by train.parallel: fsdp on "
                              f"{_world_size(path)} ranks; resume it with that setting "
                              "under torchrun with as many ranks")
    verified = verify_manifest(path, CHECKPOINT_FILES)  # every file hashed once, here
    meta_path = path / "trainer.json"
    try:
        meta = json.loads(meta_path.read_text())
    except FileNotFoundError:
        raise CheckpointError(f"{meta_path}: file not found") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise CheckpointError(f"{meta_path}: not valid JSON ({e})") from None
    if not isinstance(meta, dict) or meta.get("format") != FORMAT:
        raise CheckpointError(f"{meta_path}: expected a {FORMAT!r} object")
    for key in ("step", "param_groups", "objective_weights", "extra", "sha256"):
        if key not in meta:
            raise CheckpointError(f"{meta_path}: missing field {key!r}")
    step = meta["step"]
    named = _STEP_DIR.match(path.name)
    if (isinstance(step, bool) or not isinstance(step, int) or step < 0
            or (named is not None and int(named.group(1)) != step)):
        raise CheckpointError(f"{meta_path}: field 'step' is {str(step)[:40]}, expected the "
                              f"step in the directory name {path.name!r}")
    if not isinstance(meta["sha256"], dict):
        raise CheckpointError(f"{meta_path}: field 'sha256' is not a mapping of file digests")
    for name, digest in meta["sha256"].items():  # trainer.json's own record agrees
        if verified.get(name) != digest:
            raise CheckpointError(f"{path / name}: contents do not match the sha256 recorded in "
                                  f"{meta_path.name} (truncated or corrupt, or edited)")
    load_weights(model, path / "model.safetensors")
    tensors, _ = load_tensors(path / "trainer.safetensors")
    if optimizer is not None:
        _load_optimizer(model, optimizer, meta["param_groups"], tensors,
                        path / "trainer.safetensors")
    n_torch = sum(k.startswith("rng.torch.") for k in tensors)
    n_cuda = sum(k.startswith("rng.cuda.") for k in tensors)
    return CheckpointInfo(
        path=path, step=int(meta["step"]), data_rng=tensors.get("rng.data"),
        torch_rng=[tensors[f"rng.torch.{r}"] for r in range(n_torch)],
        cuda_rng=[tensors[f"rng.cuda.{i}"] for i in range(n_cuda)],
        objective_weights={k: float(v) for k, v in meta["objective_weights"].items()},
        extra=dict(meta["extra"]), config=meta.get("config"),
        stopped=bool(meta.get("stopped", False)),
        log=dict(meta.get("log") or {}),
        log_tensors={k[len("log."):]: v for k, v in tensors.items() if k.startswith("log.")})


def _param_names(model: nn.Module, optimizer: torch.optim.Optimizer) -> list[list[str]]:
    names = {id(p): n for n, p in model.named_parameters()}
    out = []
    for g in optimizer.param_groups:
        missing = [p for p in g["params"] if id(p) not in names]
        if missing:
            raise ValueError("optimizer: holds a parameter that is not in the model")
        out.append([names[id(p)] for p in g["params"]])
    return out


def _optimizer_tensors(model: nn.Module, optimizer: torch.optim.Optimizer,
                       tensors: dict[str, Tensor]) -> list[dict[str, Any]]:
    """Add the optimizer's state tensors to ``tensors``; return its groups as JSON."""
    names = _param_names(model, optimizer)
    flat = [n for group in names for n in group]
    sd = optimizer.state_dict()
    for idx, state in sd["state"].items():
        for key, value in state.items():
            if not isinstance(value, Tensor):
                value = torch.tensor(value)
            tensors[f"optimizer.{flat[idx]}.{key}"] = value
    groups = []
    for g, group_names in zip(sd["param_groups"], names, strict=True):
        d = {k: (list(v) if isinstance(v, tuple) else v) for k, v in g.items() if k != "params"}
        d["params"] = group_names
        groups.append(d)
    return groups


_IMPLEMENTATION_KEYS = ("fused", "foreach", "capturable", "differentiable")


def _load_optimizer(model: nn.Module, optimizer: torch.optim.Optimizer,
                    groups: list[dict[str, Any]], tensors: dict[str, Tensor],
                    file: Path) -> None:
    names = _param_names(model, optimizer)
    if len(groups) != len(names):
        raise CheckpointError(f"{file}: {len(groups)} optimizer parameter groups, the "
                              f"optimizer has {len(names)}")
    for saved, current in zip(groups, names, strict=True):
        for n in saved["params"]:
            if n not in current:
                raise CheckpointError(f"{file}: optimizer state for {n!r}, which is not a "
                                      f"trainable parameter of this run")
        for n in current:
            if n not in saved["params"]:
                raise CheckpointError(f"{file}: no optimizer state for parameter {n!r}")
    flat = [n for group in names for n in group]
    index = {n: i for i, n in enumerate(flat)}
    params = dict(model.named_parameters())
    state: dict[int, dict[str, Tensor]] = {}
    for key, value in tensors.items():
        if not key.startswith("optimizer."):
            continue
        pname, skey = key[len("optimizer."):].rsplit(".", 1)
        if pname not in index:
            raise CheckpointError(f"{file}: tensor {key!r} names no trainable parameter")
        if skey != "step" and value.shape != params[pname].shape:
            raise CheckpointError(f"{file}: tensor {key!r} has shape {tuple(value.shape)}, "
                                  f"expected {tuple(params[pname].shape)}")
        state.setdefault(index[pname], {})[skey] = value
    sd_groups = []
    for saved, current, now in zip(groups, names, optimizer.param_groups, strict=True):
        g = {k: (tuple(v) if k == "betas" else v) for k, v in saved.items() if k != "params"}
        # How the update is computed is this run's choice (a CPU checkpoint may resume on a
        # GPU with the fused kernel, and back): it changes no saved state.
        g.update({k: now[k] for k in _IMPLEMENTATION_KEYS if k in now})
        g["params"] = [index[n] for n in current]
        sd_groups.append(g)
    optimizer.load_state_dict({"state": state, "param_groups": sd_groups})
