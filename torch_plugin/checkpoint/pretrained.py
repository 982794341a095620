"""Pretrained weights in and out of a distributed model, in HF's `save_pretrained` format.

    model = LlamaForCausalLM(config)                  # under torch.device("meta"): no memory
    dist_model = torch_plugin.parallelize(model, mesh, batch, pretrained="path/to/checkpoint")
    torch_plugin.load_pretrained(dist_model, "path")  # or into a model built already
    torch_plugin.save_pretrained(dist_model, "out")   # shards + index + config: from_pretrained

Loading reads, on every rank, only the boxes of each tensor that rank holds: safetensors maps the
file and a slice reads just its bytes, so no rank materialises the whole model (a `meta` model
is planned first, its blocks allocated at their local sizes). A single `model.safetensors` and a
sharded checkpoint with its `model.safetensors.index.json` both load; a tensor stored in another
dtype is cast to the block's. Tied weights (lm_head / embed_tokens) are read from whichever of
their keys the file holds.

Saving gathers one tensor at a time to rank 0, which writes shards of at most `max_shard_size`
bytes and the index, as `save_pretrained` lays them out, plus the model's config.
"""

from __future__ import annotations

import json
import logging
import math
import os
import time
from collections import defaultdict
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from .layout import model_tensors, state_aliases

log = logging.getLogger("torch_plugin.pretrained")

INDEX = "model.safetensors.index.json"
SINGLE = "model.safetensors"


class PretrainedError(ValueError):
    """A checkpoint directory that does not fit the model (names the keys and what to do)."""


def _weight_map(path: Path) -> dict[str, Path]:
    """Checkpoint key -> the safetensors file holding it."""
    if path.is_file():
        files = [path]
    elif (path / INDEX).exists():
        index = json.loads((path / INDEX).read_text())
        return {k: path / f for k, f in index["weight_map"].items()}
    elif (path / SINGLE).exists():
        files = [path / SINGLE]
    else:
        files = sorted(path.glob("*.safetensors"))
    if not files:
        raise PretrainedError(
            f"{path}: no {SINGLE}, {INDEX} or *.safetensors file; pass the directory "
            "save_pretrained wrote"
        )
    from safetensors import safe_open

    out: dict[str, Path] = {}
    for f in files:
        with safe_open(str(f), framework="pt") as handle:
            for k in handle.keys():  # noqa: SIM118 - safe_open has keys(), no iteration
                out[k] = f
    return out


def stored_names(model: nn.Module, path: str | os.PathLike) -> frozenset[str]:
    """The model's parameter and buffer names (as named_parameters / named_buffers give them)
    whose tensor the checkpoint at `path` holds under any of its state_dict keys."""
    stored = set(_weight_map(Path(path)))
    out = set()
    names = {id(t): n for n, t in [*model.named_parameters(), *model.named_buffers()]}
    for key, t in model.state_dict(keep_vars=True).items():
        if key in stored and id(t) in names:
            out.add(names[id(t)])
    return frozenset(out)


def load_pretrained(model: Any, path: str | os.PathLike, strict: bool = True) -> dict[str, Any]:
    """Reads a `save_pretrained` directory into `model` (a ShardedModule's blocks, a pipeline
    stage's parameters, or a plain module), each rank reading only what it holds. strict: every
    tensor of the model must be in the checkpoint (missing ones are named). Returns
    {"loaded", "missing", "unexpected", "seconds", "bytes_read"}."""
    from safetensors import safe_open

    t0 = time.perf_counter()
    path = Path(path)
    where = _weight_map(path)
    aliases = state_aliases(model)
    by_file: dict[Path, list[tuple[str, str, torch.Tensor, Any]]] = defaultdict(list)
    missing: list[str] = []
    used: set[str] = set()
    for name, local, layout in model_tensors(model):
        key = next((k for k in aliases.get(name, [name]) if k in where), None)
        if key is None:
            missing.append(name)
            continue
        used.update(k for k in aliases.get(name, [name]) if k in where)
        by_file[where[key]].append((name, key, local, layout))
    if missing and strict:
        raise PretrainedError(
            f"{path}: {len(missing)} tensor(s) of {type(model).__name__} are not in the "
            f"checkpoint: {missing[:8]}{' ...' if len(missing) > 8 else ''}; is it this model's "
            "checkpoint? (strict=False loads what is there)"
        )
    read = 0
    with torch.no_grad():
        for file, entries in by_file.items():
            with safe_open(str(file), framework="pt") as handle:
                for name, key, local, layout in entries:
                    tensor = handle.get_slice(key)
                    shape = tuple(tensor.get_shape())
                    if shape != tuple(layout.shape):
                        raise PretrainedError(
                            f"{file.name}: '{key}' has shape {list(shape)} but the model's "
                            f"'{name}' is {list(layout.shape)}; the checkpoint is of another "
                            "configuration"
                        )
                    for offsets, view in layout.boxes(local.detach()):
                        box = tuple(
                            slice(o, o + s) for o, s in zip(offsets, view.shape, strict=True)
                        )
                        piece = tensor[box] if box else tensor[...]
                        view.copy_(piece)
                        read += piece.numel() * piece.element_size()
    unexpected = sorted(set(where) - used)
    took = time.perf_counter() - t0
    log.info(
        "torch_plugin: loaded %d tensors (%.1f MB read by this rank) from %s in %.2f s",
        sum(len(v) for v in by_file.values()),
        read / 1e6,
        path,
        took,
    )
    return {
        "loaded": sum(len(v) for v in by_file.values()),
        "missing": missing,
        "unexpected": unexpected,
        "seconds": took,
        "bytes_read": read,
    }


def save_pretrained(
    model: Any, path: str | os.PathLike, max_shard_size: int = 2 * 1024**3, config: Any = None
) -> list[str]:
    """Writes the whole model as `save_pretrained` does: safetensors shards of at most
    `max_shard_size` bytes, their index, and the model's config (`config=` or the model's
    `.config`). Tensors are gathered to rank 0 one at a time and each shard is written as soon
    as it is complete, so rank 0 holds one shard, not the model. Tied aliases are stored once,
    under the first key. Every rank must call it; rank 0 writes. Returns the files written."""
    from safetensors.torch import save_file

    path = Path(path)
    rank = dist.get_rank() if dist.is_initialized() else 0
    aliases = state_aliases(model)
    # (name, whole shape, element size) per stored tensor, known before anything is gathered
    # (shard boundaries and file names come from the sizes), and the whole tensors in order: a
    # model that streams them (a ShardedModule, one collective each), one that gathers them at
    # once to rank 0 (a pipeline: every stage's), or a plain module's own.
    wholes: Iterator[torch.Tensor | None]
    streams = hasattr(model, "_whole_tensors")
    if not streams and not isinstance(model, nn.Module):
        full = model.full_state_dict(rank0_only=True)
        stored = [(n, tuple(t.shape), t.element_size()) for n, t in full.items()]
        wholes = iter(full.values())
    else:
        tensors = list(model_tensors(model))
        stored = [(n, tuple(lay.shape), t.element_size()) for n, t, lay in tensors]
        wholes = model._whole_tensors() if streams else (t.detach() for _, t, _ in tensors)
    shard_of: list[int] = []
    size = 0
    for _, shape, element_size in stored:
        nbytes = math.prod(shape) * element_size
        if shard_of and size + nbytes > max_shard_size:
            size = 0
            shard_of.append(shard_of[-1] + 1)
        else:
            shard_of.append(shard_of[-1] if shard_of else 0)
        size += nbytes
    n = shard_of[-1] + 1 if shard_of else 1
    names = [SINGLE] if n == 1 else [f"model-{i + 1:05d}-of-{n:05d}.safetensors" for i in range(n)]
    if rank == 0:
        path.mkdir(parents=True, exist_ok=True)
    shard: dict[str, torch.Tensor] = {}
    weight_map: dict[str, str] = {}
    total = 0
    for k, ((name, _, _), whole) in enumerate(zip(stored, wholes, strict=False)):
        if rank != 0 or whole is None:
            continue
        key = aliases.get(name, [name])[0]
        shard[key] = whole.contiguous().clone()
        total += whole.numel() * whole.element_size()
        if k + 1 == len(stored) or shard_of[k + 1] != shard_of[k]:
            fname = names[shard_of[k]]
            save_file(shard, str(path / fname), metadata={"format": "pt"})
            weight_map.update((key, fname) for key in shard)
            shard = {}
    files: list[str] = []
    if rank == 0:
        files = list(dict.fromkeys(weight_map.values()))
        if n > 1:
            index = {
                "metadata": {"total_size": total},
                "weight_map": dict(sorted(weight_map.items())),
            }
            (path / INDEX).write_text(json.dumps(index, indent=2) + "\n")
            files.append(INDEX)
        config = config if config is not None else getattr(model, "config", None)
        if config is not None and hasattr(config, "save_pretrained"):
            config.save_pretrained(str(path))
            files.append("config.json")
    if dist.is_initialized():
        dist.barrier()
    return files


def save_pretrained_as_hf(
    model: Any,
    save_directory: str | os.PathLike,
    *,
    max_shard_size: int | str = 2 * 1024**3,
    safe_serialization: bool = True,
    state_dict: Any = None,
    push_to_hub: bool = False,
    **kwargs: Any,
) -> list[str]:
    """`dist_model.save_pretrained(path)` as a loop calls it on an HF model: save_pretrained
    above, with HF's size strings ("5GB", "500MB", "2GiB") and the generation config too. HF's
    is_main_process / save_function are taken and left to it (rank 0 writes); what it cannot do
    is refused by name."""
    refused = {
        "state_dict": state_dict is not None,
        "safe_serialization=False": not safe_serialization,
        "push_to_hub": push_to_hub,
    }
    kwargs.pop("is_main_process", None)
    kwargs.pop("save_function", None)
    refused.update((k, True) for k in kwargs)
    if any(refused.values()):
        raise TypeError(
            f"torch_plugin save_pretrained: {', '.join(k for k, v in refused.items() if v)} "
            "not supported: it gathers the distributed model's own tensors into safetensors "
            "shards (call it on every rank; rank 0 writes)"
        )
    files = save_pretrained(model, save_directory, max_shard_size=_size_bytes(max_shard_size))
    generation = getattr(model, "generation_config", None)
    rank = dist.get_rank() if dist.is_initialized() else 0
    if rank == 0 and generation is not None and hasattr(generation, "save_pretrained"):
        generation.save_pretrained(str(save_directory))
        files.append("generation_config.json")
    return files


def _size_bytes(size: int | str) -> int:
    """HF's max_shard_size: bytes, or a string in (K|M|G)B (powers of 10) or (K|M|G)iB."""
    if isinstance(size, int):
        return size
    text = size.strip().upper()
    for unit, scale in (("GIB", 2**30), ("MIB", 2**20), ("KIB", 2**10)):
        if text.endswith(unit):
            return int(float(text[: -len(unit)]) * scale)
    for unit, scale in (("GB", 10**9), ("MB", 10**6), ("KB", 10**3)):
        if text.endswith(unit):
            return int(float(text[: -len(unit)]) * scale)
    raise ValueError(f"torch_plugin save_pretrained: max_shard_size {size!r} is not a size")


def count_parameters(
    named: Iterator[tuple[str, tuple[int, ...], bool]],
    embeddings: set[str],
    only_trainable: bool = False,
    exclude_embeddings: bool = False,
) -> int:
    """HF's num_parameters over (name, whole shape, requires_grad) of a distributed model's
    parameters; `embeddings`: the names of nn.Embedding weights."""
    return sum(
        math.prod(shape)
        for name, shape, trainable in named
        if (trainable or not only_trainable) and not (exclude_embeddings and name in embeddings)
    )


def embedding_weights(model: nn.Module) -> set[str]:
    return {
        f"{name}.{p}" if name else p
        for name, m in model.named_modules()
        if isinstance(m, nn.Embedding)
        for p, _ in m.named_parameters(recurse=False)
    }
