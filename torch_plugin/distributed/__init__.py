"""Distributed runtimes: graph pipeline parallelism and cache parallelism."""

from .cache_parallel import CacheParallel, cache_parallel
from .graph import TracedModel, cost_records, trace_module_level
from .kv_cache import CacheCapacityError, KVCacheManager
from .pipeline import PipelineParallel, PipelinePlan, parallelize, plan_pipeline

__all__ = [
    "CacheCapacityError",
    "CacheParallel",
    "KVCacheManager",
    "cache_parallel",
    "PipelineParallel",
    "PipelinePlan",
    "TracedModel",
    "cost_records",
    "parallelize",
    "plan_pipeline",
    "trace_module_level",
]
