"""Distributed runtimes: graph pipeline parallelism (more strategies land here)."""

from .graph import TracedModel, cost_records, trace_module_level
from .pipeline import PipelineParallel, PipelinePlan, plan_pipeline

__all__ = [
    "PipelineParallel",
    "PipelinePlan",
    "TracedModel",
    "cost_records",
    "plan_pipeline",
    "trace_module_level",
]
