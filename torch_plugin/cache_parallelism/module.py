"""Cache parallelism for LLM decoding: `torch_plugin.cache_parallel(model, mesh)`.

The C++ pass `cache_parallel` (csrc/passes/cache_parallel.cc) finds the model's attention over
its KV-cache buffers in the ATen graph and replaces it, cache write included, with one
`torch_plugin::cp_attention` call; that call runs on the rank-local, sequence-sharded cache of a
`KVCacheManager` (kv_cache.py) and merges partial softmax results across ranks. The pass also
picks the communication scheme from the cost model; with "gather_qkv" this wrapper runs the
rest of the model data parallel over the batch and gathers the outputs back.

Two ways in:
  cp_model = torch_plugin.cache_parallel(model, mesh)  # or @torch_plugin.cache_parallel(mesh)
  torch.compile(model, backend="torch_plugin",
                options={"passes": ["cache_parallel"], "mesh": mesh})  # rest replicated
"""

from __future__ import annotations

import functools
from typing import Any

import torch
import torch.nn as nn

from .. import _C
from ..runtime.kv_cache import KVCacheManager, group_of, manager_for


@torch.library.custom_op("torch_plugin::cp_attention", mutates_args=())
def cp_attention(
    q: torch.Tensor,
    k_new: torch.Tensor,
    v_new: torch.Tensor,
    start: int,
    end: int,
    causal: bool,
    scale: float,
    cache_k: str,
    cache_v: str,
    capacity: int,
    handle: int,
    scheme: str,
    seq_major: bool,
    mask: torch.Tensor | None = None,
    positions: torch.Tensor | None = None,
) -> torch.Tensor:
    """Appends k_new/v_new at [start, end) to the sharded caches and attends over [0, end).

    mask: the attention mask the model built ([..., s, end], bool or additive: padding,
    sliding windows), applied to the columns of the positions each rank holds. positions:
    where an index write (StaticCache's index_copy_) put the new entries, consecutive; then
    start is -1 and end is what attention reads (up to the whole capacity).
    Returns [B, H, s, D] like SDPA; laid out as [B, s, H, D] in memory when `seq_major`, as
    the SDPA kernel it replaces did (the graph may view it through a transpose).
    """
    del cache_v  # the manager keeps k and v of a layer together, under the k buffer's name
    out = manager_for(handle).attention(
        q, k_new, v_new, start, end, causal, scale, cache_k, capacity, scheme, mask, positions
    )
    return out.transpose(1, 2).contiguous().transpose(1, 2) if seq_major else out.contiguous()


@torch.library.custom_op("torch_plugin::cp_cache_placeholder", mutates_args=())
def cp_cache_placeholder(new: torch.Tensor, start: int) -> torch.Tensor:
    """What a cat-grown cache step returns for its cache: zeros broadcast from one element to
    [B, H, start + s, D] (no memory). The next step passes it back; the ranks hold the split
    cache, keyed by the argument's name."""
    b, h, s, d = new.shape
    return torch.zeros(1, dtype=new.dtype, device=new.device).expand(b, h, start + s, d)


@cp_cache_placeholder.register_fake
def _(new, start):  # type: ignore[no-untyped-def]
    b, h, s, d = new.shape
    return new.new_empty((b, h, start + s, d))


@cp_attention.register_fake
def _(
    q,
    k_new,
    v_new,
    start,
    end,
    causal,
    scale,
    cache_k,
    cache_v,
    capacity,
    handle,
    scheme,
    seq_major,
    mask=None,
    positions=None,
):  # type: ignore[no-untyped-def]
    return torch.empty_like(q)


class CacheParallel(nn.Module):
    """`module` with its KV caches split along the sequence over the ranks of `mesh`.

    Call it like the model: `cp(tokens, start_pos)` on every rank with the same full batch; it
    returns what the model returns (with the batch gathered back when the rest of the model ran
    data parallel). `plan` is the pass's decision; `manager.comm.bytes_sent` counts traffic.
    """

    def __init__(
        self,
        module: nn.Module,
        mesh: Any = None,
        *,
        scheme: str = "auto",
        device_profile: str = "cpu",
        block_size: int = 16,
        num_splits: int | None = None,
        context: int = 0,
    ):
        super().__init__()
        from ..backend import torch_plugin_backend
        from ..options import Options

        self.module = module
        self.manager = KVCacheManager(
            group_of(mesh),
            block_size=block_size,
            num_splits=num_splits,
            scheme=scheme,
            allow_batch_split=True,
            device_profile=device_profile,
            context=context,
        )
        opts = Options(passes=("cache_parallel",), on_error="raise", cache_parallel=self.manager)
        backend = functools.partial(torch_plugin_backend, options=opts)
        self._compiled = torch.compile(module, backend=backend, dynamic=True)

    @property
    def plan(self) -> _C.CacheParallelPlan | None:
        return self.manager.plan

    def forward(self, tokens: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
        m = self.manager
        batch = tokens.shape[0]
        if m.global_batch is not None and m.global_batch != batch and m.layers:
            m.layers.clear()  # a new batch of sequences: the old caches are meaningless
        m.global_batch = batch
        # Whether this call's requests are sliced over the ranks: a scheme="auto" model's first
        # call runs whole while its graph is planned (the plan may say gather_qkv).
        m.sliced = m.scheme == "gather_qkv" and m.world > 1
        if not m.sliced:
            return self._compiled(tokens, *args, **kwargs)
        if batch % m.world != 0:
            raise ValueError(
                f"torch_plugin cache_parallel: scheme gather_qkv runs the batch data parallel, "
                f"but batch {batch} is not divisible by {m.world} ranks; pass a divisible batch "
                "or scheme='gather_partials'"
            )

        def mine(x: Any) -> Any:  # this rank's requests of anything batch-major (masks)
            if isinstance(x, torch.Tensor) and x.dim() >= 1 and x.shape[0] == batch:
                return x.chunk(m.world)[m.rank]
            return x

        out = self._compiled(
            mine(tokens), *[mine(a) for a in args], **{k: mine(v) for k, v in kwargs.items()}
        )
        if not isinstance(out, torch.Tensor):
            raise TypeError(
                "torch_plugin cache_parallel with gather_qkv gathers a tensor output; the model "
                f"returned {type(out).__name__}. Use scheme='gather_partials'"
            )
        return m.comm.all_gather(out, "output").flatten(0, 1)


def cache_parallel(model: nn.Module | Any = None, mesh: Any = None, **kw: Any) -> Any:
    """`cache_parallel(model, mesh, ...)` -> CacheParallel, or for a `transformers` decoder an
    HFCacheParallel whose `generate()` splits the KV cache; `@cache_parallel(mesh, ...)` on an
    nn.Module class wraps every instance it builds."""
    if isinstance(model, nn.Module):
        from .hf import HFCacheParallel, is_hf_decoder

        if is_hf_decoder(model):
            extra = set(kw) - {"block_size", "num_splits", "helix"}
            if extra:
                raise TypeError(
                    f"cache_parallel on a transformers model takes block_size, num_splits and "
                    f"helix, not {sorted(extra)}"
                )
            return HFCacheParallel(model, mesh, **kw)
        return CacheParallel(model, mesh, **kw)
    if isinstance(model, type) and issubclass(model, nn.Module):
        raise TypeError(
            "use @torch_plugin.cache_parallel(mesh) (with parentheses) on a module class"
        )
    decorator_mesh = model if mesh is None else mesh

    def wrap(cls: type) -> Any:
        if not (isinstance(cls, type) and issubclass(cls, nn.Module)):
            raise TypeError(f"@cache_parallel decorates nn.Module classes, got {cls!r}")

        @functools.wraps(cls, updated=())
        def build(*args: Any, **kwargs: Any) -> CacheParallel:
            return CacheParallel(cls(*args, **kwargs), decorator_mesh, **kw)

        return build

    return wrap
