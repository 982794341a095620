"""`parallelize`: one call from a single-device model to its distributed form."""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.utils._pytree as pytree

from ..pipeline.parallel import PipelineParallel
from ..runtime.mesh import DeviceMesh
from ..sharding.module import ShardedModule, shard_model

log = logging.getLogger("torch_plugin")


def _uncompiled(model: nn.Module) -> nn.Module:
    """A model torch.compile'd before parallelize (torch.compile(model), or model.compile() in
    place), as many scripts do: the model itself, to be distributed (Dynamo's frame cannot be
    captured), with a warning that the compile is not applied. What parallelize returns runs
    its planned program as it is: a sharded model's program with its collectives (Dynamo over
    it makes no graph), a pipeline's stages op by op."""
    if isinstance(model, torch._dynamo.eval_frame.OptimizedModule):
        how = "torch.compile(model)"
        model = model._orig_mod
    elif getattr(model, "_compiled_call_impl", None) is not None:
        how = "model.compile()"
        model._compiled_call_impl = None
    else:
        return model
    log.warning(
        "torch_plugin: parallelize got a model compiled with %s; it distributes the model "
        "itself, and what it returns runs the planned program (sharded blocks and their "
        "collectives, or pipeline stages) uncompiled: torch.compile's settings are not applied",
        how,
    )
    return model


def _model_loss(output: Any, _target: Any) -> torch.Tensor:
    """The loss a model computed from its labels: `.loss` of a ModelOutput, ["loss"] of a
    dict, the first element of a tuple (HF's return_dict=False)."""
    loss = output.get("loss") if isinstance(output, dict) else getattr(output, "loss", None)
    if loss is None and isinstance(output, (tuple, list)) and output:
        loss = output[0]
    if not isinstance(loss, torch.Tensor) or loss.dim() != 0:
        raise TypeError(
            f"the model returned no scalar loss ({type(output).__name__}); pass loss_fn"
        )
    return loss


def parallelize(
    model: nn.Module | DeviceMesh | int | None = None,
    mesh: int | DeviceMesh | None = None,
    example_inputs: tuple[Any, ...] | dict[str, Any] | Callable[[nn.Module], Any] = (),
    *,
    strategy: str | None = None,
    constraints: dict[str, str] | None = None,
    memory_budget_gb: float | None = None,
    loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] | None = None,
    num_microbatches: int | None = None,
    **options: Any,
) -> PipelineParallel | ShardedModule:
    """One call from a single-device model to its distributed form (run under torchrun).

    strategy: "shard" (automatic tensor/data parallelism, the default when `mesh` is a
    DeviceMesh: returns a ShardedModule), "pipeline" / "gpp" (graph pipeline, the default
    otherwise), "spp" (sequential pipeline). For sharding, `constraints` pins specs ({"fc.weight":
    "S(0)"}) and `memory_budget_gb` bounds parameters (+ gradients and optimizer state) and the
    activations the forward keeps for the backward (at the example batch) per rank. For pipelines
    `mesh` is the number of ranks (the world by default); `num_microbatches` fixes one
    micro-batch size (mini-batch / n), by default the partitioner picks per-stage sizes; other
    options go to `PipelineParallel`.

    As a class decorator, `@torch_plugin.parallelize(mesh, example_inputs=fn, ...)` makes every
    instance the class builds its distributed form; `example_inputs` may be a function of the
    instance (its shapes often depend on the configuration).
    """
    if not isinstance(model, nn.Module):
        if isinstance(model, type):
            raise TypeError("use @torch_plugin.parallelize(mesh, ...) (with arguments) on a class")
        decorator_mesh = model if mesh is None else mesh
        settings = dict(
            strategy=strategy,
            constraints=constraints,
            memory_budget_gb=memory_budget_gb,
            loss_fn=loss_fn,
            num_microbatches=num_microbatches,
            **options,
        )

        def wrap(cls: type) -> Any:
            if not (isinstance(cls, type) and issubclass(cls, nn.Module)):
                raise TypeError(f"@parallelize decorates nn.Module classes, got {cls!r}")

            @functools.wraps(cls, updated=())
            def build(*args: Any, **kwargs: Any) -> Any:
                instance = cls(*args, **kwargs)
                inputs = example_inputs(instance) if callable(example_inputs) else example_inputs
                return parallelize(instance, decorator_mesh, inputs, **settings)

            return build

        return wrap
    model = _uncompiled(model)
    if callable(example_inputs):
        example_inputs = example_inputs(model)
    if strategy is None:
        strategy = "shard" if isinstance(mesh, DeviceMesh) else "pipeline"
    if strategy == "shard":
        if not isinstance(mesh, DeviceMesh):
            raise ValueError("strategy 'shard' needs a DeviceMesh (DeviceMesh.from_torchrun())")
        if loss_fn is not None or num_microbatches is not None:
            raise ValueError("loss_fn / num_microbatches are pipeline options, not sharding ones")
        # Only what was given: parallelize(..., options=ShardOptions(...)) keeps its own.
        given = {"constraints": constraints, "memory_budget_gb": memory_budget_gb}
        return shard_model(
            model,
            mesh,
            example_inputs,
            **{k: v for k, v in given.items() if v is not None},
            **options,
        )
    if constraints is not None or memory_budget_gb is not None:
        raise ValueError("constraints / memory_budget_gb apply to strategy 'shard'")
    if isinstance(mesh, DeviceMesh):
        mesh = mesh.size()
    kinds = {"pipeline": "gpp", "gpp": "gpp", "spp": "spp"}
    if strategy not in kinds:
        raise ValueError(f"unknown strategy {strategy!r}; valid: shard, {', '.join(kinds)}")
    if loss_fn is None:
        if not (isinstance(example_inputs, dict) and "labels" in example_inputs):
            raise ValueError(
                "parallelize needs loss_fn(output, target) for training, or keyword inputs "
                "with `labels` for a model that computes its own loss (HF models)"
            )
        loss_fn = _model_loss
    if dist.is_initialized() and mesh is not None and int(mesh) != dist.get_world_size():
        raise ValueError(
            f"mesh of {mesh} ranks but the world has {dist.get_world_size()}; launch with "
            f"torchrun --nproc-per-node {mesh}"
        )
    if num_microbatches is not None:
        flat, _ = pytree.tree_flatten(
            example_inputs if isinstance(example_inputs, dict) else tuple(example_inputs)
        )
        batch = next(int(x.shape[0]) for x in flat if isinstance(x, torch.Tensor) and x.dim())
        if num_microbatches <= 0 or batch % num_microbatches:
            raise ValueError(
                f"num_microbatches={num_microbatches} does not divide the batch of {batch}"
            )
        options["micro_batch_sizes"] = [batch // num_microbatches]
    return PipelineParallel(
        model, example_inputs, loss_fn=loss_fn, strategy=kinds[strategy], **options
    )
