"""f32 linear layers as three bf16 products, where the user allows it: PyTorch's "high" float32
matmul precision (`torch.set_float32_matmul_precision("high")`), documented as "treat each
float32 number as the sum of two bfloat16 numbers".

On CPU, PyTorch maps "high" to oneDNN's TF32 mode, which a CPU without TF32 runs as plain f32.
On a CPU with AMX-bf16 a bf16 GEMM runs ~5x an f32 one, so three (hi*hi + hi*lo + lo*hi, summed
in f32; kernels/cpu/linear_bf16x3.cc) run 1.2-1.4x MKL's packed f32 GEMM (what Inductor with
freezing calls) at 512 rows or more on the 2-core Xeon, with a relative error of 3e-6 against
f32's 3e-7: well within the f32 bound every candidate is checked against
(precision.TOLERANCE). Inductor's graph takes them (compute "f32x3"); the other compilers keep
f32, and the search picks what runs fastest.
"""

from __future__ import annotations

import functools
import itertools
from typing import Any

import torch
import torch.fx as fx

from ..fx_bridge import attribute

COMPUTE = "f32x3"
# Linears of fewer rows are left to f32. Inductor with freezing runs f32 linears on MKL's
# prepacked sgemm, and a GEMM of few rows is bound by reading its weight, of which the two bf16
# GEMMs read 1.5x the f32 bytes: bert-base's 72 linears, each weight read from memory as in the
# model, ran at 0.95x the packed f32 at 128 rows, 0.96x at 256, 1.29x at 512 and 1.30x at 1024
# (benchmarks/bf16x3_linear.py).
MIN_ROWS = 512
# Nor a GEMM of a few million multiply-adds (a classifier head): nothing to gain from AMX.
MIN_FLOPS = 1 << 22

_aten = torch.ops.aten
_TRANSPOSES = {_aten.t.default, _aten.transpose.int, _aten.permute.default}


@functools.cache
def _kernel_available() -> bool:
    try:
        return bool(torch.ops.torch_plugin.linear_bf16x3_available())
    except (AttributeError, RuntimeError):
        return False


def _amx() -> bool:
    check = getattr(torch.cpu, "_is_amx_tile_supported", None)
    return bool(check()) if check is not None else False


def applies(device: str) -> str | None:
    """Why f32 linears stay f32 on `device` (a device_key), or None when they may run as three
    bf16 products: the user's float32 matmul precision is "high", the device a CPU with AMX,
    and torch's MKL exports its bf16 GEMM."""
    if torch.get_float32_matmul_precision() != "high":
        return "float32 matmul precision is not 'high'"
    if device != "cpu":
        return f"not on the CPU ({device})"
    if not _amx():
        return "the CPU has no AMX tiles (three bf16 GEMMs would not beat one f32 GEMM)"
    if not _kernel_available():
        return "this torch build does not export MKL's bf16 GEMM (cblas_gemm_bf16bf16f32)"
    return None


def worth(rows: int, weight_numel: int) -> bool:
    """Whether a linear of `rows` rows on a weight of `weight_numel` f32 elements is taken:
    MIN_ROWS rows or more, MIN_FLOPS or more."""
    return rows >= MIN_ROWS and 2 * rows * weight_numel >= MIN_FLOPS


def _constant(gm: fx.GraphModule, n: Any) -> torch.Tensor | None:
    if not isinstance(n, fx.Node) or n.op != "get_attr":
        return None
    obj = attribute(gm, n.target)
    return obj if isinstance(obj, torch.Tensor) else None


def _weight(gm: fx.GraphModule, mat2: Any) -> tuple[torch.Tensor, bool] | None:
    """The frozen 2-D f32 constant that `mat2` (the matmul's right operand, [K, N]) reads, and
    whether it is stored [K, N] (GPT-2's Conv1D; else [N, K], read through a transpose)."""
    if not isinstance(mat2, fx.Node):
        return None
    stored = _constant(gm, mat2)
    if stored is None and mat2.op == "call_function" and mat2.target in _TRANSPOSES:
        w = _constant(gm, mat2.args[0])
        if w is None or w.dim() != 2 or w.dtype != torch.float32:
            return None
        if mat2.target is _aten.permute.default:
            swaps = [d % 2 for d in mat2.args[1]] == [1, 0]
        elif mat2.target is _aten.transpose.int:
            swaps = mat2.args[1] % 2 != mat2.args[2] % 2  # transpose(w, 0, 0) is w itself
        else:
            swaps = True  # aten.t
        return (w, False) if swaps else None
    if stored is None or stored.dim() != 2 or stored.dtype != torch.float32:
        return None
    return stored, True


def _is_f32_2d(n: Any) -> bool:
    val = n.meta.get("val") if isinstance(n, fx.Node) else None
    return isinstance(val, torch.Tensor) and val.dim() == 2 and val.dtype == torch.float32


def with_bf16x3_linears(gm: fx.GraphModule) -> tuple[fx.GraphModule, int]:
    """A copy of `gm` (sharing its constants) whose f32 linears on frozen weights, addmm(bias,
    x, w.t()) and mm(x, w.t()), call torch_plugin.linear_bf16x3 on the weight split once; and
    how many it rewrote. `gm` itself is unchanged: the other compilers take it."""
    out = fx.GraphModule(gm, gm.graph.__deepcopy__(), class_name=type(gm).__name__)
    split: dict[tuple[int, bool], str] = {}  # a weight (and its layout) -> its split's buffer
    replaced: list[Any] = []  # the right operands replaced, dropped where no longer read
    rewritten = 0
    for n in list(out.graph.nodes):
        if n.op != "call_function" or n.kwargs:
            continue
        if n.target is _aten.addmm.default and len(n.args) == 3:
            bias_node, x, mat2 = n.args
            bias = _constant(out, bias_node)
            if bias is None or bias.dim() != 1 or bias.dtype != torch.float32:
                continue
        elif n.target is _aten.mm.default and len(n.args) == 2:
            bias_node, (x, mat2) = None, n.args
        else:
            continue
        found = _weight(out, mat2)
        if found is None or not _is_f32_2d(x) or not _is_f32_2d(n):
            continue
        stored, as_k_n = found
        rows = x.meta["val"].shape[0]
        if isinstance(rows, int) and not worth(rows, stored.numel()):
            continue
        # Keyed by the module's own constant (alive as long as `out`), not a transient view.
        key = (id(stored), as_k_n)
        if key not in split:
            free = (i for i in itertools.count() if not hasattr(out, f"_bf16x3_{i}"))
            name = f"_bf16x3_{next(free)}"
            weight = stored.t() if as_k_n else stored
            with torch.no_grad():
                out.register_buffer(name, torch.ops.torch_plugin.split_bf16x3_weight(weight))
            split[key] = name
        with out.graph.inserting_before(n):
            w3 = out.graph.get_attr(split[key])
            call = out.graph.call_function(
                torch.ops.torch_plugin.linear_bf16x3.default, (x, w3, bias_node)
            )
        val = getattr(out, split[key])
        fake = getattr(n.meta["val"], "fake_mode", None)
        if fake is not None:
            w3.meta["val"] = fake.from_tensor(val, static_shapes=True)
        call.meta = dict(n.meta)
        n.replace_all_uses_with(call)
        out.graph.erase_node(n)
        replaced.append(mat2)
        rewritten += 1
    erased: set[Any] = set()
    for m in dict.fromkeys(replaced):  # a transpose of a weight, then the weight
        for node in [m, *m.all_input_nodes]:
            if node not in erased and not node.users and node.op != "placeholder":
                erased.add(node)
                out.graph.erase_node(node)
    if rewritten:
        out.recompile()
    return out, rewritten
