"""Backend placement of one ATen graph (Collage): candidates from the C++ pattern rules,
measured on real-shaped inputs with a persistent cache, placed by the C++ dynamic program,
refined by the C++ evolutionary search over graph-level compilers, then materialised as an
`fx.GraphModule` whose groups call their backends' compiled callables.

Python measures and compiles (it has the backends); every decision is made in C++: the
candidates, the DP, the evolution, and the rounds around it (which compilers, in what order,
each round's budget, the finalist kept, eager kept or not: csrc/passes/placement_rounds.h).
"""

from __future__ import annotations

import dataclasses
import logging
import math
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch
import torch.fx as fx

from .. import _C, fx_bridge
from .backends import Backend, for_device, get_backends
from .cache import Entry, ProfileCache, device_key, machine_key
from .materialize import (  # noqa: F401 - re-exported: placement.planner is their old home
    _frozen_for,
    _GroupCall,
    _LazyCompiled,
    _region,
    build_subgraph,
    compile_region,
    frozen_inputs,
    materialize,
)
from .measure import (  # noqa: F401 - re-exported
    _CacheFlush,
    _check_outputs,
    _measure,
    _measure_boundary,
    _measure_switch_penalty,
    _outputs_match,
    _Recorder,
    _shapes_only,
    footprint_bytes,
    last_level_cache_bytes,
    synthesize_inputs,
    time_call,
    time_end_to_end,
)
from .options import PlacementOptions  # noqa: F401 - re-exported
from .result import Built, Group, PlacementResult  # noqa: F401 - re-exported

log = logging.getLogger("torch_plugin")

# 5: op-level ONNX Runtime groups without an arena; the fused kernels on all threads.
# 6: OpenVINO's large f32 matmuls on the GEMM kernel measured faster (openvino_gemm.py).
PROFILE_VERSION = "6"


def place_graph(
    gm: fx.GraphModule,
    example_inputs: Sequence[Any] | None,
    opts: PlacementOptions,
    input_kinds: Sequence[tuple[str, str]] | None = None,
    whole_graphs: Mapping[str, tuple[Group, Callable[..., Any]]] | None = None,
    beat_s: float = 0.0,
) -> tuple[fx.GraphModule, PlacementResult]:
    """Places one ATen graph (inference, or a training graph's forward or backward, which
    AOTAutograd makes pure functions); returns the materialised module and the decision.

    input_kinds: (kind, source) per placeholder; "parameter"/"buffer" inputs are frozen into
    graph compilers' subgraphs when opts.freeze and real example inputs are given.
    whole_graphs: per compiler, its whole graph already compiled (compile_region's "graph"
    region, f32, the same frozen weights), which the evolution's finalists take instead of
    compiling it again: the explicit pass's whole-graph search has built them.
    beat_s: what the graph already runs in (the explicit pass's whole-graph pick); where the
    DP predicts far slower (_C.builds_dp_placement), nothing is built or evolved: the graph is
    returned as it is and result.not_built says why."""
    t_start = time.perf_counter()
    if opts.precision == "bf16":
        log.warning(
            "torch_plugin placement: precision='bf16' applies to the whole-graph search of "
            "inference graphs; this search (a training graph's, or the finer search) builds "
            "f32 regions"
        )
    backends = get_backends(opts.backends, cache_path=opts.cache_path)
    graph, _ = fx_bridge.to_ir(gm)
    inputs = list(example_inputs) if example_inputs is not None else synthesize_inputs(gm)
    recorder = _Recorder(gm)
    with torch.no_grad():
        recorder.run(*inputs)
    values = recorder.values
    placeholders = [n.name for n in gm.graph.nodes if n.op == "placeholder"]
    frozen: dict[str, torch.Tensor] = {}
    if opts.freeze and example_inputs is not None and input_kinds is not None:
        frozen = frozen_inputs(gm, inputs, input_kinds)
    # Weights (and their views, such as a linear's transposed weight): what a group finds cold
    # inside a model larger than the cache. All graph inputs where their kinds are unknown.
    weight_names = (
        {
            n
            for n, (kind, _) in zip(placeholders, input_kinds, strict=False)
            if kind in ("parameter", "buffer")
        }
        if input_kinds is not None
        else set(placeholders)
    )
    weights = {
        values[n].untyped_storage().data_ptr()
        for n in weight_names
        if isinstance(values.get(n), torch.Tensor)
    }
    cache_bytes = last_level_cache_bytes()
    device = device_key(values)
    backends = for_device(backends, device)
    by_name: dict[str, Backend] = {b.name: b for b in backends}
    cold = opts.cold_cache
    if cold is None:
        # The flush evicts the host's last-level cache, which says nothing of a GPU's.
        cold = device == "cpu" and footprint_bytes(values) > cache_bytes
    flush = _CacheFlush(cache_bytes) if cold else None

    phases: dict[str, float] = {}
    mark = [time.perf_counter()]

    def phase(name: str) -> None:
        now = time.perf_counter()
        phases[name] = phases.get(name, 0.0) + now - mark[0]
        mark[0] = now

    phase("record")
    gen = _C.placement_candidates(graph, [b.rule_set for b in backends])
    cands = gen["candidates"]
    for c in cands:
        c["backend"] = backends[[b.rule_set for b in backends].index(c["backend"])].name

    # Bump when how groups are compiled or timed changes: cached figures must be comparable.
    versions = {"torch": torch.__version__, "torch_plugin.placement": PROFILE_VERSION}
    for b in backends:
        versions[b.name] = b.version()
    cache = ProfileCache(opts.cache_path)
    machine = machine_key(device, versions)
    measured = 0
    failures: list[str] = []
    costs: dict[int, float] = {}
    ops_of = {
        n.name: fx_bridge.op_name(n.target) if n.op == "call_function" else n.op
        for n in gm.graph.nodes
    }
    seen_sig: dict[tuple[str, str], Entry] = {}
    by_rule: dict[str, list[int]] = {}

    # At real sizes measuring takes minutes the first time (GPT-2: ~3 of place()'s ~3.5 here),
    # so it stops at time_budget_s: eager's groups first (every node needs one, and they
    # compile nothing), then the others until the budget is spent; what was measured is cached,
    # so the next search goes on from there. The evolutionary rounds get what is left.
    deadline = t_start + opts.time_budget_s  # of measuring, then of the evolutionary rounds
    left_out: dict[str, int] = {}
    bar = opts.progress_bar(len(cands), "placement: measuring")
    try:
        for c in sorted(cands, key=lambda c: c["backend"] != "aten"):
            bar.update(1)
            backend = by_name[c["backend"]]
            signature = c["signature"] + ("|cold" if cold else "")
            if backend.graph_level and frozen:
                signature += "|frozen:" + ",".join(
                    str(k) for k, i in enumerate(c["inputs"]) if i in frozen
                )
            sig_key = (backend.name, signature)
            entry = seen_sig.get(sig_key)
            key = ProfileCache.key(backend.name, signature, machine)
            if entry is None:
                entry = cache.get(key)
            if entry is None and backend.name != "aten" and time.perf_counter() > deadline:
                left_out[backend.name] = left_out.get(backend.name, 0) + 1
                continue
            if entry is None:
                entry = _measure(gm, c, backend, values, opts.samples, frozen, weights, flush)
                measured += 1
                cache.put(key, backend.name, signature, entry)
                if not entry.ok:
                    failures.append(f"{backend.name} on {c['nodes'][:3]}: {entry.note}")
                    log.info(
                        "torch_plugin placement: %s excluded for group %s (%s)",
                        backend.name,
                        c["nodes"][:4],
                        entry.note,
                    )
            seen_sig[sig_key] = entry
            tally = by_rule.setdefault(f"{backend.name}:{c['rule']}", [0, 0])
            tally[0] += 1
            tally[1] += int(entry.ok)
            if entry.ok and entry.seconds is not None:
                costs[c["id"]] = entry.seconds
            elif backend.name == "aten":
                # Eager is the fallback every node must have: keep it, at a nominal cost.
                costs[c["id"]] = 1e-5
    finally:
        bar.close()
    hits = cache.hits
    phase("measure")
    if left_out:
        log.warning(
            "torch_plugin placement: the search's time budget (%.1f s) ran out while measuring "
            "candidate groups: %s left out (the placement is the best of the %d measured or "
            "cached; a larger time_budget_s, or another run, which starts from the profile "
            "cache, measures more)",
            opts.time_budget_s,
            ", ".join(f"{n} of {b}'s" for b, n in sorted(left_out.items())),
            len(cands) - sum(left_out.values()),
        )
    # The recorded intermediates served the measurements (real inputs, eager's references).
    # From here on they only give compiles their example arguments, which are traced, not
    # read: each becomes an untouched buffer of its shape and strides (no resident pages).
    # Held alongside what the DP's compiled groups keep, a model's activations ran full-size
    # NasNet at batch 8 (8.3 GB of module outputs) out of 24 GiB.
    values = _shapes_only(values, keep=set(placeholders))
    del recorder

    penalty = opts.switch_penalty_s
    boundary: dict[str, float] = {}
    if penalty is None:
        # Measured once per machine and cached, like the boundary probes below: a re-measured
        # penalty would let a warm compile's DP choose other groups than the cold one's (the
        # result must be deterministic given the cache).
        key = ProfileCache.key("host", "switch-penalty-v1", machine)
        entry = cache.get(key)
        if entry is None:
            entry = Entry(_measure_switch_penalty(opts.samples), True, "", 0.0)
            cache.put(key, "host", "switch-penalty-v1", entry)
        penalty = entry.seconds
        # What a backend's calls cost between ATen ops beyond their isolated time (waking its
        # thread pool, moving tensors in and out): measured once per machine, cached.
        for b in backends:
            if b.graph_level:
                key = ProfileCache.key(b.name, "boundary-probe-v1", machine)
                entry = cache.get(key)
                if entry is None:
                    entry = _measure_boundary(b, opts.samples)
                    cache.put(key, b.name, "boundary-probe-v1", entry)
                boundary[b.name] = entry.seconds or 0.0
    choices = [
        _C.PlacementChoice(
            candidate=c["id"],
            nodes=c["node_ids"],
            cost=costs[c["id"]] + boundary.get(c["backend"], 0.0),
            backend=c["backend"],
        )
        for c in cands
        if c["id"] in costs
    ]
    dp = _C.PassManager(log=log.debug).place_op_level(
        graph,
        choices,
        _C.PlacementOptions(max_states=opts.max_states),
        switch_penalty=penalty,
    )
    by_id = {c["id"]: c for c in cands}
    groups = [
        Group(
            by_id[i]["backend"],
            by_id[i]["rule"],
            list(by_id[i]["nodes"]),
            list(by_id[i]["inputs"]),
            list(by_id[i]["outputs"]),
            costs[i],
            [ops_of.get(n, "?") for n in by_id[i]["nodes"]],
        )
        for i in dp.chosen
    ]
    result = PlacementResult(
        groups=groups,
        dp_cost_s=dp.cost,
        dp_exact=dp.exact,
        dp_states=dp.states,
        candidates=len(cands),
        candidates_by_rule=by_rule,
        measured=measured,
        cache_hits=hits,
        failures=failures,
        switch_penalty_s=penalty,
        boundary_s=boundary,
        cold_cache=cold,
        unmeasured=dict(left_out),
    )
    phase("dp")
    rounds = _C.PlacementRoundOptions(hopeless_ratio=float(opts.dp_hopeless_ratio))
    if not _C.builds_dp_placement(dp.cost, beat_s, rounds):
        result.not_built = (
            f"the DP's placement predicts {dp.cost * 1e3:.3f} ms, the graph already runs in "
            f"{beat_s * 1e3:.3f} ms: not built or evolved"
        )
        log.info("torch_plugin placement: %s", result.not_built)
        cache.close()
        result.phase_s = phases
        result.search_s = time.perf_counter() - t_start
        return gm, result
    # Compiled on first use: a warm compile builds only the groups its replayed rounds and
    # pick use (the pick is often one whole-graph region; a wide graph's DP has hundreds).
    compiled = _LazyCompiled(gm, groups, by_name, values, frozen)
    evolve_backends = _pick_evolve_backends(opts, backends, len(gm.graph.nodes))
    evolving = opts.evolve and bool(evolve_backends)
    try:
        cached = None
        if evolving:
            decision_key = ProfileCache.key(
                "decision",
                _C.graph_signature(graph)
                + repr(
                    (
                        sorted(by_name),
                        [b.name for b in evolve_backends],
                        opts.max_evaluations,
                        opts.seed,
                        _placement_key(groups, frozen),
                    )
                ),
                machine,
            )
            cached = cache.get_decision(decision_key)
            if cached is None and time.perf_counter() > deadline:
                # Its rounds would have no time, but their finalists (each compiler's whole
                # graph) would still be built and timed: GPT-2's took 41 s past the budget.
                evolving = False
                log.warning(
                    "torch_plugin placement: the search's time budget (%.1f s) was spent before "
                    "the evolutionary search: the DP's placement stands (a larger time_budget_s, "
                    "or another run, which starts from the profile cache, evolves it)",
                    opts.time_budget_s,
                )
        if cached is None:
            compiled.compile_all()  # a cold search runs the DP's placement first
        phase("compile")
        if evolving:
            groups, compiled, evolution = _evolve(
                gm,
                groups,
                compiled,
                evolve_backends,
                values,
                inputs,
                opts,
                cached,
                frozen,
                deadline,
                whole_graphs or {},
            )
            if not evolution["cached"]:
                cache.put_decision(decision_key, evolution)
            placed = materialize(gm, groups, compiled)
            result.groups = groups
            result.evolution = evolution
            result.measured_dp_s = evolution["seed_fitness"]
            finalists_s = evolution["finalists_s"]
            picked = finalists_s[evolution["final"]] if finalists_s else -1.0
            result.measured_final_s = picked if picked > 0 else evolution["best_fitness"]
        else:
            placed = materialize(gm, groups, compiled)
            result.measured_dp_s = time_end_to_end(placed, inputs, opts.samples)
            result.measured_final_s = result.measured_dp_s
        phase("evolve")
        _check_outputs(placed, gm, inputs)
        # Never slower than the graph we were given: both measured now, side by side. The
        # verdict is cached with the placement it judged, so a warm compile returns what the
        # cold one did (a fresh re-measurement of a near tie could flip it).
        check_key = ProfileCache.key(
            "final-check",
            _C.graph_signature(graph) + repr(_placement_key(result.groups, frozen)),
            machine,
        )
        verdict = cache.get_decision(check_key)
        if not isinstance(verdict, dict) or not {"eager_s", "final_s"} <= verdict.keys():
            with torch.no_grad():
                eager_s = time_end_to_end(gm, inputs, opts.samples)
                final_s = time_end_to_end(placed, inputs, opts.samples)
            verdict = {"eager_s": eager_s, "final_s": final_s}
            cache.put_decision(check_key, verdict)
        result.measured_eager_s = float(verdict["eager_s"])
        final_s = float(verdict["final_s"])
    finally:
        cache.close()
    if _C.keeps_eager(final_s, result.measured_eager_s, _C.PlacementRoundOptions()):
        log.info(
            "torch_plugin placement: the placed graph measured %.3f ms, eager %.3f ms; "
            "keeping eager",
            final_s * 1e3,
            result.measured_eager_s * 1e3,
        )
        placed = gm
        result.kept_eager = True
        result.groups = [
            Group("aten", "op", [n], [], [], 0.0, [ops_of.get(n, "?")])
            for n in (node.name for node in gm.graph.nodes)
            if ops_of.get(n) not in ("placeholder", "output")
        ]
    phase("check")
    result.phase_s = phases
    result.search_s = time.perf_counter() - t_start
    return placed, result


def _placement_key(groups: Sequence[Group], frozen: dict[str, torch.Tensor]) -> tuple[Any, ...]:
    """What a cached decision about a placement depends on: its groups and which weights are
    frozen (frozen weights compile, and run, differently)."""
    return [(g.backend, g.rule, g.nodes) for g in groups], sorted(frozen)


def _pick_evolve_backends(
    opts: PlacementOptions, backends: Sequence[Backend], nodes: int
) -> list[Backend]:
    """The graph-level compilers the search offloads to, one round each, in the order C++
    decides (csrc/passes/placement_rounds.h: cheapest expected compile first, from each
    compiler's seconds per node)."""
    graph_level = {b.name: b for b in backends if b.graph_level}
    order = _C.placement_round_order(
        [(b.name, b.compile_s_per_node * nodes) for b in graph_level.values()],
        _C.PlacementRoundOptions(only=opts.evolve_backend or ""),
    )
    if opts.evolve_backend is not None and not order:
        log.warning(
            "torch_plugin placement: evolve_backend %r is not an available graph-level "
            "backend; skipping the evolutionary search",
            opts.evolve_backend,
        )
    return [graph_level[name] for name in order]


def _evolve(
    gm: fx.GraphModule,
    groups: list[Group],
    compiled: Sequence[Callable[..., Any] | None],
    evolve_backends: Sequence[Backend],
    values: dict[str, Any],
    inputs: Sequence[Any],
    opts: PlacementOptions,
    cached: dict[str, Any] | None,
    frozen: dict[str, torch.Tensor],
    deadline: float,
    whole_graphs: Mapping[str, tuple[Group, Callable[..., Any]]],
) -> tuple[list[Group], Sequence[Callable[..., Any] | None], dict[str, Any]]:
    """One evolutionary round per graph-level compiler, each seeded with the previous result
    (the first with the DP's): so the final program can mix regions of several compilers.
    The rounds share what is left of the search's time_budget_s until `deadline`."""
    rounds: list[dict[str, Any]] = []
    cached_rounds = (cached or {}).get("rounds", [])
    # The seed, then per round the whole graph on its compiler and the round's result, as
    # thunks: the final pick among them is measured again (a warm compile builds its pick).
    finalists: list[Callable[[], Built]] = [lambda g=groups, c=compiled: (g, c)]
    for k, backend in enumerate(evolve_backends):
        hit = None
        if k < len(cached_rounds) and cached_rounds[k].get("backend") == backend.name:
            hit = cached_rounds[k]
        groups, compiled, info, whole = _evolve_round(
            gm,
            groups,
            compiled,
            backend,
            values,
            inputs,
            opts,
            hit,
            _C.round_budget(deadline - time.perf_counter(), len(evolve_backends) - k),
            _frozen_for(backend, frozen),
            whole_graphs.get(backend.name),
        )
        rounds.append(info)
        finalists += [whole, lambda g=groups, c=compiled: (g, c)]
    cached_all = all(r.get("cached", False) for r in rounds)
    final = (cached or {}).get("final") if cached_all else None
    final_s: list[float] = []
    if isinstance(final, int) and 0 <= final < len(finalists):
        chosen = finalists[final]()
    else:
        final, final_s, chosen = _pick_finalist(gm, finalists, inputs, opts.samples)
    summary = {
        "rounds": rounds,
        "seed_fitness": rounds[0]["seed_fitness"],
        "best_fitness": min(r["best_fitness"] for r in rounds),
        "evaluations": sum(r["evaluations"] for r in rounds),
        "cached": cached_all,
        "final": final,
        "finalists_s": final_s,
    }
    return chosen[0], chosen[1], summary


def _pick_finalist(
    gm: fx.GraphModule,
    finalists: Sequence[Callable[[], Built]],
    inputs: Sequence[Any],
    samples: int,
    turns: int = 3,
) -> tuple[int, list[float], Built]:
    """The fastest of the seed and the rounds' results, measured in turns (median of each
    one's turns). Each round kept its best by one measurement per individual; on a
    sub-millisecond graph two such measurements differ by up to 10-50% (another runtime's
    thread pool still spinning, the machine's drift), so a later round's "better" result can
    be noise, and rounds compound it. Re-measuring a handful of finalists side by side keeps
    the search from returning a placement slower than one it already held."""
    built = [make() for make in finalists]
    # The same placement reached twice (a round that kept its seed) is measured once.
    first: dict[tuple[Any, ...], int] = {}
    for k, (gs, _) in enumerate(built):
        first.setdefault(tuple((g.backend, tuple(g.nodes)) for g in gs), k)
    distinct = sorted(first.values())
    times: list[list[float]] = [[] for _ in built]
    if len(distinct) > 1:  # one distinct placement (the seed) needs no timing to be kept
        modules = {k: materialize(gm, *built[k]) for k in distinct}
        with torch.no_grad():
            # Numbers checked once per finalist, not on every turn.
            modules = {k: m for k, m in modules.items() if _outputs_match(m, gm, inputs, 1e-3)}
            for _ in range(turns):
                for k, mod in modules.items():
                    times[k].append(time_end_to_end(mod, inputs, samples))
    # C++ keeps the fastest median, or the seed when nothing was measured (the caller checks
    # it against eager).
    pick = _C.pick_finalist(times)
    log.info(
        "torch_plugin placement: finalists (seed, then whole graph and result per round) "
        "%s ms; picked %d",
        ", ".join("-" if m < 0 else f"{m * 1e3:.3f}" for m in pick.medians_s),
        pick.index,
    )
    return pick.index, list(pick.medians_s), built[pick.index]


def _evolve_round(
    gm: fx.GraphModule,
    groups: list[Group],
    compiled: Sequence[Callable[..., Any] | None],
    backend: Backend,
    values: dict[str, Any],
    inputs: Sequence[Any],
    opts: PlacementOptions,
    cached: dict[str, Any] | None,
    budget_s: float,
    consts: dict[str, torch.Tensor],
    whole_graph: tuple[Group, Callable[..., Any]] | None = None,
) -> tuple[list[Group], Sequence[Callable[..., Any] | None], dict[str, Any], Callable[[], Built]]:
    """Bits over the current groups: set = run by `backend`, with consecutive set groups (a
    contiguous stretch of a topological order, hence convex) merged into one region; a clear
    bit keeps the group as it is (a group of `backend` goes back to ATen). Returns the round's
    result and a thunk that builds the whole graph as one region of `backend` (`whole_graph`
    where it was compiled before)."""
    region_cache: dict[tuple[str, ...], tuple[Group, Callable[..., Any]] | None] = {}
    seed = [g.backend == backend.name for g in groups]
    # A region's nodes in the graph's order, whatever order its groups came in: the same region
    # then has one key (its compile, the cached verdicts on placements holding it). The whole
    # graph built here in the DP groups' order missed the final check the cold compile had
    # cached for the whole-graph search's region: a warm compile measured again.
    position = {n.name: i for i, n in enumerate(gm.graph.nodes)}

    def build(bits: Sequence[bool]) -> Built:
        out_groups: list[Group] = []
        out_fns: list[Callable[..., Any] | None] = []
        runs = dict(_C.offloaded_runs(list(bits)))  # C++ decodes the bits into regions
        i = 0
        while i < len(groups):
            if i not in runs:
                g = groups[i]
                if g.backend == backend.name:  # turned off: back to ATen
                    out_groups.append(dataclasses.replace(g, backend="aten", rule="op"))
                    out_fns.append(None)
                else:
                    out_groups.append(g)
                    out_fns.append(compiled[i])
                i += 1
                continue
            j = runs[i]
            nodes = sorted((n for g in groups[i:j] for n in g.nodes), key=position.__getitem__)
            key = tuple(nodes)
            if key not in region_cache and i == 0 and j == len(groups) and whole_graph:
                # NasNet's explicit pass compiled its three whole graphs twice, the second
                # time after the rounds had spent the budget.
                region_cache[key] = whole_graph
            if key not in region_cache:
                # "graph": the whole graph, with no other runtime between its calls.
                rule = "graph" if i == 0 and j == len(groups) else "region"
                try:
                    region_cache[key] = compile_region(gm, nodes, backend, values, consts, rule)
                except Exception as e:  # noqa: BLE001 - this region keeps its groups
                    log.info(
                        "torch_plugin placement: %s cannot compile a region of %d nodes (%s)",
                        backend.name,
                        len(nodes),
                        e,
                    )
                    region_cache[key] = None
            hit = region_cache[key]
            if hit is None:
                out_groups.extend(groups[i:j])
                out_fns.extend(compiled[i:j])
            else:
                region, fn = hit
                out_groups.append(
                    dataclasses.replace(
                        region,
                        seconds=sum(g.seconds for g in groups[i:j]),
                        ops=[o for g in groups[i:j] for o in g.ops],
                    )
                )
                out_fns.append(fn)
            i = j
        return out_groups, out_fns

    def fitness(bits: list[bool]) -> float:
        try:
            gs, fns = build(bits)
            mod = materialize(gm, gs, fns)
            with torch.no_grad():
                if not _outputs_match(mod, gm, inputs, 1e-3):
                    return math.inf
                return time_end_to_end(mod, inputs, opts.samples)
        except Exception as e:  # noqa: BLE001 - an individual that fails is just unfit
            log.debug("torch_plugin placement: individual failed (%s)", e)
            return math.inf

    def whole() -> Built:
        return build([True] * len(groups))

    if cached is not None and len(cached.get("best", [])) == len(groups):
        # A warm compile: this round already ran for this graph, options and machine.
        best = [bool(b) for b in cached["best"]]
        gs, fns = build(best) if best != seed else (groups, compiled)
        return gs, fns, dict(cached, cached=True), whole

    bar = opts.progress_bar(opts.max_evaluations, f"placement: evolving ({backend.name})")

    def progress(gen: int, best: float, evals: int) -> None:
        bar.n = evals
        bar.set_postfix(best_ms=f"{best * 1e3:.3f}")
        bar.refresh()

    try:
        pm = _C.PassManager(log=log.debug, time_budget_s=budget_s if budget_s > 0 else 1e-9)
        r = pm.evolve_placement(
            seed,
            fitness,
            _C.EvolveOptions(
                population=8,
                generations=10,
                min_improvement=0.02,
                seed=opts.seed,
                max_evaluations=opts.max_evaluations,
            ),
            progress=progress,
        ).to_dict()
    finally:
        bar.close()
    info = {
        k: r[k]
        for k in (
            "best",
            "best_fitness",
            "seed_fitness",
            "evaluations",
            "generations",
            "stopped_by_deadline",
        )
    }
    info["backend"] = backend.name
    info["offloaded"] = int(sum(r["best"]))
    if r["best"] == seed:
        return groups, compiled, info, whole
    gs, fns = build(r["best"])
    return gs, fns, info, whole
