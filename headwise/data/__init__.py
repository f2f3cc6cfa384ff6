"""Data: built-in seeded task generators, the user's files (text, pairs, mlm), task mixtures.

The shared vocabulary layout (``PAD``, ``BOS``, ``SEP``, ``QUERY``, then symbols from
``CONTENT``) is documented in ``headwise.data.batch``; each task's format in its module.
"""

from headwise.data.algorithmic import BracketDepthTask, KVRetrievalTask, ModularAdditionTask
from headwise.data.batch import BOS, CONTENT, IGNORE, PAD, QUERY, SEP, Batch
from headwise.data.mixture import Mixture
from headwise.data.mlm import MLMTask, add_mlm_head
from headwise.data.pairs import PairsTask
from headwise.data.registry import TASKS, build_task, task_arguments
from headwise.data.sequences import CopyTask, InductionTask, ReverseTask, SortTask
from headwise.data.task import Task, check_causal
from headwise.data.text import TextTask

__all__ = [
    "BOS", "CONTENT", "IGNORE", "PAD", "QUERY", "SEP", "TASKS", "Batch", "BracketDepthTask",
    "CopyTask", "InductionTask", "KVRetrievalTask", "MLMTask", "Mixture", "ModularAdditionTask",
    "PairsTask", "ReverseTask", "SortTask", "Task", "TextTask", "add_mlm_head", "build_task",
    "check_causal", "task_arguments",
]
