"""This rank's part of transformers' paged KV cache under cache parallelism (issue 41): which
pages it owns, where they live in its storage, and per step which keys it stores and attends.

transformers' allocators keep their block ids and bookkeeping; `SplitCache` hooks their pool so
each block this rank owns gets a slot in its own storage (one `PagedShard` per allocator: full
attention, or sliding-window attention kept as a ring of pages), and `Step`/`Keys` say, for one
batch, which new tokens are stored here and which keys each request attends. Used by
continuous.py's hooks.
"""

from __future__ import annotations

from typing import Any

import torch


class Step:
    """One batch's split: how the rows of a `requests="dp"` call are dealt, each request's
    queries, and per attention group (full or sliding-window layers) the keys this rank stores
    and attends (`Keys`)."""

    def __init__(self, total: int, chunk: int, lo: int) -> None:
        self.total, self.chunk, self.lo = total, chunk, lo
        self.cu_q: list[int] = []  # each request's query rows
        self.query_positions = torch.empty(0, dtype=torch.long)
        self.groups: dict[int, Keys] = {}  # by transformers' allocator index


class Keys:
    """One attention group's part of a step."""

    def __init__(self, window: int | None) -> None:
        self.window = window  # sliding window (keys at positions in (q - window, q]) or None
        self.write_rows = torch.empty(0, dtype=torch.long)  # rows of the batch stored here
        self.write_slots = torch.empty(0, dtype=torch.long)  # their rows in local storage
        # Rows in local storage of the cached keys read. Full attention: None when the keys
        # are the new ones stored here (nothing cached is read); else every key, the new ones
        # included (written first). Sliding: the cached keys only, read before the new ones
        # overwrite their ring slots; the new keys attended here are `new_rows` of the batch,
        # and `order` puts [cached; new] in request order.
        self.read_slots: torch.Tensor | None = None
        self.new_rows: torch.Tensor | None = None
        self.order: torch.Tensor | None = None
        # A decode batch (one query per request, the request's newest token): the local keys'
        # requests and places in a padded [requests, longest] layout, and each one's count.
        self.decode: tuple[torch.Tensor, torch.Tensor, torch.Tensor, int] | None = None
        # The positions and requests of the local keys (grouped by request, in order): causal
        # (and windowed) attention within each request.
        self.key_positions = torch.empty(0, dtype=torch.long)
        self.key_counts = torch.empty(0, dtype=torch.long)

    def set_keys(
        self, requests: torch.Tensor, positions: torch.Tensor, n: int, decode: bool
    ) -> None:
        """The local keys' requests (ascending) and positions."""
        self.key_positions = positions
        self.key_counts = torch.bincount(requests, minlength=n)
        if decode:
            counts = self.key_counts
            place = torch.arange(requests.numel()) - (torch.cumsum(counts, 0) - counts)[requests]
            self.decode = (requests, place, counts, max(int(counts.max()), 1))


class PagedShard:
    """This rank's pages of one group of transformers' paged cache (the layers of one
    allocator: full attention, or sliding-window attention kept as a ring of pages).

    Full attention: page j of a request (positions [j*page, (j+1)*page)) is on rank
    (j + the block id of its page 0) % world. Sliding window: transformers keeps position p in
    ring slot p % window, its page (p % window) // page holding the tokens that slide through
    it; that ring page is on rank (ring page + the block id of ring page 0) % world, so each
    physical block stays on one rank and a rank holds about 1/world of every request's window.
    The rotation by the request's first block spreads the pages beyond a multiple of world
    over the ranks. Every rank computes the same owners (their schedules agree)."""

    def __init__(self, alloc: Any, world: int, rank: int, device: torch.device) -> None:
        self.world, self.rank = world, rank
        self.window: int | None = getattr(alloc, "sliding_window", None)
        self.page = int(alloc.tokens_per_page)
        self.stride = int(alloc.block_physical_stride)
        self.write_trash = int(alloc.write_trash_index)
        self.heads, self.dim = int(alloc.num_key_value_heads), int(alloc.head_dim)
        self.dtype = alloc.cache_dtype
        self.layers = list(alloc.layer_indices)
        self.device = device
        # Slots: owned blocks at most ceil(blocks / world) plus one per request; grown on demand.
        self.capacity = max(4, -(-int(alloc.num_blocks) // world))
        self.slot_of = torch.full((int(alloc.num_blocks) + 64,), -1, dtype=torch.long)
        self.free: list[int] = list(range(self.capacity - 1, -1, -1))
        self.keys = {i: self._storage(self.capacity) for i in self.layers}
        self.values = {i: self._storage(self.capacity) for i in self.layers}
        self.in_use = 0
        # transformers' own storage is not read any more: give its memory back.
        empty = torch.empty(0, dtype=torch.uint8, device=device)
        alloc.cache_tensor = empty
        alloc._copy_view = empty
        alloc._kv_token_views = {}
        alloc._kv_page_views = {}

    def _storage(self, slots: int) -> torch.Tensor:
        return torch.zeros(
            (slots * self.page, self.heads, self.dim), dtype=self.dtype, device=self.device
        )

    # ---- slots -------------------------------------------------------------------------------

    def release(self, block_ids: list[int]) -> None:
        for b in block_ids:
            if b < self.slot_of.numel() and int(self.slot_of[b]) >= 0:
                self.free.append(int(self.slot_of[b]))
                self.slot_of[b] = -1
                self.in_use -= 1

    def release_all(self) -> None:
        self.release(torch.nonzero(self.slot_of >= 0).flatten().tolist())

    def _grow(self) -> None:
        more = max(4, self.capacity // 4)
        for i in self.layers:
            self.keys[i] = torch.cat([self.keys[i], self._storage(more)])
            self.values[i] = torch.cat([self.values[i], self._storage(more)])
        self.free.extend(range(self.capacity + more - 1, self.capacity - 1, -1))
        self.capacity += more

    def slots(self, physical: torch.Tensor, assign: bool) -> torch.Tensor:
        """Rows in local storage of transformers' physical indices (blocks this rank owns)."""
        blocks = torch.div(physical, self.stride, rounding_mode="floor")
        offsets = physical - blocks * self.stride
        if blocks.numel() and int(blocks.max()) >= self.slot_of.numel():
            grown = torch.full((int(blocks.max()) * 2 + 1,), -1, dtype=torch.long)
            grown[: self.slot_of.numel()] = self.slot_of
            self.slot_of = grown
        if assign:
            for b in torch.unique(blocks).tolist():
                if int(self.slot_of[b]) < 0:
                    if not self.free:
                        self._grow()
                    self.slot_of[b] = self.free.pop()
                    self.in_use += 1
        slot = self.slot_of[blocks]
        if blocks.numel() and bool((slot < 0).any()):
            raise RuntimeError(
                "torch_plugin cache_parallel: a cached entry this rank owns was never written "
                "here (the ranks' schedules diverged)"
            )
        return slot * self.page + offsets

    def _pages(self, positions: torch.Tensor) -> torch.Tensor:
        """The page of each position: its sequence page, or (sliding) its ring page."""
        if self.window is not None:
            positions = positions % self.window
        return torch.div(positions, self.page, rounding_mode="floor")

    def owned(self, positions: torch.Tensor, first_blocks: torch.Tensor) -> torch.Tensor:
        return (self._pages(positions) + first_blocks) % self.world == self.rank

    def block_bytes(self) -> int:
        """One block (keys and values of every layer of the group)."""
        item = torch.empty((), dtype=self.dtype).itemsize
        return 2 * self.page * self.heads * self.dim * item * len(self.layers)

    # ---- one step ----------------------------------------------------------------------------

    def prepare(
        self, step: Step, write: torch.Tensor, read: torch.Tensor, cu_k: torch.Tensor
    ) -> Keys:
        keys = Keys(self.window)
        cu_q = torch.tensor(step.cu_q, dtype=torch.long)
        q_lens = cu_q[1:] - cu_q[:-1]
        n = int(q_lens.numel())
        requests = torch.arange(n)
        of_token = torch.repeat_interleave(requests, q_lens)
        positions = step.query_positions
        decode = bool((q_lens == 1).all())
        if self.window is not None:
            return self._prepare_sliding(keys, step, write, read, cu_k, cu_q, of_token, decode)
        # Each request's page 0: its first read entry, or (nothing read: every request starts
        # at position 0) its first write.
        first = read if read.numel() else write
        starts = (cu_k if read.numel() else cu_q)[:-1].clamp(max=max(first.numel() - 1, 0))
        first_blocks = torch.div(first[starts], self.stride, rounding_mode="floor")
        mine = self.owned(positions, first_blocks[of_token])
        keys.write_rows = torch.nonzero(mine).flatten()
        keys.write_slots = self.slots(write[mine], assign=True)
        if read.numel() == 0:  # no cached entries read: the keys are the batch's own tokens
            keys.set_keys(of_token[mine], positions[keys.write_rows], n, decode=False)
            return keys
        # Entry e of request i (entries [cu_i, cu_i+1)) is at position e - cu_i.
        k_lens = cu_k[1:] - cu_k[:-1]
        of_entry = torch.repeat_interleave(requests, k_lens)
        read_positions = torch.arange(read.numel(), dtype=torch.long) - cu_k[:-1][of_entry]
        keep = self.owned(read_positions, first_blocks[of_entry])
        keys.read_slots = self.slots(read[keep], assign=False)
        keys.set_keys(of_entry[keep], read_positions[keep], n, decode)  # ascending requests
        return keys

    def _prepare_sliding(
        self,
        keys: Keys,
        step: Step,
        write: torch.Tensor,
        read: torch.Tensor,
        cu_k: torch.Tensor,
        cu_q: torch.Tensor,
        of_token: torch.Tensor,
        decode: bool,
    ) -> Keys:
        """transformers reads a request's last min(past, window - 1) cached entries (then a
        sentinel per new token) and writes each new token to its ring slot (the first ones of a
        prefill longer than the window to the trash). The cached entries and the new tokens
        together span at least `window` consecutive positions or start at 0, so ring page 0
        is among them in every step: its block is the request's rotation."""
        assert self.window is not None
        q_lens = cu_q[1:] - cu_q[:-1]
        n = int(q_lens.numel())
        requests = torch.arange(n)
        positions = step.query_positions
        cached = (cu_k[1:] - cu_k[:-1]) - q_lens if read.numel() else torch.zeros_like(q_lens)
        past = positions[cu_q[:-1].clamp(max=max(positions.numel() - 1, 0))]
        of_cached = torch.repeat_interleave(requests, cached)
        j = torch.arange(of_cached.numel()) - (torch.cumsum(cached, 0) - cached)[of_cached]
        cached_positions = past[of_cached] - cached[of_cached] + j
        cached_physical = read[cu_k[:-1][of_cached] + j] if read.numel() else j
        stored = write != self.write_trash
        # The block of each request's ring page 0.
        who = torch.cat([of_cached, of_token[stored]])
        where = torch.cat([cached_positions, positions[stored]])
        physical = torch.cat([cached_physical, write[stored]])
        zero = self._pages(where) == 0
        first_blocks = torch.full((n,), -1, dtype=torch.long)
        first_blocks[who[zero]] = torch.div(physical[zero], self.stride, rounding_mode="floor")
        if bool((first_blocks < 0).any()):
            raise RuntimeError(
                "torch_plugin cache_parallel: a request's sliding-window entries do not reach "
                "its ring page 0 (transformers' ring layout changed?)"
            )
        mine_cached = self.owned(cached_positions, first_blocks[of_cached])
        keys.read_slots = self.slots(cached_physical[mine_cached], assign=False)
        mine_new = self.owned(positions, first_blocks[of_token])
        keys.new_rows = torch.nonzero(mine_new).flatten()
        keys.write_rows = torch.nonzero(mine_new & stored).flatten()
        keys.write_slots = self.slots(write[keys.write_rows], assign=True)
        # [cached; new] by request, cached first within a request (a stable sort).
        of_key = torch.cat([of_cached[mine_cached], of_token[mine_new]])
        of_key, keys.order = torch.sort(of_key, stable=True)
        key_positions = torch.cat([cached_positions[mine_cached], positions[mine_new]])
        keys.set_keys(of_key, key_positions[keys.order], n, decode)
        return keys


class SplitCache:
    """This rank's part of transformers' paged cache: one PagedShard per attention group
    (full-attention layers, sliding-window layers), transformers' block ids kept as its
    bookkeeping, each owned block given a slot in this rank's storage and the slot returned
    when transformers frees the block."""

    def __init__(self, cache: Any, world: int, rank: int) -> None:
        kinds = list(cache.cache_allocators)
        other = [k for k in kinds if k not in ("full_attention", "sliding_attention")]
        if other:
            raise NotImplementedError(
                "torch_plugin cache_parallel.generate_batch: the model has "
                f"{', '.join(other)} layers; only full and sliding-window attention are split "
                "over the ranks under continuous batching"
            )
        self.device = torch.device(getattr(cache, "device", "cpu"))
        # Where transformers' own cache tensor was made: "meta" when it was never allocated
        # (see MetaCacheTensor), the real device otherwise.
        self.transformers_cache_device = cache.cache_tensor.device.type
        self.groups = {
            int(a.index): PagedShard(a, world, rank, self.device)
            for a in cache.cache_allocators.values()
        }
        self.group_of = {i: g for g, s in self.groups.items() for i in s.layers}
        self.page = min(s.page for s in self.groups.values())
        self.peak = 0  # the most blocks held at once, all groups
        self.peak_bytes = 0
        self.most_requests = 0  # the most requests one batch held (the bound's "+1 per request")
        pool = cache.pool
        free_blocks, reset = pool.free_blocks, pool.reset

        def freed(index: int, block_ids: list[int]) -> None:
            self.groups[int(index)].release(block_ids)
            free_blocks(index, block_ids)

        def cleared() -> None:
            for s in self.groups.values():
                s.release_all()
            reset()

        pool.free_blocks, pool.reset = freed, cleared
        cache.cache_tensor = torch.empty(0, dtype=torch.uint8, device=self.device)

    def local_bytes(self) -> int:
        """The most this rank held at once, all layers."""
        return self.peak_bytes

    def prepare(self, batch: dict[str, Any], rows_split: bool, world: int, rank: int) -> Step:
        positions = batch["position_ids"][0].to(torch.long)
        total = int(positions.numel())
        chunk = -(-total // world) if rows_split else total
        step = Step(total, chunk, rank * chunk if rows_split else 0)
        step.cu_q = batch["cu_seq_lens_q"].to(torch.long).tolist()
        step.query_positions = positions
        self.most_requests = max(self.most_requests, len(step.cu_q) - 1)
        cu_k = batch["cu_seq_lens_k"]
        for g, shard in self.groups.items():
            kind = "sliding_attention" if shard.window is not None else "full_attention"
            ck = cu_k[kind] if isinstance(cu_k, dict) else cu_k
            step.groups[g] = shard.prepare(
                step,
                batch["write_index"][g].to(torch.long),
                batch["read_index"][g].to(torch.long)
                if len(batch["read_index"]) > g
                else torch.empty(0, dtype=torch.long),
                ck.to(torch.long),
            )
        self.peak = max(self.peak, sum(s.in_use for s in self.groups.values()))
        held = sum(s.in_use * s.block_bytes() for s in self.groups.values())
        self.peak_bytes = max(self.peak_bytes, held)
        return step


class MetaCacheTensor(torch.overrides.TorchFunctionMode):
    """While transformers builds its paged cache: the one byte tensor it sizes for every block
    of every layer (`torch.zeros(n, dtype=torch.uint8)`) is made on the meta device. The split
    cache keeps its pages in its own storage (PagedShard) and releases that tensor unread, so
    each rank never allocates the whole cache, not even for the moment before the release."""

    def __torch_function__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        if func is torch.zeros and kwargs.get("dtype") is torch.uint8:
            kwargs = {**kwargs, "device": "meta"}
        return func(*args, **kwargs)
