"""The optimizer of a sharded model: ZeRO-1 (state sharded over a block's copies) and ZeRO-2
(gradient too, over dp), each step equal to one process's."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F

from ..runtime.collectives import Collectives

if TYPE_CHECKING:
    from .module import ShardedModule


class _Zero2Shard:
    """A ZeRO-2 block's flat 1/dp shard: `shard` is a Parameter viewing this dp rank's part of
    the flattened block (its update writes the block in place). A hook on the block reduce-
    scatters each accumulated gradient over dp into shard.grad and frees the whole one, so a
    rank keeps 1/dp of this block's gradient and optimizer state; `gather` rebuilds the block
    from every rank's updated shard after the step."""

    def __init__(
        self, param: nn.Parameter, comm: Collectives, name: str, syncing: Callable[[], bool]
    ) -> None:
        self.param, self.comm, self.name = param, comm, name
        self.syncing = syncing
        n = param.numel()
        self.chunk = -(-n // comm.world)  # ceil: the last rank's part is zero-padded
        lo = min(n, comm.rank * self.chunk)
        hi = min(n, lo + self.chunk)
        self.shard = nn.Parameter(param.detach().view(-1)[lo:hi])
        param.register_post_accumulate_grad_hook(self._reduce_scatter)

    def _padded(self, flat: torch.Tensor) -> torch.Tensor:
        extra = self.chunk * self.comm.world - flat.numel()
        return F.pad(flat, (0, extra)) if extra else flat

    def _reduce_scatter(self, param: torch.Tensor) -> None:
        if not self.syncing():  # no_sync(): the whole block's gradient accumulates here
            return
        grad = param.grad
        param.grad = None
        mine = self.comm.reduce_scatter(self._padded(grad.reshape(-1)), 0, "zero2_grad")
        mine = mine[: self.shard.numel()]
        self.shard.grad = mine if self.shard.grad is None else self.shard.grad + mine

    def gather(self) -> None:
        with torch.no_grad():
            part = self.shard.detach().reshape(-1)
            if part.numel() < self.chunk:  # the last ranks' parts are short (or empty)
                part = F.pad(part, (0, self.chunk - part.numel()))
            whole = self.comm.all_gather(part.contiguous(), "zero2_param")
            self.param.view(-1).copy_(whole.reshape(-1)[: self.param.numel()])


# Optimizers whose update of an element reads only that element's gradient and state: stepping
# a flat slice of a block is then stepping the block (ZeRO-2's shards need this).
_ELEMENTWISE_OPTIMIZERS = ("SGD", "Adam", "AdamW", "Adamax", "Adagrad", "RMSprop", "NAdam", "RAdam")


class ShardedOptimizer(torch.optim.Optimizer):
    """One step over a ShardedModule's blocks: a plain optimizer for the blocks whose state
    stays whole, one ZeroRedundancyOptimizer per group of ranks that share copies of the
    other blocks (the whole mesh for tp-replicated blocks, the dp axis for tp-sharded ones).
    The gradients are already summed over those copies when backward returns (the graph's
    grad_sync and the dp bucket), so each ZeRO rank steps its part of the blocks and broadcasts
    the result: ZeRO-1. ZeRO-2 blocks step their flat 1/dp shards (gradients reduce-scattered
    by the backward) with a plain `optimizer_class`, then all-gather the blocks; that needs an
    elementwise optimizer (SGD, Adam, AdamW, ...).

    It is a torch.optim.Optimizer whose `param_groups` are its parts' own group dicts, so LR
    schedulers (CosineAnnealingLR, LambdaLR, ...) drive every part; its state is checkpointed
    by torch_plugin.save_checkpoint (each rank its part), not by state_dict()."""

    def __init__(
        self,
        module: ShardedModule,
        optimizer_class: type[torch.optim.Optimizer],
        *,
        master_weights: bool = False,
        **defaults: Any,
    ) -> None:
        from torch.distributed.optim import ZeroRedundancyOptimizer

        # Master weights: float32 copies of the low-precision blocks are what the parts step.
        self.masters: list[tuple[nn.Parameter, nn.Parameter]] = []
        master_of: dict[int, nn.Parameter] = {}
        if master_weights:
            if module._zero2:
                raise NotImplementedError(
                    "master_weights with ZeRO-2 blocks: parallelize with zero=1 (ZeRO-1 parts "
                    "and plain parts keep float32 masters)"
                )
            for _, p, _ in module.named_local_parameters():
                if p.requires_grad and p.dtype in (torch.bfloat16, torch.float16):
                    m = nn.Parameter(p.detach().float().clone())
                    self.masters.append((p, m))
                    master_of[id(p)] = m

        whole_mesh = module.dp * module.world
        by_copies: dict[int, list[nn.Parameter]] = {}
        plain: list[nn.Parameter] = []
        self.zero2 = list(module._zero2.values())
        if self.zero2 and optimizer_class.__name__ not in _ELEMENTWISE_OPTIMIZERS:
            raise ValueError(
                f"{optimizer_class.__name__}: the plan uses ZeRO-2 for "
                f"{', '.join(z.name for z in self.zero2[:3])}..., whose flat shards need an "
                f"elementwise optimizer ({', '.join(_ELEMENTWISE_OPTIMIZERS)}); use one, or "
                "parallelize with zero=1"
            )
        for name, p, _ in module.named_local_parameters():
            if id(p) in module._zero2_ids:
                continue
            copies = module.plan.zero_copies.get(name)
            p = master_of.get(id(p), p)
            if copies is None or not p.requires_grad:
                plain.append(p)
            else:
                by_copies.setdefault(copies, []).append(p)
        self.optimizers: list[torch.optim.Optimizer] = []
        if plain:
            self.optimizers.append(optimizer_class(plain, **defaults))
        if self.zero2:
            self.optimizers.append(optimizer_class([z.shard for z in self.zero2], **defaults))
        for copies, params in sorted(by_copies.items()):
            if copies == whole_mesh:
                group = module.comm.group if module.dp == 1 else dist.group.WORLD
            elif copies == module.dp and module.dp > 1:
                group = module.dp_comm.group
            else:
                raise RuntimeError(
                    f"the plan shards optimizer state over {copies} copies, but this mesh has "
                    f"{module.dp} dp x {module.world} tp ranks; plan and mesh disagree"
                )
            self.optimizers.append(
                ZeroRedundancyOptimizer(
                    params, optimizer_class=optimizer_class, process_group=group, **defaults
                )
            )
        # The base class's bookkeeping (hooks, defaults) over every local block; then its
        # groups become the parts' (a scheduler's lr edits reach them).
        local = [master_of.get(id(p), p) for _, p, _ in module.named_local_parameters()]
        local += [z.shard for z in self.zero2]
        super().__init__(local, dict(defaults))
        self.param_groups = [g for o in self.optimizers for g in o.param_groups]

    def state_dict(self) -> dict[str, Any]:
        raise NotImplementedError(
            "a ShardedOptimizer's state is split over ranks: save it with "
            "torch_plugin.save_checkpoint(path, model, optimizer) (each rank writes its part; "
            "it loads into any mesh)"
        )

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        raise NotImplementedError(
            "load a ShardedOptimizer with torch_plugin.load_checkpoint(path, model, optimizer)"
        )

    def zero_grad(self, set_to_none: bool = True) -> None:
        for o in self.optimizers:
            o.zero_grad(set_to_none=set_to_none)
        for p, _ in self.masters:
            p.grad = None
        self._prepared = False

    def prepare_grads(self) -> None:
        """Copies the low-precision blocks' gradients into their float32 masters' (step does it
        too; ShardedGradScaler calls it so that unscaling runs on the masters)."""
        for p, m in self.masters:
            m.grad = None if p.grad is None else p.grad.float()
        self._prepared = True

    def step(self, closure: Any = None) -> None:  # type: ignore[override]
        if closure is not None:
            raise ValueError("ShardedOptimizer.step takes no closure (its parts step separately)")
        if not getattr(self, "_prepared", False):
            self.prepare_grads()
        self._prepared = False
        for o in self.optimizers:
            o.step()
        with torch.no_grad():
            for p, m in self.masters:
                p.copy_(m)
        for z in self.zero2:
            z.gather()

    def state_bytes(self) -> int:
        """Bytes of optimizer state this rank holds (for the ZeRO parts: its partition)."""
        total = 0
        for o in self.optimizers:
            inner = getattr(o, "optim", o)
            for st in inner.state.values():
                for v in st.values():
                    if isinstance(v, torch.Tensor) and v.dim() > 0:
                        total += v.numel() * v.element_size()
        return total
