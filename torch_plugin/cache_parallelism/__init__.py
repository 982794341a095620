"""Cache parallelism: the KV cache split by sequence over ranks, for modules compiled with the
cache_parallel pass (module.py), for `transformers` decoders' `generate()` (hf.py), and with
Helix's tensor-parallel o_proj and MLP (helix.py). The cache itself is runtime/kv_cache.py."""

from .module import CacheParallel, cache_parallel

__all__ = ["CacheParallel", "cache_parallel"]
