"""Global offsets of every rank's boxes: the layouts a resharding checkpoint rests on (no
processes: each rank's part is built here and the whole tensor rebuilt from the boxes)."""

from __future__ import annotations

import math

import pytest
import torch

from torch_plugin.checkpoint.layout import Chunks, Layout, flat_boxes
from torch_plugin.runtime.spmd_ops import _block


@pytest.mark.parametrize("shape", [(7,), (3, 5), (2, 3, 4), (4, 1, 6)])
def test_flat_ranges_are_contiguous_boxes_covering_exactly_the_range(shape) -> None:
    n = math.prod(shape)
    x = torch.arange(n).view(shape)
    for lo in range(n + 1):
        for hi in range(lo, n + 1):
            seen = []
            for start, off, size in flat_boxes(shape, lo, hi):
                box = x[tuple(slice(o, o + z) for o, z in zip(off, size, strict=True))]
                # contiguous in flat order: the box's elements are start, start+1, ...
                assert box.flatten().tolist() == list(range(start, start + box.numel()))
                seen += box.flatten().tolist()
            assert sorted(seen) == list(range(lo, hi))
            assert len(flat_boxes(shape, lo, hi)) <= 2 * len(shape)


def _rebuild(shape, parts):
    whole = torch.full(shape, -1.0)
    for chunks in parts:
        for off, view in chunks.pieces:
            idx = tuple(slice(o, o + z) for o, z in zip(off, view.shape, strict=True))
            assert (whole[idx] == -1).all(), "two boxes overlap"
            whole[idx] = view
    return whole


@pytest.mark.parametrize(
    ("shape", "spec", "world"),
    [
        ((8, 6), "S(0)", 2),
        ((8, 6), "S(1)", 3),
        ((12, 4), "S(0)x3", 2),  # packed q|k|v rows, each part split by heads
        ((4, 18), "S(1)x3", 3),
        ((10, 3), "S(0)", 4),  # uneven: 3, 3, 3, 1
        ((5, 4), "R", 2),
    ],
)
def test_blocks_and_zero2_shards_rebuild_the_whole_tensor(shape, spec, world) -> None:
    x = torch.randn(shape)
    kind, dim = spec[0], int(spec[2]) if spec[0] == "S" else -1
    sections = int(spec.split("x")[1]) if "x" in spec else 1
    blocks = [
        _block(x, dim, sections, world, r) if kind == "S" else x.clone() for r in range(world)
    ]
    layouts = [Layout(shape, spec, world, r) for r in range(world)]
    for r in range(world):
        assert layouts[r].block_shape() == tuple(blocks[r].shape)
    parts = [Chunks(shape, layouts[r], blocks[r]) for r in range(world)]
    if kind == "S":
        assert torch.equal(_rebuild(shape, parts), x)
    # ZeRO-2: each of dp=2 replicas holds a flat half of the same block.
    for r in range(world):
        flat = blocks[r].reshape(-1)
        half = -(-flat.numel() // 2)
        shards = [flat[:half], flat[half:]]
        lays = [
            Layout(shape, spec, world, r, (0, half)),
            Layout(shape, spec, world, r, (half, flat.numel())),
        ]
        got = [Chunks(shape, lay, s) for lay, s in zip(lays, shards, strict=True)]
        boxes = sorted((tuple(o), v.clone()) for c in got for o, v in c.pieces)
        want = sorted((tuple(o), v) for o, v in parts[r].pieces)
        # the flat shards cover this rank's block exactly
        assert sum(v.numel() for _, v in boxes) == sum(v.numel() for _, v in want)
        rebuilt = _rebuild(shape, got)
        mask = _rebuild(shape, [parts[r]]) != -1
        assert torch.equal(rebuilt[mask], x[mask]) and (rebuilt[~mask] == -1).all()


def test_views_write_through_to_the_local_tensor() -> None:
    local = torch.zeros(6, 4)
    chunks = Chunks((12, 4), Layout((12, 4), "S(0)x3", 2, 1), local)
    for _, view in chunks.pieces:
        view.fill_(1.0)
    assert (local == 1).all()
    with pytest.raises(ValueError, match="does not hold"):
        Chunks((12, 4), Layout((12, 4), "S(0)x3", 2, 1), torch.zeros(5, 4))
