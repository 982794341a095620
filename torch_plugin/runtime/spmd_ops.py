"""What the torch_plugin:: nodes of a sharded (SPMD) graph run: reshards, the bucketed gradient
sync, replicated outputs and the vocabulary-parallel lookup, as autograd functions over
torch.distributed (see sharding_materialize.h for the gradient convention). The graph carries
process groups as int handles, registered here."""

from __future__ import annotations

import functools
import itertools
import logging
import threading
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F

from .. import _C
from .collectives import Collectives

log = logging.getLogger("torch_plugin")

# Process groups by handle: the graph's reshard nodes carry an int, not a Python object.
_GROUPS: dict[int, Collectives] = {}
_GROUP_IDS = itertools.count(1)
_LOCK = threading.Lock()


def _register_group(comm: Collectives) -> int:
    with _LOCK:
        handle = next(_GROUP_IDS)
        _GROUPS[handle] = comm
    return handle


def _group(handle: int) -> Collectives:
    try:
        return _GROUPS[handle]
    except KeyError:
        raise RuntimeError(
            f"torch_plugin sharding: process group handle {handle} is unknown in this process; "
            "a sharded graph runs only in the process that built it"
        ) from None


@functools.lru_cache(maxsize=1024)
def _parse(spec: str) -> tuple[str, int, int]:
    """(kind, dim, sections) of 'R', 'P', 'S(d)' or the strided 'S(d)xN': the C++ parser's
    reading (the one the planner and materialiser use), cached per string."""
    return _C.parse_spec(spec)


@functools.lru_cache(maxsize=1024)
def _dual(spec: str) -> str:
    """The spec of a value's gradient under the convention of sharding_materialize.h (C++)."""
    return _C.gradient_spec(spec)


@functools.lru_cache(maxsize=1024)
def _reshard_op(src: str, dst: str) -> str:
    """The step the plan prices for src -> dst (C++ ir::ReshardOpFor)."""
    return _C.reshard_op(src, dst)


def _block(x: torch.Tensor, dim: int, sections: int, world: int, rank: int) -> torch.Tensor:
    """This rank's block of a whole tensor split along `dim` (each of `sections` parts split)."""
    if sections == 1:
        return x.chunk(world, dim)[rank].contiguous()
    parts = x.unflatten(dim, (sections, -1))
    return parts.chunk(world, dim + 1)[rank].flatten(dim, dim + 1).contiguous()


def _whole(blocks: list[torch.Tensor], dim: int, sections: int) -> torch.Tensor:
    """Inverse of _block over every rank's block."""
    if sections == 1:
        return torch.cat(blocks, dim=dim)
    parts = [b.unflatten(dim, (sections, -1)) for b in blocks]
    return torch.cat(parts, dim=dim + 1).flatten(dim, dim + 1)


def _reshard_local(x: torch.Tensor, src: str, dst: str, op: str, comm: Collectives) -> torch.Tensor:
    """The value held as `src` on this rank, as `dst`, by the step `op` the plan named and priced
    (C++ ir::ReshardOpFor; not differentiable, see _Reshard). The runtime decides nothing: it
    runs `op`, the specs giving only its dims."""
    (_, sd, sn), (_, dd, dn) = _parse(src), _parse(dst)
    w, r = comm.world, comm.rank
    if op == "none":
        return x
    if op == "zero_pad":  # the block in place in the whole shape (local: no traffic)
        shape = list(x.shape)
        shape[sd] *= w
        out = x.new_zeros(shape)
        own = _block(torch.arange(shape[sd], device=x.device), 0, sn, w, r)
        return out.index_copy_(sd, own, x)
    if op == "all_to_all":
        # Piece k: the part of this rank's block that rank k keeps along dd; what arrives from
        # rank s is rank s's block along sd of this rank's part, joined along sd.
        send = torch.stack([_block(x, dd, dn, w, k) for k in range(w)])
        got = comm.all_to_all(send.flatten(0, 1), "reshard")  # [w, *piece]
        return _whole(list(got.unbind(0)), sd, sn)
    if op in ("all_gather", "all_gather_slice"):  # the whole gathered, then (slice) a block
        whole = _whole(list(comm.all_gather(x, "reshard").unbind(0)), sd, sn)
        return whole if op == "all_gather" else _block(whole, dd, dn, w, r)
    if op == "slice":
        return _block(x, dd, dn, w, r)
    if op == "keep_on_rank_zero":  # one rank holds the value, the others zero summands
        return x.clone() if r == 0 else torch.zeros_like(x)
    if op == "all_reduce":
        return comm.all_reduce(x, "reshard")
    if op == "reduce_scatter":
        # Strided: the sections made rank-major, so each rank's block is one contiguous chunk
        # and one reduce-scatter (as priced) delivers it.
        if dn > 1:
            x = x.unflatten(dd, (dn, w, -1)).transpose(dd, dd + 1).flatten(dd, dd + 2)
        return comm.reduce_scatter(x, dd, "reshard")
    raise ValueError(f"unknown reshard step {op!r} (from {src} to {dst})")


class _Reshard(torch.autograd.Function):
    @staticmethod
    def forward(
        ctx: Any, x: torch.Tensor, src: str, dst: str, handle: int, op: str
    ) -> torch.Tensor:
        ctx.spec = (src, dst, handle)
        return _reshard_local(x, src, dst, op, _group(handle))

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[Any, ...]:
        # The dual reshard (all_gather <-> reduce_scatter, all_reduce <-> all_reduce, slice <->
        # zero_pad), its step read off C++ like the forward's.
        src, dst, handle = ctx.spec
        back_src, back_dst = _dual(dst), _dual(src)
        grad = _Reshard.apply(grad, back_src, back_dst, handle, _reshard_op(back_src, back_dst))
        return grad, None, None, None, None


class _GradSync(torch.autograd.Function):
    """Identity on the replicated parameters; the backward sums their gradient summands over
    ranks in one flat all-reduce (one bucket rather than a collective per parameter)."""

    @staticmethod
    def forward(
        ctx: Any, handle: int, pending: list[Any] | None, *params: torch.Tensor
    ) -> tuple[torch.Tensor, ...]:
        ctx.handle = handle
        ctx.pending = pending
        return tuple(p.view_as(p) for p in params)

    @staticmethod
    def backward(ctx: Any, *grads: torch.Tensor) -> tuple[Any, ...]:
        if ctx.pending is not None:  # gradients accumulated under no_sync() join this sum
            grads = tuple(
                g if q is None else g + q for g, q in zip(grads, ctx.pending, strict=True)
            )
        # Low-precision gradients are summed in float32 (bf16 sums over many ranks lose bits).
        flat = torch.cat(
            [g.reshape(-1).to(torch.promote_types(g.dtype, torch.float32)) for g in grads]
        )
        summed = _group(ctx.handle).all_reduce(flat, "grad_sync")
        out, at = [], 0
        for g in grads:
            out.append(summed[at : at + g.numel()].view(g.shape).to(g.dtype))
            at += g.numel()
        return (None, None, *out)


class _ReplicatedOutput(torch.autograd.Function):
    """Identity; every rank seeds the same loss gradient, so each holds 1/world of it."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, handle: int) -> torch.Tensor:
        ctx.world = _group(handle).world
        return x.view_as(x)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[Any, ...]:
        return grad / ctx.world, None


class _BatchLoss(torch.autograd.Function):
    """A scalar of one dp replica's batch slice (its loss) made the whole batch's:
    sum over replicas of weight * x. The weight is 1 when the model divided by the whole
    batch's label count (HF's num_items_in_batch) or returns a sum over the batch, the slice's
    share of the labels when its loss is a mean over them, its share of the rows otherwise.
    Every rank seeds the same gradient and the dp gradient sync sums the replicas, so the
    backward scales as the forward did."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, handle: int, weight: float) -> torch.Tensor:
        ctx.weight = weight
        return _group(handle).all_reduce(x.detach() * weight, "batch loss")

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[Any, ...]:
        return grad * ctx.weight, None, None


class _UnevenBatchGather(torch.autograd.Function):
    """dp replicas' outputs along the batch when it does not divide by dp (the last batch of an
    epoch): replica i holds sizes[i] rows. Gathered padded to the largest slice and trimmed.
    Every rank seeds the same loss gradient (see _ReplicatedOutput): the backward averages
    it over the replicas and keeps this replica's rows, as S(0) -> R does for an even batch."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, handle: int, sizes: tuple[int, ...]) -> torch.Tensor:
        comm = _group(handle)
        ctx.handle, ctx.sizes = handle, sizes
        most = max(sizes)
        padded = F.pad(x, (0, 0) * (x.dim() - 1) + (0, most - x.shape[0]))
        parts = comm.all_gather(padded, "batch gather").unbind(0)
        return torch.cat([p[:n] for p, n in zip(parts, sizes, strict=True)])

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[Any, ...]:
        comm = _group(ctx.handle)
        mean = comm.all_reduce(grad, "batch gather") / comm.world
        start = sum(ctx.sizes[: comm.rank])
        return mean[start : start + ctx.sizes[comm.rank]], None, None


def uneven_batch_gather(x: torch.Tensor, group: int, sizes: tuple[int, ...]) -> torch.Tensor:
    return _UnevenBatchGather.apply(x, group, sizes)


def reshard(x: torch.Tensor, src: str, dst: str, group: int, op: str | None = None) -> torch.Tensor:
    """A reshard node: `op` is the step the materialiser named (the plan's); a reshard the
    runtime adds itself (a dp output's gather) takes C++'s step for its specs."""
    return _Reshard.apply(x, src, dst, group, op if op is not None else _reshard_op(src, dst))


def grad_sync(
    params: list[torch.Tensor], group: int, pending: list[Any] | None = None
) -> tuple[torch.Tensor, ...]:
    """pending: per parameter, a gradient accumulated locally (under no_sync) to add to this
    backward's before the sum over ranks, or None."""
    return _GradSync.apply(group, pending, *params)


def replicated_output(x: torch.Tensor, group: int) -> torch.Tensor:
    return _ReplicatedOutput.apply(x, group)


def vocab_embedding(
    weight: torch.Tensor, indices: torch.Tensor, padding_idx: int, group: int
) -> torch.Tensor:
    """Megatron's vocabulary-parallel lookup: `weight` is this rank's rows of the vocabulary;
    lookups outside them give zeros, so the sum over ranks is the whole embedding (spec P).
    Plain ops, so autograd gives each rank its rows' gradient."""
    comm = _group(group)
    rows = weight.shape[0]
    local = indices - comm.rank * rows
    mine = (local >= 0) & (local < rows)
    pad = padding_idx - comm.rank * rows
    own_pad = pad if padding_idx >= 0 and 0 <= pad < rows else None
    out = F.embedding(local.clamp(0, rows - 1), weight, padding_idx=own_pad)
    return out * mine.unsqueeze(-1).to(out.dtype)


_TARGETS: dict[str, Callable[..., Any]] = {
    "torch_plugin::vocab_embedding.default": vocab_embedding,
    "torch_plugin::reshard.default": reshard,
    "torch_plugin::grad_sync.default": grad_sync,
    "torch_plugin::replicated_output.default": replicated_output,
}


def _runs_along(rows: int, batch: int, along: bool | None) -> bool:
    """Whether a draw of `rows` rows (dim 0) runs along the replica's batch: as traced (`along`,
    from the model traced at the whole batch and at the replica's slice), or, where that is
    unknown, guessed from divisibility (a tensor of, say, 8 rows that does not run along a
    batch of 2 would be taken for one that does)."""
    if batch <= 0 or rows % batch:
        return False
    return True if along is None else along


def _empty_in_order_of(t: torch.Tensor, shape: tuple[int, ...]) -> torch.Tensor:
    """An empty tensor of `shape` whose dims lie in memory in t's order: bernoulli_ fills in
    memory order, so one process's mask over a permuted layout (dropout on a transposed view)
    is only reproduced by a whole-batch tensor laid out the same way."""
    order = sorted(range(t.dim()), key=lambda d: -t.stride(d))
    base = torch.empty([shape[d] for d in order], dtype=t.dtype, device=t.device)
    inverse = [order.index(d) for d in range(t.dim())]
    return base.permute(inverse)


def replica_bernoulli_(
    t: torch.Tensor,
    p: float = 0.5,
    *,
    generator: torch.Generator | None = None,
    total: int,
    offset: int,
    batch: int,
    along: bool | None = None,
) -> torch.Tensor:
    """bernoulli_ in a dp replica's program, as one process draws it: a dropout mask over the
    replica's `batch` rows is rows [offset, offset + batch) of the whole batch's mask (`total`
    rows), drawn from the generator state every rank shares (so the generator advances as one
    process's does). A tensor whose dim 0 is k rows per sample (a [batch * seq, ...] view, as
    OPT's and XGLM's MLPs flatten their input) takes rows [offset * k, (offset + batch) * k).
    A tensor that does not run along the batch (`along`, see _runs_along) is drawn as is."""
    if t.dim() == 0 or not _runs_along(int(t.shape[0]), batch, along):
        return t.bernoulli_(p, generator=generator)
    k = t.shape[0] // batch
    whole = _empty_in_order_of(t, (total * k, *t.shape[1:]))
    whole.bernoulli_(p, generator=generator)
    with torch.no_grad():
        return t.copy_(whole[offset * k : (offset + batch) * k])


def replica_rand(
    size: list[int],
    *,
    total: int,
    offset: int,
    batch: int,
    along: bool | None = None,
    **kwargs: Any,
) -> torch.Tensor:
    """rand in a dp replica's program, as one process draws it (stochastic depth's per-sample
    keep draws, Swin's drop path): a tensor of the replica's `batch` rows (k per sample) is its
    rows of the whole batch's draw, as replica_bernoulli_ takes its rows of the mask."""
    if not size or not _runs_along(int(size[0]), batch, along):
        return torch.rand(size, **kwargs)
    k = size[0] // batch
    whole = torch.rand([total * k, *size[1:]], **kwargs)
    return whole[offset * k : (offset + batch) * k].clone()


def native_dropout_rows(
    x: torch.Tensor,
    p: float,
    train: bool | None,
    *,
    total: int,
    offset: int,
    batch: int,
    along: bool | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """native_dropout (dropout as ATen keeps it on CUDA: one fused kernel) in a dp replica's
    program, as one process draws it: the replica's rows of the mask native_dropout draws over
    the whole batch, laid out as x is (the mask depends on the shape, the layout and the
    generator, not on the values), then x * mask * scale as the kernel computes it."""
    if train is False or x.dim() == 0 or not _runs_along(int(x.shape[0]), batch, along):
        return torch.ops.aten.native_dropout.default(x, p, train)
    k = x.shape[0] // batch
    whole = _empty_in_order_of(x, (total * k, *x.shape[1:]))
    mask = torch.ops.aten.native_dropout.default(whole, p, True)[1][
        offset * k : (offset + batch) * k
    ]
    return apply_dropout_mask(x, mask, p), mask


def apply_dropout_mask(x: torch.Tensor, mask: torch.Tensor, p: float) -> torch.Tensor:
    """native_dropout's output for a mask it drew: x * mask * 1 / (1 - p), multiplied in that
    order as its CPU and CUDA kernels do."""
    return x * mask * (0.0 if p == 1 else 1.0 / (1.0 - p))


# The random draws replayed as one process draws them (dp replicas here, pipelines in
# pipeline/draws.py): dropout masks (bernoulli_ on an empty tensor where dropout decomposes, as
# on CPU; native_dropout where ATen keeps it whole, as on CUDA) and per-sample draws.
DRAWS = (
    torch.ops.aten.bernoulli_.float,
    torch.ops.aten.rand.default,
    torch.ops.aten.native_dropout.default,
)


def draws_of(graph: torch.fx.Graph) -> list[torch.fx.Node]:
    """The draws of a graph (DRAWS), in its order; a native_dropout outside training (which
    draws nothing) is not one."""
    return [n for n in graph.nodes if is_draw(n)]


def is_draw(node: torch.fx.Node) -> bool:
    """Whether a node is one of DRAWS that draws (native_dropout outside training does not)."""
    if node.op != "call_function" or node.target not in DRAWS:
        return False
    if node.target is torch.ops.aten.native_dropout.default:
        train = node.args[2] if len(node.args) > 2 else node.kwargs.get("train")
        return train is not False  # None: ATen trains
    return True


def drawn_value(node: torch.fx.Node) -> Any:
    """What a draw node draws over, as traced: native_dropout's input shape (its value is the
    pair of output and mask), the tensor itself for the others."""
    val = node.meta.get("val")
    if node.target is torch.ops.aten.native_dropout.default and isinstance(val, (tuple, list)):
        return val[0]
    return val


def draws_along_batch(
    whole: torch.fx.GraphModule, local: torch.fx.GraphModule
) -> list[bool] | None:
    """Per draw (dropout mask, per-sample rand) of a model traced at the whole batch and at a
    dp replica's slice, in graph order: whether its dim 0 changes with the batch. None where the
    two traces draw differently (another program at another batch)."""

    def rows(gm: torch.fx.GraphModule) -> list[int]:
        vals = [drawn_value(n) for n in draws_of(gm.graph)]
        return [int(v.shape[0]) if isinstance(v, torch.Tensor) and v.dim() else -1 for v in vals]

    a, b = rows(whole), rows(local)
    if len(a) != len(b):
        return None
    return [x != y and x >= 0 for x, y in zip(a, b, strict=True)]


def global_dropout_masks(
    gm: torch.fx.GraphModule,
    total: int,
    offset: int,
    batch: int,
    along: list[bool] | None = None,
) -> int:
    """Rewrites a dp replica's program so its dropout masks (bernoulli_ on an empty tensor) and
    per-sample draws (rand: stochastic depth) are its rows [offset, offset + batch) of one
    process's over `total` rows. `along`: per draw in graph order, whether it runs along the
    batch (draws_along_batch); None, or a list that does not match the program's draws, leaves
    it to divisibility (see _runs_along). Returns how many draws it rewrote; other random ops
    draw per replica, as before (logged by the caller)."""
    rewritten = 0
    replica = {
        torch.ops.aten.bernoulli_.float: replica_bernoulli_,
        torch.ops.aten.rand.default: replica_rand,
        torch.ops.aten.native_dropout.default: native_dropout_rows,
    }
    draws = draws_of(gm.graph)
    if along is not None and len(along) != len(draws):
        log.warning(
            "torch_plugin sharding: the program draws %d random tensors but the traces %d; "
            "which run along the batch is guessed from their sizes",
            len(draws),
            len(along),
        )
        along = None
    for i, node in enumerate(draws):
        node.target = replica[node.target]
        node.kwargs = {
            **node.kwargs,
            "total": total,
            "offset": offset,
            "batch": batch,
            "along": None if along is None else along[i],
        }
        rewritten += 1
    if rewritten:
        gm.recompile()
    return rewritten
