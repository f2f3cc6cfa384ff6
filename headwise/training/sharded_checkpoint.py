"""Sharded checkpoints (``train.parallel: fsdp``): each rank writes its shard, sealed by manifests.

Layout of ``out_dir/checkpoints/step_{N:07d}/`` for a run sharded over R ranks:

- ``shards/shard-0000{r}-model-00001-of-00001.safetensors`` (r = 1..R): rank r-1's rows of the
  model's parameters ``model.<name>`` and of AdamW's state ``optimizer.<name>.<key>``, written
  by Distributed Checkpoint (``torch.distributed.checkpoint``) through its safetensors storage
  (each tensor's offset in the whole tensor sits in the file's JSON header: no pickle);
- ``shards/manifest.json``: the sha256 of every shard;
- ``trainer.safetensors``: RNG states (``rng.data``, ``rng.torch.<rank>``), as for one process,
  and every rank's logging window in progress (``log.r<rank>.<name>``);
- ``trainer.json``: step, world size, optimizer param groups and state keys, objective weights,
  callback state, the train config, and the sha256 of ``trainer.safetensors`` and of
  ``shards/manifest.json``;
- ``manifest.json`` (written last): the sha256 of ``trainer.json`` and ``trainer.safetensors``.

So the checkpoint's manifest covers every shard through ``trainer.json``, and nothing else is
read: a file in ``shards/`` that its manifest does not list is refused by name, and the reader
Distributed Checkpoint is handed lists only the listed shards. All ranks write into
one temporary sibling directory; after a barrier rank 0 seals it and renames it into place
(``os.replace``): a crash leaves the whole checkpoint or none. A resume must use the same
number of ranks (``load_sharded_checkpoint``), and continues bitwise; ``load_sharded_weights``
reads the whole model back in one process, without ``torchrun`` (the report's trajectories).
"""

from __future__ import annotations

import json
import os
import shutil
import warnings
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
import torch.distributed.checkpoint as dcp
from torch import Tensor, nn
from torch.distributed.checkpoint import HuggingFaceStorageReader, HuggingFaceStorageWriter

from headwise.atomic import fsync_dir, publish_dir, write_bytes_atomic
from headwise.errors import CheckpointError
from headwise.training.checkpoint import (
    CHECKPOINT_FILES,
    SHARDS,
    CheckpointInfo,
    checkpoint_dir,
)
from headwise.training.distributed import DistContext
from headwise.training.manifest import FORMAT as MANIFEST_FORMAT
from headwise.training.manifest import (
    MANIFEST,
    check_digests,
    read_listing,
    verify_manifest,
    write_manifest,
)
from headwise.training.safetensors_io import load_tensors, load_weights, save_tensors, sha256_file

FORMAT = "headwise-trainer-sharded/1"
FILES = ("trainer.json", "trainer.safetensors")
_IMPLEMENTATION_KEYS = ("fused", "foreach", "capturable", "differentiable")
_SCALAR_DTYPES = ("float32", "float64", "bfloat16", "float16", "int64")  # AdamW's ``step``


def is_sharded(path: Path) -> bool:
    """Whether the checkpoint directory ``path`` was written by ``save_sharded_checkpoint``."""
    return (Path(path) / SHARDS).is_dir()


def _model_state(model: nn.Module) -> dict[str, Tensor]:
    """``model.<name>`` -> tensor of the model's state, a tied weight once (by its first name:
    loading it restores both names, which share the tensor)."""
    unique = {n for n, _ in model.named_parameters()} | {n for n, _ in model.named_buffers()}
    return {f"model.{k}": v for k, v in model.state_dict().items() if k in unique}


def _named_params(model: nn.Module) -> dict[int, str]:
    return {id(p): n for n, p in model.named_parameters()}


def _optimizer_state(model: nn.Module, optimizer: torch.optim.Optimizer
                     ) -> tuple[dict[str, Tensor], list[dict[str, Any]], dict[str, Any]]:
    """AdamW's state as ``optimizer.<name>.<key>`` tensors, its groups and state keys as JSON."""
    names = _named_params(model)
    tensors: dict[str, Tensor] = {}
    groups: list[dict[str, Any]] = []
    keys: dict[str, dict[str, str | None]] = {}
    for g in optimizer.param_groups:
        d = {k: (list(v) if isinstance(v, tuple) else v) for k, v in g.items() if k != "params"}
        d["params"] = [names[id(p)] for p in g["params"]]
        groups.append(d)
        for p in g["params"]:
            for key, value in optimizer.state.get(p, {}).items():
                tensors[f"optimizer.{names[id(p)]}.{key}"] = value
                keys.setdefault(names[id(p)], {})[key] = (
                    None if value.shape == p.shape else str(value.dtype).removeprefix("torch."))
    return tensors, groups, keys


def save_sharded_checkpoint(out_dir: Path, step: int, model: nn.Module,
                            optimizer: torch.optim.Optimizer, ctx: DistContext, *,
                            data_generator: torch.Generator, torch_rng: list[Tensor],
                            objective_weights: Mapping[str, float], extra: Mapping[str, Any],
                            config: Mapping[str, Any], stopped: bool,
                            log: Mapping[str, Any] | None = None,
                            log_tensors: Mapping[str, Tensor] | None = None) -> Path:
    """Write ``out_dir/checkpoints/step_{step:07d}`` from every rank; returns its path.

    Every rank calls this at the same step (collective: Distributed Checkpoint plans the write
    together, then barriers). Rank 0 writes the JSON, the RNG states, the logging window
    (``log``, its tensors ``log.<name>`` in ``trainer.safetensors``) and the manifests.
    """
    final = checkpoint_dir(out_dir, step)
    tmp = final.with_name(f".tmp-{final.name}-sharded")
    if ctx.is_main:
        final.parent.mkdir(parents=True, exist_ok=True)
        shutil.rmtree(tmp, ignore_errors=True)
        (tmp / SHARDS).mkdir(parents=True)
    ctx.barrier()
    opt_tensors, groups, keys = _optimizer_state(model, optimizer)
    state = {**_model_state(model), **opt_tensors}
    dcp.save(state, storage_writer=HuggingFaceStorageWriter(str(tmp / SHARDS),
                                                            save_distributed=True))
    ctx.barrier()
    shard_files = sorted(p.name for p in (tmp / SHARDS).iterdir())
    mine = {n: sha256_file(tmp / SHARDS / n) for n in shard_files[ctx.rank::ctx.world_size]}
    digests = {k: v for part in ctx.gather(mine) for k, v in part.items()}
    if ctx.is_main:
        write_bytes_atomic(tmp / SHARDS / MANIFEST, json.dumps(  # hashed by every rank
            {"format": MANIFEST_FORMAT, "sha256": digests}, indent=1).encode())
        tensors = {"rng.data": data_generator.get_state(),
                   **{f"rng.torch.{r}": s for r, s in enumerate(torch_rng)},
                   **{f"log.{k}": v for k, v in (log_tensors or {}).items()}}
        meta = {"format": FORMAT, "step": step, "world_size": ctx.world_size,
                "param_groups": groups, "state_keys": keys,
                "objective_weights": dict(objective_weights), "extra": dict(extra),
                "config": dict(config), "stopped": stopped, "log": dict(log or {}),
                "sha256": {"trainer.safetensors": save_tensors(tensors,
                                                               tmp / "trainer.safetensors"),
                           f"{SHARDS}/manifest.json": sha256_file(tmp / SHARDS /
                                                                  "manifest.json")}}
        write_bytes_atomic(tmp / "trainer.json", json.dumps(meta, indent=1).encode())
        write_manifest(tmp, FILES)
        fsync_dir(tmp / SHARDS)
        fsync_dir(tmp)
        publish_dir(tmp, final)  # re-saving a step (after a resume) replaces it
    ctx.barrier()
    return final


def read_sharded_meta(path: Path) -> dict[str, Any]:
    """``trainer.json`` of a sharded checkpoint, after the checks every reader of it makes:
    both manifests' digests, and no file in ``shards/`` its manifest does not list.

    Raises:
        CheckpointError: naming the file that fails a check.
    """
    verify_manifest(path, FILES)
    meta_path = path / "trainer.json"
    try:
        meta = json.loads(meta_path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise CheckpointError(f"{meta_path}: not valid JSON ({e})") from None
    if not isinstance(meta, dict) or meta.get("format") != FORMAT:
        raise CheckpointError(f"{meta_path}: expected a {FORMAT!r} object")
    for key in ("step", "world_size", "param_groups", "state_keys", "objective_weights",
                "extra", "sha256"):
        if key not in meta:
            raise CheckpointError(f"{meta_path}: missing field {key!r}")
    digests = meta["sha256"]
    shard_manifest = f"{SHARDS}/manifest.json"
    if not isinstance(digests, dict) or shard_manifest not in digests:
        raise CheckpointError(f"{meta_path}: field 'sha256' does not record {shard_manifest}")
    check_digests(path, {shard_manifest: digests[shard_manifest]}, "trainer.json")
    listed = verify_manifest(path / SHARDS)
    _refuse_unlisted(path / SHARDS, listed)
    return meta


def _refuse_unlisted(shards: Path, listed: Mapping[str, str]) -> None:
    """Refuse a file in ``shards`` that its manifest does not list: Distributed Checkpoint's
    reader would load every ``*.safetensors`` there, so an added one would be adopted.

    Raises:
        CheckpointError: naming the first such file.
    """
    for entry in sorted(os.listdir(shards)):
        if entry != MANIFEST and entry not in listed:
            raise CheckpointError(f"{shards / entry}: not listed in {shards / MANIFEST}; "
                                  "expected only the shards this checkpoint wrote (a file "
                                  "added afterwards is never read)")


class _ListedFileSystem:
    """A view of Distributed Checkpoint's file system whose directory listing holds only the
    manifest's shards (the reader lists the folder to find them)."""

    def __init__(self, inner: Any, shards: Path, listed: Mapping[str, str]) -> None:
        self._inner = inner
        self._keep = {str(shards / name) for name in listed}

    def ls(self, path: Any) -> list[str]:
        return [f for f in self._inner.ls(path) if str(f) in self._keep]

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)


def _reader(shards: Path) -> HuggingFaceStorageReader:
    """A safetensors reader of ``shards`` restricted to the files its manifest lists."""
    reader = HuggingFaceStorageReader(str(shards))
    reader.fs = _ListedFileSystem(reader.fs, shards, read_listing(shards).sha256)  # type: ignore[assignment]
    return reader


def load_sharded_checkpoint(path: Path, model: nn.Module, optimizer: torch.optim.Optimizer,
                            ctx: DistContext) -> CheckpointInfo:
    """Load a sharded checkpoint into the sharded ``model`` and its ``optimizer`` (every rank).

    Raises:
        CheckpointError: a checkpoint that is not sharded, was written with another number of
            ranks, or is corrupt (naming the file), or whose optimizer state does not match.
    """
    path = Path(path)
    if not is_sharded(path):
        raise CheckpointError(f"{path}: written by a run with train.parallel none or ddp; "
                              "resume it with that setting, or start the fsdp run afresh")
    meta = read_sharded_meta(path)
    if meta["world_size"] != ctx.world_size:
        raise CheckpointError(f"{path}: written by {meta['world_size']} ranks, resumed on "
                              f"{ctx.world_size}; exact resume needs the same number of ranks")
    state: dict[str, Tensor] = _model_state(model)
    params = {n: p for n, p in model.named_parameters()}
    current = [[n for n in (_named_params(model)[id(p)] for p in g["params"])]
               for g in optimizer.param_groups]
    if [g["params"] for g in meta["param_groups"]] != current:
        raise CheckpointError(f"{path / 'trainer.json'}: optimizer parameter groups "
                              f"do not match this run's trainable parameters")
    on_device = any(g.get("fused") or g.get("capturable") for g in optimizer.param_groups)
    for name, keys in meta["state_keys"].items():
        if name not in params:
            raise CheckpointError(f"{path / 'trainer.json'}: optimizer state for {name!r}, "
                                  "which is not a parameter of this run")
        p = params[name]
        opt_state = optimizer.state[p]
        for key, dtype in keys.items():  # allocated here, filled by the load below
            if dtype is not None and dtype not in _SCALAR_DTYPES:
                raise CheckpointError(f"{path / 'trainer.json'}: optimizer state {name}.{key} "
                                      f"has dtype {str(dtype)[:40]!r}, expected one of "
                                      f"{list(_SCALAR_DTYPES)}")
            opt_state[key] = (torch.zeros_like(p) if dtype is None else torch.zeros(
                (), dtype=getattr(torch, dtype), device=p.device if on_device else "cpu"))
            state[f"optimizer.{name}.{key}"] = opt_state[key]
    try:
        dcp.load(state, storage_reader=_reader(path / SHARDS))
    except Exception as e:  # DCP raises its own CheckpointException wrapping each rank's error
        raise CheckpointError(f"{path / SHARDS}: cannot load the shards "
                              f"({str(e).splitlines()[0][:200]})") from None
    for saved, group in zip(meta["param_groups"], optimizer.param_groups, strict=True):
        group.update({k: (tuple(v) if k == "betas" else v) for k, v in saved.items()
                      if k != "params" and k not in _IMPLEMENTATION_KEYS})
    tensors, _ = load_tensors(path / "trainer.safetensors")
    n_torch = sum(k.startswith("rng.torch.") for k in tensors)
    return CheckpointInfo(
        path=path, step=int(meta["step"]), data_rng=tensors.get("rng.data"),
        torch_rng=[tensors[f"rng.torch.{r}"] for r in range(n_torch)],
        objective_weights={k: float(v) for k, v in meta["objective_weights"].items()},
        extra=dict(meta["extra"]), config=meta.get("config"),
        stopped=bool(meta.get("stopped", False)), log=dict(meta.get("log") or {}),
        log_tensors={k[len("log."):]: v for k, v in tensors.items() if k.startswith("log.")})


def load_sharded_weights(model: nn.Module, path: Path) -> None:
    """Load a sharded checkpoint's model weights into a plain ``model``, in one process.

    Raises:
        CheckpointError: a corrupt checkpoint (naming the file), or shards that do not hold
            the model's tensors.
    """
    path = Path(path)
    read_sharded_meta(path)
    state = _model_state(model)
    try:
        with warnings.catch_warnings():  # "assuming ... a single process": it is one
            warnings.filterwarnings("ignore", "torch.distributed is disabled", UserWarning)
            dcp.load(state, storage_reader=_reader(path / SHARDS),
                     no_dist=True)
    except Exception as e:
        raise CheckpointError(f"{path / SHARDS}: the shards do not hold this model's weights "
                              f"({str(e).splitlines()[0][:200]})") from None


def load_checkpoint_weights(model: nn.Module, path: Path) -> None:
    """Load a checkpoint's model weights into a plain ``model`` in this process, whether the
    checkpoint is one file or shards (``load_sharded_weights``).

    Raises:
        CheckpointError: naming the file that is missing, corrupt or does not fit the model.
    """
    if is_sharded(path):
        load_sharded_weights(model, path)
    else:
        verify_manifest(path, CHECKPOINT_FILES)
        load_weights(model, Path(path) / "model.safetensors")
