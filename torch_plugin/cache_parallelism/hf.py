"""Cache parallelism for `transformers` decoders: `generate()` with the KV cache split by
sequence across ranks (issue 28).

    cp = torch_plugin.cache_parallel(hf_model, mesh)     # every rank, the same model
    tokens = cp.generate(**prompt, max_new_tokens=32)    # the same tokens on every rank

Built on HF's own hooks rather than a rewrite of the model's graph:
  - a `transformers` Cache of `ShardedLayer`s, which keep only this rank's blocks
    of positions (block j of `block_size` positions on rank j % world, as kv_cache.py deals
    them), so a rank holds 1/world of the cache plus at most one block;
  - an attention function registered in HF's AttentionInterface (and the original
    implementation's mask function in AttentionMaskInterface, always materialised) under a
    name of this wrapper's own, set on the model for the duration of a call. The prompt's
    attention (every rank has all its keys and values) runs the model's original attention
    function; each decode step attends over the rank's own entries with the split-KV kernel
    (`torch_plugin::split_kv_attention`, which skips a leading run of masked entries: left
    padding, keys out of a sliding window) and merges the ranks' partial results
    (`merge_attention_partials`), the same on every rank.

The rest of the model runs replicated: every rank computes the same logits, so greedy tokens
agree; for sampling, rank 0's RNG state is sent to the others when generate() starts.
"""

from __future__ import annotations

import functools
import itertools
import logging
import math
import sys
from typing import Any

import torch
import torch.distributed as dist
import torch.nn as nn

from ..ops import decode_partials
from ..runtime.collectives import Collectives
from ..runtime.kv_cache import BlockPlacement
from .helix import merge_head_group, shard_helix

log = logging.getLogger("torch_plugin.cache_parallel")
_NAMES = itertools.count()
_STAMPS = itertools.count()  # which cache layer was updated last (see _SplitSdpa)


def _calls_sdpa_itself(model: nn.Module) -> bool:
    """Whether the model's file calls F.scaled_dot_product_attention itself instead of through
    transformers' attention registry (Falcon): its attention is then intercepted at that call."""
    import inspect

    mod = sys.modules.get(type(model).__module__)
    try:
        src = inspect.getsource(mod) if mod is not None else ""
    except (OSError, TypeError):
        return False
    return "ALL_ATTENTION_FUNCTIONS" not in src and "scaled_dot_product_attention" in src


class _SplitSdpa(torch.overrides.TorchFunctionMode):
    """During generate() of a model that calls SDPA itself: an SDPA over the split cache layer
    updated last (its keys: this rank's entries) becomes the split attention, merged over the
    ranks; any other SDPA call runs as it is."""

    def __init__(self, owner: HFCacheParallel) -> None:
        super().__init__()
        self.owner = owner

    def __torch_function__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        if func is torch.nn.functional.scaled_dot_product_attention:
            out = self.owner._split_sdpa(*args, **kwargs)
            if out is not None:
                return out
        return func(*args, **kwargs)


def is_hf_decoder(model: Any) -> bool:
    return isinstance(model, nn.Module) and hasattr(model, "generate") and hasattr(model, "config")


def _layer_class() -> type:
    from transformers.cache_utils import CacheLayerMixin

    class ShardedLayer(CacheLayerMixin):
        """One attention layer's keys and values at this rank's positions, in position order
        ([batch, kv_heads, slots, head_dim]): physical slot i holds this rank's local slot
        `base + i`, slots past `n` are unused capacity. A sliding-window layer keeps only the
        positions later queries can still see (the last window - 1), dropping older ones as
        they leave the window (a shift of the held ones), as HF's sliding layers keep only the
        window."""

        is_compileable = False
        is_croppable = False

        def __init__(self, placement: BlockPlacement, capacity: int, sliding_window: int | None):
            super().__init__()
            self.placement = placement
            self.capacity = capacity  # global positions the storage is sized for
            self.sliding_window = sliding_window
            self.is_sliding = sliding_window is not None
            self.length = 0  # global positions written
            self.base = 0  # local slot of physical slot 0
            self.n = 0  # physical slots held
            self.full = True  # the last update gave attention every key (the prompt)
            self.stamp = -1  # when it was last updated (_STAMPS)

        def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
            b, h, _, d = key_states.shape
            p = self.placement
            span = self.capacity
            if self.sliding_window is not None:
                span = min(span, self.sliding_window - 1)
            # Any `span` consecutive positions hold at most this many of this rank's.
            slots = -(-span // (p.block_size * p.world)) * p.block_size + p.block_size
            self.keys = key_states.new_zeros((b, h, slots, d))
            self.values = value_states.new_zeros((b, h, slots, value_states.shape[-1]))
            self.device = key_states.device
            self.is_initialized = True

        def positions(self, device: torch.device) -> torch.Tensor:
            """Global positions of the held slots."""
            return self.placement.local_positions(self.n, device, start=self.base)

        def _drop_before(self, keep_from: int, at_least: int) -> None:
            """Drops held slots of positions before `keep_from` when there are `at_least`."""
            drop = min(self.n, max(0, self.placement.local_length(keep_from) - self.base))
            if drop < max(1, at_least):
                return
            rest = self.n - drop
            self.keys[:, :, :rest] = self.keys[:, :, drop : self.n].clone()
            self.values[:, :, :rest] = self.values[:, :, drop : self.n].clone()
            self.base += drop
            self.n = rest

        def update(
            self, key_states: torch.Tensor, value_states: torch.Tensor, *args: Any, **kwargs: Any
        ) -> tuple[torch.Tensor, torch.Tensor]:
            if not self.is_initialized:
                self.lazy_initialization(key_states, value_states)
            s = key_states.shape[-2]
            start, end = self.length, self.length + s
            pos = torch.arange(start, end, device=key_states.device)
            mine = self.placement.owned(pos)
            keep_from = 0
            if self.sliding_window is not None:
                # This step's first query (at `start`) still sees `window - 1` earlier keys;
                # of the new ones, later queries see only the last `window - 1`.
                keep_from = max(0, start - (self.sliding_window - 1))
                self._drop_before(keep_from, 1)
                mine &= pos >= max(0, end - (self.sliding_window - 1))
            count = int(mine.sum())
            if count and self.n == 0:  # nothing held: the first kept position sets the base
                self.base = self.placement.local_length(int(pos[mine][0]))
            if self.n + count > self.keys.shape[2]:
                self._drop_before(keep_from, 1)
                if self.n + count > self.keys.shape[2]:
                    self._grow(self.n + count)
            if count:
                self.keys[:, :, self.n : self.n + count] = key_states[:, :, mine]
                self.values[:, :, self.n : self.n + count] = value_states[:, :, mine]
            self.n += count
            self.length = end
            self.stamp = next(_STAMPS)
            self.full = start == 0
            if self.full:  # the prompt: attention sees all of it, on every rank
                return key_states, value_states
            return self.keys, self.values

        def _grow(self, need: int) -> None:
            """Past the capacity generate() announced: grow by half (logged)."""
            slots = max(need, self.keys.shape[2] + self.keys.shape[2] // 2)
            log.info(
                "torch_plugin cache_parallel: a cache layer grows past %d positions",
                self.capacity,
            )

            def grow(t: torch.Tensor) -> torch.Tensor:
                extra = t.new_zeros((*t.shape[:2], slots - t.shape[2], t.shape[3]))
                return torch.cat([t, extra], dim=2)

            self.keys, self.values = grow(self.keys), grow(self.values)

        def get_mask_sizes(self, query_length: int) -> tuple[int, int]:
            return self.length + query_length, 0  # masks over global positions

        def get_seq_length(self) -> int:
            return self.length

        def get_max_length(self) -> int:
            return -1

        def local_bytes(self) -> int:
            """Bytes of keys and values this rank holds (its written slots)."""
            if not self.is_initialized:
                return 0
            per_slot = (self.keys[:, :, :1].numel()) * self.keys.element_size()
            per_slot += self.values[:, :, :1].numel() * self.values.element_size()
            return self.n * per_slot

        def allocated_bytes(self) -> int:
            if not self.is_initialized:
                return 0
            return self.keys.nbytes + self.values.nbytes

    return ShardedLayer


def make_cache(config: Any, placement: BlockPlacement, capacity: int) -> Any:
    """A transformers Cache whose layers hold this rank's positions."""
    from transformers.cache_utils import Cache

    try:
        from transformers.cache_utils import get_layer_types_and_kwargs
    except ImportError:  # older transformers: every layer full attention
        get_layer_types_and_kwargs = None
    text = config.get_text_config(decoder=True) if hasattr(config, "get_text_config") else config
    layer_cls = _layer_class()
    if get_layer_types_and_kwargs is not None:
        types, kwargs = get_layer_types_and_kwargs(text)
        if isinstance(kwargs, dict):  # transformers < 5.2x: one dict for every layer
            kwargs = [kwargs] * len(types)
    else:
        types = ["full_attention"] * text.num_hidden_layers
        kwargs = [{}] * len(types)
    layers = []
    for i, (kind, kw) in enumerate(zip(types, kwargs, strict=True)):
        if kind not in ("full_attention", "sliding_attention", "chunked_attention"):
            raise NotImplementedError(
                f"torch_plugin cache_parallel: layer {i} is '{kind}' attention, whose cache is "
                "not a sequence of keys and values to split; only full and sliding-window "
                "attention layers can be cache-parallel"
            )
        if kind == "chunked_attention":
            raise NotImplementedError(
                f"torch_plugin cache_parallel: layer {i} is chunked attention (Llama-4 style); "
                "not supported yet"
            )
        window = kw.get("sliding_window") if kind == "sliding_attention" else None
        layers.append(layer_cls(placement, capacity, window))
    return Cache(layers=layers)


class HFCacheParallel(nn.Module):
    """An HF decoder whose `generate()` (and forward with a cache) keeps the KV cache split by
    sequence over the ranks of `mesh`. `.config`, `.generation_config` and the model's other
    attributes read through; `last_cache` is the cache of the last generate() call
    (`local_bytes()`: what this rank held)."""

    def __init__(
        self,
        model: nn.Module,
        mesh: Any = None,
        *,
        block_size: int = 16,
        num_splits: int | None = None,
        helix: bool = False,
    ) -> None:
        super().__init__()
        from transformers import AttentionInterface
        from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, AttentionMaskInterface

        from ..runtime.kv_cache import group_of

        if block_size < 1:
            raise ValueError(f"block_size must be >= 1, got {block_size}")
        group = group_of(mesh)
        if dist.is_available() and dist.is_initialized():
            world, rank = dist.get_world_size(group), dist.get_rank(group)
        else:
            world, rank = 1, 0
        self.module = model
        self.placement = BlockPlacement(world, rank, block_size)
        self.num_splits = num_splits
        self.comm = Collectives(group, world, rank, "torch_plugin cache_parallel")
        self.group = group
        self.original = model.config._attn_implementation or "eager"
        if self.original not in ("sdpa", "eager"):
            raise NotImplementedError(
                f"torch_plugin cache_parallel: the model uses '{self.original}' attention; load "
                "it with attn_implementation='sdpa' or 'eager'"
            )
        self.name = f"torch_plugin_cp_{next(_NAMES)}"
        AttentionInterface.register(self.name, self._attention)
        original_mask = ALL_MASK_ATTENTION_FUNCTIONS[self.original]
        # The mask over global positions is what each rank indexes by its own: never skipped.
        AttentionMaskInterface.register(self.name, functools.partial(_materialised, original_mask))
        # transformers 5.x renamed past_key_values to cache (the old name is deprecated).
        import inspect

        forward_params = inspect.signature(model.forward).parameters
        self._cache_kwarg = "cache" if "cache" in forward_params else "past_key_values"
        self.cache: Any = None
        self.last_cache: Any = None
        self.cb: Any = None  # continuous batching hooks while a manager runs (continuous.py)
        self.last_cb: Any = None
        self.decode_steps = 0
        self.attention_entered = False
        # A model that calls SDPA itself (not through the registry) decodes with its "sdpa"
        # path, whose SDPA calls over the split cache are intercepted.
        self.intercept = _calls_sdpa_itself(model)
        # Helix (cache_parallelism/helix.py): output projection and MLP tensor-parallel over the
        # same ranks, one all-to-all of the attention partials by head group in place of the
        # all-gather.
        self.helix: dict[str, int] | None = None
        if helix:
            self.helix = shard_helix(model, self.comm) if world > 1 else {}

    @property
    def config(self) -> Any:
        return self.module.config

    @property
    def generation_config(self) -> Any:
        return self.module.generation_config

    # ---- calls ---------------------------------------------------------------------------

    def _swap(self, name: str) -> None:
        setter = getattr(self.module, "set_attn_implementation", None)
        if setter is not None:
            try:
                setter(name)
                return
            except Exception:  # noqa: BLE001 - older versions validate names: set it directly
                pass
        self.module.config._attn_implementation = name

    def generate(self, *args: Any, **kwargs: Any) -> Any:
        if "past_key_values" in kwargs or "cache" in kwargs:
            raise ValueError(
                "torch_plugin cache_parallel: generate() brings its own split cache; do not pass "
                "past_key_values"
            )
        gen = self.module.generation_config
        beams = kwargs.get("num_beams", getattr(gen, "num_beams", 1)) or 1
        returns = kwargs.get("num_return_sequences", getattr(gen, "num_return_sequences", 1)) or 1
        if beams > 1 or returns > 1:
            raise NotImplementedError(
                "torch_plugin cache_parallel: beam search and num_return_sequences > 1 are not "
                "supported; use greedy decoding or sampling"
            )
        if kwargs.get("use_cache") is False:
            raise ValueError("torch_plugin cache_parallel: generate() needs use_cache=True")
        kwargs["use_cache"] = True  # a config trained with use_cache=False decodes with it
        ids = kwargs.get("input_ids", args[0] if args else None)
        prompt = int(ids.shape[-1]) if isinstance(ids, torch.Tensor) else 0
        new = kwargs.get("max_new_tokens") or getattr(gen, "max_new_tokens", None)
        if new is None:
            total = kwargs.get("max_length") or getattr(gen, "max_length", None) or 0
        else:
            total = prompt + int(new)
        self.cache = make_cache(self.module.config, self.placement, max(total, prompt + 1))
        self.comm.share_rng_state()  # sampling draws alike on every rank
        self.decode_steps = 0
        self.attention_entered = False
        self._swap("sdpa" if self.intercept else self.name)
        try:
            if self.intercept:
                with _SplitSdpa(self):
                    return self.module.generate(*args, **{self._cache_kwarg: self.cache}, **kwargs)
            return self.module.generate(*args, **{self._cache_kwarg: self.cache}, **kwargs)
        except Exception as e:
            split = any(not layer.full for layer in self.cache.layers)
            if not self.attention_entered and self.decode_steps == 0 and split:
                # The first decode step failed before our attention ran: the model attends
                # with its own code over what the cache returns (this rank's entries only).
                raise NotImplementedError(
                    f"torch_plugin cache_parallel: {type(self.module).__name__} computes its "
                    "attention itself instead of through transformers' AttentionInterface, so "
                    "it cannot attend over a split cache (it failed with "
                    f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}). Models "
                    "whose attention is registered (Llama, Mistral, Qwen, Gemma, Phi-3, "
                    "GPT-NeoX, OPT, GPT-2, Mixtral, ...) are supported"
                ) from e
            raise
        finally:
            self._swap(self.original)
            self.last_cache, self.cache = self.cache, None

    def generate_batch(self, inputs: list[list[int]], *args: Any, **kwargs: Any) -> Any:
        """transformers' `generate_batch` with the paged KV cache split by position over the
        ranks (`continuous.py`); `requests="dp"` (default) or `"replicated"` for the rest."""
        from .continuous import generate_batch

        return generate_batch(self, inputs, *args, **kwargs)

    def init_continuous_batching(self, *args: Any, **kwargs: Any) -> Any:
        """transformers' continuous batching manager, cache-parallel (`continuous.py`)."""
        from .continuous import init_manager

        return init_manager(self, *args, **kwargs)

    @property
    def _keeps_logits(self) -> bool:
        keeps = getattr(self.module, "_supports_logits_to_keep", None)
        return bool(callable(keeps) and keeps())

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        """The model's forward; with `past_key_values=` a cache from `make_cache` (or none),
        attention runs cache-parallel."""
        cache = kwargs.get("past_key_values", kwargs.get("cache"))
        if cache is None:
            return self.module(*args, **kwargs)
        self.cache = cache
        self._swap(self.name)
        try:
            return self.module(*args, **kwargs)
        finally:
            self._swap(self.original)

    # ---- attention -----------------------------------------------------------------------

    def _attention(
        self,
        module: nn.Module,
        query: torch.Tensor,
        key: torch.Tensor,
        value: torch.Tensor,
        attention_mask: torch.Tensor | None,
        dropout: float = 0.0,
        scaling: float | None = None,
        **kwargs: Any,
    ) -> tuple[torch.Tensor, None]:
        cb = self.cb
        if cb is not None and cb.step is not None:  # a continuous-batching step
            if dropout:
                raise NotImplementedError("torch_plugin cache_parallel: dropout in generation")
            out = cb.attention(
                query, key, value, scaling, kwargs.get("softcap"), kwargs.get("sliding_window")
            )
            return out, None
        # An error from here on is ours or the kernel's, not a model that bypasses this function.
        self.attention_entered = True
        cache = self.cache
        layer_idx = getattr(module, "layer_idx", None)
        if cache is None or layer_idx is None:
            raise RuntimeError(
                f"torch_plugin cache_parallel: {type(module).__name__} attends outside a "
                "cache-parallel call (no cache, or no layer_idx on the module)"
            )
        for unsupported in ("position_bias", "s_aux", "sinks"):
            if kwargs.get(unsupported) is not None:
                raise NotImplementedError(
                    f"torch_plugin cache_parallel: {type(module).__name__} passes "
                    f"`{unsupported}` to its attention, which the split attention does not take"
                )
        layer = cache.layers[layer_idx]
        if layer.full:
            return self._original(module)(
                module,
                query,
                key,
                value,
                attention_mask,
                dropout=dropout,
                scaling=scaling,
                **kwargs,
            )
        scale = scaling if scaling is not None else 1.0 / math.sqrt(query.shape[-1])
        out, lse = self._local(layer, query, attention_mask, scale, kwargs.get("softcap"))
        return self._merged(layer, query, out, lse).transpose(1, 2).contiguous(), None

    def _split_sdpa(
        self,
        query: torch.Tensor,
        key: torch.Tensor,
        value: torch.Tensor,
        attn_mask: torch.Tensor | None = None,
        dropout_p: float = 0.0,
        is_causal: bool = False,
        scale: float | None = None,
        enable_gqa: bool = False,
    ) -> torch.Tensor | None:
        """The split attention for an SDPA call a model makes itself over the cache layer it
        just updated; None when the call is not over a split layer (the prompt, other SDPAs)."""
        cache = self.cache
        if cache is None or not cache.layers:
            return None
        layer = max(cache.layers, key=lambda x: x.stamp)
        if layer.full or not layer.is_initialized or key.shape[-2] != layer.keys.shape[2]:
            return None
        self.attention_entered = True
        if dropout_p:
            raise NotImplementedError("torch_plugin cache_parallel: dropout in generate()")
        sc = scale if scale is not None else 1.0 / math.sqrt(query.shape[-1])
        out, lse = self._local(layer, query, attn_mask, sc, None, key, value)
        return self._merged(layer, query, out, lse)

    def _merged(
        self, layer: Any, query: torch.Tensor, out: torch.Tensor, lse: torch.Tensor
    ) -> torch.Tensor:
        """The ranks' partials merged: [B, H, q, D] in the query's dtype, as SDPA returns
        (Helix: only this rank's head group filled, the rest zero; its output projection's slice
        takes that group)."""
        cache = self.cache
        if self.helix:  # one all-to-all; this rank merges its head group
            out = merge_head_group(self.comm, out.float(), lse.float())
        elif self.placement.world > 1:
            outs = self.comm.all_gather(out.contiguous(), "partials")  # [world, B, H, q, D]
            lses = self.comm.all_gather(lse.contiguous(), "partials")
            out, _ = torch.ops.torch_plugin.merge_attention_partials(
                outs.movedim(0, -2).contiguous(), lses.movedim(0, -1).contiguous()
            )
        if layer is cache.layers[0]:
            self.decode_steps += 1
        return out.to(query.dtype)

    def _original(self, module: nn.Module) -> Any:
        from transformers import AttentionInterface

        if self.original == "eager":
            # Each model file has its own eager attention (softcapping, scaling conventions).
            fn = getattr(sys.modules[type(module).__module__], "eager_attention_forward", None)
            if fn is not None:
                return fn
        return AttentionInterface()[self.original]

    def _local(
        self,
        layer: Any,
        query: torch.Tensor,
        mask: torch.Tensor | None,
        scale: float,
        softcap: float | None,
        keys: torch.Tensor | None = None,
        values: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """This rank's partial attention over its entries: out [B, H, q, D] and lse [B, H, q]
        (float32; a row with no entry here has out 0 and lse -inf). keys / values: the layer's
        storage as the model passed it on (its own SDPA call); default the storage itself."""
        b, h, q_len, d = query.shape
        n = layer.n
        k = layer.keys if keys is None else keys
        v = layer.values if values is None else values
        positions = layer.positions(query.device)
        if mask is None:  # every earlier position (the queries are the newest)
            allowed = torch.ones((b, 1, q_len, n), dtype=torch.bool, device=query.device)
        elif mask.dtype == torch.bool:
            allowed = mask[..., positions]
        else:
            allowed = mask[..., positions] > torch.finfo(mask.dtype).min / 2
        if q_len == 1 and allowed.shape[1] == 1:
            row = allowed[:, 0, 0, :]  # [B, n]
            # The split-KV kernel attends to entries [start, n): the allowed ones must be a
            # suffix (padding and sliding windows cut a prefix; anything else takes the
            # general path below).
            trailing = row.flip(-1).to(torch.int64).cumprod(-1).sum(-1)
            if bool((row.sum(-1) == trailing).all()):
                starts = n - trailing
                lengths = torch.full((b,), n, dtype=torch.int64, device=query.device)
                out, lse = decode_partials(
                    query[:, :, 0].contiguous(),
                    k,
                    v,
                    lengths,
                    self.num_splits,
                    scale,
                    starts,
                    softcap or 0.0,
                    length=n,
                )
                return out.unsqueeze(2), lse.unsqueeze(2)
        group = h // k.shape[1]
        kk = k[:, :, :n].float().repeat_interleave(group, dim=1)
        vv = v[:, :, :n].float().repeat_interleave(group, dim=1)
        scores = torch.einsum("bhsd,bhnd->bhsn", query.float(), kk) * scale
        if softcap is not None:
            scores = torch.tanh(scores / softcap) * softcap
        scores = scores.masked_fill(~allowed, float("-inf"))
        lse = torch.logsumexp(scores, dim=-1)
        p = torch.exp(scores - lse.unsqueeze(-1)).nan_to_num(0.0)
        return torch.einsum("bhsn,bhnd->bhsd", p, vv), lse


def _materialised(original: Any, *args: Any, **kwargs: Any) -> Any:
    kwargs["allow_is_causal_skip"] = False
    return original(*args, **kwargs)
