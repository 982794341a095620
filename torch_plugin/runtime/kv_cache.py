"""Sequence-sharded KV cache and the cross-rank attention merge of cache parallelism (issue 7).

Positions are dealt to ranks in blocks, round-robin: block j (positions [j*block, (j+1)*block))
lives on rank j % world, so whichever rank owns the tail takes the next append and every rank's
share differs from another's by at most one block as the sequence grows. On a rank, its blocks
are stored in order, so the entries below any `end` form a prefix of the local storage: decode
attention over them is one split-KV kernel call with a length, no gather.

`KVCacheManager.attention` is what the `torch_plugin::cp_attention` node calls (the C++ pass
`cache_parallel` puts it where the model's SDPA over its cache was): append the new keys and
values, attend locally (partial output + log-sum-exp), merge across ranks. Two schemes:
  gather_partials: every rank runs the whole batch (the rest of the model replicated);
                   all-gather the partials, merge.
  gather_qkv:      each rank runs 1/world of the batch (the rest data parallel); all-gather
                   q/k/v, attend for the whole batch, all-to-all the partials back to the rank
                   that owns each request, merge there (the thesis's scheme).
Every collective goes through `Collectives`, which counts the bytes it sends, so the modelled
volumes (cost/decode_model.h) can be checked against what actually moved.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
import threading
import weakref
from typing import Any

import torch
import torch.distributed as dist

from .. import _C
from ..ops import decode_partials
from .collectives import Collectives

_MANAGERS: weakref.WeakValueDictionary[int, KVCacheManager] = weakref.WeakValueDictionary()
_NEXT_HANDLE = itertools.count(1)
_LOCK = threading.Lock()


class CacheCapacityError(RuntimeError):
    """A write past the cache's capacity."""


def manager_for(handle: int) -> KVCacheManager:
    m = _MANAGERS.get(handle)
    if m is None:
        raise RuntimeError(
            f"torch_plugin: KV cache manager {handle} no longer exists; the cache-parallel "
            "model that owned it was deleted. Rebuild it with torch_plugin.cache_parallel(...)"
        )
    return m


@dataclasses.dataclass
class _LayerShard:
    k: torch.Tensor  # [batch, kv_heads, local_capacity, head_dim]
    v: torch.Tensor


class BlockPlacement:
    """Which rank holds which positions: block j of `block_size` positions on rank j % world;
    a rank's positions in order are its local slots 0, 1, 2, ..."""

    def __init__(self, world: int, rank: int, block_size: int) -> None:
        self.world, self.rank, self.block_size = world, rank, block_size

    def owner(self, pos: int) -> int:
        return (pos // self.block_size) % self.world

    def owned(self, positions: torch.Tensor) -> torch.Tensor:
        """Which of `positions` this rank holds."""
        return (positions // self.block_size) % self.world == self.rank

    def local_slots(self, positions: torch.Tensor) -> torch.Tensor:
        b, w = self.block_size, self.world
        return (positions // (b * w)) * b + positions % b

    def local_positions(
        self, n: int, device: torch.device | None = None, start: int = 0
    ) -> torch.Tensor:
        """Global positions of this rank's local slots [start, start + n)."""
        j = torch.arange(start, start + n, device=device)
        b, w = self.block_size, self.world
        return (j // b) * b * w + self.rank * b + j % b

    def local_length(self, end: int, rank: int | None = None) -> int:
        """How many of positions [0, end) this rank (or `rank`) holds."""
        r = self.rank if rank is None else rank
        b, w = self.block_size, self.world
        rounds, rem = divmod(end, b * w)
        return rounds * b + min(max(rem - r * b, 0), b)

    def local_capacity(self, capacity: int) -> int:
        blocks = math.ceil(capacity / self.block_size)
        return math.ceil(blocks / self.world) * self.block_size


class KVCacheManager(BlockPlacement):
    """The rank-local shards of every KV cache of one model, and the attention over them.

    group: the process group the cache is split over (None: the default group, or one
    process when torch.distributed is not initialised). block_size: tokens per block dealt
    round-robin. num_splits: split-KV chunks per rank for the local decode kernel (None: by
    length). scheme: "auto" (decided by the cost model in the C++ pass), "gather_partials"
    or "gather_qkv". allow_batch_split: whether the caller can run the rest of the model data
    parallel (the `cache_parallel` wrapper can; a plain torch.compile cannot).
    """

    def __init__(
        self,
        group: Any = None,
        *,
        block_size: int = 16,
        num_splits: int | None = None,
        scheme: str = "auto",
        allow_batch_split: bool = False,
        device_profile: str = "cpu",
        context: int = 0,
    ):
        if block_size < 1:
            raise ValueError(f"block_size must be >= 1, got {block_size}")
        if scheme not in ("auto", "gather_partials", "gather_qkv"):
            raise ValueError(
                f"unknown cache-parallel scheme {scheme!r}; valid: auto, gather_partials, "
                "gather_qkv"
            )
        if dist.is_available() and dist.is_initialized():
            world, rank = dist.get_world_size(group), dist.get_rank(group)
        else:
            world, rank = 1, 0
        BlockPlacement.__init__(self, world, rank, block_size)
        self.num_splits = num_splits
        self.requested_scheme = scheme
        self.scheme: str | None = None if scheme == "auto" else scheme
        self.allow_batch_split = allow_batch_split
        self.device_profile = device_profile
        self.context = context
        self.global_batch: int | None = None  # set per call by the wrapper
        self.sliced = False  # the wrapper sliced this call's batch over the ranks (gather_qkv)
        self.comm = Collectives(group, world, rank, "torch_plugin cache_parallel")
        self.layers: dict[str, _LayerShard] = {}
        self.filled: dict[str, int] = {}  # positions written, per cat-grown cache
        self.plan: Any = None  # the pass's CacheParallelPlan, once a graph had sites
        self.warned: set[str] = set()  # "nothing to split" messages already logged
        with _LOCK:
            self.handle = next(_NEXT_HANDLE)
            _MANAGERS[self.handle] = self

    def memory_bytes(self) -> int:
        return sum(s.k.nbytes + s.v.nbytes for s in self.layers.values())

    # ------------------------------------------------------------- cache storage

    def _shard(self, key: str, like: torch.Tensor, batch: int, capacity: int) -> _LayerShard:
        s = self.layers.get(key)
        slots = self.local_capacity(capacity)
        if s is not None and s.k.shape[0] >= batch and s.k.shape[2] >= slots:
            return s
        if s is not None:
            batch, slots = max(batch, s.k.shape[0]), max(slots, s.k.shape[2])
        shape = (batch, like.shape[1], slots, like.shape[3])
        k = torch.zeros(shape, dtype=like.dtype, device=like.device)
        v = torch.zeros_like(k)
        if s is not None:  # a bigger batch or a grown cache: keep what is cached
            k[: s.k.shape[0], :, : s.k.shape[2]] = s.k
            v[: s.v.shape[0], :, : s.v.shape[2]] = s.v
        s = _LayerShard(k, v)
        self.layers[key] = s
        return s

    def append(
        self, key: str, k_new: torch.Tensor, v_new: torch.Tensor, start: int, capacity: int
    ) -> _LayerShard:
        """Writes positions [start, start + s) of k_new/v_new [B, Hkv, s, D] this rank owns."""
        s_len = k_new.shape[2]
        end = start + s_len
        if capacity == -1:  # a cat-grown cache: room for twice what it holds, as it grows
            held = self.layers.get(key)
            have = 0 if held is None else held.k.shape[2] * self.world
            capacity = have if end <= have else max(end, 2 * have)
        if start < 0 or end > capacity:
            raise CacheCapacityError(
                f"torch_plugin: KV cache '{key}' holds {capacity} positions; writing "
                f"[{start}, {end}) exceeds it. Build the model with a larger cache "
                "(e.g. max_seq_len) or start a new sequence"
            )
        shard = self._shard(key, k_new, k_new.shape[0], capacity)
        pos = torch.arange(start, end, device=k_new.device)
        mine = self.owned(pos)
        if bool(mine.any()):
            slots = self.local_slots(pos[mine])
            b = k_new.shape[0]
            shard.k[:b, :, slots] = k_new[:, :, mine].to(shard.k.dtype)
            shard.v[:b, :, slots] = v_new[:, :, mine].to(shard.v.dtype)
        return shard

    # ------------------------------------------------------------- attention

    def _local_attention(
        self,
        q: torch.Tensor,
        shard: _LayerShard,
        start: int,
        end: int,
        causal: bool,
        scale: float,
        mask: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Partial attention over this rank's entries below `end`: out [B,Hq,s,D], lse [B,Hq,s].
        mask: the model's [..., s, end] mask (bool: True attends; float: added to the scores),
        of which this rank takes the columns of the positions it holds."""
        b, hq, s_len, d = q.shape
        n = self.local_length(end)
        k, v = shard.k[:b], shard.v[:b]
        if s_len == 1 and mask is None:
            lengths = torch.full((b,), n, dtype=torch.int64, device=q.device)
            out, lse = decode_partials(
                q[:, :, 0].contiguous(), k, v, lengths, self.num_splits, scale, length=n
            )
            return out.unsqueeze(2), lse.unsqueeze(2)
        # Several new tokens (prefill): the same partials, written out; keys are this rank's
        # entries, masked by their global positions.
        hkv = k.shape[1]
        kk = k[:, :, :n].float().repeat_interleave(hq // hkv, dim=1)
        vv = v[:, :, :n].float().repeat_interleave(hq // hkv, dim=1)
        sc = scale if scale > 0 else 1.0 / math.sqrt(d)
        scores = torch.einsum("bhsd,bhnd->bhsn", q.float(), kk) * sc
        if causal:
            kpos = self.local_positions(n, q.device)
            qpos = torch.arange(start, start + s_len, device=q.device)
            scores = scores.masked_fill(kpos[None, :] > qpos[:, None], float("-inf"))
        if mask is not None:
            cols = mask.index_select(-1, self.local_positions(n, mask.device)).to(q.device)
            if cols.dtype == torch.bool:
                scores = scores.masked_fill(~cols, float("-inf"))
            else:
                scores = scores + cols.float()
        lse = torch.logsumexp(scores, dim=-1)
        p = torch.exp(scores - lse.unsqueeze(-1)).nan_to_num(0.0)  # rows with no key: 0
        return torch.einsum("bhsn,bhnd->bhsd", p, vv), lse

    def attention(
        self,
        q: torch.Tensor,
        k_new: torch.Tensor,
        v_new: torch.Tensor,
        start: int,
        end: int,
        causal: bool,
        scale: float,
        cache_k: str,
        capacity: int,
        scheme: str,
        mask: torch.Tensor | None = None,
        positions: torch.Tensor | None = None,
    ) -> torch.Tensor:
        s_len = k_new.shape[2]
        if end == -1:  # a cat-grown cache: the step appends after the past it was given
            held = self.filled.get(cache_k, 0)
            if start not in (0, held):
                raise RuntimeError(
                    f"torch_plugin cp_attention ({cache_k}): the cache passed in holds {start} "
                    f"positions, the split cache {held}: pass back the cache this model "
                    "returned (its placeholder), or start a new sequence with an empty one"
                )
            end = start + s_len
            self.filled[cache_k] = end
        if positions is not None:  # an index write: where the new entries went
            start = int(positions[0]) if positions.numel() else 0
            want = torch.arange(start, start + s_len, device=positions.device)
            if positions.shape != (s_len,) or not torch.equal(positions, want):
                raise RuntimeError(
                    f"torch_plugin cp_attention ({cache_k}): the cache positions written "
                    f"({positions.tolist()[:8]}...) are not {s_len} consecutive positions; a "
                    "split cache appends in order (decode with cache_position = arange)"
                )
            if end < start + s_len:
                raise RuntimeError(
                    f"torch_plugin cp_attention ({cache_k}): attention reads [0, {end}) but "
                    f"the step wrote up to {start + s_len}"
                )
        elif end != start + s_len:
            raise RuntimeError(
                f"torch_plugin cp_attention ({cache_k}): end {end} != start {start} + "
                f"{s_len} new entries"
            )
        if mask is not None and mask.shape[-1] != end:
            raise RuntimeError(
                f"torch_plugin cp_attention ({cache_k}): the attention mask covers "
                f"{mask.shape[-1]} keys, attention reads {end}"
            )
        # The scheme is the plan's (the C++ pass chose it and wrote it into the node): the
        # batch this rank holds must be the one that scheme runs, not a scheme guessed from it.
        if scheme not in ("gather_partials", "gather_qkv"):
            raise RuntimeError(
                f"torch_plugin cp_attention ({cache_k}): the node carries scheme {scheme!r}; a "
                "planned graph carries 'gather_partials' or 'gather_qkv'"
            )
        # gather_qkv on a call the wrapper ran whole (scheme="auto": planned during the call)
        # runs unsplit: every rank holds every request.
        split = scheme == "gather_qkv" and self.world > 1 and self.sliced
        global_batch = self.global_batch or q.shape[0]
        local_batch = q.shape[0]
        expect = global_batch // self.world if split else global_batch
        if local_batch != expect or (split and global_batch % self.world):
            raise RuntimeError(
                f"torch_plugin cp_attention ({cache_k}): the plan's scheme {scheme} runs "
                + (
                    f"1/{self.world} of the batch per rank (the cache_parallel wrapper slices it)"
                    if split
                    else "the whole batch on every rank"
                )
                + f", but this rank holds {local_batch} of a batch of {global_batch}"
            )
        if split:  # the thesis's scheme: gather q/k/v of every rank's requests
            q = self.comm.all_gather(q, "qkv").flatten(0, 1)
            k_new = self.comm.all_gather(k_new, "qkv").flatten(0, 1)
            v_new = self.comm.all_gather(v_new, "qkv").flatten(0, 1)
            if mask is not None and mask.dim() == 4 and mask.shape[0] == local_batch:
                mask = self.comm.all_gather(mask.contiguous(), "qkv").flatten(0, 1)
        shard = self.append(cache_k, k_new, v_new, start, capacity)
        out, lse = self._local_attention(q, shard, start, end, causal, scale, mask)
        if self.world == 1:
            return out.to(q.dtype)
        if split:
            outs = self.comm.all_to_all(out, "partials")  # [world, b_local, Hq, s, D]
            lses = self.comm.all_to_all(lse, "partials")
        else:
            outs = self.comm.all_gather(out, "partials")  # [world, B, Hq, s, D]
            lses = self.comm.all_gather(lse, "partials")
        merged, _ = torch.ops.torch_plugin.merge_attention_partials(
            outs.movedim(0, -2).contiguous(), lses.movedim(0, -1).contiguous()
        )
        return merged.to(q.dtype)


def group_of(mesh: Any) -> Any:
    """The process group of a 1-D torch_plugin or torch DeviceMesh, a ProcessGroup, or None
    (the default group)."""
    from .mesh import DeviceMesh

    if mesh is None or isinstance(mesh, dist.ProcessGroup):
        return mesh
    if isinstance(mesh, DeviceMesh):
        if len(mesh.shape) != 1:
            raise ValueError(
                f"torch_plugin cache parallelism splits the KV cache over one axis; {mesh} has "
                f"{len(mesh.shape)}: pass mesh[{mesh.axis_names[-1]!r}] (the axis to split over)"
            )
        return mesh.group()
    get_group = getattr(mesh, "get_group", None)
    if get_group is not None:
        if getattr(mesh, "ndim", 1) != 1:
            raise ValueError(
                "torch_plugin cache parallelism splits the KV cache over a 1-D mesh; got a "
                f"{mesh.ndim}-D mesh. Pass mesh[...] for the axis to split over"
            )
        return get_group()
    raise TypeError(
        "torch_plugin: `mesh` must be a 1-D torch_plugin.DeviceMesh or torch DeviceMesh, a "
        "ProcessGroup or "
        f"None (the default group), got {type(mesh).__name__}"
    )


def pass_options(manager: KVCacheManager) -> _C.CacheParallelOptions:
    """The cache_parallel pass's options for this manager."""
    return _C.CacheParallelOptions(
        world=manager.world,
        handle=manager.handle,
        scheme=manager.scheme or manager.requested_scheme,
        allow_batch_split=manager.allow_batch_split,
        device=manager.device_profile,
        context=manager.context,
        batch=manager.global_batch or 0,
    )
