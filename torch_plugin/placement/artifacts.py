"""Compiled whole-graph artifacts kept beside the profile cache, so a warm compile skips the slow
step of rebuilding its pick (issue 39).

The profile cache keeps the decision; rebuilding the pick is what a warm compile then costs.
Inductor has its own FX graph cache and OpenVINO converts in under a second, but the ONNX export
that ONNX Runtime needs took 3-12 s per graph at real sizes (torch.export, decompositions,
onnxscript's optimiser), most of a warm compile (GPT-2: 14 s of 14.3 s). The serialised ONNX
model is kept instead, under a key of everything it was built from: the subgraph's code, its
inputs' shapes, strides and dtypes, the frozen weights' bytes (SHA-256, about 2 GB/s here: the
optimiser folds weights into new initialisers, so the weights are part of the artifact), the
opset and the library versions. At most `MAX_BYTES` are kept; the least recently used go first.
"""

from __future__ import annotations

import hashlib
import logging
import os
import tempfile
from collections.abc import Callable, Sequence
from typing import Any, BinaryIO

import torch
import torch.fx as fx

log = logging.getLogger("torch_plugin")

MAX_BYTES = 8 << 30


def artifact_dir(cache_path: str | None) -> str | None:
    """The directory beside the profile cache; None where nothing is kept (":memory:")."""
    from .cache import default_path

    path = cache_path or default_path()
    if path == ":memory:":
        return None
    return os.path.splitext(os.path.abspath(path))[0] + ".artifacts"


def graph_key(gm: fx.GraphModule, inputs: Sequence[Any], versions: Sequence[str]) -> str:
    """What a compiled whole graph depends on: code, input layouts, constants' bytes."""
    h = hashlib.sha256()
    h.update(gm.code.encode())
    for v in versions:
        h.update(v.encode())
    for x in inputs:
        if isinstance(x, torch.Tensor):
            h.update(repr((tuple(x.shape), x.stride(), str(x.dtype))).encode())
        else:
            h.update(repr(x).encode())
    for name, t in sorted(gm.named_buffers()):
        t = t.detach()
        h.update(repr((name, tuple(t.shape), str(t.dtype))).encode())
        h.update(tensor_bytes(t))
    return h.hexdigest()


def tensor_bytes(t: torch.Tensor) -> memoryview:
    """A tensor's elements as bytes, for hashing: as uint8, since numpy has no bf16 (a device
    tensor is copied to the host once)."""
    return t.detach().cpu().contiguous().reshape(-1).view(torch.uint8).numpy().data


def load(directory: str | None, key: str, suffix: str) -> bytes | None:
    if directory is None:
        return None
    path = os.path.join(directory, key + suffix)
    try:
        with open(path, "rb") as f:
            data = f.read()
        os.utime(path)  # recently used
        return data
    except OSError:
        return None


def store(directory: str | None, key: str, suffix: str, data: bytes) -> bool:
    """Writes atomically (write_file), then trims the directory to MAX_BYTES. A failure to
    write is logged and ignored (False): the artifact is only a shortcut."""
    if directory is None or len(data) > MAX_BYTES // 2:
        return False
    if not write_file(directory, key + suffix, lambda f: f.write(data)):
        return False
    _trim(directory)
    return True


def write_file(directory: str, filename: str, write: Callable[[BinaryIO], Any]) -> bool:
    """`write` into a temporary file in `directory`, renamed to `filename` once whole: a reader
    never sees half a file. A failure is logged and ignored (False), the temporary file gone."""
    tmp = None
    try:
        os.makedirs(directory, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=directory, suffix=".part")
        with os.fdopen(fd, "wb") as f:
            write(f)
        os.replace(tmp, os.path.join(directory, filename))
        tmp = None
    except OSError as e:
        log.info("torch_plugin placement: could not keep an artifact in %s (%s)", directory, e)
        return False
    finally:
        if tmp is not None:
            os.unlink(tmp)
    return True


def _trim(directory: str) -> None:
    entries = []
    for name in os.listdir(directory):
        path = os.path.join(directory, name)
        try:
            st = os.stat(path)
        except OSError:
            continue
        entries.append((st.st_mtime, st.st_size, path))
    total = sum(size for _, size, _ in entries)
    for _, size, path in sorted(entries):
        if total <= MAX_BYTES:
            break
        try:
            os.remove(path)
            total -= size
        except OSError:
            pass
