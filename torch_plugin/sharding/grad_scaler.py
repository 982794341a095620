"""fp16 loss scaling for sharded and pipelined models: torch's GradScaler whose inf/NaN check is
agreed over the ranks, as FSDP's ShardedGradScaler does.

Each rank unscales only the gradients it holds (its blocks, its stages), so one rank can see an
overflow the others do not; stepping on some ranks and skipping on others would leave the
replicas apart. `unscale_` therefore takes the maximum of every rank's found-inf flag before
`step` and `update` read it. With a ShardedOptimizer keeping float32 master weights, the
low-precision gradients are first copied into the masters' (float32) gradients, so the
unscale and the step run on the masters.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist


class ShardedGradScaler(torch.amp.GradScaler):
    """`torch.amp.GradScaler` for models from `torch_plugin.parallelize` (sharded or pipelined):
    written the usual way (`scaler.scale(loss).backward(); scaler.step(opt); scaler.update()`),
    every rank skips or takes each step together. process_group: the ranks that share the model
    (default: the whole world)."""

    def __init__(
        self, device: str = "cpu", *, process_group: dist.ProcessGroup | None = None, **kw: Any
    ) -> None:
        super().__init__(device, **kw)
        self.process_group = process_group

    def unscale_(self, optimizer: torch.optim.Optimizer) -> None:
        if not self._enabled:
            return
        prepare = getattr(optimizer, "prepare_grads", None)
        if prepare is not None:
            prepare()  # low-precision gradients into the float32 masters, unscaled there
        super().unscale_(optimizer)
        state = self._per_optimizer_states[id(optimizer)]
        found = state["found_inf_per_device"]
        flag = torch.zeros((), dtype=torch.float32, device=self._scale.device)
        for v in found.values():
            flag = torch.maximum(flag, v.to(flag.device))
        if dist.is_available() and dist.is_initialized():
            # Every rank calls this once per unscale_, whatever gradients it holds.
            dist.all_reduce(flag, op=dist.ReduceOp.MAX, group=self.process_group)
        if found:
            for v in found.values():
                v.copy_(flag.to(v.device))
        else:
            found[flag.device] = flag
