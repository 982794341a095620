"""Distributed runtimes: automatic sharding, graph pipeline parallelism, cache parallelism."""

from .api import parallelize
from .cache_parallel import CacheParallel, cache_parallel
from .checkpoint import (
    CheckpointError,
    SaveHandle,
    complete_checkpoints,
    load_checkpoint,
    save_checkpoint,
)
from .grad_scaler import ShardedGradScaler
from .graph import TracedModel, cost_records, trace_module_level
from .kv_cache import CacheCapacityError, KVCacheManager
from .mesh import DeviceMesh
from .pipeline import PipelineParallel, PipelinePlan, plan_pipeline
from .pretrained import PretrainedError, load_pretrained, save_pretrained
from .sharding import ShardedModule, ShardedOptimizer, ShardingPlan, ShardOptions, shard_model

__all__ = [
    "CacheCapacityError",
    "CacheParallel",
    "CheckpointError",
    "SaveHandle",
    "complete_checkpoints",
    "load_checkpoint",
    "save_checkpoint",
    "DeviceMesh",
    "ShardedModule",
    "ShardedGradScaler",
    "ShardedOptimizer",
    "ShardingPlan",
    "ShardOptions",
    "shard_model",
    "KVCacheManager",
    "cache_parallel",
    "PipelineParallel",
    "PipelinePlan",
    "TracedModel",
    "cost_records",
    "parallelize",
    "PretrainedError",
    "load_pretrained",
    "save_pretrained",
    "plan_pipeline",
    "trace_module_level",
]
