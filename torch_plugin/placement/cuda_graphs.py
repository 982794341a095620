"""A whole inference graph compiled by Inductor and replayed as one CUDA graph: a candidate of
the default compile's whole-graph search on a GPU (issue 40).

At batch 1 a GPU graph is host-bound: Inductor's compiled code launches each kernel from
Python (~5 us apiece), so a BERT-base forward waits on the host more than on the device. A
CUDA graph replays every launch with one call. It is a candidate, not a rule: the search times
it against Inductor's plain graph and eager, in turns, and picks the fastest; it shares
Inductor's compile of the graph (InductorBackend memoises whole graphs), so trying it costs a
capture and its timing.

What the replay keeps of the call's semantics:
- inputs are copied into buffers the graph owns (a caller's tensor may be freed or reused
  after the call); parameters passed as inputs (weights not frozen) are read in place, and a
  call whose parameter moved, or whose inputs differ in shape, dtype or device, runs the plain
  compiled graph;
- outputs are cloned out of the graph's memory pool, so an output the caller keeps is not
  overwritten by the next call (what torch.compile's mode="reduce-overhead" leaves to the
  user);
- graphs that draw random numbers are refused (a captured graph would replay one draw), as are
  graphs that write into their inputs (the replay writes into its copies), graphs with a CPU
  tensor input (its value would be captured) and graphs under autograd.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
import torch.fx as fx
from torch.utils import _pytree as pytree

from .. import fx_bridge
from .backends import Backend, BackendError, Compiled, InductorBackend

# Calls before the capture (on a side stream): Inductor's first calls autotune and allocate.
WARMUP_CALLS = 3


def capture_blocker(gm: fx.GraphModule, inputs: Sequence[Any]) -> str | None:
    """Why `gm` cannot be replayed as one CUDA graph, or None."""
    if torch.is_grad_enabled():
        return "CUDA graphs are captured for inference graphs only (autograd is on)"
    # The op registry's "random" class, as the default compile decides it: ATen's attention
    # kernels carry the nondeterministic_seeded tag for their dropout even at dropout_p=0.
    if fx_bridge.has_random_ops(fx_bridge.to_ir(gm)[0]):
        return "the graph draws random numbers; a replay would repeat one draw"
    if fx_bridge.mutates_inputs(gm):
        return "the graph writes into its inputs; a replay would write into its own copies"
    tensors = [x for x in inputs if isinstance(x, torch.Tensor)]
    if not tensors or any(x.device.type != "cuda" for x in tensors):
        return "a graph input is not a CUDA tensor (its value would be captured)"
    return None


class GraphReplay:
    """`fn` (a compiled graph) captured on `inputs` and replayed per call."""

    def __init__(self, fn: Compiled, inputs: Sequence[Any]) -> None:
        # Captured and replayed on the inputs' GPU, whichever device is current.
        self.device = next(x.device for x in inputs if isinstance(x, torch.Tensor))
        with torch.cuda.device(self.device):
            self._capture(fn, inputs)

    def _capture(self, fn: Compiled, inputs: Sequence[Any]) -> None:
        self.fn = fn
        self.n = len(inputs)
        self.copies: list[tuple[int, torch.Tensor]] = []  # (input, the graph's buffer)
        self.in_place: list[tuple[int, int]] = []  # (input, data_ptr it must keep)
        self.scalars: list[tuple[int, Any]] = []
        static: list[Any] = []
        for i, x in enumerate(inputs):
            if isinstance(x, torch.nn.Parameter):
                self.in_place.append((i, x.data_ptr()))
                static.append(x)
            elif isinstance(x, torch.Tensor):
                buf = torch.empty_strided(x.shape, x.stride(), dtype=x.dtype, device=x.device)
                buf.copy_(x)
                self.copies.append((i, buf))
                static.append(buf)
            else:
                self.scalars.append((i, x))
                static.append(x)
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(WARMUP_CALLS):
                fn(*static)
        torch.cuda.current_stream().wait_stream(side)
        self.graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(self.graph):
            out = fn(*static)
        self.outputs, self.spec = pytree.tree_flatten(out)
        self.static = static  # the buffers the graph reads stay alive with it

    def _fits(self, args: Sequence[Any]) -> bool:
        if len(args) != self.n:
            return False
        for i, buf in self.copies:
            a = args[i]
            if (
                not isinstance(a, torch.Tensor)
                or a.shape != buf.shape
                or a.dtype != buf.dtype
                or a.device != buf.device
            ):
                return False
        for i, ptr in self.in_place:
            a = args[i]
            if not isinstance(a, torch.Tensor) or a.data_ptr() != ptr:
                return False
        return all(args[i] == v for i, v in self.scalars)

    def __call__(self, *args: Any) -> Any:
        if not self._fits(args):
            return self.fn(*args)
        for i, buf in self.copies:
            buf.copy_(args[i])
        if torch.cuda.current_device() != self.device.index:
            with torch.cuda.device(self.device):
                self.graph.replay()
        else:
            self.graph.replay()
        return pytree.tree_unflatten(
            [t.clone() if isinstance(t, torch.Tensor) else t for t in self.outputs], self.spec
        )


class CudaGraphBackend(Backend):
    """Inductor's whole graph, replayed as one CUDA graph (see the module docstring)."""

    name = "inductor_cudagraphs"
    rule_set = "inductor"
    graph_level = True
    rtol = atol = 1e-3
    devices = ("cuda",)
    # Its compile is Inductor's, already paid by the "inductor" candidate: the search tries it
    # right after that one and never skips it for the budget (WholeGraphSearchOptions::
    # compiles_with), and its seconds are no compile rate of its own (record_compile_rates).
    compiles_with = "inductor"
    compile_s_per_node = 0.0

    def __init__(self, inner: InductorBackend) -> None:
        self.inner = inner
        self.compute = inner.compute

    def unavailable(self) -> str | None:
        return None if torch.cuda.is_available() else "no CUDA device"

    def version(self) -> str:
        return self.inner.version()

    def compile(self, gm: fx.GraphModule, inputs: Sequence[torch.Tensor], rule: str) -> Compiled:
        if rule != "graph":
            raise BackendError("CUDA graphs are captured for whole graphs only")
        reason = capture_blocker(gm, inputs)
        if reason is not None:
            raise BackendError(reason)
        fn = self.inner.compile(gm, inputs, rule)
        try:
            return GraphReplay(fn, inputs)
        except Exception as e:  # noqa: BLE001 - a graph that cannot be captured stays plain
            raise BackendError(f"CUDA graph capture failed: {type(e).__name__}: {e}") from e
