"""Graph pipeline parallelism (GraphPipe): the plan from the C++ partitioner and the runtime
that executes it (parallel.py), the ATen-level capture that HF models are split at
(capture.py), and one process's random draws replayed per step (draws.py)."""

from .parallel import PipelineParallel, PipelinePlan, plan_pipeline

__all__ = ["PipelineParallel", "PipelinePlan", "plan_pipeline"]
