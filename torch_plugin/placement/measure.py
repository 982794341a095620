"""Measuring for the placement search: real-shaped inputs, timing (hot or with the last-level
cache evicted), each candidate group compiled, checked against eager once and timed."""

from __future__ import annotations

import glob
import logging
import math
import statistics
import time
from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.fx as fx

from ..fx_bridge import rng_state_inputs
from .backends import Backend, BackendError
from .cache import Entry
from .materialize import _frozen_for, _GroupCall, build_subgraph
from .precision import all_close, close

log = logging.getLogger("torch_plugin")


class _Recorder(fx.Interpreter):
    """Runs the graph once on real inputs and keeps every node's value by name."""

    def __init__(self, gm: fx.GraphModule) -> None:
        super().__init__(gm)
        self.values: dict[str, Any] = {}

    def run_node(self, n: fx.Node) -> Any:
        out = super().run_node(n)
        self.values[n.name] = out
        return out


def synthesize_inputs(gm: fx.GraphModule) -> list[Any]:
    """Real tensors shaped like the placeholders' fake values: floats random, ints zero (valid
    indices and positions), bools true. Real also when called inside a fake mode: AOTAutograd
    compiles a backward that takes sizes from its forward right after the forward, inside its
    fake mode, and tensors made there were fake (every candidate but eager then read as
    differing: GPT-2's dynamic backward, "error inf")."""
    from torch._subclasses.fake_tensor import unset_fake_temporarily

    with unset_fake_temporarily():
        return _synthesized(gm)


def _synthesized(gm: fx.GraphModule) -> list[Any]:
    from .._compat import size_hint as size  # a symbol's value without a guard on it

    gen = torch.Generator().manual_seed(0)
    states = rng_state_inputs(gm)
    out: list[Any] = []
    for n in gm.graph.nodes:
        if n.op != "placeholder":
            continue
        v = n.meta.get("val")
        if n.name in states and isinstance(v, torch.Tensor):
            # A generator state a recomputed random op runs from: the device generator's own
            # (zeros are no valid mt19937 state: "Invalid mt19937 state", and the backward of
            # every gradient-checkpointed model with dropout fell back unplaced).
            if v.device.type == "cuda":
                out.append(torch.cuda.get_rng_state(v.device))
            else:
                out.append(torch.get_rng_state())
            continue
        if isinstance(v, torch.Tensor):
            shape = [size(d) for d in v.shape]
            if v.dtype.is_floating_point:
                t = torch.randn(shape, generator=gen, dtype=v.dtype) * 0.5
            elif v.dtype == torch.bool:
                t = torch.ones(shape, dtype=torch.bool)
            else:
                t = torch.zeros(shape, dtype=v.dtype)
            # With the traced strides: a compiled graph (Inductor's) asserts its inputs' strides,
            # and a backward's saved activations are often transposed views.
            stride = tuple(size(s) for s in v.stride())
            if t.stride() != stride and t.numel() > 0:
                t = torch.empty_strided(shape, stride, dtype=v.dtype).copy_(t)
            out.append(t)
        elif isinstance(v, (int, torch.SymInt)):
            out.append(size(v))
        else:
            raise BackendError(f"cannot make an input for placeholder '{n.name}'")
    return out


def time_call(
    fn: Callable[..., Any],
    args: Sequence[Any],
    samples: int,
    warm_s: float = 0.0,
    min_s: float = 0.0,
    prepare: Callable[[], None] | None = None,
    max_s: float = math.inf,
    warm: bool = False,
    ran_s: float | None = None,
    settle_s: float = math.inf,
) -> float:
    """Median seconds per call; each sample repeats the call until it lasts >= 0.2 ms.

    prepare: run, untimed, before each sample, which is then a single call (a cache flush).

    warm_s / min_s: warm up for at least warm_s, and keep sampling past `samples` until the
    samples last min_s. End-to-end measurements that decide the search use them: on a
    sub-millisecond graph, seven samples right after a compile varied by up to 80% (0.58 to
    1.07 ms for one ONNX Runtime session of GPT-2), enough to pick a slower placement.

    max_s: fewer samples (at least 2, their minimum) where `samples` calls would last longer: a
    call of a second (a 1B decoder's prefill on 2 cores) needs no seven samples per round;
    a call that alone lasts max_s is timed once (after the warm-up call), and the first timing
    of one lasting warm_s or more is one of the samples.

    warm: `fn` has just run on `args` (a compiled graph's output check): no warm-up call (at
    batch 8 one was a second of every compiler's first turn).

    ran_s: as warm, in ran_s seconds, a run as representative as any later one (eager's
    reference run; not a compiled graph's first run: OpenVINO's first inference of GPT-2 at
    batch 8 took seconds more than the next): where it lasted max_s it is the sample.

    settle_s: `fn` has run on `args` before (not just now): a first call lasting settle_s or
    more is a timing like the rest, not a warm-up. Measured on the 2-core Xeon, alternating
    OpenVINO's, Inductor's and eager's graphs: a graph's first call after another's was within
    the spread of its next two (bert-base b1 ~0.1 s, GPT-2 b8 ~1 s), and the warm-up calls were
    a second of every later round at batch 8."""
    # CUDA work is asynchronous: without a sync the host clock times the launches only.
    cuda = any(isinstance(a, torch.Tensor) and a.is_cuda for a in args)
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    if ran_s is not None and ran_s >= max_s and prepare is None:
        return ran_s
    t_start = time.perf_counter()
    once = 0.0
    if not warm and ran_s is None:
        fn(*args)
        sync()
        first = time.perf_counter() - t_start
        if prepare is None and first >= settle_s:
            once = first
    if not once:
        t0 = time.perf_counter()
        fn(*args)
        sync()
        once = max(time.perf_counter() - t0, 1e-7)
    reps = 1 if prepare is not None else max(1, min(200, math.ceil(2e-4 / once)))
    # With the few samples max_s leaves, their median is their mean, which one slow call moves
    # (OpenVINO's GPT-2 at batch 8: 0.39-0.41 s a call, then one of 1.21 s, and the median of
    # its turns tied with Inductor's 0.47 s); their minimum does not.
    robust: Callable[[list[float]], float] = statistics.median
    if math.isfinite(max_s):
        if once >= max_s and prepare is None:
            # One call outlasts the allowance: it is the sample. A 1.2B Llama's 512-token
            # prefill takes ~5 s here; four calls a turn were half its whole-graph search.
            return once
        few = max(2, math.ceil(max_s / once))
        if few < samples:
            samples, robust = few, min
    # The calls made so far count towards the warm-up: after one call longer than warm_s, the
    # loop used to make one more (a third of a turn of a 0.4 s graph).
    t_end = t_start + warm_s
    while time.perf_counter() < t_end:
        fn(*args)
    # Under max_s, a first timing of one call that followed a call at least warm_s long is a
    # sample like the rest.
    long_call = math.isfinite(max_s) and prepare is None and reps == 1 and once >= warm_s > 0
    times = [once] if long_call else []
    t_end = time.perf_counter() + min_s
    while len(times) < samples or time.perf_counter() < t_end:
        if prepare is not None:
            prepare()
        sync()
        t0 = time.perf_counter()
        for _ in range(reps):
            fn(*args)
        sync()
        times.append((time.perf_counter() - t0) / reps)
    return robust(times)


def time_end_to_end(
    fn: Callable[..., Any],
    args: Sequence[Any],
    samples: int,
    warm: bool = False,
    ran_s: float | None = None,
    has_run: bool = False,
) -> float:
    """time_call for a whole placed graph: 10 ms of warm-up, >= 50 ms of samples, fewer
    samples where they would last over 0.5 s. has_run: `fn` ran on `args` before (a later
    round of the whole-graph search): a first call of 20 ms or more is a sample."""
    return time_call(
        fn,
        args,
        samples,
        warm_s=0.01,
        min_s=0.05,
        max_s=0.5,
        warm=warm,
        ran_s=ran_s,
        settle_s=0.02 if has_run else math.inf,
    )


def last_level_cache_bytes() -> int:
    """Size of the CPU's largest cache, from sysfs; 32 MiB where it cannot be read."""
    units = {"K": 2**10, "M": 2**20, "G": 2**30}
    best = 0
    for path in glob.glob("/sys/devices/system/cpu/cpu0/cache/index*/size"):
        try:
            with open(path) as f:
                text = f.read().strip()
            best = max(best, int(text[:-1]) * units[text[-1]] if text[-1] in units else int(text))
        except (OSError, ValueError, IndexError):
            continue
    return best or 32 * 2**20


def _shapes_only(values: dict[str, Any], keep: set[str]) -> dict[str, Any]:
    """values with each tensor of 1 MiB or more not named in `keep` replaced by an
    uninitialised one of the same shape, strides and dtype: its pages are never touched."""
    out: dict[str, Any] = {}
    for name, v in values.items():
        if name in keep or not isinstance(v, torch.Tensor) or v.nbytes < 1 << 20:
            out[name] = v
        else:
            out[name] = torch.empty_strided(v.shape, v.stride(), dtype=v.dtype, device=v.device)
    return out


def footprint_bytes(values: dict[str, Any]) -> int:
    """Bytes of the distinct CPU storages behind a recorded run's values (weights, inputs and
    every activation): the data one inference touches."""
    seen: set[int] = set()
    total = 0
    for v in values.values():
        for t in v if isinstance(v, (tuple, list)) else (v,):
            if isinstance(t, torch.Tensor) and t.device.type == "cpu":
                storage = t.untyped_storage()
                if storage.data_ptr() not in seen:
                    seen.add(storage.data_ptr())
                    total += storage.nbytes()
    return total


class _CacheFlush:
    """Evicts the last-level cache (writes a buffer 1.5x its size), then reads the given
    tensors back in: inside a model larger than the cache, a group finds its weights cold (the
    rest of the model ran since its last call) and its activation inputs warm (just made)."""

    def __init__(self, cache_bytes: int) -> None:
        self.buf = torch.zeros(cache_bytes * 3 // 2 // 4)

    def __call__(self, warm: Sequence[Any]) -> None:
        self.buf.add_(1.0)
        for t in warm:
            if isinstance(t, torch.Tensor) and t.numel():
                t.sum()


def _direct_aten(gm: fx.GraphModule) -> Callable[..., Any]:
    """Calls the group's node targets directly: what the inline host graph pays, without the
    GraphModule call overhead that a measurement of `gm` itself would add."""
    nodes = list(gm.graph.nodes)
    placeholders = [n for n in nodes if n.op == "placeholder"]
    body = [n for n in nodes if n.op == "call_function"]
    out = nodes[-1].args[0]

    def run(*args: Any) -> tuple[Any, ...]:
        env: dict[fx.Node, Any] = dict(zip(placeholders, args, strict=False))
        for n in body:
            a = fx.node.map_arg(n.args, lambda x: env[x])
            k = fx.node.map_arg(n.kwargs, lambda x: env[x])
            env[n] = n.target(*a, **k)
        return tuple(env[o] for o in out)

    if all(n.op in ("placeholder", "call_function", "output") for n in nodes):
        return run
    return gm


def _measure(
    gm: fx.GraphModule,
    c: dict[str, Any],
    backend: Backend,
    values: dict[str, Any],
    samples: int,
    frozen: dict[str, torch.Tensor],
    weights: set[int] | None = None,
    flush: _CacheFlush | None = None,
) -> Entry:
    """Compiles candidate `c` on `backend`, checks it against eager once and times it.
    weights: storages that a flush leaves cold; the group's other inputs are read back in."""
    consts = _frozen_for(backend, frozen)
    args = [values[i] for i in c["inputs"] if i not in consts]
    warm = [
        a
        for a in args
        if isinstance(a, torch.Tensor) and a.untyped_storage().data_ptr() not in (weights or ())
    ]
    refs = [values[o] for o in c["outputs"]]
    t0 = time.perf_counter()
    try:
        sub = build_subgraph(gm, c["nodes"], c["inputs"], c["outputs"], consts)
        if backend.name == "aten":
            fn: Callable[..., Any] = _direct_aten(sub)
        else:
            if not all(isinstance(a, torch.Tensor) for a in args + refs):
                raise BackendError("non-tensor inputs or outputs")
            fn = backend.compile(sub, args, c["rule"])
        compile_s = time.perf_counter() - t0
        with torch.no_grad():
            got = list(fn(*args))
            if len(got) != len(refs) or not all(
                close(a, b, backend.rtol, backend.atol) for a, b in zip(got, refs, strict=False)
            ):
                return Entry(None, False, "wrong numerics vs eager", compile_s)
            prepare = None if flush is None else (lambda: flush(warm))
            seconds = time_call(fn, args, samples, prepare=prepare)
        return Entry(seconds, True, "", compile_s)
    except Exception as e:  # noqa: BLE001 - a backend failing on a group only excludes it
        return Entry(None, False, f"{type(e).__name__}: {str(e)[:200]}", time.perf_counter() - t0)


def _measure_boundary(backend: Backend, samples: int) -> Entry:
    """Extra seconds a call to `backend` costs when it alternates with ATen ops, over the sum
    of both alone: a 128x128 matmul probe, big enough for the backend to use its threads."""
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(128, 128, generator=gen)
    w = torch.randn(128, 128, generator=gen)
    probe = torch.fx.experimental.proxy_tensor.make_fx(lambda a, b: (torch.mm(a, b),))(x, w)
    try:
        fn = backend.compile(probe, [x, w], "fusion")
        alone = time_call(fn, [x, w], samples)
        aten = time_call(torch.add, [x, 1.0], samples)

        def alternating(a: torch.Tensor, b: torch.Tensor) -> Any:
            return fn(torch.add(a, 1.0), b)

        both = time_call(alternating, [x, w], samples)
        return Entry(max(0.0, both - alone - aten), True, "", 0.0)
    except Exception as e:  # noqa: BLE001 - no probe, no extra penalty
        return Entry(0.0, True, f"probe failed: {type(e).__name__}: {e}", 0.0)


def _measure_switch_penalty(samples: int) -> float:
    """Seconds the host graph pays to call a group module and unpack its outputs."""
    x = torch.zeros(1)
    mod = _GroupCall(lambda a: (a,), "probe", 1)

    def via_module(a: torch.Tensor) -> Any:
        return mod(a)[0]

    def inline(a: torch.Tensor) -> Any:
        return a

    return max(0.0, time_call(via_module, [x], samples) - time_call(inline, [x], samples))


def _outputs_match(
    mod: fx.GraphModule, ref: fx.GraphModule, inputs: Sequence[Any], tol: float
) -> bool:
    try:
        got = mod(*inputs)
    except Exception as e:  # noqa: BLE001 - a placement that cannot run is unfit, not fatal
        log.info(
            "torch_plugin placement: a candidate placement failed to run (%s: %s)",
            type(e).__name__,
            e,
        )
        return False
    return all_close(got, ref(*inputs), tol)


def _check_outputs(placed: fx.GraphModule, gm: fx.GraphModule, inputs: Sequence[Any]) -> None:
    with torch.no_grad():
        if not _outputs_match(placed, gm, inputs, 1e-3):
            raise BackendError("the placed graph's outputs differ from eager's; not using it")
