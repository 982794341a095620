"""The torch.compile backend: Dynamo graph -> AOTAutograd (ATen, fw + bw) -> C++ pipeline -> FX.

AOTAutograd is configured exactly like PyTorch's `aot_eager` (same partitioner, no extra
decompositions), so the identity pipeline executes the very same ATen graph and is
bit-identical to `aot_eager`. Each ATen graph (forward, backward, or inference) goes through
`fx_bridge.to_ir`, `_C.run_pipeline` and `fx_bridge.from_ir`. Any failure there falls back to
the unrewritten graph with one log line (or re-raises with on_error="raise").
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import logging
import os
import time
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import torch
import torch.fx as fx

from . import _C, fx_bridge
from .options import PYTHON_PASSES, Options

log = logging.getLogger("torch_plugin")
BACKEND_NAME = "torch_plugin"


def _remove_sink(sinks: list[Any], sink: Any) -> None:
    """Removes `sink` itself: list.remove would take the first equal one (two sinks holding
    equal records, or both empty, compare equal)."""
    del sinks[next(i for i, x in enumerate(sinks) if x is sink)]


# Stats sinks opened by collect_stats(); each compiled ATen graph appends one record per sink.
_STATS_SINKS: list[list[dict[str, Any]]] = []


@contextlib.contextmanager
def collect_stats() -> Iterator[list[dict[str, Any]]]:
    """Collects one record per compiled ATen graph: kind, node count, export/pipeline/import ms."""
    sink: list[dict[str, Any]] = []
    _STATS_SINKS.append(sink)
    try:
        yield sink
    finally:
        _remove_sink(_STATS_SINKS, sink)


def _dynamo_input_kinds(gm: fx.GraphModule, example_inputs: Sequence[Any]) -> list[tuple[str, str]]:
    """(kind, source) per Dynamo graph input: parameters and buffers by their module path."""
    kinds = []
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    for i, node in enumerate(placeholders):
        example = example_inputs[i] if i < len(example_inputs) else None
        grapharg = node.meta.get("grapharg")
        source = ""
        if grapharg is not None and getattr(grapharg, "source", None) is not None:
            source = grapharg.source.name
            source = source() if callable(source) else str(source)
        if isinstance(example, torch.nn.Parameter):
            kinds.append(("parameter", fx_bridge.module_path(source)))
        elif "_buffers" in source:
            kinds.append(("buffer", fx_bridge.module_path(source)))
        elif isinstance(example, (torch.SymInt, int)) and not isinstance(example, bool):
            kinds.append(("symbol", ""))
        elif isinstance(example, torch.Tensor) and source.startswith("L["):
            # A forward argument, named by its place in the call ("k_cache", "past.0"): the
            # same name in every graph of the function (cache parallelism keys caches by it).
            kinds.append(("user", fx_bridge.module_path(source)))
        else:
            kinds.append(("user", ""))
    return kinds


def _dump(opts: Options, tag: str, text: str) -> None:
    if opts.dump_ir is None:
        return
    os.makedirs(opts.dump_ir, exist_ok=True)
    with open(os.path.join(opts.dump_ir, f"{tag}.ir"), "w") as f:
        f.write(text)


def _cache_parallel_options(
    pm: _C.PassManager,
    graph: Any,
    manager: Any,
    kind: str,
    auto: bool = False,
    on_error: str = "fallback",
) -> _C.CacheParallelOptions | None:
    """Plans cache parallelism once per graph; the first plan fixes the manager's scheme.
    auto (the default backend with a mesh): None where the graph has no decode attention,
    which is then placed like any other graph."""
    from .runtime.kv_cache import pass_options

    plan = pm.plan_cache_parallel(graph, pass_options(manager))
    if auto and not plan.sites:
        log.info(
            "torch_plugin: %s graph has no decode attention over a KV cache; placed instead of "
            "cache-parallel",
            kind,
        )
        return None
    if plan.sites:
        if manager.scheme is None:
            manager.scheme = plan.scheme
        manager.plan = plan
        log.info(
            "torch_plugin cache_parallel: %d attention site(s) over %d rank(s), scheme %s",
            len(plan.sites),
            manager.world,
            manager.scheme,
        )
    elif kind in ("forward", "inference"):
        # Asked for and applied nowhere: say so loudly, naming each attention node and why it
        # was left alone (once per model), or raise under on_error="raise".
        why = (
            "; ".join(plan.skipped)
            if plan.skipped
            else "the graph has no scaled_dot_product_attention node"
        )
        message = (
            f"torch_plugin cache_parallel: nothing to split in this {kind} graph, it runs "
            f"unsplit: {why}. The pass splits decode attention over a KV cache buffer written "
            "in the step (docs/features/cache_parallelism.md)"
        )
        if on_error == "raise":
            raise RuntimeError(message)
        if message not in manager.warned:
            manager.warned.add(message)
            log.warning("%s", message)
    return pass_options(manager)


# Managers of models compiled with options={"passes": ["cache_parallel"], ...}, one per options
# object (kept alive here so its id stays unique), so recompiles of a model share its caches.
_COMPILE_MANAGERS: dict[int, tuple[Any, Any]] = {}


def _manager_for_compile(options: Any, opts: Options) -> Any:
    from .runtime.kv_cache import KVCacheManager, group_of

    if opts.cache_parallel is not None:
        return opts.cache_parallel
    entry = _COMPILE_MANAGERS.get(id(options))
    if entry is None:
        entry = (options, KVCacheManager(group_of(opts.mesh), scheme="gather_partials"))
        _COMPILE_MANAGERS[id(options)] = entry
    return entry[1]


# Results of the placement pass, one per placed graph, for whoever listens (torch_plugin.place).
_PLACEMENT_SINKS: list[list[Any]] = []
# Calls of placed inference graphs, (graph, arguments, outputs), for whoever records them.
_CALL_RECORDERS: list[list[tuple[Any, list[Any], Any]]] = []


@contextlib.contextmanager
def recording_calls() -> Iterator[list[tuple[Any, list[Any], Any]]]:
    """Collects (boxed graph callable, its arguments, its outputs) of every placed inference
    graph called inside the block (torch_plugin.place's direct call path)."""
    sink: list[tuple[Any, list[Any], Any]] = []
    _CALL_RECORDERS.append(sink)
    try:
        yield sink
    finally:
        _remove_sink(_CALL_RECORDERS, sink)


def _boxed(gm: fx.GraphModule, inputs: Sequence[Any]) -> Any:
    """The graph as AOTAutograd calls it (boxed): one compiled group called straight where the
    graph is only that (placement/materialize.py), the graph's own code otherwise."""
    from torch._dynamo.backends.debugging import boxed_nop

    from .placement.materialize import boxed_single_group

    return boxed_single_group(gm) or boxed_nop(gm, inputs)


def _recordable(fn: Any, gm: fx.GraphModule) -> Any:
    """A boxed graph callable whose calls the recorders see (one list check otherwise). It
    carries the placed GraphModule, from which the direct call path builds a leaner one."""

    def run(args: list[Any]) -> Any:
        if not _CALL_RECORDERS:
            return fn(args)
        flat = list(args)  # the boxed callable empties its list
        out = fn(args)
        for sink in _CALL_RECORDERS:
            sink.append((run, flat, out))
        return out

    run._boxed_call = True  # type: ignore[attr-defined]
    run.graph_module = gm  # type: ignore[attr-defined]
    return run


def _place(
    gm: fx.GraphModule,
    opts: Options,
    kind: str,
    example_inputs: Sequence[Any] | None,
    record: dict[str, Any],
    input_kinds: Sequence[tuple[str, str]] | None,
    has_random_ops: bool = False,
    reference_sink: list[Any] | None = None,
) -> fx.GraphModule:
    """Backend placement of an inference graph, or of a training graph's forward or backward.

    AOTAutograd's partition makes each of those a pure function: the forward returns the
    activations its backward saves as extra outputs, so a group's outputs include them and
    no autograd runs inside a group. A graph with random ops (dropout) goes to the default's
    search over eager and Inductor only, which draws them from ATen's generator as eager does,
    each run from the same generator state (whole_graph.py); the explicit pass leaves it as
    is (its other compilers draw other random numbers than ATen)."""
    writes = fx_bridge.written_inputs(gm)
    if has_random_ops and not opts.auto:
        log.info(
            "torch_plugin placement: %s graph left as is: it draws random numbers (dropout?), "
            "which another backend would draw differently",
            kind,
        )
        record["placement"] = None
        return gm
    from .placement.planner import PlacementOptions, place_graph
    from .placement.whole_graph import place_whole_graph_first

    placement_opts = opts.placement or PlacementOptions()
    if opts.precision is not None:
        placement_opts = dataclasses.replace(placement_opts, precision=opts.precision)
    real = None
    if example_inputs is not None and all(
        not isinstance(x, torch.Tensor) or not isinstance(x, torch._subclasses.FakeTensor)
        for x in example_inputs
    ):
        # A dynamic graph's sizes come as Dynamo's symbols: measured at their values (using a
        # symbol as an int would specialise the graph to it).
        from ._compat import size_hint

        real = [size_hint(x) if isinstance(x, torch.SymInt) else x for x in example_inputs]
    from torch._dispatch.python import no_python_dispatcher
    from torch._subclasses.fake_tensor import unset_fake_temporarily

    # AOTAutograd calls its compilers under its fake mode and the Python dispatcher; measuring
    # needs real tensors and ops at their normal speed (the dispatcher costs ~5 us per op).
    search = place_graph
    # Tensors made under inference_mode have no version counter for the guard to read.
    freezable = real is not None and not any(
        isinstance(x, torch.Tensor) and x.is_inference() for x in real
    )
    if writes:
        # A graph that writes into its inputs (a static KV cache's update): its whole graph on
        # eager or Inductor, the only compilers that write as eager does (whole_graph.py).
        placement_opts = _auto_placement_options(placement_opts, kind, freezable, True)
        search = functools.partial(place_whole_graph_first, kind=kind, writes=writes)
    elif placement_opts.search == "whole_graph_first":
        search = functools.partial(place_whole_graph_first, kind=kind)
    elif kind == "inference":
        # The explicit pass on an inference graph starts from the default compile's pick
        # (whole graphs, weights frozen) and keeps the finer search's placement only where it
        # measures faster: never slower than the default.
        placement_opts = dataclasses.replace(
            placement_opts, freeze=placement_opts.freeze or freezable
        )
        search = functools.partial(place_whole_graph_first, kind=kind, always_refine=True)
    if opts.auto:
        placement_opts = _auto_placement_options(
            placement_opts, kind, freezable, has_random_ops or bool(writes)
        )
        search = functools.partial(
            place_whole_graph_first,
            kind=kind,
            random_ops=has_random_ops,
            reference_sink=reference_sink,
            writes=writes,
        )
    with unset_fake_temporarily(), no_python_dispatcher():
        placed, result = search(gm, real, placement_opts, input_kinds)
    result.kind = kind
    record["placement"] = result.backend_counts()
    record["summary"] = result.summary()
    record["frozen"] = getattr(result, "frozen", 0)
    if opts.auto:
        log.info("torch_plugin: %s", result.summary())
    else:
        log.info("torch_plugin placement:\n%s", result.table())
    for sink in _PLACEMENT_SINKS:
        sink.append(result)
    return placed


def _auto_placement_options(base: Any, kind: str, freezable: bool, random_ops: bool) -> Any:
    """The default backend's placement: whole graphs first; weights frozen into inference
    graphs (a guard re-places when they change); training graphs, and graphs that draw random
    numbers or write into their inputs (`random_ops`), choose between eager and Inductor only:
    Inductor's gradients match eager's to float32 rounding, it draws random numbers as eager
    does, and it writes into a graph's inputs as eager does."""
    if kind == "inference" and not random_ops:
        return dataclasses.replace(base, search="whole_graph_first", freeze=freezable)
    return dataclasses.replace(
        base,
        search="whole_graph_first",
        freeze=freezable and kind == "inference",
        backends=tuple(b for b in base.backends if b in ("aten", "inductor")),
        allow_refine=False,
    )


def _symbolic(gm: fx.GraphModule) -> bool:
    """Whether a graph input has a symbolic size (a dynamic-shape graph): the default placement
    measures such an inference graph at the sizes of the call that compiled it, on compilers
    that keep the sizes symbolic only; a training graph runs as aot_eager."""
    from .placement.backends import symbolic_placeholders

    return any(symbolic_placeholders(gm))


def rewrite_aten_graph(
    gm: fx.GraphModule,
    opts: Options,
    kind: str = "forward",
    input_kinds: Sequence[tuple[str, str]] | None = None,
    cache_manager: Any = None,
    example_inputs: Sequence[Any] | None = None,
    reference_sink: list[Any] | None = None,
) -> fx.GraphModule:
    """Round-trips one ATen graph through the C++ pipeline; falls back to `gm` on failure.
    reference_sink: gets the graph's eager outputs on `example_inputs` where the default
    placement ran them."""
    from torch._dynamo.exc import RestartAnalysis

    t0 = time.perf_counter()
    record: dict[str, Any] = {"kind": kind, "nodes": len(gm.graph.nodes), "fallback": None}
    try:
        graph, ctx = fx_bridge.to_ir(gm, input_kinds)
        t1 = time.perf_counter()
        tag = f"{kind}_{id(gm):x}"
        _dump(opts, f"{tag}.before", str(graph))
        log_fn = log.info if opts.log_passes else log.debug
        pm = _C.PassManager(log=log_fn, verify_each=opts.verify_each)
        rewrite = _C.RewriteOptions()
        cpp_passes = [p for p in opts.passes or () if p not in PYTHON_PASSES]
        if cache_manager is not None:
            planned = _cache_parallel_options(
                pm, graph, cache_manager, kind, opts.auto, opts.on_error
            )
            if planned is None:
                cache_manager = None
            else:
                rewrite.cache_parallel = planned
                if opts.auto:
                    cpp_passes = ["cache_parallel"]
        new_graph, report = pm.run(graph, cpp_passes, rewrite)
        t2 = time.perf_counter()
        _dump(opts, f"{tag}.after", str(new_graph))
        new_gm = fx_bridge.from_ir(new_graph, ctx)
        if opts.runs("placement") or (opts.auto and cache_manager is None):
            has_random = fx_bridge.has_random_ops(new_graph)
            if opts.auto and _symbolic(new_gm) and kind == "inference" and example_inputs is None:
                # Its whole graph goes to a compiler that keeps its sizes symbolic, measured at
                # the call's sizes (whole_graph.py), which are not known here.
                log.info(
                    "torch_plugin: %s graph with symbolic sizes (dynamic shapes) runs as "
                    "aot_eager would; compile with dynamic=False to have it placed",
                    kind,
                )
            elif fx_bridge.mutates_inputs(new_gm) and (
                kind != "inference" or example_inputs is None
            ):
                # Measured, its writes are run on copies of the inputs they land in (the
                # caller's own inputs), which only an inference graph called with them has.
                log.warning(
                    "torch_plugin: %s graph writes into its inputs (a KV cache, a running "
                    "statistic) and was compiled without its real inputs; it runs as "
                    "aot_eager would",
                    kind,
                )
            else:
                new_gm = _place(
                    new_gm,
                    opts,
                    kind,
                    example_inputs,
                    record,
                    input_kinds,
                    has_random,
                    reference_sink,
                )
        t3 = time.perf_counter()
        estimates = new_graph.estimate() if _STATS_SINKS else []
        record.update(
            export_ms=(t1 - t0) * 1e3,
            pipeline_ms=(t2 - t1) * 1e3,
            import_ms=(t3 - t2) * 1e3,
            verify_ms=report.verify_ms,
            passes=[r.to_dict() for r in report.passes],
            symbolic_inputs=ctx.symbolic_inputs,
            ir_nodes=new_graph.num_nodes,
            flops=sum(e[3] for e in estimates if e[5]),
            bytes=sum(e[4] for e in estimates if e[5]),
        )
    except RestartAnalysis:  # Dynamo's to handle: it traces the frame again (whole_graph.py)
        raise
    except Exception as e:  # noqa: BLE001 - any failure of ours must not break the user's model
        if opts.on_error == "raise":
            raise
        log.warning(
            "torch_plugin: falling back to the unrewritten %s graph (%s: %s)",
            kind,
            type(e).__name__,
            e,
        )
        record["fallback"] = f"{type(e).__name__}: {e}"
        new_gm = gm
    for sink in _STATS_SINKS:
        sink.append(record)
    return new_gm


class FrozenWeightsGuard:
    """An inference graph whose weights were frozen into its compiled regions, guarded: each
    call checks that every frozen argument still holds the data it was frozen from (the same
    tensor object, or another on the same storage) unchanged since (its version counter), and
    re-places the graph with the new weights when not. Re-placing twice means the weights keep
    changing: the graph is then placed once more without freezing and runs that way from then
    on. The check runs in C++ (_C.FrozenArguments): a Python loop over ResNet-50's 267 weights
    cost 170 us a call right after an inference had evicted the caches."""

    _boxed_call = True

    def __init__(
        self,
        fn: Any,
        args: Sequence[Any],
        kinds: Sequence[tuple[str, str]],
        replace: Any,
    ) -> None:
        self.index = [i for i, (k, _) in enumerate(kinds) if k in ("parameter", "buffer")]
        self.fn = fn
        self.replace = replace
        self.replaced = 0
        self.frozen = _C.FrozenArguments(list(args), self.index)

    def __call__(self, args: list[Any]) -> Any:
        i = self.frozen.first_changed(args)
        if i >= 0:
            return self._changed(args, i)
        return self.fn(args)

    def _changed(self, args: list[Any], i: int) -> Any:
        self.replaced += 1
        freeze = self.replaced < 3
        log.info(
            "torch_plugin: weight argument %d of a frozen inference graph was replaced or "
            "changed in place; placing the graph again%s",
            i,
            "" if freeze else " without freezing (its weights keep changing)",
        )
        self.fn = self.replace(list(args) if freeze else None)
        self.frozen = _C.FrozenArguments(list(args), self.index if freeze else [])
        return self.fn(args)


def _replace_frozen(
    fx_g: fx.GraphModule,
    opts: Options,
    kinds: Sequence[tuple[str, str]],
    manager: Any,
    args: list[Any] | None,
) -> Any:
    """The inference graph placed again: with `args`' weights frozen, or (None) unfrozen."""
    import dataclasses

    from .placement.planner import PlacementOptions

    if args is None:
        base = opts.placement or PlacementOptions()
        opts = dataclasses.replace(opts, placement=dataclasses.replace(base, freeze=False))
    placed = rewrite_aten_graph(fx_g, opts, "inference", kinds if args else None, manager, args)
    _release_models(placed)
    return _boxed(placed, args or [])


def torch_plugin_backend(
    gm: fx.GraphModule,
    example_inputs: Sequence[Any],
    options: Mapping[str, Any] | Options | None = None,
    mode: str | None = None,
    **kwargs: Any,
) -> Any:
    """`torch.compile(model, backend="torch_plugin", options={...})` lands here."""
    if mode is not None:
        raise ValueError(
            "torch_plugin: `mode` is not supported; pass options={...} "
            "(valid keys: passes, on_error, verify_each, dump_ir, log_passes, mesh, placement)"
        )
    if kwargs:
        raise ValueError(f"torch_plugin: unexpected arguments {sorted(kwargs)}")
    opts = Options.from_user(options)
    from functorch.compile import min_cut_rematerialization_partition
    from torch._dynamo.backends.common import aot_autograd

    input_kinds = _dynamo_input_kinds(gm, example_inputs)
    wants_cache_parallel = opts.runs("cache_parallel") or (opts.auto and opts.mesh is not None)
    manager = _manager_for_compile(options, opts) if wants_cache_parallel else None

    # The training forward's outputs on the real example inputs (its eager reference run), by
    # node name: its backward's search runs on the activations they save, not on random ones.
    forward_values: dict[str, Any] = {}
    # A default compile's inference graph seen before: its saved model, without AOTAutograd.
    known_key = None
    if opts.auto and manager is None and not _CALL_RECORDERS:
        from .placement.known_graphs import structure_key

        known_key = structure_key(gm, example_inputs, input_kinds, opts)

    # The real inputs of the compile in progress: Dynamo's, or a known graph's call whose weights
    # changed (usual() below). Not kept after a compile (a known graph's callable keeps
    # usual(), which would keep a compile's batch and weights alive).
    compiling: list[Sequence[Any]] = [()]

    def forward_compiler(fx_g: fx.GraphModule, inputs: Sequence[Any]) -> Any:
        n_inputs = sum(1 for n in fx_g.graph.nodes if n.op == "placeholder")
        kinds = input_kinds if n_inputs == len(input_kinds) else None
        example_inputs = compiling[0]
        real = list(example_inputs) if opts.auto and n_inputs == len(example_inputs) else None
        sink: list[Any] = []
        placed = rewrite_aten_graph(fx_g, opts, "forward", kinds, manager, real, sink)
        _release_models(placed)
        forward_values.clear()
        if sink:
            forward_values.update(_values_by_name(fx_g, sink[0]))
        return _boxed(placed, inputs)

    def inference_compiler(fx_g: fx.GraphModule, inputs: Sequence[Any]) -> Any:
        n_inputs = sum(1 for n in fx_g.graph.nodes if n.op == "placeholder")
        kinds = input_kinds if n_inputs == len(input_kinds) else None
        if kinds is not None:
            # A buffer the graph writes into (a running statistic, a cache registered as a
            # buffer) is state: neither frozen (whole_graph.py freezes by these kinds) nor
            # guarded as a weight.
            written = set(fx_bridge.written_inputs(fx_g))
            kinds = [("user", k[1]) if i in written else k for i, k in enumerate(kinds)]
        example_inputs = compiling[0]
        real = list(example_inputs) if n_inputs == len(example_inputs) else None
        with collect_stats() as stats:
            placed = rewrite_aten_graph(fx_g, opts, "inference", kinds, manager, real)
        _remember(known_key, placed, real, kinds, opts, stats)
        fn = _boxed(placed, inputs)
        if (
            (opts.auto or opts.runs("placement"))
            and real is not None
            and kinds is not None
            and stats
            and stats[0].get("frozen")
        ):
            fn = FrozenWeightsGuard(
                fn, real, kinds, lambda args: _replace_frozen(fx_g, opts, kinds, manager, args)
            )
        return _recordable(fn, placed) if opts.runs("placement") or opts.auto else fn

    def backward_compiler(fx_g: fx.GraphModule, inputs: Sequence[Any]) -> Any:
        real = _backward_inputs(fx_g, forward_values) if opts.auto else None
        forward_values.clear()
        placed = rewrite_aten_graph(fx_g, opts, "backward", None, manager, real)
        _release_models(placed)
        return _boxed(placed, inputs)

    def usual(args: Sequence[Any]) -> Any:
        compiling[0] = args
        try:
            # Same configuration as torch's aot_eager, so the identity path is bit-identical to
            # it.
            return aot_autograd(
                fw_compiler=forward_compiler,
                bw_compiler=backward_compiler,
                inference_compiler=inference_compiler,
                partition_fn=min_cut_rematerialization_partition,
                keep_inference_input_mutations=True,
            )(gm, args)
        finally:
            compiling[0] = ()

    if known_key is not None:
        known = _recall(known_key, example_inputs, input_kinds, opts, usual)
        if known is not None:
            return known
    return usual(example_inputs)


def _cache_path(opts: Options) -> str | None:
    return opts.placement.cache_path if opts.placement is not None else None


def _release_models(placed: fx.GraphModule) -> None:
    """Lets go of the models a placed graph's groups hold for known_graphs.remember (only an
    inference graph of the default compile's may be kept)."""
    from .placement.known_graphs import release

    release(placed)


def _remember(
    key: str | None,
    placed: fx.GraphModule,
    real: Sequence[Any] | None,
    kinds: Sequence[tuple[str, str]] | None,
    opts: Options,
    stats: list[dict[str, Any]],
) -> None:
    """Keeps a placed inference graph for known_graphs.recall where it may serve a later
    compile of the same Dynamo graph; lets go of the models its groups held for it either way."""
    from .placement.known_graphs import release, remember, simple_convention

    models = release(placed)
    if key is None or real is None or kinds is None or not models:
        return
    record = stats[0] if stats else {}
    if not record.get("frozen") or not simple_convention():
        return
    from torch._subclasses.fake_tensor import unset_fake_temporarily

    with unset_fake_temporarily():
        remember(key, placed, models, real, kinds, _cache_path(opts), record.get("summary", ""))


def _recall(
    key: str,
    example_inputs: Sequence[Any],
    kinds: Sequence[tuple[str, str]],
    opts: Options,
    usual: Any,
) -> Any:
    """A known inference graph from its saved model (known_graphs.py), recorded as placed
    graphs are; None where there is none."""
    from .placement.known_graphs import frozen_indices, recall
    from .placement.result import PlacementResult

    fn = recall(key, example_inputs, kinds, _cache_path(opts), usual)
    if fn is None:
        return None
    result = PlacementResult(
        groups=[],
        dp_cost_s=0.0,
        dp_exact=True,
        dp_states=0,
        kind="inference",
        whole_graph={"pick": fn.backend, "cached": True, "known_graph": fn.summary, "trials": []},
        search_s=fn.search_s,
        frozen=len(frozen_indices(kinds)),
    )
    summary = result.summary()
    log.info("torch_plugin: %s", summary)
    for sink in _PLACEMENT_SINKS:
        sink.append(result)
    for sink in _STATS_SINKS:
        sink.append({"kind": "inference", "summary": summary, "frozen": result.frozen})
    return fn


def _values_by_name(fx_g: fx.GraphModule, outputs: Sequence[Any]) -> dict[str, Any]:
    """A forward graph's output values by the name of the node that made each (the names
    AOTAutograd's partition gives its backward's placeholders for the values it saves). The
    generator states a recomputed random op saves (gradient checkpointing's dropout: the
    forward's run_and_save_rng_state) are `rng_state_output_<i>` in the backward, numbered in
    the order the forward returns them."""
    out_node = next(n for n in fx_g.graph.nodes if n.op == "output")
    nodes = out_node.args[0] if isinstance(out_node.args[0], (tuple, list)) else [out_node.args[0]]
    if len(nodes) != len(outputs):
        return {}
    values: dict[str, Any] = {}
    states = 0
    for n, v in zip(nodes, outputs, strict=True):
        if not isinstance(n, fx.Node):
            continue
        values[n.name] = v
        if fx_bridge.is_saved_rng_state(n):
            values[f"rng_state_output_{states}"] = v
            states += 1
    return values


def _backward_inputs(fx_g: fx.GraphModule, saved: dict[str, Any]) -> list[Any] | None:
    """A backward graph's example inputs: each saved value as its forward computed it on the
    real inputs, each incoming gradient (tangent) random at its traced shape, at half the unit
    scale (measure.synthesize_inputs' floats). None where the forward's values are not all
    known (its search did not run it: a warm compile), and the backward's search synthesizes
    every input, as before. Random saved activations made deep models' gradients overflow:
    GPT-2's 12-layer backward came out inf on eager and on Inductor alike, and Inductor was
    dropped as differing."""
    from .placement.measure import synthesize_inputs

    if not saved:
        return None
    placeholders = [n for n in fx_g.graph.nodes if n.op == "placeholder"]
    made = synthesize_inputs(fx_g)
    values = []
    for n, random_value in zip(placeholders, made, strict=True):
        if n.name in saved:
            values.append(saved[n.name])
        elif n.name.startswith("tangents"):
            values.append(random_value)
        else:
            return None
    return values


def register() -> None:
    """Registers the backend name with Dynamo unless its entry point will do it.

    With the package installed, Dynamo finds `torch_plugin` through the `torch_dynamo_backends`
    entry point and registers it itself; registering here as well would make Dynamo's lookup
    fail with "duplicate name". So register only when Dynamo has not seen the name yet, as an
    entry point or otherwise.
    """
    from torch._dynamo.backends import registry

    compiler_fns = getattr(registry, "_COMPILER_FNS", {})
    backends = getattr(registry, "_BACKENDS", {})
    if BACKEND_NAME in compiler_fns or backends.get(BACKEND_NAME) is not None:
        return
    registry.register_backend(compiler_fn=torch_plugin_backend, name=BACKEND_NAME)
