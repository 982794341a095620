"""`generate()` on a distributed training model (a sharded model, a pipeline): HF's generate on
a gathered copy of the whole model.

Training scripts sample from the model they train (an evaluation callback, a look at a few
completions every N steps) by calling `model.generate(...)`. The distributed forms run a program
planned for training calls; decoding calls the model once per token with a KV cache the program
does not take. So every rank gathers the current weights into a plain copy of the model (kept,
and gathered again only after some rank's weights changed) and runs HF's generate on it; rank
0's output is every rank's (sampling draws from each rank's own generator). The copy costs a
whole model's memory per rank: it is for the models a training run samples from, and
distributed decoding is cache parallelism's (torch_plugin.cache_parallel).
"""

from __future__ import annotations

import logging
from typing import Any

import torch
import torch.distributed as dist
import torch.nn as nn

log = logging.getLogger("torch_plugin")


class GeneratesOnGatheredCopy:
    """Mixin: `generate()` on a plain copy of the whole model. The class gives
    `_generation_parts()`: (the model's structure to copy, a function returning every
    parameter and buffer whole by name (a collective), this rank's tensors whose versions tell
    a change, the process group, what the model is)."""

    def _generation_parts(self) -> tuple[nn.Module | None, Any, list[torch.Tensor], Any, str]:
        raise NotImplementedError

    def generate(self, *args: Any, **kwargs: Any) -> Any:
        """HF's generate on the whole model with its current weights; every rank calls it
        (its first call, and the first after an optimizer step, gathers the weights) and gets
        rank 0's output."""
        template, whole, local, group, what = self._generation_parts()
        if template is None:
            raise AttributeError(
                f"torch_plugin: generate() on this {what} needs a copy of the model's "
                "structure, which could not be made (copy.deepcopy failed; see the log)"
            )
        if not hasattr(template, "generate"):
            raise AttributeError(
                f"torch_plugin: generate() needs an HF generation model (one with .generate); "
                f"this {what} was built from {type(template).__name__}"
            )
        device = next((t.device for t in local), torch.device("cpu"))
        versions = [t._version for t in local]
        cached = self.__dict__.get("_generation_copy")
        # On the model's device: NCCL reduces device tensors only.
        changed = torch.tensor([int(cached is None or cached[0] != versions)], device=device)
        if dist.is_initialized():
            dist.all_reduce(changed, op=dist.ReduceOp.MAX, group=group)
        if changed.item():
            model = cached[1] if cached is not None else _materialized(template, device)
            _load_whole(model, whole(), what, every=_on_meta(template))
            self.__dict__["_generation_copy"] = (versions, model)
            if cached is None:
                size = sum(p.numel() * p.element_size() for p in model.parameters())
                log.info(
                    "torch_plugin: generate() on the %s runs HF's generate on a gathered copy "
                    "of the whole model on every rank (%.1f MB each); distributed decoding is "
                    "torch_plugin.cache_parallel's",
                    what,
                    size / 2**20,
                )
        model = self.__dict__["_generation_copy"][1]
        model.train(bool(getattr(self, "training", False)))
        out = model.generate(*args, **kwargs)
        if dist.is_initialized() and dist.get_world_size(group) > 1:
            # Through host memory: a pickled device tensor would land on rank 0's device.
            box = [_mapped(out, lambda t: t.cpu())]
            src = 0 if group is None else dist.get_global_rank(group, 0)
            dist.broadcast_object_list(box, src=src, group=group)
            out = _mapped(box[0], lambda t: t.to(device))
        return out

    def _forget_generation_copy(self) -> None:
        """After a cast or a move (which keeps tensor versions): gathered again next time."""
        self.__dict__.pop("_generation_copy", None)


def _mapped(out: Any, fn: Any) -> Any:
    """generate's output (a tensor, or a ModelOutput / dict of them) with fn on each tensor."""
    if isinstance(out, torch.Tensor):
        return fn(out)
    if isinstance(out, dict):  # ModelOutput is an OrderedDict: its fields, in place
        for k, v in list(out.items()):
            out[k] = _mapped(v, fn)
        return out
    if isinstance(out, (tuple, list)):
        return type(out)(_mapped(v, fn) for v in out)
    return out


def _materialized(template: nn.Module, device: torch.device) -> nn.Module:
    """A copy of `template` with storage of its own (a structure on the meta device: empty
    tensors, every one of which the gathered tensors must then fill)."""
    import copy

    model = copy.deepcopy(template)
    if _on_meta(template):
        model = model.to_empty(device=device)
    for p in model.parameters():
        p.requires_grad_(False)
    return model


def _on_meta(model: nn.Module) -> bool:
    return any(t.is_meta for t in [*model.parameters(), *model.buffers()])


def _load_whole(model: nn.Module, tensors: dict[str, torch.Tensor], what: str, every: bool) -> None:
    """Copies each whole tensor into the parameter or buffer of its name (a tied weight under
    whichever of its names the gathered tensors use). `every`: each must be given (a copy of
    a meta structure); else a tensor no stage runs (an unused causal-mask buffer) keeps the
    model's own value."""
    names: dict[int, list[str]] = {}
    held: dict[int, torch.Tensor] = {}
    for name, t in [
        *model.named_parameters(remove_duplicate=False),
        *model.named_buffers(remove_duplicate=False),
    ]:
        names.setdefault(id(t), []).append(name)
        held[id(t)] = t
    missing = []
    with torch.no_grad():
        for key, t in held.items():
            found = next((n for n in names[key] if n in tensors), None)
            if found is not None:
                t.copy_(tensors[found])
            elif every:
                missing.append(names[key][0])
    if missing:
        raise RuntimeError(
            f"torch_plugin: generate() on the {what}: the gathered model has no tensor for "
            f"{missing[:4]}{' ...' if len(missing) > 4 else ''}"
        )
