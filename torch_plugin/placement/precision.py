"""Reduced-precision inference (issue 39): the `precision` option, the tolerance each precision
states against an eager reference, and the graph rewrite that lets a compiler compute in bf16.

`precision="f32"` (the default) keeps every candidate within 1e-3 of eager elementwise (relative
to each output's largest magnitude), as before. `precision="bf16"` lets each backend compute at
bf16 where it can (OpenVINO's inference-precision hint; Inductor and ATen on the graph traced
again under `torch.autocast`, the casts of frozen weights folded away); every candidate, f32 ones
included, is then held to a relative L2 error of at most 5e-2 per floating output against the
graph's eager outputs. A graph that already computes in bf16 (a bf16 model, or a call under
`torch.autocast`) implies the option.
"""

from __future__ import annotations

import contextlib
import itertools
import math
from collections.abc import Sequence
from typing import Any

import torch
import torch.fx as fx

from ..fx_bridge import attribute

PRECISIONS = ("f32", "bf16")
# Stated bounds: f32 elementwise (rtol = atol, the latter scaled by the output's largest
# magnitude); bf16 the relative L2 error of each floating output. bf16 keeps 8 significant bits
# (unit roundoff 2^-9 = 2e-3); a dozen layers accumulating it land near 5e-3 (OpenVINO's bf16 on
# bert-base), and a 1.2B Llama's logits under PyTorch's own autocast at 2.9e-2 (at the earlier
# 2e-2 its bf16 graphs were all refused and the option ran eager). 5e-2 admits what PyTorch's
# bf16 gives a user; a wrong graph is off by order 1.
TOLERANCE = {"f32": 1e-3, "bf16": 5e-2}
_DTYPES = {"bf16": torch.bfloat16}


def check_precision(value: Any) -> str | None:
    """The user's `precision` option, validated: None (decided per graph) or a name."""
    if value is None or value in PRECISIONS:
        return value
    raise ValueError(
        f"torch_plugin option 'precision' must be one of {', '.join(PRECISIONS)} (or None: f32 "
        f"unless the graph already computes in bf16), got {value!r}"
    )


def graph_precision(gm: fx.GraphModule) -> str:
    """'bf16' when a value of the graph is bf16 (a bf16 model, or a graph traced under
    autocast), else 'f32'."""
    for n in gm.graph.nodes:
        v = n.meta.get("val")
        vals = v if isinstance(v, (tuple, list)) else [v]
        if any(isinstance(x, torch.Tensor) and x.dtype == torch.bfloat16 for x in vals):
            return "bf16"
    return "f32"


def resolve(requested: str | None, gm: fx.GraphModule) -> str:
    """The precision a graph is placed at: the lower of what was asked and what it computes."""
    implied = graph_precision(gm)
    return "bf16" if "bf16" in (requested, implied) else "f32"


def _on_kernel(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.device.type == b.device.type == "cpu" and a.dtype in _KERNEL_DTYPES


def _kernel_stats(a: torch.Tensor, b: torch.Tensor, rtol: float, atol: float) -> tuple[float, bool]:
    """Floating CPU `a` against `b` (same shape and dtype) in one pass of our kernel
    (kernels/cpu/output_compare.cc): the relative L2 error (_relative) and `_torch_close`'s
    answer. In torch ops both took a dozen temporaries, 1.25 s a check of GPT-2's batch-8
    logits."""
    diff_sq, ref_sq, apart, _ = torch.ops.torch_plugin.compare_outputs(
        a.detach(), b.detach(), rtol, atol
    ).tolist()
    return _relative(math.sqrt(diff_sq), math.sqrt(ref_sq)), apart == 0


def _torch_error(a: torch.Tensor, b: torch.Tensor) -> float:
    ref = b.detach().double()
    diff = torch.linalg.vector_norm(a.detach().double() - ref)
    return _relative(float(diff), float(torch.linalg.vector_norm(ref)))


def _torch_close(a: torch.Tensor, b: torch.Tensor, rtol: float, atol: float) -> bool:
    """Every element within rtol and atol times `b`'s largest finite magnitude (at least 1),
    NaN matching NaN."""
    scale = float(b.abs().nan_to_num(0.0, posinf=0.0, neginf=0.0).max())
    return torch.allclose(a, b, rtol=rtol, atol=atol * max(1.0, scale), equal_nan=True)


def _relative(diff: float, norm: float) -> float:
    """The relative L2 error: inf where it is NaN, or where `b` is all zero and `a` is not."""
    if math.isnan(diff):
        return math.inf
    return diff / norm if norm > 0 else (0.0 if diff == 0 else math.inf)


_KERNEL_DTYPES = (torch.float32, torch.float64, torch.bfloat16, torch.float16)


def _compare(got: Any, want: Any, tol: float | None) -> tuple[float, bool]:
    """Over every output: the largest relative L2 error of a floating one (inf where shapes,
    dtypes or non-floating outputs differ; 0 for outputs all zero in both) and whether all are
    `close` at rtol = atol = tol (None: not asked, True; off the CPU it would cost passes of
    its own)."""
    got_l, want_l = _as_list(got), _as_list(want)
    if len(got_l) != len(want_l):
        return math.inf, False
    worst, ok = 0.0, True
    for a, b in zip(got_l, want_l, strict=True):
        if not (isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor)):
            if a != b:
                return math.inf, False
            continue
        if a.shape != b.shape or a.dtype != b.dtype:
            return math.inf, False
        if not b.dtype.is_floating_point:
            if not torch.equal(a, b):
                return math.inf, False
            continue
        if b.numel() == 0:
            continue
        if _on_kernel(a, b):
            err, close_ = _kernel_stats(a, b, tol or 0.0, tol or 0.0)
        else:
            err, close_ = _torch_error(a, b), tol is None or _torch_close(a, b, tol, tol)
        worst, ok = max(worst, err), ok and close_
    return worst, ok


def output_error(got: Any, want: Any) -> float:
    """The largest relative L2 error over floating outputs (inf where shapes, dtypes or
    non-floating outputs differ; 0 for outputs that are all zero in both)."""
    return _compare(got, want, None)[0]


def close(a: Any, b: Any, rtol: float, atol: float) -> bool:
    """Elementwise closeness, the absolute part scaled by `b`'s largest finite magnitude; shapes,
    dtypes and non-floating values must be equal."""
    if isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor):
        if a.shape != b.shape or a.dtype != b.dtype:
            return False
        if not a.dtype.is_floating_point:
            return torch.equal(a, b)
        if b.numel() == 0:
            return True
        if _on_kernel(a, b):
            return _kernel_stats(a, b, rtol, atol)[1]
        return _torch_close(a, b, rtol, atol)
    return a == b


def all_close(got: Any, want: Any, tol: float) -> bool:
    """`close` on every output, as many outputs as eager's."""
    got_l, want_l = _as_list(got), _as_list(want)
    return len(got_l) == len(want_l) and all(
        close(a, b, tol, tol) for a, b in zip(got_l, want_l, strict=True)
    )


def _as_list(outputs: Any) -> list[Any]:
    return list(outputs) if isinstance(outputs, (tuple, list)) else [outputs]


def within(got: Any, want: Any, precision: str) -> tuple[bool, float]:
    """Whether a candidate's outputs meet the precision's stated bound, and its error: one pass
    over each output for both."""
    err, ok = _compare(got, want, TOLERANCE["f32"])
    if precision == "f32":
        return ok, err
    return err <= TOLERANCE[precision], err


# Ops evaluated once when all their inputs are constants: the weight casts autocast inserts and
# the layout ops between a weight and its cast (addmm's t(w) is cast after the transpose).
_FOLDABLE = {
    torch.ops.aten._to_copy.default,
    torch.ops.prims.convert_element_type.default,
    torch.ops.aten.t.default,
    torch.ops.aten.transpose.int,
    torch.ops.aten.permute.default,
    torch.ops.aten.view.default,
    torch.ops.aten.reshape.default,
    torch.ops.aten._unsafe_view.default,
    torch.ops.aten.unsqueeze.default,
    torch.ops.aten.expand.default,
}


def lower_precision_graph(
    gm: fx.GraphModule, inputs: Sequence[Any], precision: str
) -> fx.GraphModule:
    """`gm` traced again under `torch.autocast` at `precision` (what autocast casts: matmuls,
    convolutions, attention), its outputs cast back to their original dtypes, and the casts of
    its constant weights evaluated once, so the compiled graph holds bf16 weights instead of
    casting f32 ones on every call."""
    from torch._guards import tracing
    from torch.fx.experimental.proxy_tensor import make_fx

    dtype = _DTYPES[precision]
    tensors = itertools.chain((x for x in inputs if isinstance(x, torch.Tensor)), gm.buffers())
    device = next((t.device.type for t in tensors), "cpu")
    out_node = next(n for n in gm.graph.nodes if n.op == "output")
    out_dtypes = [getattr(a.meta.get("val"), "dtype", None) for a in out_node.args[0]]

    def run(*args: Any) -> tuple[Any, ...]:
        with torch.autocast(device, dtype=dtype):
            outs = _Autocast(gm, dtype).run(*args)
        return tuple(
            o.to(d) if isinstance(o, torch.Tensor) and d is not None and o.dtype != d else o
            for o, d in zip(outs, out_dtypes, strict=True)
        )

    # Outside the enclosing Dynamo frame's tracing context, whose fake mode make_fx would
    # reuse (and which does not take the real constant weights). A dynamic graph's inputs are
    # that frame's fakes of symbolic sizes (backends._frame_fakes), and make_fx traces in their
    # mode, so that the sizes stay symbols: that mode takes the constants while it traces.
    from torch._guards import detect_fake_mode

    mode = detect_fake_mode([x for x in inputs if isinstance(x, torch.Tensor)])
    allowed = mode.allow_non_fake_inputs if mode is not None else None
    try:
        if mode is not None:
            mode.allow_non_fake_inputs = True
        with torch.no_grad(), tracing(None):
            traced = make_fx(
                run,
                decomposition_table=_UPCAST_DECOMPOSITIONS,
                tracing_mode="fake",
                _allow_non_fake_inputs=True,
            )(*inputs)
    finally:
        if mode is not None:
            mode.allow_non_fake_inputs = allowed
    fold_constants(traced)
    casts_before_views(traced)
    return traced


_VIEWS = {torch.ops.aten.view.default, torch.ops.aten._unsafe_view.default}


def casts_before_views(gm: fx.GraphModule) -> int:
    """Moves each dtype cast of a view (of a non-constant) above the view, in place; returns how
    many it moved. Autocast casts a linear's activation where the ATen graph has it, after
    the view that flattens it for addmm; traced under autocast from the model, the cast comes
    first. Inductor folds view, addmm, view into one 3-D oneDNN linear, and then fuses the
    linear's activation into it, only in the latter order (ViT-B/16 at bf16: twelve GELUs left
    as kernels of their own)."""
    moved = 0
    for n in list(gm.graph.nodes):
        if n.op != "call_function" or n.target is not torch.ops.aten._to_copy.default:
            continue
        view = n.args[0] if len(n.args) == 1 else None
        if set(n.kwargs) != {"dtype"} or not isinstance(view, fx.Node):
            continue
        if view.op != "call_function" or view.target not in _VIEWS or len(view.users) != 1:
            continue
        src = view.args[0]
        if not isinstance(src, fx.Node) or src.op == "get_attr":
            continue  # a constant's cast is folded (fold_constants) whatever its order
        with gm.graph.inserting_before(n):
            cast = gm.graph.call_function(n.target, (src,), dict(n.kwargs))
            moved_view = gm.graph.call_function(view.target, (cast, *view.args[1:]), view.kwargs)
        val = src.meta.get("val")
        if isinstance(val, torch.Tensor):
            # In the mode of the trace's own fakes (not the enclosing Dynamo frame's).
            fake = getattr(val, "fake_mode", None)
            with fake if fake is not None else contextlib.nullcontext():
                cast.meta["val"] = val.to(n.kwargs["dtype"])
        moved_view.meta = dict(n.meta)
        n.replace_all_uses_with(moved_view)
        gm.graph.erase_node(n)
        gm.graph.erase_node(view)
        moved += 1
    if moved:
        gm.recompile()
    return moved


def _gelu_in_f32(x: torch.Tensor, approximate: str = "none") -> torch.Tensor:
    """GELU written out as PyTorch's decomposition, a bf16/f16 input computed in f32 between two
    prims.convert_element_type: the form in which Inductor fuses it into a bf16 linear's oneDNN
    call (fx_passes/mkldnn_fusion.py). Kept as aten.gelu (or cast with aten._to_copy), ViT-B/16's
    twelve GELUs ran as kernels of their own: Inductor's own kernels 8.8 ms a call against
    5.8 ms for Inductor traced under autocast."""
    gelu = torch._decomp.decomposition_table[torch.ops.aten.gelu.default]
    if x.dtype not in (torch.bfloat16, torch.float16):
        return gelu(x, approximate=approximate)
    convert = torch.ops.prims.convert_element_type.default
    return convert(gelu(convert(x, torch.float32), approximate=approximate), x.dtype)


_UPCAST_DECOMPOSITIONS = {torch.ops.aten.gelu.default: _gelu_in_f32}


# ATen ops autocast does not cast, whose composites it does: the graph holds them after
# decomposition. Attention kernels (autocast casts the composite scaled_dot_product_attention
# only): their query, key, value and float mask must share a dtype, and a key concatenated with
# an f32 cache (GPT-2's, under use_cache) arrives in f32. aten.convolution (autocast casts
# conv2d and the others, which lower to it): left in f32, ResNet-50's convolutions ran at f32
# speed under the bf16 option (Inductor's graph 42 ms against 23 ms for Inductor traced under
# autocast).
_CAST_ALL = {
    getattr(torch.ops.aten, name).default
    for name in (
        "_scaled_dot_product_flash_attention_for_cpu",
        "_scaled_dot_product_flash_attention",
        "_scaled_dot_product_efficient_attention",
        "_scaled_dot_product_cudnn_attention",
        "_scaled_dot_product_attention_math",
        "convolution",
    )
    if hasattr(torch.ops.aten, name)
}


class _Autocast(fx.Interpreter):
    """Runs the graph as autocast would, and casts the floating operands of the ATen ops in
    _CAST_ALL to the lower precision as autocast casts their composites (f64 kept, as autocast
    keeps it)."""

    def __init__(self, gm: fx.GraphModule, dtype: torch.dtype) -> None:
        super().__init__(gm)
        self.dtype = dtype

    def call_function(self, target: Any, args: Any, kwargs: Any) -> Any:
        if target in _CAST_ALL:

            def cast(x: Any) -> Any:
                if (
                    isinstance(x, torch.Tensor)
                    and x.is_floating_point()
                    and x.dtype not in (self.dtype, torch.float64)
                ):
                    return x.to(self.dtype)
                return x

            args = tuple(cast(a) for a in args)
            kwargs = {k: cast(v) for k, v in kwargs.items()}
        return super().call_function(target, args, kwargs)


def fold_constants(gm: fx.GraphModule) -> int:
    """Evaluates the _FOLDABLE ops whose inputs are all constants (get_attr), in place; returns
    how many constants it made. Attributes no longer read are dropped."""
    const: dict[fx.Node, torch.Tensor] = {}
    for n in gm.graph.nodes:
        if n.op == "get_attr":
            obj = attribute(gm, n.target)
            if isinstance(obj, torch.Tensor):
                const[n] = obj
    made = 0
    for n in list(gm.graph.nodes):
        if n.op != "call_function" or n.target not in _FOLDABLE:
            continue
        if not n.all_input_nodes or any(a not in const for a in n.all_input_nodes):
            continue
        args = fx.node.map_arg(n.args, lambda a: const[a])
        kwargs = fx.node.map_arg(n.kwargs, lambda a: const[a])
        with torch.no_grad():
            value = n.target(*args, **kwargs)
        name = next(f"_folded_{i}" for i in itertools.count() if not hasattr(gm, f"_folded_{i}"))
        # A buffer, as GraphModule keeps its tensor constants: tracers (Inductor's) lift it.
        gm.register_buffer(name, value)
        with gm.graph.inserting_before(n):
            attr = gm.graph.get_attr(name)
        attr.meta = dict(n.meta)
        n.replace_all_uses_with(attr)
        gm.graph.erase_node(n)
        const[attr] = value
        made += 1
    # Unused constants (the f32 weights now cast once) go, so the graph does not hold both.
    for n in reversed(list(gm.graph.nodes)):
        if not n.users and (n.op == "get_attr" or n.target in _FOLDABLE):
            gm.graph.erase_node(n)
    used = {str(n.target) for n in gm.graph.nodes if n.op == "get_attr"}
    names = {*vars(gm), *gm._buffers}
    for name in [k for k in names if k.startswith(("_tensor_constant", "_folded_"))]:
        if name not in used:
            delattr(gm, name)
    gm.recompile()
    return made


# Outputs from this size on are cast back outside the compiled graph (see defer_output_casts).
DEFER_CAST_MIN_BYTES = 4 << 20


def defer_output_casts(gm: fx.GraphModule, min_bytes: int = DEFER_CAST_MIN_BYTES) -> list[Any]:
    """Takes the casts back to the original dtype off the lowered graph's large outputs, in
    place: those outputs are returned in the lowered dtype, and the returned list holds, per
    output, the dtype the caller casts it to (None: as returned). The compiled graph would
    write each cast into memory fresh from torch's allocator, which past glibc's mmap
    threshold faults in on every call; the caller casts into arrays it hands out again
    (backends.OutputBuffers). GPT-2's 206 MB of f32 logits at batch 8: 77 ms cast into fresh
    memory, 7 ms into memory written before."""
    out_node = next(n for n in gm.graph.nodes if n.op == "output")
    outs = list(out_node.args[0])
    casts: list[Any] = [None] * len(outs)
    for i, o in enumerate(outs):
        if not isinstance(o, fx.Node) or o.target is not torch.ops.aten._to_copy.default:
            continue
        src, val = o.args[0], o.meta.get("val")
        if set(o.kwargs) != {"dtype"} or len(o.args) != 1 or not isinstance(src, fx.Node):
            continue
        if not isinstance(val, torch.Tensor) or val.numel() * val.element_size() < min_bytes:
            continue
        outs[i], casts[i] = src, o.kwargs["dtype"]
    if any(c is not None for c in casts):
        out_node.args = (tuple(outs),)
        gm.graph.eliminate_dead_code()
        gm.recompile()
    return casts
