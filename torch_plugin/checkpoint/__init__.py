"""Checkpoints of any layout: torch.distributed.checkpoint saves and loads with resharding
(dcp.py), the whole-tensor offsets of each rank's blocks (layout.py), and HF `save_pretrained`
directories read into and written from each rank's blocks (pretrained.py).

Models are read through the protocol in layout.py, not by class: this package sits below
sharding and pipeline, which use it."""

from .dcp import CheckpointError, SaveHandle, complete_checkpoints, load_checkpoint, save_checkpoint
from .pretrained import PretrainedError, load_pretrained, save_pretrained

__all__ = [
    "CheckpointError",
    "PretrainedError",
    "SaveHandle",
    "complete_checkpoints",
    "load_checkpoint",
    "load_pretrained",
    "save_checkpoint",
    "save_pretrained",
]
