"""Cache parallelism under transformers' continuous batching (issue 41).

    cp = torch_plugin.cache_parallel(hf_model, mesh)
    out = cp.generate_batch(prompts, generation_config, max_new_tokens=64)  # request id -> output

Built on transformers' own engine (`ContinuousBatchingManager`: its scheduler, its paged-cache
bookkeeping, its request broadcast between ranks) through four hooks, nothing copied:
  - the manager's `DistributedHelper` sees this wrapper's group as its "TP" group: rank 0 takes
    the requests and broadcasts them, every rank schedules the same batches in the same order
    (what transformers does for tensor-parallel serving), with the KV heads left whole;
  - `PagedAttentionCache.update` writes and reads this rank's pages only. Page j of a request
    (positions [j*page, (j+1)*page)) lives on rank (j + the request's first block id) % world
    (paged.py: `PagedShard.owned`); transformers' block ids stay its bookkeeping, each owned
    block gets a slot in this rank's storage (`SplitCache`, one `PagedShard` per attention
    group), and the slot is returned when transformers frees the block. transformers' own cache
    tensor is never allocated (`MetaCacheTensor`);
  - the attention function (registered in AttentionInterface) attends every query of the batch
    over this rank's keys of its request (the split-KV kernel for decode batches; causal by
    position within each request otherwise) and merges the ranks' partials;
  - the model call: with `requests="dp"` (the thesis's choice) every rank runs the
    non-attention layers on 1/world of the batch's tokens; q, k and v are all-gathered before
    attention and the partials come back by one all-to-all, each rank merging its own rows.
    With Helix the rows stay replicated and the MLP and output projection are tensor-parallel
    (`helix.py`), the partials going to their head group by one all-to-all.

Sliding-window layers keep transformers' ring of pages per request, each ring page on one rank
(`PagedShard`), so a rank holds about 1/world of every request's window.

Not supported (refused with the reason): sampling, several return sequences, and the CPU swap
pool (`cpu_offload_space`): a preempted request is recomputed.
"""

from __future__ import annotations

import math
import types
from typing import Any

import torch
import torch.nn as nn

from ..ops import decode_partials
from ..runtime.kv_cache import CacheCapacityError
from .helix import merge_head_group
from .paged import Keys, MetaCacheTensor, SplitCache, Step


class GroupMesh:
    """The part of a DeviceMesh that transformers' DistributedHelper reads: one unnamed axis
    over `group` (it treats an unnamed mesh as its tensor-parallel mesh)."""

    mesh_dim_names = None
    ndim = 1

    def __init__(self, group: Any, world: int, rank: int) -> None:
        self._group, self._world, self._rank = group, world, rank

    def size(self, dim: int | None = None) -> int:
        return self._world

    def get_group(self, mesh_dim: Any = None) -> Any:
        import torch.distributed as dist

        return self._group if self._group is not None else dist.group.WORLD

    def get_local_rank(self, mesh_dim: Any = None) -> int:
        return self._rank


class ContinuousCP:
    """The hooks of one cache-parallel continuous-batching manager (see the module docstring)."""

    def __init__(self, owner: Any, requests: str) -> None:
        self.owner = owner
        self.comm = owner.comm
        self.world, self.rank = owner.comm.world, owner.comm.rank
        self.rows_split = requests == "dp" and self.world > 1
        self.shard: SplitCache | None = None
        self.step: Step | None = None
        self.group = 0  # the attention group of the layer being run (set by update)
        self.steps = 0
        self.kernel_calls = 0  # decode attentions run by the split-KV kernel
        self.tokens = 0  # the batches' tokens, all steps (the thesis's volumes scale with it)
        self.mask_allocated = False  # whether transformers built its packed-batch mask
        # dp rows send token ids, not logits, when transformers only takes their argmax.
        self.ids_only = False

    # ---- the cache -----------------------------------------------------------------------

    def install(self, cache: Any, offloading: Any) -> None:
        self.shard = SplitCache(cache, self.world, self.rank)
        cache.update = self.update

        # Preemption when the cache is full: transformers either copies a request's blocks to
        # a CPU swap pool (through its own cache tensor, which the split cache does not use)
        # or frees them and requeues the request (its blocks come back through pool.free_blocks,
        # which releases this rank's slots): only the second is possible here.
        if offloading is not None and getattr(offloading, "_cpu_pool", None) is not None:
            raise NotImplementedError(
                "torch_plugin cache_parallel.generate_batch: ContinuousBatchingConfig("
                "cpu_offload_space > 0) swaps cache blocks through transformers' own cache "
                "tensor, which the split cache replaces; leave cpu_offload_space at 0 (a "
                "preempted request is recomputed instead)"
            )

    def update(
        self, key: torch.Tensor, value: torch.Tensor, layer_idx: int, kwargs: dict[str, Any]
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Stores this rank's entries of the new keys and values, returns its keys and values
        for the batch: [1, kv_heads, n_local, D]."""
        split, step = self.shard, self.step
        assert split is not None and step is not None, "update outside a cache-parallel step"
        self.group = g = split.group_of[layer_idx]
        shard, keys = split.groups[g], step.groups[g]
        if self.rows_split:  # the batch's keys and values from every rank's rows
            both = torch.cat([key, value], dim=1)  # [1, 2*kvh, chunk, D]
            every = self.comm.all_gather(both, "cp_qkv")  # [world, 1, 2*kvh, chunk, D]
            both = torch.cat(list(every.unbind(0)), dim=2)[:, :, : step.total]
            key, value = both.chunk(2, dim=1)
        k_rows = key[0].transpose(0, 1)  # [T, kvh, D]
        v_rows = value[0].transpose(0, 1)
        ks, vs = shard.keys[layer_idx], shard.values[layer_idx]
        if keys.new_rows is not None:  # sliding: read the cached keys before the ring moves on
            assert keys.read_slots is not None and keys.order is not None
            k = torch.cat(
                [
                    ks.index_select(0, keys.read_slots),
                    k_rows.index_select(0, keys.new_rows).to(ks.dtype),
                ]
            ).index_select(0, keys.order)
            v = torch.cat(
                [
                    vs.index_select(0, keys.read_slots),
                    v_rows.index_select(0, keys.new_rows).to(vs.dtype),
                ]
            ).index_select(0, keys.order)
            ks.index_copy_(
                0, keys.write_slots, k_rows.index_select(0, keys.write_rows).to(ks.dtype)
            )
            vs.index_copy_(
                0, keys.write_slots, v_rows.index_select(0, keys.write_rows).to(vs.dtype)
            )
            return k.transpose(0, 1).unsqueeze(0), v.transpose(0, 1).unsqueeze(0)
        k, v = k_rows.index_select(0, keys.write_rows), v_rows.index_select(0, keys.write_rows)
        ks.index_copy_(0, keys.write_slots, k.to(ks.dtype))
        vs.index_copy_(0, keys.write_slots, v.to(vs.dtype))
        if keys.read_slots is not None:  # else the keys are the new ones just stored
            k, v = ks.index_select(0, keys.read_slots), vs.index_select(0, keys.read_slots)
        return k.transpose(0, 1).unsqueeze(0), v.transpose(0, 1).unsqueeze(0)

    # ---- attention -----------------------------------------------------------------------

    def attention(
        self,
        query: torch.Tensor,
        key: torch.Tensor,
        value: torch.Tensor,
        scaling: float | None,
        softcap: float | None,
        sliding_window: int | None = None,
    ) -> torch.Tensor:
        """[1, rows, H, D]: the merged attention of this rank's rows of the batch."""
        step = self.step
        assert step is not None
        keys = step.groups[self.group]
        if sliding_window is not None and sliding_window != keys.window:
            raise NotImplementedError(
                f"torch_plugin cache_parallel: a layer attends with a sliding window of "
                f"{sliding_window} over a cache group kept for {keys.window or 'full attention'}"
            )
        if self.rows_split:
            every = self.comm.all_gather(query, "cp_qkv")  # [world, 1, H, chunk, D]
            query = torch.cat(list(every.unbind(0)), dim=2)  # [1, H, world*chunk, D]
        h, rows, d = query.shape[1:]
        scale = scaling if scaling is not None else 1.0 / math.sqrt(d)
        if keys.decode is not None:
            out, lse = self._decode(query, key, value, keys, scale, softcap)
        else:
            out, lse = self._dense(query, key, value, step, keys, scale, softcap)
        merged = self._merge(out.unsqueeze(0), lse.unsqueeze(0), step)  # [1, H, r, D]
        return merged.to(query.dtype).transpose(1, 2).contiguous()

    def _dense(
        self,
        query: torch.Tensor,
        key: torch.Tensor,
        value: torch.Tensor,
        step: Step,
        keys: Keys,
        scale: float,
        softcap: float | None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Prefill (or mixed) batches: each request's queries over its local keys, causal by
        position and within the window if the layer has one (transformers' packed mask is
        block-diagonal: nothing outside a request's block is computed). out [H, rows, D] and
        lse [H, rows], float32."""
        h, rows, d = query.shape[1:]
        kvh = key.shape[1]
        group = h // kvh
        out = torch.zeros((h, rows, d), dtype=torch.float32, device=query.device)
        lse = torch.full((h, rows), float("-inf"), dtype=torch.float32, device=query.device)
        q_all, k_all, v_all = query[0].float(), key[0].float(), value[0].float()
        ends = torch.cumsum(keys.key_counts, 0).tolist()
        k0 = 0
        for i, k1 in enumerate(ends):
            q0, q1 = step.cu_q[i], step.cu_q[i + 1]
            if q1 == q0 or k1 == k0:
                k0 = k1
                continue
            nq, nk = q1 - q0, k1 - k0
            q = q_all[:, q0:q1].reshape(kvh, group * nq, d)
            scores = torch.matmul(q, k_all[:, k0:k1].transpose(1, 2)) * scale
            if softcap:
                scores = torch.tanh(scores / softcap) * softcap
            scores = scores.view(kvh, group, nq, nk)
            gap = step.query_positions[q0:q1][:, None] - keys.key_positions[k0:k1][None, :]
            hidden = gap < 0  # the future
            if keys.window is not None:
                hidden |= gap >= keys.window
            scores = scores.masked_fill(hidden, float("-inf"))
            m = torch.logsumexp(scores, dim=-1)  # [kvh, group, nq]
            p = torch.exp(scores - m.unsqueeze(-1).clamp(min=torch.finfo(torch.float32).min))
            o = torch.matmul(p.view(kvh, group * nq, nk), v_all[:, k0:k1])
            out[:, q0:q1] = o.view(h, nq, d)
            lse[:, q0:q1] = m.reshape(h, nq)
            k0 = k1
        return out, lse

    def _decode(
        self,
        query: torch.Tensor,
        key: torch.Tensor,
        value: torch.Tensor,
        keys: Keys,
        scale: float,
        softcap: float | None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """A decode batch: the split-KV kernel over each request's local entries, laid out
        [requests, kv_heads, longest, D] (one copy of what this rank reads, as transformers'
        own index_select makes of the whole cache). A sliding layer's keys are all in the
        window of the one query."""
        assert keys.decode is not None
        kept, place, counts, longest = keys.decode
        n_req = int(counts.numel())
        h, rows, d = query.shape[1:]
        kvh = key.shape[1]
        pk = key.new_zeros((n_req, longest, kvh, d))
        pv = value.new_zeros((n_req, longest, kvh, d))
        pk[kept, place] = key[0].transpose(0, 1)
        pv[kept, place] = value[0].transpose(0, 1)
        q = query[0, :, :n_req].transpose(0, 1).contiguous()  # [requests, H, D]
        out, lse = decode_partials(
            q,
            pk.transpose(1, 2).contiguous(),
            pv.transpose(1, 2).contiguous(),
            counts,
            None,
            scale,
            None,
            softcap or 0.0,
            length=longest,
        )
        self.kernel_calls += 1
        out, lse = out.transpose(0, 1), lse.transpose(0, 1)  # [H, requests, ...]
        if rows > n_req:  # padding rows of a dealt batch
            out = torch.cat([out, out.new_zeros((h, rows - n_req, d))], dim=1)
            lse = torch.cat([lse, lse.new_full((h, rows - n_req), float("-inf"))], dim=1)
        return out, lse

    def _merge(self, out: torch.Tensor, lse: torch.Tensor, step: Step) -> torch.Tensor:
        if self.world == 1:
            return out
        if self.owner.helix:
            return merge_head_group(self.comm, out, lse)
        if self.rows_split:  # rows [r*chunk, (r+1)*chunk) of every rank's partials to rank r
            b, h, rows, d = out.shape
            packed = torch.cat([out, lse.unsqueeze(-1)], dim=-1)[0]  # [H, rows, D + 1]
            packed = packed.view(h, self.world, step.chunk, d + 1).transpose(0, 1)
            got = self.comm.all_to_all(
                packed.reshape(self.world * h, step.chunk, d + 1), "cp_partials"
            )
            outs = got[..., :d].movedim(0, -2).unsqueeze(0).contiguous()  # [1, H, c, w, D]
            lses = got[..., d].movedim(0, -1).unsqueeze(0).contiguous()  # [1, H, c, w]
        else:
            outs = self.comm.all_gather(out.contiguous(), "cp_partials").movedim(0, -2).contiguous()
            lses = self.comm.all_gather(lse.contiguous(), "cp_partials").movedim(0, -1).contiguous()
        merged, _ = torch.ops.torch_plugin.merge_attention_partials(outs, lses)
        return merged

    # ---- the model call ------------------------------------------------------------------

    def call(self, model: nn.Module, batch: dict[str, Any]) -> Any:
        shard = self.shard
        assert shard is not None, "the batch processor was not hooked"
        self.step = step = shard.prepare(batch, self.rows_split, self.world, self.rank)
        self.steps += 1
        self.tokens += step.total
        try:
            if not self.rows_split:
                return model(**batch)
            return self._call_rows(model, batch, step)
        finally:
            self.step = None

    def _call_rows(self, model: nn.Module, batch: dict[str, Any], step: Step) -> Any:
        lo, chunk, total = step.lo, step.chunk, step.total
        call = dict(batch)
        for name in ("input_ids", "position_ids"):
            rows = batch[name][:, lo : min(lo + chunk, total)]
            if rows.shape[1] < chunk:  # the last rank's rows padded (their keys never stored)
                rows = torch.cat([rows, rows.new_zeros((1, chunk - rows.shape[1]))], dim=1)
            call[name] = rows
        # The rows whose logits are kept, in transformers' order (not sorted: rows of requests
        # still prefilling are zeros at the end); each comes from the rank that holds it.
        wanted = batch["logits_indices"].to(torch.long)
        owner = torch.div(wanted, chunk, rounding_mode="floor")
        onehot = torch.nn.functional.one_hot(owner, self.world)
        index = (onehot.cumsum(0) - 1).gather(1, owner.unsqueeze(1)).squeeze(1)
        width = max(int(onehot.sum(0).max()), 1) if wanted.numel() else 1
        mine = wanted[owner == self.rank] - lo
        mine = torch.cat([mine, mine.new_zeros(width - mine.numel())])
        if self.owner._keeps_logits:
            call["logits_to_keep"] = mine
            logits = model(**call).logits  # [1, width, V]
        else:
            call.pop("logits_to_keep", None)
            logits = model(**call).logits[:, mine]
        if self.ids_only:
            # Greedy with no logits processor and no log-probabilities: transformers only takes
            # the argmax of these rows, so each rank sends its rows' token ids, not their
            # logits (8 bytes a row instead of 4 x vocab), and the rows transformers reads are
            # 0 at that id and -inf elsewhere (the same argmax: bf16 -> f32 is exact).
            ids = self.comm.all_gather(logits[0].argmax(-1).contiguous(), "cp_logits")
            picked = ids[owner, index]  # [len(wanted)]
            out = logits.new_full((1, picked.numel(), logits.shape[-1]), float("-inf"))
            out[0, torch.arange(picked.numel()), picked] = 0
            return types.SimpleNamespace(logits=out)
        every = self.comm.all_gather(logits.contiguous(), "cp_logits")  # [w, 1, width, V]
        logits = every[owner, 0, index].unsqueeze(0)  # [1, len(wanted), V]
        return types.SimpleNamespace(logits=logits)


class CBModel:
    """What the manager runs in place of the model: the cache-parallel call, every other
    attribute the model's own."""

    def __init__(self, model: nn.Module, hooks: ContinuousCP) -> None:
        object.__setattr__(self, "_model", model)
        object.__setattr__(self, "_hooks", hooks)

    def __call__(self, **batch: Any) -> Any:
        return self._hooks.call(self._model, batch)

    def _supports_logits_to_keep(self) -> bool:
        # The rows call takes care of a model without it; a replicated call passes it on.
        return self._hooks.rows_split or self._hooks.owner._keeps_logits

    def __getattr__(self, name: str) -> Any:
        return getattr(self._model, name)


_MISSING = object()


def check_supported(gen: Any) -> None:
    """Refusals that need no rank to start: the same on every rank, raised before any
    collective."""
    if getattr(gen, "do_sample", False):
        raise NotImplementedError(
            "torch_plugin cache_parallel.generate_batch: sampling (do_sample=True) is not "
            "supported under continuous batching (every rank must draw the same tokens from its "
            "own copy of the logits); use greedy decoding, or generate() for sampling"
        )
    if (getattr(gen, "num_return_sequences", 1) or 1) > 1 or (
        getattr(gen, "num_beams", 1) or 1
    ) > 1:
        raise NotImplementedError(
            "torch_plugin cache_parallel.generate_batch: num_return_sequences > 1 and beam "
            "search copy cache blocks between requests, which the split cache does not do"
        )


def init_manager(
    owner: Any,
    generation_config: Any = None,
    continuous_batching_config: Any = None,
    workload_hints: Any = None,
    requests: str = "dp",
) -> Any:
    """transformers' ContinuousBatchingManager for `owner.module`, hooked for cache
    parallelism over `owner`'s ranks (the manager form: start(), add_request(), get_result(),
    stop())."""
    from transformers.generation.configuration_utils import ContinuousBatchingConfig

    if requests not in ("dp", "replicated"):
        raise ValueError(f"requests must be 'dp' or 'replicated', got {requests!r}")
    if owner.helix:
        requests = "replicated"  # Helix splits the MLP by columns over replicated rows
    model = owner.module
    gen = generation_config if generation_config is not None else model.generation_config
    check_supported(gen)
    cb = continuous_batching_config or ContinuousBatchingConfig()
    if getattr(model, "_cached_continuous_batching_manager", None) is not None:
        raise ValueError(
            "torch_plugin cache_parallel: the model holds a persistent continuous batching "
            "manager of its own; call destroy_cached_continuous_batching_manager() first"
        )
    world, rank = owner.comm.world, owner.comm.rank
    previous = model.__dict__.get("_device_mesh", _MISSING)
    model._device_mesh = GroupMesh(owner.group, world, rank) if world > 1 else None
    try:
        manager = type(model).init_continuous_batching(model, gen, cb, workload_hints)
    finally:
        if previous is _MISSING:
            model.__dict__.pop("_device_mesh", None)
        else:
            model._device_mesh = previous
    # The KV heads stay whole on every rank: the cache is split by position, not by head.
    manager.distributed_helper.tp_plan = {}
    hooks = ContinuousCP(owner, requests)
    create = manager._create_batch_processor

    def created() -> Any:
        # Our attention before the processor is built: transformers allocates a packed-batch
        # mask of max_batch_tokens x (cache reads + max_batch_tokens) only for sdpa / eager
        # (2.8 GB at its default cache size here), which the split attention never reads.
        owner._swap(owner.name)
        with MetaCacheTensor():
            processor = create()
        if processor.model_runner.pad_inputs:
            raise NotImplementedError(
                "torch_plugin cache_parallel.generate_batch: the ContinuousBatchingConfig asks "
                "for compiled or CUDA-graph batches, which transformers pads to fixed sizes; the "
                "split cache takes unpadded batches only (leave varlen_compile_config, "
                "decode_compile_config and use_cuda_graph unset)"
            )
        if getattr(processor.cache, "update", None) != hooks.update:
            hooks.install(processor.cache, getattr(processor, "offloading_manager", None))
        io = getattr(processor, "inputs_and_outputs", None)
        hooks.mask_allocated = getattr(io, "attention_mask", None) is not None
        runner = processor.model_runner
        processing = getattr(getattr(runner, "logit_processor", None), "do_processing", True)
        hooks.ids_only = not (
            processing
            or getattr(runner, "return_logprobs", True)
            or getattr(runner, "do_sample", True)
        )
        return processor

    manager._create_batch_processor = created
    manager.model = CBModel(model, hooks)
    manager.torch_plugin_cp = hooks
    owner.cb = hooks
    stop = manager.stop

    def stopped(block: bool = True, timeout: float | None = None, **kwargs: Any) -> None:
        try:
            stop(block=block, timeout=timeout, **kwargs)
        finally:
            if not manager.is_running():
                owner._swap(owner.original)
                if owner.cb is hooks:
                    owner.cb = None
                    owner.last_cb = hooks

    manager.stop = stopped
    return manager


def generate_batch(
    owner: Any,
    inputs: list[list[int]],
    generation_config: Any = None,
    continuous_batching_config: Any = None,
    progress_bar: bool = False,
    requests: str = "dp",
    **kwargs: Any,
) -> dict[str, Any]:
    """transformers' `generate_batch` (same arguments and return: request id to
    GenerationOutput), cache-parallel over `owner`'s ranks; every rank returns all outputs."""
    from tqdm import tqdm
    from transformers.generation.continuous_batching.model_runner import (
        infer_max_single_request_tokens,
    )
    from transformers.generation.continuous_batching.utils import WorkloadHints

    if not inputs:
        return {}
    gen = generation_config if generation_config is not None else owner.module.generation_config
    max_new = kwargs.pop("max_new_tokens", None)
    max_new = gen.max_new_tokens if max_new is None else max_new
    if kwargs:
        raise TypeError(f"generate_batch() got unexpected arguments {sorted(kwargs)}")
    hints = WorkloadHints(
        max_prompt_length=max(len(x) for x in inputs),
        max_generated_length=max_new or 0,
        num_requests=len(inputs),
    )
    manager = init_manager(owner, generation_config, continuous_batching_config, hints, requests)
    results: dict[str, Any] = {}
    try:
        manager.warmup()  # builds the batch processor and this rank's split cache
        cache = manager.batch_processor.cache
        room = infer_max_single_request_tokens(cache)
        for i, prompt in enumerate(inputs):
            if len(prompt) + (max_new or 0) > room:
                raise CacheCapacityError(
                    f"torch_plugin cache_parallel.generate_batch: request {i} needs "
                    f"{len(prompt)} prompt + {max_new} new tokens = "
                    f"{len(prompt) + (max_new or 0)} cache entries; the paged cache holds at most "
                    f"{room} for one request ({cache.num_blocks} blocks of "
                    f"{owner.cb.shard.page} tokens over {owner.comm.world} ranks). Pass "
                    "ContinuousBatchingConfig(num_blocks=...) with more blocks"
                )
        manager.start()
        ids = manager.add_requests(inputs, max_new_tokens=max_new)
        with tqdm(total=len(ids), disable=not progress_bar, unit="request") as bar:
            while len(results) < len(ids):
                out = manager.get_result(timeout=1)
                if out is None:
                    if not manager.is_running():
                        break
                    continue
                if out.is_finished():
                    results[out.request_id] = out
                    bar.update(1)
    finally:
        manager.stop(block=True, timeout=30)
        manager.destroy()
    failed = {k: v.error for k, v in results.items() if v.error is not None}
    missing = [k for k in ids if k not in results]
    if failed or missing:
        first = next(iter(failed.values()), "the generation loop stopped")
        raise RuntimeError(
            f"torch_plugin cache_parallel.generate_batch: {len(failed)} requests failed and "
            f"{len(missing)} never finished on rank {owner.comm.rank}: {first}"
        )
    return {k: results[k] for k in ids}
