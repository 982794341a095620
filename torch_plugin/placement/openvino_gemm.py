"""OpenVINO's f32 GEMM kernel for each weight shape of a graph, chosen by measurement (issue 39).

OpenVINO's CPU plugin runs an f32 FullyConnected on MLAS's sgemm when nothing is fused after
it, and on oneDNN's (a 1x1 brgconv or an inner product) when an activation is. Neither wins
everywhere. On this 2-core avx512 host, oneDNN ran bert-base's 3072->768 projection at 1024 rows
in 22.5 ms against MLAS's 25.2 ms, and MLAS was as fast or faster on its 768->768 and 768->3072
ones. Timed in turns in one process, ov.convert_model's own bert-base graph ran 828 ms against
859 ms at batch 8, and 115 ms against 120 ms at batch 1, with its 3072->768 projections moved to
oneDNN.

So each distinct (rows, in, out) shape of a graph's matmuls on constant weights is timed both
ways on a one-layer model, and where oneDNN wins by more than MARGIN, the graph gets an identity
activation after that matmul: a clamp to [-inf, inf], which OpenVINO fuses into the
FullyConnected and so runs on oneDNN. A matmul whose result goes to an activation OpenVINO fuses
(GELU, ReLU, ...) is on oneDNN already and is left alone. The choices are kept in the profile
cache per shape, thread count, OpenVINO version and machine, so a warm compile or a second
process measures nothing.

One difference from eager: OpenVINO's clamp turns a NaN into -inf. So a NaN coming out of a
steered matmul (from a NaN or an infinity in its input) leaves it as -inf.
"""

from __future__ import annotations

import logging
import math
import statistics
import time
from collections.abc import Callable
from typing import Any

import torch
import torch.fx as fx

from .cache import ProfileCache, machine_key

log = logging.getLogger("torch_plugin")

aten = torch.ops.aten

# oneDNN must be this much faster than MLAS to be picked: closer timings are noise.
MARGIN = 0.03
# Smaller matmuls (multiply-adds) are left as OpenVINO picks: they take under 0.2 ms here, and
# timing their shape would cost more than any kernel could save.
MIN_MACS = 1 << 24
# Nor are matmuls on more weights (elements) than this: a one-layer model of a 1.2B Llama's
# 128256-word head would hold gigabytes for a kernel choice that OpenVINO makes by size anyway
# (it runs weights of 16 MB and more on oneDNN's inner product, not its 1x1 convolution).
MAX_WEIGHTS = 1 << 25
# Bump when what a cached choice means changes.
CHOICE_VERSION = "openvino-gemm-v1"

# (rows, in, out) -> seconds of one call as OpenVINO picks (MLAS) and with the clamp (oneDNN).
Timer = Callable[[int, int, int], tuple[float, float]]


def gemm_shapes(gm: fx.GraphModule) -> dict[fx.Node, tuple[int, int, int]]:
    """Each matmul with a constant 2-D weight in `gm` (addmm, mm or linear, f32) and its (rows,
    in, out). A constant weight is a graph attribute (frozen), what OpenVINO makes a
    FullyConnected of; a weight fed as an input stays a MatMul and has no MLAS path."""
    out = {}
    for n in gm.graph.nodes:
        if n.op != "call_function":
            continue
        if n.target is aten.addmm.default and not n.kwargs:
            x, w = n.args[1], _transposed_weight(n.args[2])
        elif n.target is aten.mm.default:
            x, w = n.args[0], _transposed_weight(n.args[1])
        elif n.target is aten.linear.default:
            x, w = n.args[0], n.args[1] if _is_constant(n.args[1]) else None
        else:
            continue
        val, xv = n.meta.get("val"), x.meta.get("val") if isinstance(x, fx.Node) else None
        if w is None or not isinstance(val, torch.Tensor) or not isinstance(xv, torch.Tensor):
            continue
        wv = getattr(gm, str(w.target), None) if isinstance(w.target, str) else None
        if val.dtype != torch.float32 or xv.dim() < 2 or getattr(wv, "ndim", 2) != 2:
            continue
        if _feeds_fused_activation(n) or not _static(xv, val):
            continue
        k, m = int(xv.shape[-1]), int(xv.numel()) // max(int(xv.shape[-1]), 1)
        out[n] = (m, k, int(val.shape[-1]))
    return out


# Activations OpenVINO fuses into a FullyConnected (which puts it on oneDNN already).
_ACTIVATIONS = {
    aten.gelu.default,
    aten.relu.default,
    aten.silu.default,
    aten.sigmoid.default,
    aten.tanh.default,
    aten.hardswish.default,
    aten.hardtanh.default,
    aten.elu.default,
    aten.clamp.default,
}
_VIEWS = {aten.view.default, aten._unsafe_view.default, aten.reshape.default}


def _feeds_fused_activation(n: fx.Node) -> bool:
    """Whether `n`'s result (through reshapes) goes to one activation and nothing else."""
    while len(n.users) == 1:
        (n,) = n.users
        if n.target in _ACTIVATIONS:
            return True
        if n.target not in _VIEWS:
            return False
    return False


def _static(*values: torch.Tensor) -> bool:
    return all(isinstance(d, int) for v in values for d in v.shape)


def _is_constant(a: Any) -> bool:
    return isinstance(a, fx.Node) and a.op == "get_attr"


def _transposed_weight(a: Any) -> fx.Node | None:
    """The constant weight of an addmm/mm's right operand t(W) (aten's linear), or None."""
    if isinstance(a, fx.Node) and a.target in (aten.t.default, aten.permute.default):
        if a.target is aten.permute.default and list(a.args[1]) != [1, 0]:
            return None
        return a.args[0] if _is_constant(a.args[0]) else None
    return None


def worth_timing(shape: tuple[int, int, int]) -> bool:
    """Whether a (rows, in, out) matmul is within MIN_MACS and MAX_WEIGHTS."""
    _, k, n = shape
    return math.prod(shape) >= MIN_MACS and k * n <= MAX_WEIGHTS


def steer(
    gm: fx.GraphModule, prefers_onednn: Callable[[int, int, int], bool], recompile: bool = True
) -> int:
    """Puts the identity clamp after each matmul of `gm` whose shape `prefers_onednn`; returns
    how many (the graph is changed in place, and recompiled where any unless told not to)."""
    steered = 0
    for node, shape in gemm_shapes(gm).items():
        if not prefers_onednn(*shape):
            continue
        with gm.graph.inserting_after(node):
            clamp = gm.graph.call_function(aten.clamp.default, (node, float("-inf"), float("inf")))
        node.replace_all_uses_with(clamp, delete_user_cb=lambda u, c=clamp: u is not c)
        # The converter reads each node's type and shape off these.
        clamp.meta.update({k: node.meta[k] for k in ("val", "tensor_meta") if k in node.meta})
        steered += 1
    if steered and recompile:
        gm.recompile()
    return steered


class GemmChooser:
    """Whether oneDNN runs a (rows, in, out) f32 FullyConnected faster than MLAS here: measured
    once per shape and machine (`timer`, by default a one-layer OpenVINO model), kept in the
    profile cache at `cache_path` (None: the default cache; ":memory:": this process only)."""

    def __init__(
        self, cache_path: str | None, threads: int | None = None, timer: Timer | None = None
    ) -> None:
        self.cache_path = cache_path
        self._threads = threads  # None: torch's at each call, as OpenVINO is compiled with
        self.timer = timer or (lambda m, k, n: time_fully_connected(m, k, n, self.threads))
        self.choices: dict[tuple[tuple[int, int, int], int], bool] = {}

    @property
    def threads(self) -> int:
        return self._threads or torch.get_num_threads()

    def __call__(self, m: int, k: int, n: int) -> bool:
        import openvino

        memo = ((m, k, n), self.threads)
        if memo in self.choices:
            return self.choices[memo]
        machine = machine_key("cpu", {"openvino": openvino.__version__})
        key = ProfileCache.key(CHOICE_VERSION, repr(memo), machine)
        cache = ProfileCache(self.cache_path)
        try:
            cached = cache.get_decision(key)
            if isinstance(cached, dict) and "onednn" in cached:
                self.choices[memo] = bool(cached["onednn"])
                return self.choices[memo]
            mlas, onednn = self.timer(m, k, n)
            choice = onednn < (1.0 - MARGIN) * mlas
            cache.put_decision(key, {"onednn": choice, "mlas_s": mlas, "onednn_s": onednn})
        finally:
            cache.close()
        if choice:
            log.info(
                "torch_plugin placement: OpenVINO's %dx%d->%d matmul on oneDNN (%.2f ms "
                "against MLAS's %.2f ms)",
                m,
                k,
                n,
                onednn * 1e3,
                mlas * 1e3,
            )
        self.choices[memo] = choice
        return choice


def time_fully_connected(m: int, k: int, n: int, threads: int) -> tuple[float, float]:
    """Seconds of one call of an [m, k] x [n, k]^T + bias FullyConnected in OpenVINO (f32,
    latency hint, `threads`) as it is and with the identity clamp after it: both compiled once,
    then timed in turns (three blocks each of at least 30 ms or two calls), medians."""
    import numpy
    import openvino as ov
    import openvino.opset13 as ops

    rng = numpy.random.default_rng(0)
    w = (rng.random((n, k), dtype=numpy.float32) - 0.5) * 0.04
    b = (rng.random(n, dtype=numpy.float32) - 0.5) * 0.04
    config = {
        "INFERENCE_PRECISION_HINT": "f32",
        "PERFORMANCE_HINT": "LATENCY",
        "INFERENCE_NUM_THREADS": threads,
    }
    a = rng.random((m, k), dtype=numpy.float32) - 0.5
    requests = []
    for fused in (False, True):
        x = ops.parameter([m, k], numpy.float32)
        y = ops.add(ops.matmul(x, ops.constant(w), False, True), ops.constant(b))
        if fused:
            y = ops.clamp(y, float("-inf"), float("inf"))
        request = ov.Core().compile_model(ov.Model([y], [x]), "CPU", config).create_infer_request()
        request.infer([a], share_inputs=True)  # the first call finishes the compile
        requests.append(request)
    samples: list[list[float]] = [[], []]
    for _ in range(3):
        for request, times in zip(requests, samples, strict=True):
            end, block = time.perf_counter() + 0.03, []
            while time.perf_counter() < end or len(block) < 2:
                t0 = time.perf_counter()
                request.infer([a], share_inputs=True)
                block.append(time.perf_counter() - t0)
            times.append(min(block))
    return statistics.median(samples[0]), statistics.median(samples[1])
