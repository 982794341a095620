"""The default backend's placement: each compiler's whole graph first (issue 27).

`torch.compile(model, backend="torch_plugin")` with no options lands here for every graph.
The C++ driver (`_C.search_whole_graph_first`, csrc/passes/placement_search.h) decides: it
asks this module to compile the whole graph on each available compiler (Inductor first: its
compile time fixes the budget), times them in turns against eager, picks, and says whether
the finer search (planner.place_graph: DP + evolution) may run in what is left of the budget.
This module compiles, checks numerics, times and materialises; the decision is cached with
the profile cache, so a warm compile builds only the pick.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import logging
import statistics
import time
import zlib
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import nullcontext
from types import SimpleNamespace
from typing import Any

import torch
import torch.fx as fx

from .. import _C, fx_bridge
from . import bf16x3, kernel_floor, memory
from .artifacts import artifact_dir, tensor_bytes
from .backends import InductorBackend, for_device, get_backends, symbolic_placeholders
from .cache import ProfileCache, device_key, machine_key
from .cuda_graphs import CudaGraphBackend
from .planner import (
    PROFILE_VERSION,
    Group,
    PlacementOptions,
    PlacementResult,
    _frozen_for,
    compile_region,
    frozen_inputs,
    materialize,
    place_graph,
    synthesize_inputs,
    time_call,
    time_end_to_end,
)
from .precision import TOLERANCE, _as_list, resolve, within

log = logging.getLogger("torch_plugin")

# Bump when what a cached whole-graph decision means changes.
DECISION_VERSION = "whole-graph-first-v1"


def place_whole_graph_first(
    gm: fx.GraphModule,
    example_inputs: Sequence[Any] | None,
    opts: PlacementOptions,
    input_kinds: Sequence[tuple[str, str]] | None = None,
    kind: str = "inference",
    always_refine: bool = False,
    random_ops: bool = False,
    reference_sink: list[Any] | None = None,
    writes: Sequence[int] = (),
) -> tuple[fx.GraphModule, PlacementResult]:
    """Places one ATen graph as a whole on the compiler that runs it fastest (or leaves it to
    eager); returns the module to run and the decision. always_refine (the explicit placement
    pass): the finer search runs from that pick, in the user's time_budget_s, and replaces it
    only where it measures faster. random_ops: the graph draws random numbers (dropout); every
    run of the search starts from the generators' state at the call (so each draws eager's
    numbers and can be checked against eager's outputs), which is restored at the end: the
    user's stream is not advanced by measuring. reference_sink: gets eager's outputs on the
    example inputs where the search ran them (a training forward's: the real activations its
    backward's search then runs on). writes: the placeholders the graph writes into (a static
    KV cache's update): it goes to eager and Inductor only (the numpy runtimes return new values
    instead of writing them), measured on copies of those inputs, each check run from their
    values at the call, and what it writes is checked against eager's as its outputs are."""
    t_start = time.perf_counter()
    # Tolerance: the lower of what was asked and what the graph computes in. Compute: bf16
    # only where asked, for inference graphs (a training graph's gradients stay the user's).
    precision = resolve(opts.precision, gm)
    compute = "bf16" if opts.precision == "bf16" and kind == "inference" else "f32"
    inputs = list(example_inputs) if example_inputs is not None else synthesize_inputs(gm)
    device = device_key(inputs)
    if compute == "f32" and precision == "f32" and kind == "inference":
        # The user's "high" float32 matmul precision: Inductor's linears may run as three bf16
        # products (bf16x3.py), checked against the f32 bound as every candidate is.
        why_not = bf16x3.applies(device)
        if why_not is None:
            compute = bf16x3.COMPUTE
        elif torch.get_float32_matmul_precision() == "high":
            log.info("torch_plugin placement: f32 linears stay f32: %s", why_not)
    backends = for_device(get_backends(opts.backends, compute, opts.cache_path), device)
    # A dynamic-shape graph (its sizes symbols, their values arguments) goes only to compilers
    # that keep its sizes symbolic: the others compile for the sizes they are shown, which the
    # next call's may not be. Nor does the finer search take it (it measures regions at fixed
    # sizes).
    dynamic = any(symbolic_placeholders(gm))
    if dynamic:
        backends = [b for b in backends if b.dynamic_shapes]
    rng = _Generators(inputs) if random_ops else None
    if rng is not None:  # Inductor draws from ATen's generator; the others would not
        backends = [b for b in backends if b.name in ("aten", "inductor")]
    written = _Writes(inputs, writes) if writes else None
    if written is not None:  # Inductor writes into its inputs as eager does; the others cannot
        backends = [b for b in backends if b.name in ("aten", "inductor")]
    by_name = {b.name: b for b in backends}
    if (
        device.startswith("cuda")
        and kind == "inference"
        and not dynamic  # a CUDA graph replays the sizes it captured
        and opts.cuda_graphs
        and isinstance(by_name.get("inductor"), InductorBackend)
    ):
        backends.append(CudaGraphBackend(by_name["inductor"]))
        by_name[backends[-1].name] = backends[-1]
    if "onnxruntime" in by_name:  # its export is most of a warm compile: kept on disk
        by_name["onnxruntime"].artifacts = artifact_dir(opts.cache_path)
    graph, _ = fx_bridge.to_ir(gm)
    placeholders = [n.name for n in gm.graph.nodes if n.op == "placeholder"]
    values = dict(zip(placeholders, inputs, strict=True))
    frozen: dict[str, torch.Tensor] = {}
    if opts.freeze and example_inputs is not None and input_kinds is not None:
        frozen = frozen_inputs(gm, inputs, input_kinds)
    nodes = [n.name for n in gm.graph.nodes if n.op not in ("placeholder", "output")]
    compilers = [b.name for b in backends if b.graph_level]
    computes = {n: by_name[n].compute for n in compilers}  # the precision each computes in

    versions = {"torch": torch.__version__, "torch_plugin.placement": PROFILE_VERSION}
    for b in backends:
        versions[b.name] = b.version()
    machine = machine_key(device, versions)
    decision_key = ProfileCache.key(
        DECISION_VERSION,
        _C.graph_signature(graph)
        + repr(
            (
                sorted(by_name),
                sorted(frozen),
                opts.budget_factor,
                opts.allow_refine,
                always_refine,
                # The explicit pass's whole-graph budget is its time_budget_s (below).
                opts.time_budget_s if always_refine else None,
                precision,
                compute,
            )
        ),
        machine,
    )

    def replaying(fn: Any) -> Any:
        """`fn` as the search runs it: from the generators' state at the call (random ops)
        and from its written inputs' values at the call (`writes`), every run."""
        fn = fn if rng is None else rng.replaying(fn)
        return fn if written is None else written.replaying(fn)

    built: dict[str, Any] = {"eager": replaying(gm)}
    regions: dict[str, tuple[Group, Any]] = {}  # each checked graph's region, for the finer search
    placed_by: dict[str, fx.GraphModule] = {"eager": gm}  # what runs each pick for the user
    failures: list[str] = []
    errors: dict[str, float] = {}
    want: list[Any] = []
    want_written: list[Any] = []  # what eager's reference run wrote into its inputs (`writes`)
    # The graph that ran last, and for eager's reference run its seconds: the next timing of
    # that graph needs no warm-up call, and eager's reference run is its first sample where it
    # lasted 0.5 s or more (the 1.2B Llama's: ~6 s). A compiled graph's check is not: its
    # first run may finish the compile (OpenVINO's first inference of GPT-2 at batch 8 took
    # seconds more than the next).
    last_run: list[tuple[str, float | None]] = [("", None)]

    def reference() -> Any:
        if not want:
            with torch.no_grad():
                t0 = time.perf_counter()
                want.append(built["eager"](*inputs))
                last_run[0] = ("eager", time.perf_counter() - t0)
                if written is not None:
                    want_written.append(written.values())
        return want[0]

    # A graph checked before on these very weights is not checked again when a warm compile
    # rebuilds it: the check ran eager and the graph once more (at batch 8, a second of a
    # four-second warm compile; the 1.2B Llama's, 8 s of 20).
    digest = _weights_digest(gm, frozen) if _may_skip_check(frozen, inputs) else None
    passed: list[str] = []
    served: set[str] = set()  # compilers whose whole graph came from a cache: not a compile
    saved: dict[str, float] = {}  # what the user's own compile would have taken on top

    from torch._dynamo.exc import RestartAnalysis

    def compile_whole(name: str, check: bool = True) -> bool:
        backend = by_name[name]
        try:
            group, fn = compile_region(
                gm, nodes, backend, values, _frozen_for(backend, frozen), "graph"
            )
            if backend.last_from_cache:
                served.add(name)
            saved[name] = backend.last_saved_s
            placed_mod = materialize(gm, [group], [fn])
            mod = replaying(placed_mod)
            if not check:
                built[name] = mod
                placed_by[name] = placed_mod
                regions[name] = (group, fn)
                return True
            expected = reference()
            with torch.no_grad():
                got = mod(*inputs)
                last_run[0] = (name, None)
                if written is not None:  # what it wrote into its inputs counts as outputs do
                    got = [*_as_list(got), *written.values()]
                    expected = [*_as_list(expected), *want_written[0]]
                ok, errors[name] = within(got, expected, precision)
                if not ok:
                    failures.append(
                        f"{name}: outputs differ from eager's (error {errors[name]:.2g} over "
                        f"the {precision} bound {TOLERANCE[precision]:g})"
                    )
                    return False
        except RestartAnalysis as e:
            # Inductor, compiling a dynamic graph on the frame's sizes, asks Dynamo to trace
            # the frame again with its float arguments fixed (as it does as the frame's own
            # backend); the next trace's graph is searched afresh. Not from a backward: AOT
            # would take it for a failure and compile the backward again at its first call,
            # after the frame's compile, where nothing restarts.
            if kind != "backward":
                raise
            failures.append(f"{name}: {type(e).__name__} (a float argument made a symbol)")
            return False
        except Exception as e:  # noqa: BLE001 - a compiler failing is a logged fallback
            failures.append(f"{name}: {type(e).__name__}: {str(e).splitlines()[0][:200]}")
            log.info(
                "torch_plugin placement: %s cannot compile the whole %s graph (%s)",
                name,
                kind,
                failures[-1],
            )
            return False
        built[name] = mod
        placed_by[name] = placed_mod
        regions[name] = (group, fn)
        passed.append(name)
        return True

    def time_whole(name: str) -> float:
        if name == "eager":
            reference()  # eager's first run gives the reference and warms eager up
        ran, ran_s = last_run[0]
        last_run[0] = ("", None)
        warm = ran == name
        ran_s = ran_s if warm else None
        with torch.no_grad():
            # Eager ran for the reference, a compiler's graph for its check: a later round's
            # first call is a sample, not a warm-up (a second a graph at batch 8).
            seconds = time_end_to_end(
                built[name],
                inputs,
                opts.samples,
                warm=warm,
                ran_s=ran_s,
                has_run=name == "eager" or name in passed,
            )
        # Less the copies that set its written inputs back before each run.
        return seconds if written is None else max(seconds - written.restore_s, 0.0)

    def floor(name: str, target_s: float) -> float:
        # Inductor's matmuls timed alone: its compile is skipped where they cannot beat the
        # fastest graph so far (kernel_floor.py). Not for a symbolic-size graph.
        if dynamic or not kernel_floor.applies(by_name.get(name), inputs):
            return 0.0
        try:
            return kernel_floor.matmul_floor(gm, target_s)
        except Exception as e:  # noqa: BLE001 - no floor is a bound too (0)
            log.info("torch_plugin placement: no matmul floor for %s (%s)", name, e)
            return 0.0

    cache = ProfileCache(opts.cache_path)
    try:
        cached = cache.get_decision(decision_key)
        plan: dict[str, Any] | None = None
        # A refined decision too: its pick is what the finer placement is measured against, and
        # the finer search replays from its own caches (below). Searching every whole graph
        # again instead made a refined graph's warm compile as long as a cold one.
        if isinstance(cached, dict) and "pick" in cached:
            pick = cached["pick"]
            checked = digest is not None and isinstance(
                cache.get_decision(_verified_key(decision_key, pick, digest)), dict
            )
            if pick == "eager" or (pick in by_name and compile_whole(pick, check=not checked)):
                plan = dict(cached, cached=True)
        if plan is None:
            bar = opts.progress_bar(len(compilers), f"torch_plugin: compiling the {kind} graph")

            def compile_step(name: str) -> bool:
                bar.set_postfix_str(name)
                ok = compile_whole(name)
                bar.update(1)
                return ok

            try:
                rates = compile_rates(cache, machine, compilers, computes)
                measurer = SimpleNamespace(
                    compile=compile_step,
                    time=time_whole,
                    elapsed=lambda: time.perf_counter() - t_start,
                    served=lambda name: name in served,
                    saved_s=lambda name: saved.get(name, 0.0),
                    floor=floor,
                    free_bytes=memory.free_bytes,
                )
                # As a dict: the profile cache keeps it as JSON.
                plan = (
                    _C.PassManager()
                    .search_whole_graph_first(
                        compilers,
                        measurer,
                        _C.WholeGraphSearchOptions(
                            turns=3,
                            # The explicit pass (always_refine) searches in the user's
                            # time_budget_s, not in the default compile's multiple of
                            # Inductor's compile: that left ONNX Runtime's whole graph
                            # uncompiled on NasNet (3.6 s expected, 1.8 s of 12.6 s left),
                            # and the finer search, its measuring cut by the budget, ended
                            # 1.3x slower than that graph.
                            budget_s=float(opts.time_budget_s) if always_refine else 0.0,
                            budget_factor=float(opts.budget_factor),
                            fallback_budget_s=float(opts.time_budget_s),
                            allow_refine=bool(opts.allow_refine and opts.evolve) and not dynamic,
                            always_refine=always_refine and not dynamic,
                            refine_candidates=len(nodes),
                            lower_bound_s={} if dynamic else lower_bounds(graph, backends, inputs),
                            expected_compile_s=expected_compiles(backends, rates, len(nodes)),
                            compiles_with={
                                b.name: b.compiles_with
                                for b in backends
                                if b.graph_level and b.compiles_with
                            },
                            compile_bytes=memory.compile_bytes(compilers, frozen, computes),
                        ),
                    )
                    .to_dict()
                )
            finally:
                bar.close()
            if plan["notes"]:
                log.info("torch_plugin placement: %s", plan["notes"])
            plan["cached"] = False
            if dynamic:
                plan["reason"] = (
                    "sizes symbolic (dynamic shapes): only compilers that keep them so ("
                    + (", ".join(compilers) or "none here")
                    + "), no finer search"
                )
            plan["failures"] = failures
            plan["errors"] = errors
            plan["precision"] = precision
            plan["compute"] = computes
            plan["bf16x3_linears"] = {
                n: by_name[n].last_bf16x3 for n in compilers if computes[n] == bf16x3.COMPUTE
            }
    finally:
        cache.close()

    if rng is not None:
        rng.restore()
    pick = plan["pick"]
    placed = placed_by.get(pick, gm)
    result = PlacementResult(
        groups=_groups(gm, nodes, pick, float(plan["pick_s"])),
        dp_cost_s=0.0,
        dp_exact=True,
        dp_states=0,
        measured_eager_s=plan["eager_s"] or None,
        measured_final_s=plan["pick_s"] or None,
        failures=list(plan.get("failures", [])),
        kept_eager=pick == "eager",
        kind=kind,
        whole_graph=plan,
        frozen=len(frozen) if pick != "eager" else 0,
    )
    # The explicit pass searches again from a cached pick (the finer search has a cache of its
    # own); the default compile replays the cached decision, the finer search where it won.
    if plan["refine"] and (always_refine or not plan["cached"] or plan.get("refined")):
        # The explicit pass's finer search gets what the whole-graph search left of the user's
        # time_budget_s; the default compile's, what is left of its budget but at least a second.
        if always_refine:
            budget = max(0.0, opts.time_budget_s - (time.perf_counter() - t_start))
        else:
            budget = max(1.0, float(plan["refine_budget_s"]))
        # Its evolution's finalists include each compiler's whole graph: built above where the
        # finer search would build the same (f32: it builds f32 regions).
        reuse = regions if compute == "f32" else {}
        placed, result = _refine(
            gm, example_inputs, opts, input_kinds, placed, result, plan, budget, reuse, decision_key
        )
    checked = passed if digest is not None else []
    if not plan["cached"] or checked:
        cache = ProfileCache(opts.cache_path)
        try:
            if not plan["cached"]:
                keep = {k: v for k, v in plan.items() if k != "cached"}
                keep["refined"] = bool(result.whole_graph and result.whole_graph.get("refined"))
                # A search that left a compiler out for the memory free at that moment is not
                # kept: the next process, with more room, searches again.
                if not plan["memory_limited"]:
                    cache.put_decision(decision_key, keep)
                # Graphs with frozen weights only (Inductor serves others from its FX graph
                # cache), and of those the compiles no cache served.
                if frozen:
                    trials = [t for t in plan["trials"] if t["backend"] not in served]
                    record_compile_rates(cache, machine, trials, len(nodes), computes, by_name)
            for name in checked:
                verified = {"error": errors.get(name)}
                cache.put_decision(_verified_key(decision_key, name, str(digest)), verified)
        finally:
            cache.close()
    result.search_s = time.perf_counter() - t_start
    if reference_sink is not None and want:
        reference_sink.append(want[0])
    return placed, result


def _may_skip_check(frozen: dict[str, torch.Tensor], inputs: Sequence[Any]) -> bool:
    """Whether a rebuilt graph's check may be skipped for weights it was checked on: frozen
    weights (the compiled graph holds them), all on the CPU (a device's would be copied to be
    fingerprinted, and its check runs fast)."""
    tensors = [*frozen.values(), *(x for x in inputs if isinstance(x, torch.Tensor))]
    return bool(frozen) and all(t.device.type == "cpu" for t in tensors)


def _weights_digest(gm: fx.GraphModule, frozen: dict[str, torch.Tensor]) -> str:
    """A fingerprint of the frozen weights and the graph's own constants: names, shapes,
    dtypes and a CRC-32 of each `DIGEST_PIECE` bytes of theirs (several times SHA-256's speed;
    it tells the weights a graph was checked on from changed ones, which is all it is for).
    zlib lets go of the GIL while it sums, so the pieces are summed on as many threads as
    torch computes on: on one thread of the 2-core Xeon the 1.2B Llama's 4.9 GB took 2.4-3.0 s
    of its warm compile, on two 1.05-1.5 s. At most `DIGEST_BATCH` bytes of pieces are held at
    a time (a non-contiguous tensor's bytes are a copy)."""
    tensors = [*sorted(frozen.items()), *sorted(gm.named_buffers())]
    h = hashlib.sha256()
    threads = max(1, torch.get_num_threads())
    with ThreadPoolExecutor(threads) if threads > 1 else nullcontext() as pool:

        def add(batch: list[tuple[str, torch.Tensor, list[memoryview]]]) -> None:
            flat = [p for _, _, ps in batch for p in ps]
            sums = iter(pool.map(zlib.crc32, flat) if pool else map(zlib.crc32, flat))
            for name, t, ps in batch:
                h.update(repr((name, tuple(t.shape), t.stride(), str(t.dtype), len(ps))).encode())
                for _ in ps:
                    h.update(next(sums).to_bytes(4, "little"))
            batch.clear()

        batch: list[tuple[str, torch.Tensor, list[memoryview]]] = []
        held = 0
        for name, t in tensors:
            data = tensor_bytes(t)
            batch.append(
                (name, t, [data[i : i + DIGEST_PIECE] for i in range(0, len(data), DIGEST_PIECE)])
            )
            held += len(data)
            if held >= DIGEST_BATCH:
                add(batch)
                held = 0
        add(batch)
    return h.hexdigest()


# Pieces small enough to share a large model's weights out evenly between threads, summed a
# batch at a time.
DIGEST_PIECE = 16 << 20
DIGEST_BATCH = 512 << 20


def _verified_key(decision_key: str, compiler: str, digest: str) -> str:
    """Where a compiler's whole graph is recorded as checked on weights of this digest."""
    return ProfileCache.key(VERIFIED_VERSION, f"{decision_key}\n{compiler}", digest)


VERIFIED_VERSION = "whole-graph-verified-v1"

# Compile seconds per node kept per compiler, the precision it computes in, and machine: the
# last few whole-graph compiles. v2: the output check's run no longer counted as compile time.
RATE_VERSION = "compile-rate-v2"
RATE_HISTORY = 8


def compile_rates(
    cache: ProfileCache,
    machine: str,
    compilers: Sequence[str],
    computes: dict[str, str] | None = None,
) -> dict[str, float]:
    """Per compiler, the median seconds per node of its last whole-graph compiles on this
    machine (with these library versions) in the precision it computes in (`computes`, f32
    where absent); absent where none was recorded. They replace the backends' fixed priors
    (Backend.compile_s_per_node) in the search's compile expectations. Per precision: OpenVINO
    compiled GPT-2 at batch 8 in 5.4 s in f32 and 1.4 s in bf16, so a bf16 search after an
    f32 one expected 4.6 s, ordered it after Inductor and found the budget spent."""
    computes = computes or {}
    histories = {n: _rate_history(cache, machine, n, computes.get(n, "f32")) for n in compilers}
    return {name: float(statistics.median(h)) for name, h in histories.items() if h}


def expected_compiles(
    backends: Sequence[Any], rates: dict[str, float], nodes: int
) -> dict[str, float]:
    """Per graph compiler, its expected whole-graph compile in seconds: its recorded rate (else
    its prior) times the nodes. Absent for a compiler that replays another's compile (a CUDA
    graph of Inductor's): the search places it after that one (compiles_with)."""
    return {
        b.name: rates.get(b.name, b.compile_s_per_node) * nodes
        for b in backends
        if b.graph_level and b.compiles_with is None
    }


def record_compile_rates(
    cache: ProfileCache,
    machine: str,
    trials: Sequence[dict[str, Any]],
    nodes: int,
    computes: dict[str, str] | None = None,
    by_name: dict[str, Any] | None = None,
) -> None:
    """Adds each compiled trial's seconds per node to its compiler's history: its compile
    less one run of its graph (the output check's; a batch-8 GPT-2's check runs made
    OpenVINO's compile look 30% of Inductor's, which ordered it after Inductor). The rest of
    the check's run stays: a first run may finish the compile (OpenVINO's). Called with the
    trials that compiled: a graph served from a cache (Inductor's FX graph cache, a kept
    artifact) would record a rate far below a real compile's."""
    if nodes <= 0:
        return
    for t in trials:
        name = t["backend"]
        compile_s = t["compile_s"] - t.get("median_s", 0.0)
        if name == "eager" or not t["compiled"] or compile_s <= 0:
            continue
        # A replay's seconds are a capture's, or the compile it replays when it went first: no
        # compile rate of its own (recorded, they had it expected to cost Inductor's compile).
        if getattr((by_name or {}).get(name), "compiles_with", None) is not None:
            continue
        compute = (computes or {}).get(name, "f32")
        seen = [*_rate_history(cache, machine, name, compute), compile_s / nodes]
        payload = {"s_per_node": seen[-RATE_HISTORY:]}
        cache.put_decision(_rate_key(machine, name, compute), payload)


def _rate_key(machine: str, compiler: str, compute: str) -> str:
    return ProfileCache.key(RATE_VERSION, f"{compiler}:{compute}", machine)


def _rate_history(cache: ProfileCache, machine: str, compiler: str, compute: str) -> list[float]:
    got = cache.get_decision(_rate_key(machine, compiler, compute))
    seen = got.get("s_per_node") if isinstance(got, dict) else None
    return list(seen) if isinstance(seen, list) else []


# The measured peak times this: a boost clock or a noisy measurement must not make a bound
# unsound (a compiler wrongly ruled out).
PEAK_SLACK = 1.25


@functools.cache
def _f32_peak(threads: int) -> float:
    return float(_C.measure_f32_peak(threads))


def lower_bounds(graph: Any, backends: Sequence[Any], inputs: Sequence[Any]) -> dict[str, float]:
    """Per graph compiler that computes in f32 on the CPU: the seconds its graph takes at least,
    the graph's multiply-add FLOPs (those the cost model knows) at the machine's f32 peak. With
    bf16 allowed, one that stays in f32 (ONNX Runtime) cannot beat a bf16 graph faster than
    that, and its compile is saved; in f32 the bound rarely rules anything out."""
    on_cpu = all(x.device.type == "cpu" for x in inputs if isinstance(x, torch.Tensor))
    names = [b.name for b in backends if b.graph_level and b.compute == "f32"]
    if not on_cpu or not names:
        return {}
    flops = sum(e[3] for e in graph.estimate() if e[5])
    peak = _f32_peak(torch.get_num_threads()) * PEAK_SLACK
    if flops <= 0 or peak <= 0:
        return {}
    return {n: flops / peak for n in names}


def _groups(gm: fx.GraphModule, nodes: list[str], pick: str, seconds: float) -> list[Group]:
    ops = {
        n.name: fx_bridge.op_name(n.target) if n.op == "call_function" else n.op
        for n in gm.graph.nodes
    }
    if pick == "eager":
        return [Group("aten", "op", [n], [], [], 0.0, [ops[n]]) for n in nodes]
    return [Group(pick, "graph", list(nodes), [], [], seconds, [ops[n] for n in nodes])]


# What the finer search saw, reported with a whole-graph pick it did not beat.
_FINER_STATS = (
    "candidates",
    "candidates_by_rule",
    "measured",
    "cache_hits",
    "unmeasured",
    "cold_cache",
    "evolution",
    "phase_s",
    "measured_dp_s",
    "dp_states",
    "dp_exact",
)


def _refine(
    gm: fx.GraphModule,
    example_inputs: Sequence[Any] | None,
    opts: PlacementOptions,
    input_kinds: Sequence[tuple[str, str]] | None,
    placed: fx.GraphModule,
    result: PlacementResult,
    plan: dict[str, Any],
    budget_s: float,
    whole_graphs: dict[str, tuple[Group, Any]] | None = None,
    decision_key: str = "",
) -> tuple[fx.GraphModule, PlacementResult]:
    """The finer search in what is left of the budget; kept only if it measures faster than
    the whole-graph pick, the two timed in turns. The verdict is cached under the decision and
    the finer placement it judged: a warm compile returns what the cold one did (BERT at batch
    8 re-measured a near tie and ran OpenVINO's 93-node placement warm, ONNX Runtime's whole
    graph cold)."""
    # f32 regions (the summary says so when the precision is bf16).
    if opts.precision == "bf16":
        log.info(
            "torch_plugin placement: the finer search builds f32 regions; its placement "
            "replaces the bf16 whole-graph pick only where it measures faster"
        )
    finer_opts = dataclasses.replace(
        opts,
        search="exhaustive",
        time_budget_s=budget_s,
        precision=None,
    )
    try:
        finer, finer_result = place_graph(
            gm,
            example_inputs,
            finer_opts,
            input_kinds,
            whole_graphs=whole_graphs,
            beat_s=float(plan["pick_s"]) if plan["pick"] != "eager" else 0.0,
        )
    except Exception as e:  # noqa: BLE001 - the whole-graph pick stands
        log.info(
            "torch_plugin placement: the finer search failed (%s); keeping %s", e, plan["pick"]
        )
        return placed, result
    if finer_result.not_built:  # the pick stands, nothing to time against it
        plan["finer_not_built"] = finer_result.not_built
        _keep_pick_with(result, finer_result)
        return placed, result
    verdict_key = ProfileCache.key(
        "refine-verdict",
        decision_key + repr([(g.backend, g.rule, tuple(g.nodes)) for g in finer_result.groups]),
        "",
    )
    cache = ProfileCache(opts.cache_path)
    try:
        verdict = cache.get_decision(verdict_key) if decision_key else None
        if not isinstance(verdict, dict) or not {"whole_s", "finer_s"} <= verdict.keys():
            inputs = list(example_inputs) if example_inputs is not None else synthesize_inputs(gm)
            times: dict[int, list[float]] = {0: [], 1: []}
            with torch.no_grad():
                for _ in range(3):
                    times[0].append(time_end_to_end(placed, inputs, opts.samples))
                    times[1].append(time_end_to_end(finer, inputs, opts.samples))
            verdict = {k: statistics.median(times[i]) for i, k in enumerate(("whole_s", "finer_s"))}
            if decision_key:
                cache.put_decision(verdict_key, verdict)
    finally:
        cache.close()
    whole_s, finer_s = float(verdict["whole_s"]), float(verdict["finer_s"])
    plan["finer_s"] = finer_s
    if finer_s < whole_s * 0.98:
        plan["refined"] = True
        finer_result.whole_graph = plan
        finer_result.kind = result.kind
        finer_result.frozen = result.frozen
        finer_result.measured_final_s = finer_s
        return finer, finer_result
    plan["refined"] = False
    _keep_pick_with(result, finer_result)
    return placed, result


def _keep_pick_with(result: PlacementResult, finer_result: PlacementResult) -> None:
    """The pick stands; what the finer search saw (candidates per rule, their failures) is
    reported with it."""
    for field in _FINER_STATS:
        setattr(result, field, getattr(finer_result, field))
    result.failures = [*result.failures, *finer_result.failures]


class _Restoring:
    """State a search sets back before each run: `replaying(fn)` is `fn` run after restore()."""

    def restore(self) -> None:
        raise NotImplementedError

    def replaying(self, fn: Any) -> Any:
        def run(*args: Any) -> Any:
            self.restore()
            return fn(*args)

        run.__wrapped__ = fn  # type: ignore[attr-defined] - what is timed, for inspection
        return run


class _Writes(_Restoring):
    """The inputs a graph writes into, as its search runs it: each a copy of the caller's in
    `inputs` (measuring must not write into the user's tensors), set back to its value at the
    call before every run (`replaying`): a write that is not idempotent (a static cache's
    length counter, added to each call) would otherwise land once per run, and GPT-2's next
    write went past its cache's end. `values()` copies out what a run wrote."""

    def __init__(self, inputs: list[Any], index: Sequence[int]) -> None:
        self.index = list(index)
        self.inputs = inputs
        for i in self.index:
            inputs[i] = inputs[i].clone()
        self.start = [inputs[i].clone() for i in self.index]

    def restore(self) -> None:
        for i, x in zip(self.index, self.start, strict=True):
            self.inputs[i].copy_(x)

    def values(self) -> tuple[torch.Tensor, ...]:
        return tuple(self.inputs[i].clone() for i in self.index)

    @functools.cached_property
    def restore_s(self) -> float:
        """Seconds of one restore (timed once): what each timed run spent on it."""
        return time_call(lambda: self.restore(), (), 5, warm_s=0.0, min_s=0.01, max_s=0.1)


class _Generators(_Restoring):
    """The random generators a graph on these inputs' devices draws from (the CPU's, each CUDA
    device's), their state taken now: `replaying(fn)` is `fn` run from that state every call,
    `restore()` sets it back."""

    def __init__(self, inputs: Sequence[Any]) -> None:
        self.cuda = sorted(
            {
                x.device.index or 0
                for x in inputs
                if isinstance(x, torch.Tensor) and x.device.type == "cuda"
            }
        )
        self.cpu = torch.get_rng_state()
        self.states = [torch.cuda.get_rng_state(d) for d in self.cuda]

    def restore(self) -> None:
        torch.set_rng_state(self.cpu)
        for d, state in zip(self.cuda, self.states, strict=True):
            torch.cuda.set_rng_state(state, d)
