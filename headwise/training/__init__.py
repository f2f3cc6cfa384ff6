"""Training: the ``train()`` loop, its config, checkpoints with exact resume, and DDP helpers."""

from headwise.training.checkpoint import (
    CheckpointInfo,
    checkpoint_dir,
    clean_checkpoints,
    latest_checkpoint,
    linked_checkpoints,
    list_checkpoints,
    load_checkpoint,
    save_checkpoint,
)
from headwise.training.config import TrainConfig
from headwise.training.device import resolve_device
from headwise.training.evaluate import EVAL_SEED_OFFSET, evaluate
from headwise.training.loop import LR_SCALE, TrainResult, TrainState, make_optimizer, train
from headwise.training.metrics import task_loss
from headwise.training.safetensors_io import load_weights, save_weights

__all__ = [
    "EVAL_SEED_OFFSET", "LR_SCALE", "CheckpointInfo", "TrainConfig", "TrainResult", "TrainState",
    "checkpoint_dir", "clean_checkpoints", "evaluate", "latest_checkpoint",
    "linked_checkpoints", "list_checkpoints", "load_checkpoint", "load_weights", "make_optimizer",
    "resolve_device", "save_checkpoint", "save_weights", "task_loss", "train",
]
