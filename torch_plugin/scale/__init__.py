"""Training layouts for clusters this machine cannot run: the modelled step time of a 3-D
(+ context-parallel) layout of a decoder on a cluster profile, and the layout the planner picks.

    spec = torch_plugin.scale.transformer_spec(model)        # a HF decoder, built on "meta"
    plan = torch_plugin.plan_at_scale(model, world_size=16384, seq_len=8192, global_batch=2048)
    plan.layout, plan.estimate.step_time, plan.estimate.memory_bytes

Every decision is C++ (csrc/passes/layout_plan.cc); this package reads the model's sizes and
checks them against its real parameter count.
"""

from __future__ import annotations

from .plan import (
    cluster_profile,
    estimate_training_step,
    plan_at_scale,
    transformer_spec,
)

__all__ = ["cluster_profile", "estimate_training_step", "plan_at_scale", "transformer_spec"]
