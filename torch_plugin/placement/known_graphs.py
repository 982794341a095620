"""Inference graphs recognised before AOTAutograd: a warm or second process's compile (issue 39).

A warm compile replays the cached decision, but AOTAutograd still traces Dynamo's graph to ATen
first (bert-base: 0.85 s of a 4-5 s compile in a second process) and OpenVINO converts that ATen
graph again (0.28 s); Inductor's pick ran its freezing passes again before its FX graph cache
could serve it (5-6 s). Where the default compile ran an inference graph as one OpenVINO, ONNX
Runtime or Inductor model with its weights frozen in, and AOTAutograd's calling convention is
the plain one (each Dynamo input one ATen placeholder, none written, no output aliasing an input
or another output), the model is kept beside the profile cache (OpenVINO's IR, its weights
memory-mapped when read back; ONNX Runtime's export is kept there already; Inductor's output
code and constants, inductor_artifact.py) under a key of Dynamo's graph: its
code, its inputs' layouts and kinds, the options, the autocast state and the library versions.
The frozen weights' digest is stored with it and compared on recall. A hit compiles the kept
model and calls it with the user's tensors; a call whose weights changed since (in place or
replaced) compiles the usual way from then on. Anything else (another graph, other weights, a
call that needs gradients) takes the usual path.
"""

from __future__ import annotations

import functools
import hashlib
import importlib.metadata
import logging
import os
import shutil
import tempfile
import time
from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.fx as fx

from .. import _C
from .artifacts import MAX_BYTES, _trim, artifact_dir
from .cache import ProfileCache, machine_key

log = logging.getLogger("torch_plugin")

# Bump when what an entry means changes.
VERSION = "known-graph-v1"


def structure_key(
    gm: fx.GraphModule,
    example_inputs: Sequence[Any],
    kinds: Sequence[tuple[str, str]],
    options: Any,
) -> str | None:
    """Dynamo's graph, its inputs and the options as a key; None where no entry may serve it:
    an input that is not a plain CPU tensor (a size, a fake, one made under inference_mode,
    whose version the weights guard cannot read), a graph holding tensors of its own (they
    would be ATen inputs ahead of the user's) or modules (their attributes are not in its
    code), symbolic sizes, or a call that needs gradients."""
    from torch._subclasses.fake_tensor import FakeTensor

    for x in example_inputs:
        if (
            not isinstance(x, torch.Tensor)
            or isinstance(x, FakeTensor)
            or x.device.type != "cpu"
            or x.is_inference()
        ):
            return None
    if torch.is_grad_enabled() and any(x.requires_grad for x in example_inputs):
        return None
    if any(True for _ in gm.parameters()) or any(True for _ in gm.buffers()):
        return None
    for n in gm.graph.nodes:
        if n.op in ("get_attr", "call_module"):
            return None
        val = n.meta.get("example_value") if n.op == "placeholder" else None
        if isinstance(val, torch.Tensor) and any(
            isinstance(d, torch.SymInt) for d in (*val.shape, *val.stride())
        ):
            return None
    h = hashlib.sha256()
    h.update(VERSION.encode())
    h.update(_own_code())
    h.update(gm.code.encode())
    for x, kind in zip(example_inputs, kinds, strict=True):
        h.update(repr((tuple(x.shape), x.stride(), str(x.dtype), x.requires_grad, kind)).encode())
    h.update(repr(options).encode())
    autocast = torch.is_autocast_enabled("cpu"), torch.get_autocast_dtype("cpu")
    # The float32 matmul precision decides whether Inductor's linears run as three bf16
    # products (bf16x3.py): a graph kept under "high" must not serve a call under "highest".
    state = (autocast, torch.is_grad_enabled(), torch.get_default_dtype())
    h.update(repr((*state, torch.get_float32_matmul_precision())).encode())
    return h.hexdigest()


@functools.cache
def _own_code() -> bytes:
    """A digest of torch_plugin's own code (its Python sources, its extension's build): what
    makes the ATen graph and the model from Dynamo's graph, which an entry's key is. Each
    upgrade, and each rebuild, starts afresh."""
    import torch_plugin

    h = hashlib.sha256()
    root = os.path.dirname(torch_plugin.__file__)
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames.sort()
        for name in sorted(filenames):
            if name.endswith(".py"):
                with open(os.path.join(dirpath, name), "rb") as f:
                    h.update(name.encode() + f.read())
    st = os.stat(_C.__file__)
    h.update(repr((st.st_size, st.st_mtime_ns)).encode())
    return h.digest()


def frozen_indices(kinds: Sequence[tuple[str, str]]) -> list[int]:
    """The inputs frozen into an inference graph (backend.FrozenWeightsGuard's)."""
    return [i for i, (k, _) in enumerate(kinds) if k in ("parameter", "buffer")]


def weights_digest(example_inputs: Sequence[Any], frozen: Sequence[int]) -> str:
    from .whole_graph import _weights_digest

    tensors = {f"{i:06d}": example_inputs[i] for i in frozen}
    return _weights_digest(fx.GraphModule({}, fx.Graph()), tensors)


def _entry_key(key: str) -> str:
    versions = {m: _version(m) for m in ("openvino", "onnxruntime", "onnxscript")}
    return ProfileCache.key(
        VERSION, key, machine_key("cpu", {"torch": torch.__version__, **versions})
    )


def _version(dist: str) -> str:
    """An installed package's version, read off its metadata: importing onnxscript for it cost
    a second process's compile about a second."""
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return "absent"


def simple_convention() -> bool:
    """Whether AOTAutograd's inference graph being compiled calls as Dynamo's does: no input
    written, every output a fresh tensor, no extra inputs (tokens, subclasses, rng states)."""
    from torch._functorch._aot_autograd.schemas import OutputType, PlainTensorMeta
    from torch._guards import TracingContext

    ctx = TracingContext.try_get()
    meta = getattr(ctx, "fw_metadata", None)
    if meta is None:
        return False
    return (
        not any(i.mutates_data or i.mutates_metadata for i in meta.input_info)
        and all(o.output_type == OutputType.non_alias for o in meta.output_info)
        and meta.num_intermediate_bases == 0
        and not meta.tokens
        and meta.num_graphsafe_rng_states == 0
        # A graph that sets the grad mode (torch.set_grad_enabled called as a function):
        # AOTAutograd's wrapper sets it again after each call.
        and meta.grad_enabled_mutation is None
        and all(isinstance(m, PlainTensorMeta) for m in meta.subclass_inp_meta)
    )


def release(placed: fx.GraphModule) -> list[dict[str, Any]]:
    """What the placed graph's whole-graph groups hold for remember() (OpenVINO's model, ONNX
    Runtime's artifact key, Inductor's output code and constants), taken off them: OpenVINO's
    model shares the frozen weights' memory, and kept with its callable it would keep weights
    the user has since replaced alive."""
    from .materialize import _GroupCall

    taken = []
    for mod in placed.modules():
        if isinstance(mod, _GroupCall) and hasattr(mod.fn, "ir"):
            taken.append({**mod.fn.ir, "backend": mod.backend})
            del mod.fn.ir
    return taken


def remember(
    key: str,
    placed: fx.GraphModule,
    models: list[dict[str, Any]],
    example_inputs: Sequence[Any],
    kinds: Sequence[tuple[str, str]],
    cache_path: str | None,
    summary: str,
) -> bool:
    """Keeps the placed graph's model (`models`, from release) under `key` where it is the
    whole graph, its weights frozen in, its arguments user inputs only; False where it is not
    (nothing kept)."""
    from .materialize import _GroupCall, single_group_call

    found = single_group_call(
        placed,
        lambda n: n.op == "call_module" and type(placed.get_submodule(str(n.target))) is _GroupCall,
    )
    directory = artifact_dir(cache_path)
    if found is None or len(models) != 1 or directory is None:
        return False
    call, index, order = found
    group = placed.get_submodule(str(call.target))
    frozen = frozen_indices(kinds)
    (model,) = models
    if group.backend != model["backend"] or set(index) & set(frozen):
        return False
    n_placeholders = sum(1 for n in placed.graph.nodes if n.op == "placeholder")
    if n_placeholders != len(example_inputs):
        return False
    entry = {
        "backend": group.backend,
        "index": index,
        "order": order,
        "frozen": frozen,
        "summary": summary,
    }
    entry["digest"] = weights_digest(example_inputs, frozen)
    if group.backend == "openvino":
        # Named by the weights too: the files of one graph on other weights are other files,
        # so no entry is ever read beside another's weights (two processes, a failed write).
        entry["artifact"] = f"{key[:32]}-{entry['digest'][:32]}"
        weights = sum(example_inputs[i].nbytes for i in frozen)
        if weights > MAX_BYTES // 2 or not _save_ir(model["model"], directory, entry["artifact"]):
            return False
        entry["compute"] = model["compute"]
    elif group.backend == "inductor":  # its output code and constants (inductor_artifact.py)
        from . import inductor_artifact

        entry["artifact"] = f"{key[:32]}-{entry['digest'][:32]}"
        weights = {i: example_inputs[i] for i in frozen}
        manifest = inductor_artifact.save(directory, entry["artifact"], model["inductor"], weights)
        if manifest is None:
            return False
        _touch(directory, entry["artifact"], INDUCTOR_SUFFIXES)
        _trim(directory)
        entry["inductor"] = manifest
    else:  # ONNX Runtime's export, kept already (named by its weights' bytes)
        entry["artifact"], entry["names"] = model["artifact"], model["names"]
    cache = ProfileCache(cache_path)
    try:
        cache.put_decision(_entry_key(key), entry)
    finally:
        cache.close()
    return True


def _save_ir(model: Any, directory: str, name: str) -> bool:
    import openvino as ov

    tmp = None
    try:
        os.makedirs(directory, exist_ok=True)
        tmp = tempfile.mkdtemp(dir=directory, suffix=".part")
        ov.save_model(model, os.path.join(tmp, "m.xml"), compress_to_fp16=False)
        # The weights first: an .xml is only ever read beside its whole .bin.
        os.replace(os.path.join(tmp, "m.bin"), os.path.join(directory, name + ".bin"))
        os.replace(os.path.join(tmp, "m.xml"), os.path.join(directory, name + ".xml"))
        _touch(directory, name)
        _trim(directory)
    except Exception as e:  # noqa: BLE001 - the model is only a shortcut
        log.info("torch_plugin placement: could not keep a model in %s (%s)", directory, e)
        return False
    finally:
        if tmp is not None:
            shutil.rmtree(tmp, ignore_errors=True)
    return True


# The files of a kept model: OpenVINO's IR, Inductor's output code and constants.
OPENVINO_SUFFIXES = (".xml", ".bin")
INDUCTOR_SUFFIXES = (".py", ".pt")


def _touch(directory: str, name: str, suffixes: Sequence[str] = OPENVINO_SUFFIXES) -> None:
    """The files of a kept model used now, at one time: the least recently used go first
    (_trim), and a pair goes together."""
    now = time.time()
    for suffix in suffixes:
        os.utime(os.path.join(directory, name + suffix), (now, now))


def recall(
    key: str,
    example_inputs: Sequence[Any],
    kinds: Sequence[tuple[str, str]],
    cache_path: str | None,
    usual: Callable[[list[Any]], Any],
) -> Callable[..., Any] | None:
    """The graph of `key` from its saved model, called with Dynamo's arguments; None where
    there is none for these weights (or it cannot be read). `usual(args)`: the usual compile,
    which runs from the first call whose weights changed since."""
    t0 = time.perf_counter()
    directory = artifact_dir(cache_path)
    if directory is None:
        return None
    try:
        cache = ProfileCache(cache_path)
        try:
            entry = cache.get_decision(_entry_key(key))
        finally:
            cache.close()
    except Exception as e:  # noqa: BLE001 - an unreadable cache is a cache miss
        log.info("torch_plugin placement: known graph unreadable (%s)", e)
        return None
    frozen = frozen_indices(kinds)
    if not isinstance(entry, dict) or entry.get("frozen") != frozen:
        return None
    if entry["digest"] != weights_digest(example_inputs, frozen):
        return None
    fn = _runner(entry, directory, cache_path, {i: example_inputs[i] for i in frozen})
    if fn is None:
        return None
    index, order = entry["index"], entry["order"]
    guard = _C.FrozenArguments(list(example_inputs), frozen)
    state: dict[str, Any] = {"fn": fn}

    def run(*args: Any) -> Any:
        if "usual" in state:
            return state["usual"](*args)
        if guard.first_changed(list(args)) >= 0:
            log.info(
                "torch_plugin: a weight of a known inference graph was replaced or changed in "
                "place; compiling it the usual way"
            )
            # The kept model goes: it may hold the replaced weights (Inductor's reads them).
            del state["fn"]
            state["usual"] = usual(list(args))
            return state["usual"](*args)
        res = state["fn"](*[args[i] for i in index])
        return tuple([res[k] for k in order])

    run.backend = entry["backend"]  # type: ignore[attr-defined]
    run.search_s = time.perf_counter() - t0  # type: ignore[attr-defined]
    run.summary = entry["summary"]  # type: ignore[attr-defined]
    return run


def _runner(
    entry: dict[str, Any],
    directory: str,
    cache_path: str | None,
    weights: dict[int, torch.Tensor],
) -> Any:
    """The entry's compiled model as its backend calls it; None where it cannot be read.
    `weights`: the frozen weights by argument index (Inductor's code reads them in place)."""
    from . import artifacts
    from .backends import _cast_outputs, get_backends

    try:
        name = entry["backend"]
        if name == "inductor":
            from . import inductor_artifact

            fn = inductor_artifact.load(directory, entry["artifact"], entry["inductor"], weights)
            if fn is None:
                return None
            _touch(directory, entry["artifact"], INDUCTOR_SUFFIXES)
            casts = inductor_artifact.output_casts(entry["inductor"])
            return _cast_outputs(fn, casts) if any(c is not None for c in casts) else fn
        (backend,) = [
            b
            for b in get_backends([name], entry.get("compute", "f32"), cache_path)
            if b.name == name
        ]
        if name == "openvino":
            import openvino as ov

            xml = os.path.join(directory, entry["artifact"] + ".xml")
            if not os.path.exists(xml):
                return None
            _touch(directory, entry["artifact"])
            return backend.runner(ov.Core().read_model(xml))
        model = artifacts.load(directory, entry["artifact"], ".onnx")
        return None if model is None else backend.runner(model, "graph", entry["names"])
    except Exception as e:  # noqa: BLE001 - the usual compile instead
        log.info("torch_plugin placement: known graph's kept model unusable (%s)", e)
        return None
