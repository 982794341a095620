"""Distributed runtimes: automatic sharding, graph pipeline parallelism, cache parallelism."""

from ..cache_parallelism.module import CacheParallel, cache_parallel
from ..checkpoint.dcp import (
    CheckpointError,
    SaveHandle,
    complete_checkpoints,
    load_checkpoint,
    save_checkpoint,
)
from ..checkpoint.pretrained import PretrainedError, load_pretrained, save_pretrained
from ..pipeline.parallel import PipelineParallel, PipelinePlan, plan_pipeline
from ..runtime.graph import TracedModel, cost_records, trace_module_level
from ..runtime.kv_cache import CacheCapacityError, KVCacheManager
from ..runtime.mesh import DeviceMesh
from ..sharding.grad_scaler import ShardedGradScaler
from ..sharding.module import (
    ShardedModule,
    ShardedOptimizer,
    ShardingPlan,
    ShardOptions,
    shard_model,
)
from .api import parallelize

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
