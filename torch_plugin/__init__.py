"""torch_plugin: a torch.compile backend whose decisions are made by C++ passes.

import torch, torch_plugin
fast = torch.compile(model, backend="torch_plugin")  # each graph on what measures fastest
exact = torch.compile(model, backend="torch_plugin", options={"passes": []})  # identity
"""

# ruff: noqa: E402
from __future__ import annotations

import torch  # noqa: F401  (loads libtorch before our extension, which links against it)

from ._compat import check_torch

# Before _C loads: a torch of another minor release fails inside the dynamic loader, naming
# nothing a user can act on. (Hence the imports below this call: E402.)
check_torch()

from . import _C, distributed, models, ops, placement, scale, schedule  # noqa: F401  (ops registers fake kernels, autograd)
from ._C import GraphError, PassError, PlanError
from .backend import register, torch_plugin_backend
from .distributed import (
    CacheParallel,
    CheckpointError,
    DeviceMesh,
    KVCacheManager,
    PipelineParallel,
    PipelinePlan,
    ShardedGradScaler,
    ShardedModule,
    ShardedOptimizer,
    cache_parallel,
    load_checkpoint,
    load_pretrained,
    parallelize,
    plan_pipeline,
    save_checkpoint,
    save_pretrained,
)
from .options import Options
from .placement import PlacedModule, place
from .scale import plan_at_scale
from .schedule import Schedule, ScheduleError, build, create_schedule

__all__ = [
    "CacheParallel",
    "CheckpointError",
    "DeviceMesh",
    "ShardedModule",
    "ShardedGradScaler",
    "ShardedOptimizer",
    "KVCacheManager",
    "GraphError",
    "Options",
    "cache_parallel",
    "PassError",
    "PipelineParallel",
    "PipelinePlan",
    "PlacedModule",
    "PlanError",
    "Schedule",
    "ScheduleError",
    "build",
    "create_schedule",
    "distributed",
    "models",
    "parallelize",
    "load_checkpoint",
    "load_pretrained",
    "save_pretrained",
    "place",
    "save_checkpoint",
    "placement",
    "plan_at_scale",
    "plan_pipeline",
    "scale",
    "torch_plugin_backend",
]
__version__ = "0.1.0"

register()
