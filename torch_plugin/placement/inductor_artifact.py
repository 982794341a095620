"""Inductor's whole graph, compiled with freezing, kept for a later process (issue 39).

A known graph (known_graphs.py) skips AOTAutograd and the search in a warm or second process,
but where Inductor's graph was the pick it had nothing to keep: Inductor's FX graph cache keeps
the compiled code, yet each process traced the graph through AOTAutograd again and ran the
freezing passes (constant folding, weight packing) before it could look the code up (bert-base
on the 2-core Xeon: 5-6 s of a 10.5 s second process, against 0.5-1 s for a kept OpenVINO
model). What the compiled code needs is its source and its constants, so those are kept:

- the output code (Inductor's generated module, which loads its C++ kernels from Inductor's
  cache, or builds them again where that cache was cleared);
- each constant as what makes it from the user's weights: a view of a frozen weight (most of
  them: the code reads the weights in place), MKL's packing of a weight (`_mkl_linear`'s packed
  matrix: made again from the weight in milliseconds, where its bytes are 3-1000x the weight's),
  the bytes and oneDNN descriptor of another packed weight (bf16 matmuls, convolutions), or its
  values (folded constants).

Only a graph whose compiled code takes the region's inputs in order (nothing frozen among
them), writes none of them and holds nothing but tensors is kept. The known graph's weights
digest and its guard (known_graphs.recall) say when the user's weights still are the ones the
code was compiled on.
"""

from __future__ import annotations

import ast
import ctypes
import logging
import os
from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.fx as fx

from .artifacts import MAX_BYTES, write_file

log = logging.getLogger("torch_plugin")

# The call whose packed matrix is made again from its weight rather than kept: its arguments
# are (input, packed, weight, bias, batch), the packed matrix the weight packed for that batch.
_MKL_LINEAR = "torch.ops.mkl._mkl_linear.default"


def recorder(sink: list[dict[str, Any]]) -> Callable[..., Any]:
    """compile_fx's inner_compile, recording the frozen graph, its compiled form and how many
    inputs the compiled form takes."""
    from torch._inductor.compile_fx import compile_fx_inner

    def inner_compile(gm: fx.GraphModule, example_inputs: Sequence[Any], **kwargs: Any) -> Any:
        compiled = compile_fx_inner(gm, example_inputs, **kwargs)
        sink.append({"gm": gm, "compiled": compiled, "n_inputs": len(example_inputs)})
        return compiled

    return inner_compile


def describe(
    recorded: list[dict[str, Any]], n_inputs: int, casts: Sequence[torch.dtype | None]
) -> dict[str, Any] | None:
    """What keeping the compiled graph takes (`recorded`: recorder's sink after one compile of
    a region of `n_inputs` inputs); None where it cannot be kept."""
    from torch._inductor.output_code import CompiledFxGraph, CompiledFxGraphConstantsWithGm

    if len(recorded) != 1:
        return None
    (rec,) = recorded
    compiled = rec["compiled"]
    if (
        not isinstance(compiled, CompiledFxGraph)
        or not compiled.source_code
        or rec["n_inputs"] != n_inputs
        or compiled.mutated_input_idxs
        or compiled.inputs_to_check
        or compiled.torchbind_constants
        or compiled.opaque_value_type_classes
    ):
        return None
    constants = CompiledFxGraphConstantsWithGm(rec["gm"]).unwrap(compiled)
    if not all(isinstance(t, torch.Tensor) and t.device.type == "cpu" for t in constants.values()):
        return None
    return {
        "source": compiled.source_code,
        "constants": constants,
        "casts": [None if c is None else str(c) for c in casts],
        "vec_isa": _checked_isas(),
    }


def save(
    directory: str, name: str, ir: dict[str, Any], weights: dict[int, torch.Tensor]
) -> dict[str, Any] | None:
    """Writes `ir` (describe's) as `name`.py and `name`.pt in `directory`; returns what load
    needs besides (kept in the known graph's entry), or None where it was not written (over
    half of the artifacts' MAX_BYTES, or the disk refused it). `weights`: the frozen weights by
    argument index."""
    constants: dict[str, torch.Tensor] = ir["constants"]
    recipes = _mkl_recipes(ir["source"], constants)
    views: dict[str, Any] = {}
    packed: dict[str, Any] = {}
    stored: dict[str, torch.Tensor] = {}
    for cname, t in constants.items():
        if cname in recipes:
            continue
        if t.is_mkldnn:
            stored[cname] = _mkldnn_bytes(t)
            stored[cname + ".md"] = torch.ops.mkldnn._get_mkldnn_serialized_md(t)
            packed[cname] = {"sizes": list(t.shape), "dtype": str(t.dtype)}
            continue
        view = _view_of(t, weights)
        if view is not None:
            views[cname] = view
        else:
            stored[cname] = t.detach()
    if sum(t.nbytes for t in stored.values()) > MAX_BYTES // 2:
        return None
    source = ir["source"].encode()
    if not write_file(directory, name + ".pt", lambda f: torch.save(stored, f)):
        return None
    if not write_file(directory, name + ".py", lambda f: f.write(source)):
        return None
    return {
        "views": views,
        "packed": packed,
        "recipes": recipes,
        "casts": ir["casts"],
        # Inductor's kernels are generated for the thread count they were compiled under.
        "threads": torch.get_num_threads(),
        "vec_isa": ir["vec_isa"],
    }


def load(
    directory: str, name: str, manifest: dict[str, Any], weights: dict[int, torch.Tensor]
) -> Callable[..., Any] | None:
    """The kept graph `name` bound to `weights` (the frozen weights by argument index), called
    with the region's inputs, before its outputs' casts (output_casts); None where its files
    are gone or do not fit these weights."""
    from torch._guards import tracing
    from torch._subclasses.fake_tensor import unset_fake_temporarily

    # Called inside Dynamo's compile: under its fake mode (or its tracing context, whose fake
    # mode torch.load detects) the kept constants would be read as tensors without data.
    with unset_fake_temporarily(), tracing(None):
        return _load(directory, name, manifest, weights)


def _load(
    directory: str, name: str, manifest: dict[str, Any], weights: dict[int, torch.Tensor]
) -> Callable[..., Any] | None:
    from torch._inductor.codecache import PyCodeCache

    from .. import _C

    if manifest.get("threads") != torch.get_num_threads():
        # Inductor's code is generated for a thread count (its loops' split across threads).
        log.info(
            "torch_plugin placement: Inductor's kept graph was compiled for %s threads, this "
            "process runs %d: compiling it again",
            manifest.get("threads"),
            torch.get_num_threads(),
        )
        return None
    try:
        with open(os.path.join(directory, name + ".py")) as f:
            source = f.read()
        stored = torch.load(os.path.join(directory, name + ".pt"), mmap=True, weights_only=True)
    except (OSError, RuntimeError) as e:
        log.info("torch_plugin placement: Inductor's kept graph unreadable (%s)", e)
        return None
    if not all(isinstance(t, torch.Tensor) and t.device.type == "cpu" for t in stored.values()):
        log.info("torch_plugin placement: Inductor's kept constants were read without data")
        return None
    constants: dict[str, torch.Tensor] = {}
    for cname, v in manifest["views"].items():
        w = weights.get(v["input"])
        if w is None or str(w.dtype) != v["dtype"]:
            return None
        constants[cname] = w.detach().as_strided(
            v["size"], v["stride"], w.storage_offset() + v["offset"]
        )
    for cname, p in manifest["packed"].items():
        constants[cname] = _C.mkldnn_from_bytes(
            stored[cname], p["sizes"], _dtype(p["dtype"]), stored[cname + ".md"]
        )
    for cname, t in stored.items():
        if cname not in manifest["packed"] and not cname.endswith(".md"):
            constants[cname] = t
    for cname, (weight, batch) in manifest["recipes"].items():
        constants[cname] = torch.ops.mkl._mkl_reorder_linear_weight(constants[weight], batch)
    _vouch_for_isas(manifest.get("vec_isa"))
    key, path = PyCodeCache.write(source)
    module = PyCodeCache.load_by_key_path(key, path, None, constants)
    call = module.call

    def run(*args: Any) -> Any:
        return call(list(args))

    return run


def output_casts(manifest: dict[str, Any]) -> list[torch.dtype | None]:
    """The dtype each output of the kept graph is cast to after it runs (None: as it is), as
    the compiled graph's were (backends._cast_outputs)."""
    return [None if c is None else _dtype(c) for c in manifest["casts"]]


def _checked_isas() -> list[str] | None:
    """The vector ISAs Inductor found to build and load in this process (None: not probed)."""
    from torch._inductor import cpu_vec_isa

    if not cpu_vec_isa.valid_vec_isa_list.cache_info().currsize:
        return None
    return [str(isa) for isa in cpu_vec_isa.valid_vec_isa_list()]


def _vouch_for_isas(checked: list[str] | None) -> None:
    """Inductor's code looks its kernels up under the vector ISA it picks, which it first
    probes: a test program built and loaded in a new process per ISA (1.8 s of a 5 s second
    process at bert-base on the 2-core Xeon). Where the process that compiled the kept graph
    found every ISA this CPU's flags name to work (the known graph's key holds the machine and
    torch's version), the base probe is skipped (Inductor's own `cpp.vec_isa_ok`) and the
    list computed once for the process, as the probe would; the probes of the ISAs' own extra
    features (VNNI, bf16, AMX) still run, since they choose compiler flags."""
    import platform

    from torch._inductor import config, cpu_vec_isa

    try:
        probe = cpu_vec_isa.valid_vec_isa_list
        if checked is None or probe.cache_info().currsize or config.cpp.vec_isa_ok is not None:
            return
        if platform.machine() not in ("x86_64", "AMD64"):
            return
        flags = cpu_vec_isa.x86_isa_checker()
        named = [
            str(isa)
            for isa in cpu_vec_isa.supported_vec_isa_list
            if all(flag in flags for flag in str(isa).split())
        ]
        if named != checked:
            return
        with config.patch({"cpp.vec_isa_ok": True}):
            probe()
    except Exception as e:  # noqa: BLE001 - Inductor probes as it always does
        log.info("torch_plugin placement: Inductor's ISA probe not skipped (%s)", e)


def _dtype(text: str) -> torch.dtype:
    dtype = getattr(torch, text.removeprefix("torch."), None)
    if not isinstance(dtype, torch.dtype):
        raise ValueError(f"not a dtype: {text}")
    return dtype


def _mkldnn_bytes(t: torch.Tensor) -> torch.Tensor:
    """The bytes of oneDNN's packed tensor `t` as a uint8 tensor on its memory, not a copy:
    valid while `t` lives (save's constants hold it). A copy was new memory the size of the
    packed weights: for the 1.2B Llama's bf16 graph 2.45 GB, 32 s of its 164 s cold compile on
    the 2-core Xeon, whose memory is slow the first time it is touched."""
    import numpy

    n = torch.ops.mkldnn._nbytes(t)
    raw = (ctypes.c_uint8 * n).from_address(torch.ops.mkldnn.data_ptr(t))
    return torch.from_numpy(numpy.frombuffer(raw, dtype=numpy.uint8))


def _view_of(t: torch.Tensor, weights: dict[int, torch.Tensor]) -> dict[str, Any] | None:
    """`t` as a view of one of the frozen weights (its index, and its place in that weight's
    storage relative to the weight's own), or None where it reads memory of no weight."""
    if t.layout != torch.strided or t.numel() == 0:
        return None
    ptr = t.untyped_storage().data_ptr()
    lo = t.storage_offset()
    hi = lo + sum((n - 1) * s for n, s in zip(t.shape, t.stride(), strict=True))
    for i, w in weights.items():
        if (
            w.layout != torch.strided
            or w.dtype != t.dtype
            or w.untyped_storage().data_ptr() != ptr
            or not w.is_contiguous()
        ):
            continue
        if w.storage_offset() <= lo and hi < w.storage_offset() + w.numel():
            return {
                "input": i,
                "dtype": str(t.dtype),
                "size": list(t.shape),
                "stride": list(t.stride()),
                "offset": lo - w.storage_offset(),
            }
    return None


def _mkl_recipes(source: str, constants: dict[str, torch.Tensor]) -> dict[str, list[Any]]:
    """Packed constants the output code passes to MKL's linear beside the weight they pack:
    packed name -> [weight's constant name, batch]. A packed constant seen with two weights or
    batches, or whose weight is not a plain constant, is kept as bytes instead."""
    seen: dict[str, set[tuple[str, int]]] = {}
    for line in source.splitlines():
        if _MKL_LINEAR not in line:
            continue
        try:
            tree = ast.parse(line.strip())
        except SyntaxError:
            continue
        for node in ast.walk(tree):
            if not (isinstance(node, ast.Call) and ast.unparse(node.func) == _MKL_LINEAR):
                continue
            args = node.args
            if (
                len(args) == 5
                and isinstance(args[1], ast.Name)
                and isinstance(args[2], ast.Name)
                and isinstance(args[4], ast.Constant)
                and isinstance(args[4].value, int)
            ):
                seen.setdefault(args[1].id, set()).add((args[2].id, args[4].value))
    recipes: dict[str, list[Any]] = {}
    for packed_name, uses in seen.items():
        if len(uses) != 1:
            continue
        ((weight, batch),) = uses
        p, w = constants.get(packed_name), constants.get(weight)
        if p is not None and p.is_mkldnn and w is not None and not w.is_mkldnn:
            recipes[packed_name] = [weight, batch]
    return recipes
