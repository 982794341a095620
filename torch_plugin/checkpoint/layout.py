"""Where each rank's tensors sit in the whole ones: the global offsets that make a checkpoint
reshardable.

A `ShardedModule` block of spec `S(d)` is one box of the whole tensor; a strided `S(d)xN` block
(a packed q|k|v weight split per section) is N boxes; a ZeRO-2 optimizer shard is a flat range
of a block, which is a few boxes again. `Chunks` describes a local tensor as those boxes so that
torch.distributed.checkpoint records each with its offsets, and loads any other layout by
intersecting boxes (as it does for DTensor).
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn
from torch.distributed.checkpoint.metadata import (
    ChunkStorageMetadata,
    MetadataIndex,
    TensorProperties,
)
from torch.distributed.checkpoint.planner import TensorWriteData, WriteItem, WriteItemType

from ..runtime.spmd_ops import _parse


def rank_range(size: int, world: int, rank: int) -> tuple[int, int]:
    """[start, stop) of `rank`'s part when torch.chunk splits `size` into `world` parts."""
    step = -(-size // world) if size else 0
    start = min(size, rank * step)
    return start, min(size, start + step)


def flat_boxes(shape: tuple[int, ...], lo: int, hi: int) -> list[tuple[int, list[int], list[int]]]:
    """The flat range [lo, hi) of a row-major tensor of `shape` as boxes that are each contiguous
    in memory: [(flat start, offsets, sizes)], at most 2 per dimension."""
    if lo >= hi:
        return []
    if not shape:
        return [(0, [], [])]
    inner = math.prod(shape[1:])
    first, last = -(-lo // inner), hi // inner  # the whole rows [first, last)
    rest = list(shape[1:])

    def within(row: int, a: int, b: int) -> list[tuple[int, list[int], list[int]]]:
        return [
            (row * inner + s, [row, *o], [1, *z])
            for s, o, z in flat_boxes(tuple(rest), a - row * inner, b - row * inner)
        ]

    if first > last:  # lo and hi inside one row
        return within(lo // inner, lo, hi)
    out = within(first - 1, lo, first * inner) if lo < first * inner else []
    if last > first:
        out.append((first * inner, [first] + [0] * len(rest), [last - first, *rest]))
    if hi > last * inner:
        out += within(last, last * inner, hi)
    return out


@dataclass(frozen=True)
class Layout:
    """How a rank's tensor maps into the whole one of `shape`: the block of `spec` that rank
    `rank` of `world` holds, or (flat) the range [lo, hi) of that block's flattened elements."""

    shape: tuple[int, ...]
    spec: str = "R"
    world: int = 1
    rank: int = 0
    flat: tuple[int, int] | None = None

    def block_shape(self) -> tuple[int, ...]:
        kind, dim, sections = _parse(self.spec)
        if kind != "S":
            return self.shape
        a, b = rank_range(self.shape[dim] // sections, self.world, self.rank)
        shape = list(self.shape)
        shape[dim] = sections * (b - a)
        return tuple(shape)

    def boxes(self, local: torch.Tensor) -> list[tuple[list[int], torch.Tensor]]:
        """(global offsets, view of `local`) per box this rank holds; writing into a view writes
        `local`."""
        block = self.block_shape()
        if self.flat is None:
            expect = block
            rects = [([0] * len(block), local)]
        else:
            lo, hi = self.flat
            expect = (hi - lo,)
            rects = [
                (off, local.view(-1)[s - lo : s - lo + math.prod(z)].view(z))
                for s, off, z in flat_boxes(block, lo, hi)
            ]
        if tuple(local.shape) != tuple(expect):
            raise ValueError(
                f"a tensor of shape {tuple(local.shape)} does not hold the {self.spec} block "
                f"{expect} of {self.shape} (rank {self.rank} of {self.world})"
            )
        kind, dim, sections = _parse(self.spec)
        if kind == "P":
            raise ValueError("partial sums (spec P) are not state; only R and S(d) blocks are")
        if kind != "S":
            return [(o, v) for o, v in rects if v.numel()]
        section = self.shape[dim] // sections
        start, stop = rank_range(section, self.world, self.rank)
        width = stop - start
        out = []
        for off, view in rects:
            a, b = off[dim], off[dim] + view.shape[dim]
            for k in range(a // width if width else 0, -(-b // width) if width else 0):
                lo, hi = max(a, k * width), min(b, (k + 1) * width)
                if lo >= hi:
                    continue
                glob = list(off)
                glob[dim] = k * section + start + (lo - k * width)
                piece = view.narrow(dim, lo - a, hi - lo)
                if piece.numel():
                    out.append((glob, piece))
        return out


class Chunks:
    """A rank's part of a whole tensor as boxes with global offsets, in the protocol that
    torch.distributed.checkpoint's planners read (`__create_write_items__`,
    `__create_chunk_list__`, `size()`): saves write each box once, loads read each box from
    whatever boxes the checkpoint has."""

    def __init__(self, shape: tuple[int, ...], layout: Layout, local: torch.Tensor) -> None:
        self.shape = torch.Size(shape)
        self.local = local
        self.pieces = [(torch.Size(o), v) for o, v in layout.boxes(local)]
        self._by_offset = {o: v for o, v in self.pieces}

    def size(self) -> torch.Size:
        return self.shape

    def nbytes(self) -> int:
        return sum(v.numel() * v.element_size() for _, v in self.pieces)

    def __create_write_items__(self, fqn: str, obj: object) -> list[WriteItem]:
        return [
            WriteItem(
                index=MetadataIndex(fqn, off),
                type=WriteItemType.SHARD,
                tensor_data=TensorWriteData(
                    chunk=ChunkStorageMetadata(offsets=off, sizes=v.shape),
                    properties=TensorProperties.create_from_tensor(v),
                    size=self.shape,
                ),
            )
            for off, v in self.pieces
        ]

    def __create_chunk_list__(self) -> list[ChunkStorageMetadata]:
        return [ChunkStorageMetadata(offsets=off, sizes=v.shape) for off, v in self.pieces]

    def piece(self, offsets: torch.Size | None) -> torch.Tensor:
        try:
            return self._by_offset[torch.Size(offsets or [0] * len(self.shape))]
        except KeyError:
            raise ValueError(f"no box at offsets {offsets} in this rank's part") from None

    def staged(self) -> Chunks:
        """A copy whose boxes are contiguous CPU tensors: an async save writes these while
        training goes on changing the originals."""
        copy = object.__new__(Chunks)
        copy.shape, copy.local = self.shape, None
        copy.pieces = [(o, v.detach().to("cpu", copy=True).contiguous()) for o, v in self.pieces]
        copy._by_offset = dict(copy.pieces)
        return copy


# ---- what a model stores, as whole-tensor layouts ---------------------------------------------
# A distributed model (ShardedModule, PipelineParallel) says what it stores through
# `_stored_tensors()` (state name, this rank's tensor, its Layout; tied aliases once) and
# `_state_aliases()` (state name -> every state_dict key naming it), and gives its tensors whole
# through `full_state_dict()` or, one at a time, `_whole_tensors()` (in `_stored_tensors` order:
# a collective). Checkpoints and pretrained weights read models only through these, so they need
# not know the classes, and the classes need not import them.


def model_tensors(model: Any) -> Iterator[tuple[str, torch.Tensor, Layout]]:
    """(state name, this rank's tensor, its layout) per stored tensor, tied aliases once."""
    stored = getattr(model, "_stored_tensors", None)
    if stored is not None:
        yield from stored()
        return
    if not isinstance(model, nn.Module):
        raise TypeError(
            f"{type(model).__name__}: save_checkpoint takes a ShardedModule, a PipelineParallel "
            "or an nn.Module"
        )
    seen_ids: set[int] = set()
    for n, t in model.state_dict(keep_vars=True).items():
        if id(t) not in seen_ids and isinstance(t, torch.Tensor):
            seen_ids.add(id(t))
            yield n, t, Layout(tuple(t.shape))


def state_aliases(model: Any) -> dict[str, list[str]]:
    """Each stored tensor's name -> every state_dict key naming it (tied weights share one)."""
    aliases = getattr(model, "_state_aliases", None)
    if aliases is not None:
        return aliases()
    by_id: dict[int, list[str]] = defaultdict(list)
    for k, t in model.state_dict(keep_vars=True).items():
        by_id[id(t)].append(k)
    return {keys[0]: keys for keys in by_id.values()}  # model_tensors names the first key
