"""Automatic sharding (Rhino/nnScaler on CBC): the planned, captured SPMD program a rank runs
(module.py), its capture and rewrite (capture.py), the plan's report (report.py), the sharded
optimizer with ZeRO (optim.py) and the gradient scaler that agrees across ranks."""

from .grad_scaler import ShardedGradScaler
from .module import ShardedModule, ShardedOptimizer, ShardingPlan, ShardOptions, shard_model

__all__ = [
    "ShardOptions",
    "ShardedGradScaler",
    "ShardedModule",
    "ShardedOptimizer",
    "ShardingPlan",
    "shard_model",
]
