"""Distributed runtimes: graph pipeline parallelism (more strategies land here)."""

from .graph import TracedModel, cost_records, trace_module_level
from .pipeline import PipelineParallel, PipelinePlan, parallelize, plan_pipeline

__all__ = [
    "PipelineParallel",
    "PipelinePlan",
    "TracedModel",
    "cost_records",
    "parallelize",
    "plan_pipeline",
    "trace_module_level",
]
