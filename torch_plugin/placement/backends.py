"""Placement backends: each compiles one subgraph (an ATen `fx.GraphModule` returning a tuple) to
a callable and names the C++ pattern rule set that says which groups it can take.

aten (eager, every op), inductor (compile_fx), openvino and onnxruntime (PyPI, CPU), and fused
(our kernels in kernels/cpu). A backend whose package is missing reports why and is skipped.
"""

from __future__ import annotations

import contextlib
import copy
import functools
import importlib
import inspect
import io
import logging
import math
import operator
import os
import shutil
import tempfile
import warnings
import weakref
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import torch
import torch.fx as fx

from ..fx_bridge import written_inputs

log = logging.getLogger("torch_plugin")

Compiled = Callable[..., Sequence[torch.Tensor]]


class BackendError(RuntimeError):
    """The backend cannot take this group; the group is excluded for it."""


class Backend:
    name = ""
    rule_set = ""
    graph_level = False  # a graph compiler whose larger regions the evolutionary search tries
    rtol = 1e-4
    atol = 1e-4
    # What the compiled graph computes in: "bf16" where the precision option allows it and
    # the backend can (placement/precision.py); "f32" keeps the graph's own dtypes.
    compute = "f32"
    # The compiler whose compile this one replays another way (a CUDA graph of Inductor's
    # graph), or None: its compile seconds are not a compile's.
    compiles_with: str | None = None
    # Expected seconds per graph node to compile a whole graph (0: unknown), from real-size
    # compiles on a 2-core machine (bert-base, GPT-2, ResNet-50, ViT-B/16, T5-base): the search
    # skips a compiler that would overrun its budget (placement_search.h).
    compile_s_per_node = 0.0
    # Whether it compiles a graph whose sizes are symbolic (a dynamic-shape graph, called with
    # the symbols' values among its arguments) into code for every size. The others compile
    # for the sizes they are shown and must not be given such a graph.
    dynamic_shapes = False
    # Device types whose tensors the compiled graph takes; a graph on another device never
    # sees this backend (for_device).
    devices: tuple[str, ...] = ("cpu", "cuda")
    # Whether the last compile() was served from a cache (a kept artifact, Inductor's FX graph
    # cache): its seconds say nothing of how long this compiler takes to compile.
    last_from_cache = False
    # Seconds that the user's own compile of the last graph would have taken beyond this
    # one's: work it ran side by side that the compiler runs in turn (vec_isa.py).
    last_saved_s = 0.0
    # How many f32 linears the last compile runs as three bf16 products (compute "f32x3",
    # bf16x3.py): none where the graph has no linear of enough rows.
    last_bf16x3 = 0
    # The profile cache for what a backend measures of its own (OpenVINO's GEMM kernels);
    # get_backends sets the placement's. ":memory:" keeps it to this instance.
    cache_path: str | None = ":memory:"

    def unavailable(self) -> str | None:
        """Why the backend cannot run here, or None."""
        return None

    def version(self) -> str:
        return torch.__version__

    def compile(self, gm: fx.GraphModule, inputs: Sequence[torch.Tensor], rule: str) -> Compiled:
        raise NotImplementedError


class AtenBackend(Backend):
    """Eager ATen: the node targets called directly, exactly as the host graph runs them."""

    name = rule_set = "aten"
    rtol = atol = 0.0
    dynamic_shapes = True

    def compile(self, gm: fx.GraphModule, inputs: Sequence[torch.Tensor], rule: str) -> Compiled:
        return gm


class InductorBackend(Backend):
    name = rule_set = "inductor"
    graph_level = True
    rtol = atol = 1e-3
    compile_s_per_node = 0.025  # 17-73 ms (ResNet-50's convolutions the most)
    # A dynamic graph is compiled on the enclosing frame's symbolic sizes, as Inductor compiles
    # it as the frame's own backend: one program for every size, and what it assumes of the
    # sizes becomes the frame's guards (_frame_fakes).
    dynamic_shapes = True

    def compile(self, gm: fx.GraphModule, inputs: Sequence[torch.Tensor], rule: str) -> Compiled:
        # A whole graph is compiled once per search: the CUDA-graph candidate
        # (placement/cuda_graphs.py) replays this instance's compile of the same graph.
        key = _graph_key(gm, inputs, self.compute) if rule == "graph" else None
        self.last_saved_s = 0.0
        if key is not None and key in self._graphs:
            self.last_from_cache = True
            self.last_bf16x3 = getattr(self._graphs[key], "bf16x3_linears", 0)
            return self._graphs[key]
        if _on_cpu(gm, inputs):
            from .vec_isa import probe_side_by_side

            self.last_saved_s = probe_side_by_side()
        compiled = self._compile(gm, inputs)
        self.last_bf16x3 = getattr(compiled, "bf16x3_linears", 0)
        if key is not None:
            self._graphs[key] = compiled
        return compiled

    @functools.cached_property
    def _graphs(self) -> dict[Any, Compiled]:
        return {}

    def _compile(self, gm: fx.GraphModule, inputs: Sequence[torch.Tensor]) -> Compiled:
        from torch._dynamo.utils import counters
        from torch._guards import TracingContext, tracing
        from torch._inductor.compile_fx import compile_fx
        from torch._subclasses.fake_tensor import FakeTensor, FakeTensorMode
        from torch.fx.experimental.symbolic_shapes import ShapeEnv

        from .inductor_artifact import describe, recorder

        # Outside the enclosing Dynamo frame's tracing context: the subgraph's guards and fake
        # mode are its own, not the user's frame's. A context of its own with a shape env,
        # which Inductor's FX graph cache needs ("Bypassing FX Graph Cache because 'No shape
        # env'"): with it a warm compile loads the compiled graph instead of rebuilding it.
        # The inputs are given as fake tensors of static shapes: real ones, AOTAutograd would
        # make every size a symbol of that shape env, and Inductor then spent a third of its
        # compile on symbolic size arithmetic (ResNet-50: 17.4 s against 11.2 s). A graph whose
        # sizes are symbols (padded batches of changing length) is compiled on them instead.
        frame = _frame_fakes(gm)
        gm = _views_as_reshapes(gm)
        casts: list[Any] = []
        linears = 0
        if self.compute == "f32x3":  # f32 linears as three bf16 products (bf16x3.py)
            from .bf16x3 import with_bf16x3_linears

            gm, linears = with_bf16x3_linears(gm)
        elif self.compute != "f32":
            from .precision import defer_output_casts, lower_precision_graph

            gm = lower_precision_graph(gm, frame[1] if frame else inputs, self.compute)
            casts = defer_output_casts(gm)
        if frame is not None:
            mode, fake_inputs = frame
        else:
            mode = FakeTensorMode(shape_env=ShapeEnv())
            fake_inputs = [
                mode.from_tensor(x, static_shapes=True)
                if isinstance(x, torch.Tensor) and not isinstance(x, FakeTensor)
                else x
                for x in inputs
            ]
        # Frozen weights (module constants): Inductor's freezing folds and prepacks them, as
        # PyTorch recommends for CPU inference (torch._inductor.config.freezing), and its FX
        # graph cache keeps the compiled graph (_frozen_graph_cacheable).
        freeze = any(True for _ in gm.buffers()) and not torch.is_grad_enabled()
        # Random ops (dropout) draw from ATen's generator as eager does, in eager's order: the
        # same masks and the same stream after the call, where Inductor's own generator would
        # draw others (and its outputs could not be checked against eager's).
        with (
            warnings.catch_warnings(),
            tracing(TracingContext(mode)),
            torch._inductor.config.patch(freezing=freeze, fallback_random=True),
            _frozen_graph_cacheable() if freeze else contextlib.nullcontext(),
        ):
            warnings.simplefilter("ignore")
            hits = counters["inductor"]["fxgraph_cache_hit"]
            # A static graph compiled with freezing may be kept for a later process
            # (inductor_artifact.py): its frozen graph and output code are recorded.
            recorded: list[dict[str, Any]] = []
            if _recomputes(gm):
                compiled = _compile_partitioned(gm, mode, fake_inputs)
            elif freeze and frame is None:
                compiled = compile_fx(gm, fake_inputs, inner_compile=recorder(recorded))
            else:
                compiled = compile_fx(gm, fake_inputs)
            self.last_from_cache = counters["inductor"]["fxgraph_cache_hit"] > hits
        written = written_inputs(gm)
        compiled = (
            _with_strides(compiled, inputs, written)
            if frame is None
            else _with_symbolic_strides(compiled, frame[1])
        )
        if any(c is not None for c in casts):
            compiled = _cast_outputs(compiled, casts)
        n_inputs = sum(1 for n in gm.graph.nodes if n.op == "placeholder")
        ir = describe(recorded, n_inputs, casts) if recorded and not written else None
        if ir is not None:  # known_graphs.release takes it
            compiled.ir = {"inductor": ir}  # type: ignore[attr-defined]
        if linears:
            compiled.bf16x3_linears = linears  # type: ignore[attr-defined]
        return compiled


def _on_cpu(gm: fx.GraphModule, inputs: Sequence[Any]) -> bool:
    """Whether the graph's tensors (its inputs and frozen weights) are all on the CPU, where
    Inductor generates C++ for the CPU's vector ISA."""
    tensors = [*(x for x in inputs if isinstance(x, torch.Tensor)), *gm.buffers()]
    return all(t.device.type == "cpu" for t in tensors)


@contextlib.contextmanager
def _frozen_graph_cacheable() -> Iterator[None]:
    """Inductor's FX graph cache made to keep a graph compiled with freezing. It keys a frozen
    weight by its shape and dtype and, on a hit, reads the weight off the graph being compiled
    (the code does not depend on its values; vectors of up to 8 elements, which it inlines,
    are keyed by value). But freezing packs matmul and convolution weights for oneDNN, and the
    cache refused any graph holding such a tensor ("mkldnn tensors unpickleable"): a warm or
    second process compiled an Inductor pick from scratch (bert-base: 34 s of a 45 s warm
    compile). Within this context a packed frozen weight is keyed as the other frozen weights
    are (its packing follows from the input sizes, which are in the key). Where this torch
    lacks those hooks, the graph is compiled uncached as before."""
    from torch._inductor import codecache

    try:
        from torch._inductor.freezing_utils import is_frozen_param
    except ImportError:
        is_frozen_param = None
    pickler = getattr(codecache, "FxGraphCachePickler", None)
    validator = getattr(codecache, "CacheabilityValidator", None)
    reduce = getattr(pickler, "_reduce_tensor", None)
    check = getattr(validator, "check_tensor", None)
    ident = getattr(codecache, "_ident", None)
    if reduce is None or check is None or ident is None or is_frozen_param is None:
        log.info(
            "torch_plugin placement: Inductor's FX graph cache cannot keep a graph compiled "
            "with freezing in torch %s (its hooks for that are missing): an Inductor pick is "
            "compiled again in every warm or second process",
            torch.__version__,
        )
        yield
        return

    def packed(t: torch.Tensor) -> bool:
        return t.is_mkldnn and is_frozen_param(t)

    def reduce_tensor(self: Any, t: torch.Tensor) -> Any:
        if packed(t):
            return ident, (("frozen mkldnn weight", tuple(t.shape), str(t.dtype)),)
        return reduce(self, t)

    def check_tensor(t: torch.Tensor) -> None:
        if not packed(t):
            check(t)

    pickler._reduce_tensor = reduce_tensor
    validator.check_tensor = staticmethod(check_tensor)
    try:
        yield
    finally:
        pickler._reduce_tensor = reduce
        validator.check_tensor = staticmethod(check)


def _recomputes(gm: fx.GraphModule) -> bool:
    """Whether `gm` is one half of a training step under activation checkpointing (HF's
    gradient_checkpointing_enable, torch.utils.checkpoint): its random ops run from a saved
    generator state (AOTAutograd's run_and_save_rng_state in the forward, run_with_rng_state in
    the backward) or its nodes are tagged for recomputation. compile_fx traces such a graph
    again through AOTAutograd, which cannot: "no rule registered for HigherOrderOperator
    run_and_save_rng_state" (forward), "7 disjoint backward regions that require recomputation"
    (a 2-layer GPT-2's backward), and both ran on eager."""
    rng = (torch.ops.higher_order.run_and_save_rng_state, torch.ops.higher_order.run_with_rng_state)
    return any(
        n.op == "call_function" and (n.target in rng or "recompute" in n.meta)
        for n in gm.graph.nodes
    )


def _compile_partitioned(gm: fx.GraphModule, mode: Any, fake_inputs: Sequence[Any]) -> Any:
    """An AOTAutograd-partitioned graph compiled as Inductor compiles the halves of its own
    partition: Inductor's decompositions applied by a plain retrace (no functionalisation, no
    partition: both were done), then compile_fx_inner. Random decompositions as
    fallback_random picks them (the caller's config): ATen's kernels, eager's numbers."""
    from torch._inductor.compile_fx import compile_fx_inner
    from torch._inductor.decomposition import select_decomp_table
    from torch.fx.experimental.proxy_tensor import make_fx

    with mode:
        decomposed = make_fx(gm, decomposition_table=select_decomp_table())(*fake_inputs)
    compiled = compile_fx_inner(decomposed, list(fake_inputs))

    def run(*args: Any) -> Any:
        return compiled(list(args))  # the boxed convention: it may clear the list it gets

    return run


def _views_as_reshapes(gm: fx.GraphModule) -> fx.GraphModule:
    """`gm` (a copy where it changes) with each aten.view a reshape. A view in an ATen graph
    was valid for the strides its tracer saw; Inductor traces the graph again with its own
    decompositions, which may lay a value out otherwise (a cat whose other input is empty, as
    in a decoder's first key/value concatenation, becomes the key itself, still transposed):
    GPT-2's training forward then failed ("Cannot view a tensor with shape [4, 12, 64, 128]
    and strides (98304, 64, 1, 768)"). A reshape is that view where the layout allows it and a
    copy where not."""
    views = [
        n
        for n in gm.graph.nodes
        if n.op == "call_function" and n.target is torch.ops.aten.view.default
    ]
    if not views:
        return gm
    gm = fx.GraphModule(gm, copy.deepcopy(gm.graph))
    for n in gm.graph.nodes:
        if n.op == "call_function" and n.target is torch.ops.aten.view.default:
            n.target = torch.ops.aten.reshape.default
    gm.recompile()
    return gm


def _frame_fakes(gm: fx.GraphModule) -> tuple[Any, list[Any]] | None:
    """For a graph with symbolic sizes: the enclosing frame's fake mode and its placeholders'
    fake values (tensors of symbolic sizes, the sizes' SymInts), on which Inductor compiles it
    as it would as the frame's own backend. Its shape env is the frame's, so whatever Inductor
    assumes of the sizes (a guard it adds) is checked by Dynamo on every call, and a call that
    breaks it compiles the frame again. None for a graph of static sizes."""
    if not any(symbolic_placeholders(gm)):
        return None
    from torch._guards import TracingContext, detect_fake_mode

    vals = _placeholder_vals(gm)
    mode = detect_fake_mode([v for v in vals if isinstance(v, torch.Tensor)])
    if mode is None or mode.shape_env is None:
        raise BackendError("a graph with symbolic sizes but no fake values to compile it on")
    # Only while Dynamo compiles that frame are the guards it adds the frame's (a graph placed
    # again later, when its frozen weights changed, would add them to guards already built).
    ctx = TracingContext.try_get()
    if ctx is None or ctx.fake_mode is not mode:
        raise BackendError(
            "a graph with symbolic sizes compiles on Inductor only while Dynamo compiles its "
            "frame, whose guards then check what Inductor assumes of the sizes"
        )
    return mode, vals


def _graph_key(gm: fx.GraphModule, inputs: Sequence[Any], compute: str) -> Any:
    """What a compiled graph depends on: its code, its inputs' layouts, its constants (by
    storage) and the grad mode."""
    metas = tuple(
        (tuple(x.shape), x.stride(), x.dtype, str(x.device))
        if isinstance(x, torch.Tensor)
        else repr(x)
        for x in inputs
    )
    consts = tuple((name, b.data_ptr()) for name, b in gm.named_buffers())
    return (gm.code, metas, consts, compute, torch.is_grad_enabled())


def _with_strides(fn: Any, inputs: Sequence[Any], written: Sequence[int] = ()) -> Any:
    """Inductor's code asserts the strides it was compiled for. A graph's input may come with
    others at run time (a training backward compiled on the traced strides of an activation
    that the forward, placed elsewhere, returns laid out otherwise: Phi-3's fused qkv split):
    such an input is copied to the compiled layout first, and where the graph writes into it
    (`written`), the copy's new values are copied back. One tuple compare per input."""
    expect = [
        (i, tuple(x.shape), x.stride())
        for i, x in enumerate(inputs)
        if isinstance(x, torch.Tensor) and x.layout == torch.strided
    ]
    writes = set(written)

    def run(*args: Any) -> Any:
        back = []
        for i, shape, stride in expect:
            x = args[i]
            if x.stride() != stride and tuple(x.shape) == shape and x.numel() > 1:
                y = torch.empty_strided(shape, stride, dtype=x.dtype, device=x.device).copy_(x)
                args = (*args[:i], y, *args[i + 1 :])
                if i in writes:
                    back.append((x, y))
        out = fn(*args)
        for x, y in back:
            x.copy_(y)
        return out

    return run


def _with_symbolic_strides(fn: Any, vals: Sequence[Any]) -> Any:
    """_with_strides for a graph of symbolic sizes (`vals`: its placeholders' fake values): each
    tensor input's strides, as Inductor compiled them, are expressions of the sizes, evaluated
    at each call's sizes (read off the arguments: a size argument, or a tensor's dimension), and
    an input laid out otherwise is copied to them. Inputs whose strides use a size no argument
    gives are left to Inductor's own check."""
    import sympy
    from torch.utils._sympy.printers import PythonPrinter

    where: dict[Any, str] = {}  # symbol -> the Python expression reading it off the arguments
    for i, v in enumerate(vals):
        if isinstance(v, torch.SymInt) and isinstance(v.node.expr, sympy.Symbol):
            where.setdefault(v.node.expr, f"a[{i}]")
        elif isinstance(v, torch.Tensor):
            for d, size in enumerate(v.shape):
                if isinstance(size, torch.SymInt) and isinstance(size.node.expr, sympy.Symbol):
                    where.setdefault(size.node.expr, f"a[{i}].size({d})")
    printer = PythonPrinter()
    subs = {sym: sympy.Symbol(f"_tp_{k}") for k, sym in enumerate(where)}
    checks: list[tuple[int, str]] = []
    for i, v in enumerate(vals):
        if not isinstance(v, torch.Tensor) or v.layout != torch.strided:
            continue
        exprs = [
            s.node.expr if isinstance(s, torch.SymInt) else sympy.Integer(s) for s in v.stride()
        ]
        if any(not e.free_symbols <= where.keys() for e in exprs):
            continue
        texts = [printer.doprint(e.xreplace(subs)) for e in exprs]
        checks.append((i, "(" + "".join(t + ", " for t in texts) + ")"))
    if not checks:
        return fn
    names = {f"_tp_{k}": text for k, text in enumerate(where.values())}
    body = "".join(f"    {n} = {text}\n" for n, text in names.items())
    body += "    return [" + ", ".join(f"({i}, {t})" for i, t in checks) + "]\n"
    scope: dict[str, Any] = {"math": math}
    exec(f"def expected(a):\n{body}", scope)  # noqa: S102 - sympy printed from the graph's sizes
    expected = scope["expected"]

    def run(*args: Any) -> Any:
        for i, stride in expected(args):
            x = args[i]
            if x.stride() != stride and x.numel() > 1:
                copied = torch.empty_strided(x.shape, stride, dtype=x.dtype, device=x.device)
                args = (*args[:i], copied.copy_(x), *args[i + 1 :])
        return fn(*args)

    return run


def _cast_outputs(fn: Any, casts: Sequence[Any]) -> Any:
    """`fn` with its outputs cast to `casts[i]` where not None (precision.defer_output_casts),
    each into an array no earlier result still holds (OutputBuffers, one per output); a dtype
    numpy lacks, a non-contiguous or non-CPU output is cast as torch casts it."""
    import numpy

    np_dtypes = {torch.float32: numpy.float32, torch.float64: numpy.float64}
    pools: dict[int, OutputBuffers] = {}

    def cast(i: int, x: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        if dtype not in np_dtypes or not x.is_contiguous() or x.device.type != "cpu":
            return x.to(dtype)
        pool = pools.get(i)
        if pool is None or pool.shape != tuple(x.shape):
            pool = pools[i] = OutputBuffers(tuple(x.shape), numpy.dtype(np_dtypes[dtype]))
        return torch.from_numpy(pool.take()).copy_(x)

    def run(*args: Any) -> Any:
        outs = fn(*args)
        return type(outs)(
            o if c is None else cast(i, o, c)
            for i, (o, c) in enumerate(zip(outs, casts, strict=True))
        )

    return run


class _NumpyBackend(Backend):
    """Shared by the backends that take numpy arrays and return numpy arrays."""

    module = ""
    devices = ("cpu",)

    def unavailable(self) -> str | None:
        try:
            importlib.import_module(self.module)
        except Exception as e:  # noqa: BLE001 - any import failure means unavailable
            return f"python package '{self.module}' is not importable ({type(e).__name__}: {e})"
        return None

    def version(self) -> str:
        return str(getattr(importlib.import_module(self.module), "__version__", "?"))

    @staticmethod
    def _check_inputs(inputs: Sequence[Any]) -> None:
        for x in inputs:
            if not isinstance(x, torch.Tensor) or x.dtype in (torch.bfloat16,) or x.is_complex():
                raise BackendError(f"input of type {type(x).__name__} is not a supported tensor")


class OpenVINOBackend(_NumpyBackend):
    name = rule_set = "openvino"
    module = "openvino"
    graph_level = True
    rtol = atol = 1e-3
    compile_s_per_node = 0.001  # 0.3-0.8 s per real-size graph
    # Its model keeps a symbolic size as a dynamic dimension (-1) and reads each symbol's value
    # off a tensor argument's shape (_sizes_from_shapes).
    dynamic_shapes = True

    @staticmethod
    def _check_inputs(inputs: Sequence[Any]) -> None:
        # bf16 tensors go in from their bits (runner); numpy has no bf16 for the others' path.
        _NumpyBackend._check_inputs(
            [x for x in inputs if not (isinstance(x, torch.Tensor) and x.dtype == torch.bfloat16)]
        )

    def compile(self, gm: fx.GraphModule, inputs: Sequence[Any], rule: str) -> Compiled:
        import openvino as ov

        symbolic = symbolic_placeholders(gm)
        # A dynamic graph's sizes are read off its tensors' shapes inside the model (what
        # OpenVINO's frontend converts): their arguments are dropped.
        gm, keep = _sizes_from_shapes(gm)
        inputs = [inputs[i] for i in keep]
        self._check_inputs(inputs)
        # The rewrites below change one copy of `gm`, made by the first that applies: when
        # each made its own copy, the three took the 1.2B Llama's warm compile 0.66-1.02 s,
        # against 0.44-0.47 s so.
        own = _CopyOnWrite(gm)
        _without_legacy_empty_cat_inputs(own)
        _with_kv_heads_repeated(own)
        # Its matmul kernels are timed at the graph's sizes, which a dynamic graph has not.
        if self.compute == "f32" and not any(symbolic):  # MLAS runs f32 only: at bf16 oneDNN
            try:
                self._steered(own)
            except Exception as e:  # noqa: BLE001 - the graph as it is still converts
                log.info(
                    "torch_plugin placement: OpenVINO's matmul kernels left as it picks them "
                    "(timing them failed: %s: %s)",
                    type(e).__name__,
                    str(e).splitlines()[0][:200] if str(e) else "",
                )
        gm = own.result()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            try:
                model = self._convert_fx(gm, inputs)
            except Exception:  # noqa: BLE001 - TorchScript's frontend may take what FX's cannot
                if any(symbolic):  # a trace fixes the sizes it is shown
                    raise
                model = ov.convert_model(gm, example_input=tuple(inputs))
        run = self.runner(model, keep if len(keep) != len(symbolic) else None)
        if rule == "graph":
            # A whole graph's model, for known_graphs.py to save where it is the pick; taken off
            # the callable either way (it holds the frozen weights' memory, which it shares).
            run.ir = {"model": model, "compute": self.compute}  # type: ignore[attr-defined]
        return run

    def runner(self, model: Any, keep: Sequence[int] | None = None) -> Compiled:
        """The converted (or read back) `model` compiled, as a callable on torch tensors;
        `keep`: the arguments it takes (the others are sizes it reads off tensors' shapes)."""
        import numpy
        import openvino as ov

        # f32 unless the precision option allows bf16: OpenVINO would otherwise pick bf16 on
        # CPUs that have it.
        compiled = ov.Core().compile_model(
            model,
            "CPU",
            {
                "INFERENCE_PRECISION_HINT": "bf16" if self.compute == "bf16" else "f32",
                "PERFORMANCE_HINT": "LATENCY",
                "INFERENCE_NUM_THREADS": torch.get_num_threads(),
            },
        )
        request = compiled.create_infer_request()
        outputs = list(compiled.outputs)
        preset = [(i, OutputBuffers(shape, dtype)) for i, shape, dtype in _preset_outputs(outputs)]
        dropped = keep is not None
        # Inputs are handed to the request as tensors on their own memory where they already
        # are what it takes (its dtype, C-contiguous, not 0-d), and outputs read off its
        # tensors: infer(list)'s conversion of its arguments and its result dict cost a
        # one-input model 50 us more a call warm and 90-200 us more right after the caches were
        # evicted. Any other input goes through that conversion (a cast, a copy).
        types = _numpy_types()
        in_dtypes = [types.get(p.get_element_type()) for p in compiled.inputs]
        direct_outputs = all(types.get(o.get_element_type()) for o in outputs)
        # numpy has no bf16: OpenVINO hands a bf16 output over as float16 holding bf16's bits
        # (a bf16 model's logits read 1.80 for 0.69), reinterpreted here, not converted.
        bf16 = ov.Type.bf16
        bf16_outputs = {i for i, o in enumerate(outputs) if o.get_element_type() == bf16}

        def tensor(i: int, a: Any) -> torch.Tensor:
            t = torch.from_numpy(a.copy())
            return t.view(torch.bfloat16) if i in bf16_outputs else t

        set_input, get_output = request.set_input_tensor, request.get_output_tensor
        # bf16 inputs (a bf16 model's activations) go in as tensors of OpenVINO's bf16 made
        # from their bits, each other input as its port's type.
        bf16_inputs = {k for k, p in enumerate(compiled.inputs) if p.get_element_type() == bf16}

        def set_each(args: Sequence[torch.Tensor]) -> None:
            for k, a in enumerate(args):
                a = a.detach().contiguous()
                if k in bf16_inputs:
                    bits = a.view(torch.int16).numpy()
                    set_input(k, ov.Tensor(bits, ov.Shape(list(a.shape)), bf16))
                else:
                    set_input(k, ov.Tensor(numpy.array(a.numpy(), dtype=in_dtypes[k])))

        def direct(arrays: list[Any]) -> bool:
            if not direct_outputs or len(arrays) != len(in_dtypes):
                return False
            for a, dtype in zip(arrays, in_dtypes, strict=True):
                if a.dtype != dtype or a.ndim == 0 or not a.flags.c_contiguous:
                    return False
            for k, a in enumerate(arrays):
                set_input(k, ov.Tensor(a, shared_memory=True))
            return True

        def run(*args: Any) -> tuple[torch.Tensor, ...]:
            # Large outputs are written by OpenVINO straight into tensors of ours, each one no
            # earlier output still holds; the rest are views of its buffers (reused by the
            # next call), copied once.
            if dropped:
                args = tuple(args[i] for i in keep)
            written = {}
            for i, buffers in preset:
                a = buffers.take()
                request.set_output_tensor(i, ov.Tensor(a, shared_memory=True))
                written[i] = torch.from_numpy(a)
            if bf16_inputs:
                set_each(args)
            else:
                arrays = [a.detach().numpy() for a in args]
                if not direct(arrays):
                    res = request.infer(arrays, share_inputs=True, share_outputs=True)
                    return tuple(
                        written[i] if i in written else tensor(i, res[o])
                        for i, o in enumerate(outputs)
                    )
            request.infer(share_outputs=True)
            return tuple(
                written[i] if i in written else tensor(i, get_output(i).data)
                for i in range(len(outputs))
            )

        run.output_buffers = dict(preset)  # type: ignore[attr-defined] - what the tests inspect
        return run

    @functools.cached_property
    def gemms(self) -> Any:
        """Which matmul shapes OpenVINO runs faster on oneDNN than on MLAS (openvino_gemm.py)."""
        from .openvino_gemm import GemmChooser

        return GemmChooser(self.cache_path)

    def _steered(self, own: _CopyOnWrite) -> None:
        """Hands each large matmul that oneDNN runs faster to it (openvino_gemm.steer)."""
        from .openvino_gemm import gemm_shapes, steer, worth_timing

        def chosen(*shape: int) -> bool:
            return worth_timing(shape) and self.gemms(*shape)

        # Changed only where a matmul moves: the shapes are all timed (or cached) first, so a
        # timing that fails leaves the graph as it was.
        picks = {s for s in set(gemm_shapes(own.gm).values()) if chosen(*s)}
        if picks:
            steer(own.writable(), lambda *s: s in picks, recompile=False)

    @staticmethod
    def _convert_fx(gm: fx.GraphModule, inputs: Sequence[torch.Tensor]) -> Any:
        """The ATen graph through OpenVINO's FX frontend (what its own torch.compile backend
        uses). ov.convert_model would trace the GraphModule with TorchScript, whose frontend
        has no conversion for ATen's flash-attention and native_layer_norm: every BERT and
        GPT-2 region failed there, so OpenVINO took no group of either model."""
        import openvino as ov
        from openvino.frontend import FrontEndManager
        from openvino.frontend.pytorch.fx_decoder import TorchFXPythonDecoder

        types = {
            torch.float32: ov.Type.f32,
            torch.float64: ov.Type.f64,
            torch.float16: ov.Type.f16,
            torch.bfloat16: ov.Type.bf16,  # a bf16 model's activations (runner feeds their bits)
            torch.int64: ov.Type.i64,
            torch.int32: ov.Type.i32,
            torch.bool: ov.Type.boolean,
        }
        frontend = FrontEndManager().load_by_framework("pytorch")
        # Held in a local until convert() returns: the frontend calls back into this Python
        # object, and a temporary is collected first ("pure virtual function" in convert).
        # Each input's shape with its symbolic sizes dynamic (-1), the others fixed.
        shapes = [
            [-1 if isinstance(d, torch.SymInt) else int(d) for d in shape]
            for shape in (
                v.shape if isinstance(v, torch.Tensor) else x.shape
                for v, x in zip(_placeholder_vals(gm), inputs, strict=True)
            )
        ]
        if any(-1 in shape for shape in shapes):
            # A dynamic graph: dynamic from the start, so that conversion keeps them so.
            dtypes = [x.dtype for x in inputs]
            decoder = TorchFXPythonDecoder(gm, input_shapes=shapes, input_types=dtypes)
        else:
            decoder = TorchFXPythonDecoder(gm)
        model = frontend.convert(frontend.load(decoder))
        del decoder
        if len(model.inputs) != len(inputs):
            raise BackendError(f"{len(model.inputs)} model inputs for {len(inputs)} arguments")
        for port, x, shape in zip(model.inputs, inputs, shapes, strict=True):
            if x.dtype not in types:
                raise BackendError(f"input dtype {x.dtype}")
            port.get_node().set_element_type(types[x.dtype])
            port.get_node().set_partial_shape(ov.PartialShape(shape))
        model.validate_nodes_and_infer_types()
        return model


def _sizes_from_shapes(gm: fx.GraphModule) -> tuple[fx.GraphModule, list[int]]:
    """`gm` (a copy where it changes) with each placeholder that is a symbolic size replaced by
    that dimension of a tensor placeholder (aten.sym_size), and the placeholders it keeps, by
    index. Dynamo passes a dynamic graph's sizes as int arguments beside the tensors they size;
    OpenVINO's frontend converts a size read off a shape, as in the graphs its own backend
    gets, but no int argument that every op takes (aten.slice wants it 1-D, a size list 0-D)."""
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    sizes = [n for n in placeholders if isinstance(n.meta.get("val"), torch.SymInt)]
    if not sizes:
        return gm, list(range(len(placeholders)))
    dims: dict[Any, tuple[str, int]] = {}  # symbol -> (tensor placeholder, dimension)
    for n in placeholders:
        v = n.meta.get("val")
        if isinstance(v, torch.Tensor):
            for d, size in enumerate(v.shape):
                if isinstance(size, torch.SymInt):
                    dims.setdefault(size.node.expr, (n.name, d))
    missing = [n.name for n in sizes if n.meta["val"].node.expr not in dims]
    if missing:
        raise BackendError(f"the sizes {missing} are no tensor argument's dimension")
    gm = fx.GraphModule(gm, copy.deepcopy(gm.graph))
    by_name = {n.name: n for n in gm.graph.nodes}
    first = next(n for n in gm.graph.nodes if n.op != "placeholder")
    for old in [by_name[n.name] for n in sizes]:
        tensor, d = dims[old.meta["val"].node.expr]
        with gm.graph.inserting_before(first):
            new = gm.graph.call_function(torch.ops.aten.sym_size.int, (by_name[tensor], d))
        new.meta = dict(old.meta)
        old.replace_all_uses_with(new)
        gm.graph.erase_node(old)
    gm.recompile()
    size_names = {n.name for n in sizes}
    return gm, [i for i, n in enumerate(placeholders) if n.name not in size_names]


def _placeholder_vals(gm: fx.GraphModule) -> list[Any]:
    return [n.meta.get("val") for n in gm.graph.nodes if n.op == "placeholder"]


def symbolic_placeholders(gm: fx.GraphModule) -> list[bool]:
    """Per placeholder: whether it is a symbolic size (an int argument) or a tensor with one."""
    return [
        isinstance(v, torch.SymInt)
        or (isinstance(v, torch.Tensor) and any(isinstance(d, torch.SymInt) for d in v.shape))
        for v in _placeholder_vals(gm)
    ]


# Outputs from this size on are preset (OpenVINO writes into a tensor of ours); smaller ones are
# copied out, which costs less than presetting (about 2 us) below it.
PRESET_MIN_BYTES = 64 << 10


class OutputBuffers:
    """Arrays for one output of a compiled graph, each handed out again once nothing holds it.

    A fresh array per call is fresh memory per call: past glibc's mmap threshold (32 MB at
    most) every allocation is mapped anew and faults in on first write. GPT-2's 206 MB of f32
    logits at batch 8 cost 73 ms a call in 4 KB faults, 16 ms in numpy's huge pages, and on a
    VM that reports free memory to its host the huge pages stalled whole calls by 150-250 ms
    (the host faults them in again). So each array is handed out as a view of it, and written
    again only once that view is gone: the tensor torch.from_numpy makes of it holds it, and so
    do that tensor's views (through its storage) and OpenVINO's tensor. A weak reference tells,
    where a reference count would depend on the interpreter. A caller that keeps each output
    (`out = model(x)` holds the last one during the next call) gets the other of two arrays;
    one that keeps more gets fresh ones, never one it still holds."""

    KEEP = 2  # arrays kept for reuse: a loop that holds the last output alternates two

    def __init__(self, shape: tuple[int, ...], dtype: Any) -> None:
        self.shape, self.dtype = shape, dtype
        self.slots: list[tuple[Any, weakref.ref[Any]]] = []  # (array, its view handed out)

    @property
    def arrays(self) -> list[Any]:
        return [a for a, _ in self.slots]

    def take(self) -> Any:
        import numpy

        for k, (a, handed) in enumerate(self.slots):
            if handed() is None:
                view = a.view()
                self.slots[k] = (a, weakref.ref(view))
                return view
        a = numpy.empty(self.shape, self.dtype)
        view = a.view()
        if len(self.slots) < self.KEEP:
            self.slots.append((a, weakref.ref(view)))
        return view


def _numpy_types() -> dict[Any, Any]:
    """numpy's dtype for each OpenVINO element type it has (not bf16)."""
    import numpy
    import openvino as ov

    return {
        ov.Type.f32: numpy.dtype(numpy.float32),
        ov.Type.f64: numpy.dtype(numpy.float64),
        ov.Type.f16: numpy.dtype(numpy.float16),
        ov.Type.i64: numpy.dtype(numpy.int64),
        ov.Type.i32: numpy.dtype(numpy.int32),
        ov.Type.i8: numpy.dtype(numpy.int8),
        ov.Type.u8: numpy.dtype(numpy.uint8),
        ov.Type.boolean: numpy.dtype(numpy.bool_),
    }


def _preset_outputs(outputs: Sequence[Any]) -> list[tuple[int, tuple[int, ...], Any]]:
    """(index, shape, dtype) of the compiled model's outputs that a call hands OpenVINO as its
    own arrays to write into: static shape, a dtype numpy has, at least PRESET_MIN_BYTES.
    Taking its results as copies (infer's default) and then copying them out of numpy moved
    GPT-2's 26 MB of logits twice a call: 3 ms of 80. One preset output costs about 2 us."""
    import numpy

    dtypes = _numpy_types()  # not bf16: such outputs are copied out
    preset = []
    for i, o in enumerate(outputs):
        shape, dtype = o.get_partial_shape(), dtypes.get(o.get_element_type())
        if dtype is None or not shape.is_static:
            continue
        dims = tuple(int(d) for d in shape.to_shape())
        if math.prod(dims) * numpy.dtype(dtype).itemsize >= PRESET_MIN_BYTES:
            preset.append((i, dims, numpy.dtype(dtype)))
    return preset


class _CopyOnWrite:
    """A graph module that rewrites change in place of a copy made by the first of them, so
    that several rewrites cost one copy and its code is generated again once more (`result`),
    not a copy each. The copy shares the caller's submodules: a rewrite changes its top
    graph only."""

    def __init__(self, gm: fx.GraphModule) -> None:
        self.gm = gm
        self.owned = False

    def writable(self) -> fx.GraphModule:
        if not self.owned:
            self.gm = fx.GraphModule(self.gm, copy.deepcopy(self.gm.graph))
            self.owned = True
        return self.gm

    def result(self) -> fx.GraphModule:
        if self.owned:
            self.gm.recompile()
        return self.gm


def _without_legacy_empty_cat_inputs(own: _CopyOnWrite) -> None:
    """Drops the 1-D empty tensors among aten.cat's inputs.
    aten.cat skips such legacy inputs whatever the other inputs' rank; OpenVINO's Concat does
    not ("Axis -2 out of the tensor rank range"). Every HF decoder at its default
    `use_cache=True` concatenates its first keys and values onto one (the cache layer's
    `torch.tensor([])`), so OpenVINO converted none of them (GPT-2 at real size included)."""

    def legacy_empty(a: Any) -> bool:
        v = a.meta.get("val") if isinstance(a, fx.Node) else None
        return isinstance(v, torch.Tensor) and v.dim() == 1 and v.shape[0] == 0

    def droppable(n: fx.Node) -> bool:
        if n.op != "call_function" or n.target is not torch.ops.aten.cat.default:
            return False
        ins = list(n.args[0])
        return any(legacy_empty(a) for a in ins) and not all(legacy_empty(a) for a in ins)

    if not any(droppable(n) for n in own.gm.graph.nodes):
        return
    graph = own.writable().graph
    for n in list(graph.nodes):
        if droppable(n):
            n.args = ([a for a in n.args[0] if not legacy_empty(a)], *n.args[1:])
    # The dropped inputs' producers, now unused. Not Graph.eliminate_dead_code: it also cleans
    # the submodules get_attr nodes name, which the copy shares with the caller's graph.
    for n in reversed(graph.nodes):
        if not n.users and not n.is_impure():  # placeholders and the output are impure
            graph.erase_node(n)


def _with_kv_heads_repeated(own: _CopyOnWrite) -> None:
    """Repeats grouped-query attention's keys and values to the query's heads before ATen's
    CPU flash attention, which groups heads itself;
    OpenVINO's ScaledDotProductAttention refuses keys with fewer heads ("Key input shape not
    compatible"), so no Llama-3, Mistral or Qwen2 graph converted (the 1.2B Llama ran on
    Inductor at 0.5x ONNX Runtime). The repeat is HF's repeat_kv: unsqueeze, expand, reshape."""
    aten = torch.ops.aten
    sdpa = aten._scaled_dot_product_flash_attention_for_cpu.default

    def groups(n: fx.Node) -> int:
        if n.op != "call_function" or n.target is not sdpa:
            return 1
        q, k = (a.meta.get("val") if isinstance(a, fx.Node) else None for a in n.args[:2])
        if not isinstance(q, torch.Tensor) or not isinstance(k, torch.Tensor) or q.dim() != 4:
            return 1
        hq, hk = q.shape[1], k.shape[1]
        return hq // hk if hk != hq and hk > 0 and hq % hk == 0 else 1

    if all(groups(n) == 1 for n in own.gm.graph.nodes):
        return
    gm = own.writable()
    for n in list(gm.graph.nodes):
        rep = groups(n)
        if rep == 1:
            continue
        new_args = list(n.args)
        for i in (1, 2):
            kv = n.args[i]
            b, h, t, d = kv.meta["val"].shape
            with gm.graph.inserting_before(n):
                x = gm.graph.call_function(aten.unsqueeze.default, (kv, 2))
                x = gm.graph.call_function(aten.expand.default, (x, [b, h, rep, t, d]))
                x = gm.graph.call_function(aten.clone.default, (x,))
                x = gm.graph.call_function(aten.view.default, (x, [b, h * rep, t, d]))
            # The converter reads shapes and dtypes off the nodes' fake values.
            v = kv.meta["val"]
            v = aten.unsqueeze.default(v, 2).expand(b, h, rep, t, d).clone()
            x.meta["val"] = v.view(b, h * rep, t, d)
            new_args[i] = x
        n.args = tuple(new_args)


class OnnxRuntimeBackend(_NumpyBackend):
    name = rule_set = "onnxruntime"
    module = "onnxruntime"
    graph_level = True
    rtol = atol = 1e-3
    compile_s_per_node = 0.015  # 13-18 ms: the export (torch.export, translation) dominates
    # Where exported whole graphs are kept (artifacts.artifact_dir); None keeps nothing.
    artifacts: str | None = None

    def compile(self, gm: fx.GraphModule, inputs: Sequence[torch.Tensor], rule: str) -> Compiled:
        self._check_inputs(inputs)
        self.last_from_cache = False
        model, key = self._exported(gm, inputs, rule)
        names = [n.name for n in gm.graph.nodes if n.op == "placeholder"]
        run = self.runner(model, rule, names)
        if key is not None:  # kept beside the profile cache: known_graphs.py may name it
            run.ir = {"artifact": key, "names": names}  # type: ignore[attr-defined]
        return run

    def runner(self, model: bytes | str, rule: str, placeholders: Sequence[str]) -> Compiled:
        """A session of the ONNX `model` (bytes, or the path of an export past 2 GB, removed
        once loaded) as a callable on torch tensors; `placeholders`: its graph's inputs."""
        import onnxruntime as ort

        opts = ort.SessionOptions()
        opts.log_severity_level = 3
        # Share the cores with torch's own thread pool: as many threads as torch uses. Op-level
        # groups do not spin (a spinning pool starves the ATen ops in between). Regions spin
        # between their ops (waking the pool per op cost ~40% on a whole ResNet region) but
        # stop when a run returns: left spinning, the pool took a core from whatever ran next
        # (OpenVINO after an ONNX Runtime prefix of ResNet-50: 3-14 ms more than the whole
        # graph, against 0.2-1.3 ms stopped; benchmarks/placement_mix.py). Only the whole graph
        # ("graph"), with no other runtime beside it, keeps spinning between runs (stopping
        # cost 2% on ResNet-50 called back to back).
        opts.intra_op_num_threads = torch.get_num_threads()
        opts.inter_op_num_threads = 1
        spin = "1" if rule in ("region", "graph") else "0"
        opts.add_session_config_entry("session.intra_op.allow_spinning", spin)
        if rule not in ("region", "graph"):
            # An op-level group's arena keeps its output buffers after each run: ~29 MB held
            # per session for one batch-8 convolution with a 24.5 MB output, 9 MB without.
            # Hundreds of such groups hold a model's activations again (full-size NasNet at
            # batch 8 has 8.3 GB of module outputs; its search ran out of 24 GiB).
            opts.enable_cpu_mem_arena = False
        if rule == "region":
            opts.add_session_config_entry("session.force_spinning_stop", "1")
        try:
            session = ort.InferenceSession(model, opts, providers=["CPUExecutionProvider"])
        finally:
            if isinstance(model, str):  # loaded: the exported files are not needed any more
                shutil.rmtree(os.path.dirname(model), ignore_errors=True)
        names = [i.name for i in session.get_inputs()]
        if len(names) != len(placeholders):
            # The exporter drops inputs the graph does not read; keep the ones it kept.
            keep = [list(placeholders).index(n) for n in names]
        else:
            keep = list(range(len(placeholders)))

        feeds = list(zip(names, keep, strict=False))

        def run(*args: torch.Tensor) -> tuple[torch.Tensor, ...]:
            # detach(): a training graph's forward gets its parameters, which need grad.
            feed = {n: args[i].detach().numpy() for n, i in feeds}
            return tuple(torch.from_numpy(r) for r in session.run(None, feed))

        run.session = session  # type: ignore[attr-defined] - for inspection (tests)
        return run

    def _exported(
        self, gm: fx.GraphModule, inputs: Sequence[torch.Tensor], rule: str
    ) -> tuple[bytes | str, str | None]:
        """The ONNX model of `gm` and its key among the artifacts (None: not kept); a whole
        graph's from the artifacts beside the profile cache when it was exported before
        (artifacts.py), exported and kept otherwise. A model past protobuf's 2 GB is a file
        path instead (_export_onnx), not kept."""
        from torch._guards import tracing

        from . import artifacts

        key = None
        if rule == "graph" and self.artifacts is not None:
            import onnxscript

            versions = [torch.__version__, self.version(), onnxscript.__version__]
            key = artifacts.graph_key(gm, inputs, versions)
            cached = artifacts.load(self.artifacts, key, ".onnx")
            self.last_from_cache = cached is not None
            if cached is not None:
                return cached, key
        # torch.export runs Dynamo; outside the enclosing frame's tracing context, or its
        # guards leak into (and break) the user's compiled frame.
        with (
            warnings.catch_warnings(),
            contextlib.redirect_stdout(io.StringIO()),
            quiet_loggers(_EXPORTER_LOGGERS),
            tracing(None),
        ):
            warnings.simplefilter("ignore")
            model = _export_onnx(gm, tuple(inputs))
        if key is not None and isinstance(model, bytes):
            if artifacts.store(self.artifacts, key, ".onnx", model):
                return model, key
        return model, None


# The exporter's own loggers: onnxscript's optimiser and onnx_ir's passes log each initializer
# they merge and each node they do not fold at INFO, several hundred lines for one GPT-2 graph,
# which an application logging at INFO printed for every ONNX Runtime candidate.
_EXPORTER_LOGGERS = ("torch.onnx", "onnxscript", "onnx_ir")


@contextlib.contextmanager
def quiet_loggers(names: Sequence[str], level: int = logging.ERROR) -> Any:
    """Within: the loggers `names` that take their level from their parents (set to none of
    their own) at `level`; after: as they were. A level the application set on one is kept."""
    loggers = [logging.getLogger(n) for n in names]
    quieted = [lg for lg in loggers if lg.level == logging.NOTSET]
    for lg in quieted:
        lg.setLevel(level)
    try:
        yield
    finally:
        for lg in quieted:
            lg.setLevel(logging.NOTSET)


@functools.cache
def _torchlib_registry(opset: int) -> Any:
    """ATen-to-ONNX translations, built once per process. torch.onnx.export builds them anew
    on every call by reading the source of ~1,500 onnxscript functions: about 0.75 s of each
    ~1.3 s export of a one-op group, paid for every ONNX Runtime candidate measured."""
    from torch.onnx._internal.exporter import _registration

    return _registration.ONNXRegistry.from_torchlib(opset_version=opset)


# Weights past this many bytes go to a file beside the model: one protobuf message holds at
# most 2 GB (a 1.2B-parameter f32 Llama's 5 GB failed to serialise, so ONNX Runtime never
# ran it, though it was the fastest f32 runtime there at 2.0x Inductor).
_ONNX_INLINE_WEIGHTS_MAX = 1 << 30


def _export_onnx(gm: fx.GraphModule, args: tuple[torch.Tensor, ...]) -> bytes | str:
    """The serialised ONNX model torch.onnx.export(gm, args, dynamo=True) writes, through the
    exporter's core with a reused registry (same opset, same passes); the public call where
    the core is not what this was written against (another torch). A model whose weights pass
    _ONNX_INLINE_WEIGHTS_MAX is saved with its weights as external data in a new temporary
    directory: the model file's path is returned, and whoever loads it removes the
    directory."""
    try:
        from torch.onnx import _constants
        from torch.onnx._internal.exporter import _constants as _exporter_constants
        from torch.onnx._internal.exporter import _core

        opset = _constants.ONNX_DEFAULT_OPSET  # what the public call uses when given none
        registry_opset = max(opset, _exporter_constants.TORCHLIB_OPSET)
        params = inspect.signature(_core.export).parameters
        if not {"registry", "opset_version", "verbose"} <= params.keys():
            raise ImportError("torch.onnx's exporter core has another signature")
    except (ImportError, AttributeError):
        buf = io.BytesIO()
        torch.onnx.export(gm, args, buf, dynamo=True, verbose=False)
        return buf.getvalue()
    program = _core.export(
        gm,
        args,
        None,
        registry=_torchlib_registry(registry_opset),
        opset_version=opset,
        verbose=False,
    )
    weights = sum(
        v.const_value.nbytes
        for v in program.model.graph.initializers.values()
        if v.const_value is not None
    )
    if weights > _ONNX_INLINE_WEIGHTS_MAX:
        path = os.path.join(tempfile.mkdtemp(prefix="torch_plugin_onnx_"), "model.onnx")
        program.save(path, external_data=True)
        return path
    return program.model_proto.SerializeToString()


# ---------------------------------------------------------------- our fused kernels


def _placeholder_index(gm: fx.GraphModule) -> dict[fx.Node, int]:
    return {n: i for i, n in enumerate(n for n in gm.graph.nodes if n.op == "placeholder")}


def _output_nodes(gm: fx.GraphModule) -> list[fx.Node]:
    out = next(n for n in gm.graph.nodes if n.op == "output")
    return list(out.args[0])


def _only(gm: fx.GraphModule, targets: Sequence[Any]) -> fx.Node:
    found = [n for n in gm.graph.nodes if n.op == "call_function" and n.target in targets]
    if len(found) != 1:
        raise BackendError(f"expected one of {targets}, found {len(found)}")
    return found[0]


def _arg(ph: dict[fx.Node, int], a: Any) -> int:
    if not isinstance(a, fx.Node) or a not in ph:
        raise BackendError("operand is not a group input")
    return ph[a]


_ACTS = {
    torch.ops.aten.gelu.default: "gelu",
    torch.ops.aten.relu.default: "relu",
    torch.ops.aten.tanh.default: "tanh",
    torch.ops.aten.silu.default: "silu",
}
_VIEWS = (
    torch.ops.aten.view.default,
    torch.ops.aten.reshape.default,
    torch.ops.aten._unsafe_view.default,
)


def _fused_linear_act(gm: fx.GraphModule) -> Compiled:
    ph = _placeholder_index(gm)
    addmm = _only(gm, [torch.ops.aten.addmm.default])
    if addmm.kwargs.get("beta", 1) != 1 or addmm.kwargs.get("alpha", 1) != 1:
        raise BackendError("addmm with alpha/beta")
    ib, ix, iw = (_arg(ph, a) for a in addmm.args[:3])
    act_node = _only(gm, list(_ACTS))
    act = _ACTS[act_node.target]
    if act == "gelu" and act_node.kwargs.get("approximate", "none") == "tanh":
        act = "gelu_tanh"
    views = [n for n in gm.graph.nodes if n.op == "call_function" and n.target in _VIEWS]
    shape = list(views[0].args[1]) if views else None
    if _output_nodes(gm) != [act_node]:
        raise BackendError("an intermediate result is used outside the group")
    kernel = torch.ops.torch_plugin.linear_act.default

    def run(*args: torch.Tensor) -> tuple[torch.Tensor]:
        y = kernel(args[ix], args[iw], args[ib], act)
        return (y.view(shape) if shape is not None else y,)

    return run


def _fused_layer_norm(gm: fx.GraphModule) -> Compiled:
    """(add +) layer norm. A training graph's forward also returns the statistics its
    backward saves (mean, rstd): then the kernel that writes them runs."""
    ph = _placeholder_index(gm)
    ln = _only(gm, [torch.ops.aten.native_layer_norm.default])
    x, normalized, w, b, eps = ln.args
    if len(normalized) != 1 or w is None or b is None:
        raise BackendError("layer norm over more than the last dim, or without affine")
    adds = [n for n in gm.graph.nodes if n.target is torch.ops.aten.add.Tensor]
    getitems = {n.args[1]: n for n in gm.graph.nodes if n.target is operator.getitem}
    outs = _output_nodes(gm)
    # Where each output comes from: 0 = the residual sum, 1 = normalised, 2 = mean, 3 = rstd.
    source = {getitems.get(0): 1, getitems.get(1): 2, getitems.get(2): 3, **{a: 0 for a in adds}}
    source.pop(None, None)
    if any(o not in source for o in outs):
        raise BackendError("an intermediate result of the layer norm is used outside the group")
    stats = any(source[o] >= 2 for o in outs)
    iw, ib = _arg(ph, w), _arg(ph, b)
    kernel = (
        torch.ops.torch_plugin.add_layer_norm_stats.default
        if stats
        else torch.ops.torch_plugin.add_layer_norm.default
    )
    order = [source[o] for o in outs]
    if adds:
        add = adds[0]
        if add.kwargs.get("alpha", 1) != 1 or add is not x:
            raise BackendError("add with alpha, or not the layer norm's input")
        ia, ir = (_arg(ph, a) for a in add.args)
        va, vr = (a.meta.get("val") for a in add.args)
        if va is None or vr is None or va.shape != vr.shape:
            raise BackendError("the residual add broadcasts")

        def run_add(*args: torch.Tensor) -> tuple[torch.Tensor, ...]:
            res = kernel(args[ia], args[ir], args[iw], args[ib], eps)
            return tuple(res[i] for i in order)

        return run_add
    ix = _arg(ph, x)

    def run(*args: torch.Tensor) -> tuple[torch.Tensor, ...]:
        res = kernel(args[ix], None, args[iw], args[ib], eps)
        return tuple(res[i] for i in order)

    return run


def _fused_softmax(gm: fx.GraphModule) -> Compiled:
    ph = _placeholder_index(gm)
    sm = _only(gm, [torch.ops.aten._softmax.default])
    src, dim, half_to_float = sm.args
    val = src.meta.get("val")
    if half_to_float or val is None or dim not in (-1, val.dim() - 1):
        raise BackendError("softmax not over the last dim")
    if _output_nodes(gm) != [sm]:
        raise BackendError("an intermediate result is used outside the group")
    scores, mask, scale = src, None, 1.0
    scale_input: int | None = None
    invert = False
    if isinstance(src, fx.Node) and src.target is torch.ops.aten.add.Tensor and src not in ph:
        if src.kwargs.get("alpha", 1) != 1:
            raise BackendError("add with alpha")
        a, m = src.args
        if isinstance(m, fx.Node) and m not in ph and a in ph:
            a, m = m, a
        scores, mask = a, _arg(ph, m)
    if (
        isinstance(scores, fx.Node)
        and scores not in ph
        and scores.target
        in (
            torch.ops.aten.div.Tensor,
            torch.ops.aten.mul.Tensor,
        )
    ):
        s, c = scores.args
        invert = scores.target is torch.ops.aten.div.Tensor
        if isinstance(c, fx.Node):
            cv = c.meta.get("val")
            if cv is None or cv.dim() != 0:
                raise BackendError("scale is not a scalar")
            scale_input = _arg(ph, c)
        else:
            scale = 1.0 / float(c) if invert else float(c)
        scores = s
    iscores = _arg(ph, scores)
    kernel = torch.ops.torch_plugin.scaled_masked_softmax.default

    def run(*args: torch.Tensor) -> tuple[torch.Tensor]:
        k = scale
        if scale_input is not None:
            c = float(args[scale_input])
            k = 1.0 / c if invert else c
        return (kernel(args[iscores], k, args[mask] if mask is not None else None),)

    return run


def _fused_attention(gm: fx.GraphModule) -> Compiled:
    """ATen's CPU SDPA node (what F.scaled_dot_product_attention lowers to) on our flash
    kernel, which returns the same (out, logsumexp); a training forward may use both."""
    ph = _placeholder_index(gm)
    sdpa = _only(gm, [torch.ops.aten._scaled_dot_product_flash_attention_for_cpu.default])
    q, k, v = sdpa.args[:3]
    dropout = sdpa.args[3] if len(sdpa.args) > 3 else sdpa.kwargs.get("dropout_p", 0.0)
    causal = sdpa.args[4] if len(sdpa.args) > 4 else sdpa.kwargs.get("is_causal", False)
    mask, scale = sdpa.kwargs.get("attn_mask"), sdpa.kwargs.get("scale")
    if dropout != 0.0:
        raise BackendError("attention with dropout")
    if not isinstance(causal, bool) or not (scale is None or isinstance(scale, (int, float))):
        raise BackendError("is_causal or scale is not a constant")
    iq, ik, iv = (_arg(ph, a) for a in (q, k, v))
    imask = _arg(ph, mask) if mask is not None else None
    if mask is not None and getattr(mask.meta.get("val"), "dtype", None) != torch.float32:
        raise BackendError("attention mask is not an additive float32 mask")
    getitems = {
        n.args[1]: n for n in gm.graph.nodes if n.target is operator.getitem and n.args[0] is sdpa
    }
    outs = _output_nodes(gm)
    if any(o not in getitems.values() for o in outs):
        raise BackendError("the attention's outputs are used other than through getitem")
    order = [next(i for i, n in getitems.items() if n is o) for o in outs]
    kernel = torch.ops.torch_plugin.attention.default
    fscale = None if scale is None else float(scale)

    def run(*args: torch.Tensor) -> tuple[torch.Tensor, ...]:
        mask_arg = args[imask] if imask is not None else None
        res = kernel(args[iq], args[ik], args[iv], mask_arg, causal, fscale)
        return tuple(res[i] for i in order)

    return run


class FusedBackend(Backend):
    """Our CPU kernels (kernels/cpu/fused_inference.cc, flash_attention.cc), one adapter per
    C++ rule."""

    name = rule_set = "fused"
    rtol = atol = 1e-4
    devices = ("cpu",)
    adapters: dict[str, Callable[[fx.GraphModule], Compiled]] = {
        "linear_act": _fused_linear_act,
        "add_layer_norm": _fused_layer_norm,
        "layer_norm": _fused_layer_norm,
        "softmax": _fused_softmax,
        "attention": _fused_attention,
    }

    def compile(self, gm: fx.GraphModule, inputs: Sequence[torch.Tensor], rule: str) -> Compiled:
        adapter = self.adapters.get(rule)
        if adapter is None:
            raise BackendError(f"no kernel for rule '{rule}'")
        device = next(
            (x.device for x in inputs if isinstance(x, torch.Tensor) and x.device.type != "cpu"),
            None,
        )
        if device is not None:
            raise BackendError(f"the fused '{rule}' kernel runs on CPU only; inputs on {device}")
        return adapter(gm)


BACKENDS: dict[str, type[Backend]] = {
    "aten": AtenBackend,
    "inductor": InductorBackend,
    "openvino": OpenVINOBackend,
    "onnxruntime": OnnxRuntimeBackend,
    "fused": FusedBackend,
}
DEFAULT_BACKENDS = ("aten", "fused", "inductor", "openvino", "onnxruntime")


# Backends that compute in bf16 when the precision option allows it. ONNX Runtime's CPU
# provider has no bf16 MatMul or Conv kernels (it would insert casts around f32 ones): it stays
# at f32, which meets the bf16 bound too. Eager ("aten") is the reference; our fused kernels
# are f32.
LOWER_PRECISION = ("inductor", "openvino")
# Backends whose f32 linears run as three bf16 products under "high" float32 matmul precision
# (compute "f32x3", bf16x3.py); the others keep f32.
BF16X3 = ("inductor",)


def for_device(backends: Sequence[Backend], device: str) -> list[Backend]:
    """The backends that run graphs on `device` (a device_key: "cpu" or "cuda:<model>"). The
    CPU-only ones (OpenVINO's and ONNX Runtime's CPU runtimes, our fused CPU kernels) are left
    out of a GPU graph's search instead of each exporting the graph only to fail on its
    tensors (a bert-base export costs seconds)."""
    kind = device.split(":", 1)[0]
    kept = [b for b in backends if kind in b.devices]
    dropped = [b.name for b in backends if kind not in b.devices]
    if dropped:
        log.info(
            "torch_plugin placement: %s run on the CPU only; not tried on this %s graph",
            ", ".join(dropped),
            kind,
        )
    return kept


def get_backends(
    names: Sequence[str], compute: str = "f32", cache_path: str | None = ":memory:"
) -> list[Backend]:
    """Instances of the named backends that can run here; 'aten' is always included first.
    compute: "bf16" lets the backends in LOWER_PRECISION compute in it, "f32x3" those in BF16X3
    run f32 linears as three bf16 products. cache_path: the
    profile cache the backends keep their own measurements in (None: the default one)."""
    unknown = [n for n in names if n not in BACKENDS]
    if unknown:
        raise ValueError(
            f"torch_plugin placement: unknown backend(s) {', '.join(map(repr, unknown))}; "
            f"valid: {', '.join(BACKENDS)}"
        )
    out: list[Backend] = [AtenBackend()]
    for name in names:
        if name == "aten":
            continue
        backend = BACKENDS[name]()
        if compute != "f32" and name in (BF16X3 if compute == "f32x3" else LOWER_PRECISION):
            backend.compute = compute
        backend.cache_path = cache_path
        reason = backend.unavailable()
        if reason is not None:
            log.warning("torch_plugin placement: skipping backend %s: %s", name, reason)
            continue
        out.append(backend)
    return out
