"""Device choice: ``auto|cpu|cuda|cuda:N`` validated by name and resolved against this machine.

One definition for every entry point (``train.device`` in a spec, ``--device`` on the CLI,
``TrainConfig.device``): a name is checked for syntax where it is read (a spec written on a
laptop stays valid for a GPU machine), and for availability when a model is placed, with an
error naming the device and what this machine has.
"""

from __future__ import annotations

import os
import re

import torch

from headwise.errors import ConfigError

DEVICE_CHOICES = "auto, cpu, cuda or cuda:N"
_NAME = re.compile(r"^(auto|cpu|cuda(:\d+)?)$")


def check_device_name(name: object, field: str = "device") -> str:
    """``name`` if it is a valid device name, else a ``ConfigError`` naming ``field``.

    Raises:
        ConfigError: not a string of the form auto, cpu, cuda or cuda:N.
    """
    if not isinstance(name, str) or not _NAME.match(name):
        raise ConfigError(f"{field}: got {name!r}, expected {DEVICE_CHOICES}")
    return name


def resolve_device(name: str | torch.device = "auto", field: str = "device") -> torch.device:
    """The ``torch.device`` a name stands for on this machine.

    ``auto`` is ``cuda`` (the current CUDA device) when CUDA is available, else ``cpu``.

    Raises:
        ConfigError: an invalid name, CUDA asked for on a machine without it, or a CUDA index
            beyond the visible devices (the message names the device and what is available).
    """
    if isinstance(name, torch.device):
        name = str(name)
    check_device_name(name, field)
    if name == "auto":
        return torch.device("cuda") if torch.cuda.is_available() else torch.device("cpu")
    device = torch.device(name)
    if device.type == "cuda":
        if not torch.cuda.is_available():
            why = ("this torch build has no CUDA support" if torch.version.cuda is None
                   else "no CUDA device is visible")
            raise ConfigError(f"{field}: got {name!r}, but CUDA is not available on this machine "
                              f"({why}, torch {torch.__version__}); use cpu or auto")
        count = torch.cuda.device_count()
        if device.index is not None and device.index >= count:
            raise ConfigError(f"{field}: got {name!r}, but only {count} CUDA device(s) are "
                              f"visible (cuda:0-cuda:{count - 1})")
    return device


def model_device(model: torch.nn.Module) -> torch.device:
    """The device of the model's first parameter (``cpu`` for a model without parameters)."""
    param = next(model.parameters(), None)
    return param.device if param is not None else torch.device("cpu")


def place(model: torch.nn.Module, name: str | torch.device = "auto",
          field: str = "device") -> torch.device:
    """Move ``model`` to the device ``name`` resolves to and return that device.

    ``auto`` leaves a model that is already on a CUDA device where it is; plain ``cuda`` is
    the current CUDA device, or ``cuda:LOCAL_RANK`` under ``torchrun``.

    Raises:
        ConfigError: as ``resolve_device``.
    """
    current = model_device(model)
    if name == "auto" and current.type == "cuda":
        return current
    device = resolve_device(name, field)
    if device.type == "cuda" and device.index is None:
        # Under torchrun each process takes its own GPU (as ``distributed.setup`` does).
        local = os.environ.get("LOCAL_RANK") if int(os.environ.get("WORLD_SIZE", "1")) > 1 else None
        device = torch.device("cuda", int(local) if local is not None
                              else torch.cuda.current_device())
    model.to(device)
    return device
