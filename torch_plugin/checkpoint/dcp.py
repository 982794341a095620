"""Sharded checkpoints on torch.distributed.checkpoint (DCP): parallel saves, resharding loads.

    torch_plugin.save_checkpoint(f"ckpt/step-{step}", model, opt, extra={"step": step})
    extra = torch_plugin.load_checkpoint("ckpt", model, opt)   # the latest complete one

Every rank writes only its own boxes of each tensor, described with global offsets
(checkpoint_layout), so a checkpoint loads into another world size, mesh shape or plan. A save
is written under `<path>.partial` and renamed once every rank's files, their checksums
(manifest.json) and DCP's metadata are on disk: a crash mid-save leaves the previous checkpoint
the latest complete one. A load checks the manifest first, on every rank, and all ranks raise
the same error for a missing, truncated or corrupted file.
"""

from __future__ import annotations

import hashlib
import io
import json
import logging
import math
import os
import random
import shutil
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch import nn
from torch.distributed.checkpoint.default_planner import DefaultLoadPlanner, DefaultSavePlanner
from torch.distributed.checkpoint.metadata import MetadataIndex, TensorStorageMetadata

from .layout import Chunks, Layout, model_tensors

log = logging.getLogger("torch_plugin.checkpoint")

MANIFEST = "manifest.json"
FORMAT = 1


class CheckpointError(RuntimeError):
    """A checkpoint that is missing, incomplete or damaged, or that does not fit the model."""


# ---- DCP planners: our Chunks are looked up by their box offsets ------------------------------


class _SavePlanner(DefaultSavePlanner):
    def lookup_object(self, index: MetadataIndex) -> Any:
        obj = self.state_dict[index.fqn]
        if isinstance(obj, Chunks):
            t = obj.piece(index.offset).detach()
            # torch.save writes a view's whole storage: a box of a larger block is copied.
            whole = t.untyped_storage().nbytes() == t.numel() * t.element_size()
            return t if whole and t.is_contiguous() and t.storage_offset() == 0 else t.clone()
        return super().lookup_object(index)


class _LoadPlanner(DefaultLoadPlanner):
    def __init__(self) -> None:
        super().__init__(flatten_state_dict=False, flatten_sharded_tensors=False)

    def set_up_planner(
        self, state_dict: dict[str, Any], metadata: Any = None, is_coordinator: bool = False
    ) -> None:
        # The default set-up maps every value it does not know (our Chunks) to None.
        self.original_state_dict = self.state_dict = state_dict
        self.metadata, self.is_coordinator, self.mappings = metadata, is_coordinator, {}

    def lookup_tensor(self, index: MetadataIndex) -> torch.Tensor:
        obj = self.state_dict[index.fqn]
        if isinstance(obj, Chunks):
            return obj.piece(index.offset)
        return super().lookup_tensor(index)


# ---- what a model and an optimizer hold, as whole-tensor layouts ------------------------------


def _param_layouts(model: Any, optimizer: Any = None) -> dict[int, tuple[str, Layout]]:
    """id(parameter an optimizer may hold) -> (name, layout); ZeRO-2 flat shards and float32
    master weights included."""
    out = {id(t): (n, lay) for n, t, lay in model_tensors(model)}
    more = getattr(model, "_parameter_layouts", None)  # a ShardedModule's blocks and shards
    if more is not None:
        out.update(more(out))
    else:
        out.update((id(p), (n, Layout(tuple(p.shape)))) for n, p in model.named_parameters())
    _add_masters(out, optimizer)
    return out


def _add_masters(out: dict[int, tuple[str, Layout]], optimizer: Any) -> None:
    """A master weight has its parameter's name and layout (its value is saved as the
    parameter's optimizer state "master")."""
    for p, m in getattr(optimizer, "masters", ()):
        if id(p) in out:
            out[id(m)] = out[id(p)]


def _optimizers(optimizer: Any) -> list[tuple[Any, torch.optim.Optimizer]]:
    """(holder of the param_groups a scheduler edits, the optimizer holding state) pairs: a
    ShardedOptimizer's parts, a ZeroRedundancyOptimizer's local optimizer, or the optimizer."""
    from torch.distributed.optim import ZeroRedundancyOptimizer

    parts = getattr(optimizer, "optimizers", None)
    out = []
    for o in parts if parts is not None else [optimizer]:
        out.append((o, o.optim) if isinstance(o, ZeroRedundancyOptimizer) else (o, o))
    return out


def _held(
    optimizer: Any, layouts: dict[int, tuple[str, Layout]]
) -> Iterator[tuple[torch.optim.Optimizer, nn.Parameter, str, Layout]]:
    """(optimizer holding state, parameter, its name, its layout) for every parameter the
    optimizer's state-holding parts step on this rank."""
    for _, states_of in _optimizers(optimizer):
        for group in states_of.param_groups:
            for p in group["params"]:
                if id(p) not in layouts:
                    raise CheckpointError(
                        f"the optimizer holds a {tuple(p.shape)} tensor that is not one of the "
                        "model's parameters: build it over model.parameters() or with "
                        "model.optimizer(...)"
                    )
                yield (states_of, p, *layouts[id(p)])


_HPARAMS_SKIP = ("params",)


def _optimizer_entries(
    model: Any, optimizer: Any, layouts: dict[int, tuple[str, Layout]]
) -> tuple[dict[str, Chunks], dict[str, dict[str, Any]]]:
    """State tensors as Chunks under optim.state.<param>.<key>; hyperparameters per param."""
    state: dict[str, Chunks] = {}
    hparams: dict[str, dict[str, Any]] = {}
    for groups_of, _ in _optimizers(optimizer):
        for group in groups_of.param_groups:
            for p in group["params"]:
                if id(p) in layouts:
                    hparams[layouts[id(p)][0]] = {
                        k: v for k, v in group.items() if k not in _HPARAMS_SKIP
                    }
    for states_of, p, name, lay in _held(optimizer, layouts):
        for k, v in states_of.state.get(p, {}).items():
            if not isinstance(v, torch.Tensor):
                if v is not None:
                    raise CheckpointError(
                        f"optimizer state {name}.{k} is a {type(v).__name__}; only tensors "
                        "are checkpointed per parameter"
                    )
                continue
            scalar = v.dim() == 0
            state[f"optim.state.{name}.{k}"] = Chunks(
                () if scalar else lay.shape, Layout(()) if scalar else lay, v
            )
    for p, m in getattr(optimizer, "masters", ()):
        name, lay = layouts[id(p)]
        state[f"optim.state.{name}.master"] = Chunks(lay.shape, lay, m.detach())
    return state, hparams


def _rng_state() -> dict[str, Any]:
    out: dict[str, Any] = {"torch": torch.get_rng_state(), "python": random.getstate()}
    try:
        import numpy as np

        out["numpy"] = np.random.get_state()
    except ImportError:
        pass
    if torch.cuda.is_available():
        out["cuda"] = torch.cuda.get_rng_state_all()
    return out


def _set_rng_state(state: dict[str, Any]) -> None:
    torch.set_rng_state(state["torch"])
    random.setstate(state["python"])
    if "numpy" in state:
        import numpy as np

        np.random.set_state(state["numpy"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


# ---- files ------------------------------------------------------------------------------------


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _write_durable(path: Path, data: bytes) -> None:
    with open(path, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 22), b""):
            h.update(block)
    return h.hexdigest()


def _group_info(group: Any) -> tuple[int, int]:
    if not dist.is_initialized():
        return 0, 1
    return dist.get_rank(group), dist.get_world_size(group)


def _all_gather(obj: Any, group: Any) -> list[Any]:
    if not dist.is_initialized():
        return [obj]
    out: list[Any] = [None] * dist.get_world_size(group)
    dist.all_gather_object(out, obj, group=group)
    return out


def _barrier(group: Any) -> None:
    if dist.is_initialized():
        dist.barrier(group=group)


# ---- save -------------------------------------------------------------------------------------


class SaveHandle:
    """An async save in flight: `wait()` returns once the checkpoint is complete on disk (and
    raises what the writer raised). The next save_checkpoint on the model waits for it too."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.seconds = 0.0
        self.bytes_written = 0
        self.payload_bytes = 0
        self._error: BaseException | None = None
        self._thread: threading.Thread | None = None

    def wait(self) -> Path:
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        if self._error is not None:
            error, self._error = self._error, None
            raise CheckpointError(f"the async save of {self.path} failed: {error}") from error
        return self.path

    def done(self) -> bool:
        return self._thread is None or not self._thread.is_alive()


def save_checkpoint(
    path: str | os.PathLike,
    model: Any,
    optimizer: Any = None,
    extra: Any = None,
    *,
    async_save: bool = False,
    keep: int | None = None,
    group: Any = None,
) -> SaveHandle:
    """Writes `model`'s (and `optimizer`'s) state to the directory `path`, each rank its own
    blocks, collectively (call it on every rank). `extra` (the step, the data position, a
    scheduler's state_dict) comes back from load_checkpoint; each rank's RNG states are saved
    with it. `async_save=True` copies the state to CPU and returns while a thread writes it:
    call `.wait()` on the handle (or the next save does) before relying on the files. `keep`
    prunes older complete checkpoints in path's parent directory, keeping the newest `keep`."""
    path = Path(path)
    pending: SaveHandle | None = getattr(model, "_tp_pending_save", None)
    if pending is not None:
        pending.wait()
    t0 = time.perf_counter()
    rank, world = _group_info(group)
    layouts = _param_layouts(model, optimizer)
    state: dict[str, Any] = {
        f"model.{n}": Chunks(lay.shape, lay, t.detach()) for n, t, lay in model_tensors(model)
    }
    merged: dict[str, Any] | None = None
    if optimizer is not None:
        opt_state, hparams = _optimizer_entries(model, optimizer, layouts)
        state.update(opt_state)
        merged = {}  # ZeRO ranks hold some parameters each: every rank saves all of them
        for part in _all_gather(hparams, group):
            merged.update(part)
    blob = io.BytesIO()
    torch.save({"user": extra, "rng": _rng_state(), "world": world, "param_groups": merged}, blob)
    partial = path.with_name(path.name + ".partial")
    if rank == 0:
        shutil.rmtree(partial, ignore_errors=True)
        partial.mkdir(parents=True)
    _barrier(group)
    handle = SaveHandle(path)
    args = (partial, path, state, blob.getvalue(), keep, t0, handle)
    if not async_save:
        _write(*args, group)
        return handle
    comm = getattr(model, "_tp_checkpoint_comm", None)
    if comm is None:
        # A group of its own: the writer thread's collectives must not interleave with the
        # training step's on the model's groups. Held by a Collectives, so it is released
        # before the interpreter shuts down (see collectives.hold_groups).
        from ..runtime.collectives import Collectives

        ranks = None if group is None else dist.get_process_group_ranks(group)
        pg = dist.new_group(ranks=ranks, backend="gloo") if dist.is_initialized() else None
        comm = model._tp_checkpoint_comm = Collectives(pg, world, rank, "torch_plugin checkpoint")
    staged = {k: v.staged() if isinstance(v, Chunks) else v for k, v in state.items()}
    args = (partial, path, staged, blob.getvalue(), keep, t0, handle)

    def run() -> None:
        try:
            _write(*args, comm.group)
        except BaseException as e:  # handed to wait()
            handle._error = e

    handle._thread = threading.Thread(target=run, name=f"save {path.name}", daemon=True)
    handle._thread.start()
    model._tp_pending_save = handle
    log.info("torch_plugin checkpoint: staged %s in %.2f s", path, time.perf_counter() - t0)
    return handle


def _write(
    partial: Path,
    path: Path,
    state: dict[str, Any],
    blob: bytes,
    keep: int | None,
    t0: float,
    handle: SaveHandle,
    group: Any,
) -> None:
    rank, world = _group_info(group)
    writer = dcp.FileSystemWriter(str(partial), sync_files=True, single_file_per_rank=True)
    metadata = dcp.save(
        state,
        storage_writer=writer,
        planner=_SavePlanner(flatten_state_dict=False, flatten_sharded_tensors=False),
        process_group=group,
        no_dist=not dist.is_initialized(),
    )
    _write_durable(partial / f"extra_{rank}.pt", blob)
    # Tensor bytes this rank wrote (its files also hold torch.save's per-item headers).
    for fqn, md in metadata.state_dict_metadata.items():
        if isinstance(md, TensorStorageMetadata):
            size = md.properties.dtype.itemsize
            for c in md.chunks:
                info = metadata.storage_data.get(MetadataIndex(fqn, c.offsets))
                if info is not None and info.relative_path.startswith(f"__{rank}_"):
                    handle.payload_bytes += math.prod(c.sizes) * size
    mine = sorted(p for p in partial.glob(f"__{rank}_*") if p.is_file())
    mine.append(partial / f"extra_{rank}.pt")
    files = {p.name: {"bytes": p.stat().st_size, "sha256": _sha256(p), "rank": rank} for p in mine}
    everyone = _all_gather(files, group)
    if rank == 0:
        manifest = {"format": FORMAT, "world": world, "created_ns": time.time_ns(), "files": {}}
        for part in everyone:
            manifest["files"].update(part)
        meta = partial / ".metadata"
        manifest["files"][".metadata"] = {
            "bytes": meta.stat().st_size,
            "sha256": _sha256(meta),
            "rank": 0,
        }
        _write_durable(partial / MANIFEST, json.dumps(manifest, indent=1).encode())
        _fsync_dir(partial)
        old = path.with_name(path.name + ".old")
        if path.exists():
            shutil.rmtree(old, ignore_errors=True)
            path.rename(old)
        partial.rename(path)
        _fsync_dir(path.parent)
        shutil.rmtree(old, ignore_errors=True)
        if keep is not None:
            for stale in complete_checkpoints(path.parent)[:-keep]:
                shutil.rmtree(stale, ignore_errors=True)
    _barrier(group)
    handle.seconds = time.perf_counter() - t0
    handle.bytes_written = sum(f["bytes"] for f in files.values())
    log.info(
        "torch_plugin checkpoint: rank %d wrote %d bytes of %s in %.2f s",
        rank,
        handle.bytes_written,
        path,
        handle.seconds,
    )


# ---- find, verify, load -----------------------------------------------------------------------


def _manifest(path: Path) -> dict[str, Any] | None:
    try:
        return json.loads((path / MANIFEST).read_text())
    except (OSError, ValueError):
        return None


def complete_checkpoints(root: str | os.PathLike) -> list[Path]:
    """The complete checkpoints directly under `root`, oldest first."""
    root = Path(root)
    found = []
    for d in root.iterdir() if root.is_dir() else []:
        m = _manifest(d) if d.is_dir() and not d.name.endswith((".partial", ".old")) else None
        if m is not None:
            found.append((m.get("created_ns", 0), d.name, d))
    return [d for _, _, d in sorted(found)]


def _resolve(path: Path) -> Path | None:
    """The checkpoint `path` names: itself, or the latest complete one under it (None: none)."""
    if (path / MANIFEST).exists():
        return path
    if path.name.endswith(".partial") or (path / ".metadata").exists():
        raise CheckpointError(
            f"{path} is not a complete checkpoint (no {MANIFEST}: its save did not finish); "
            f"load its parent directory to get the latest complete one"
        )
    found = complete_checkpoints(path)
    return found[-1] if found else None


def _verify(path: Path, group: Any) -> dict[str, Any]:
    """Every rank checks every file's size and its share of the checksums; all ranks raise the
    same error, so none goes on into a load the others left."""
    rank, world = _group_info(group)
    problems = []
    manifest = _manifest(path)
    if manifest is None:
        problems.append(f"{MANIFEST} is missing or unreadable")
    else:
        for i, (name, info) in enumerate(sorted(manifest["files"].items())):
            f = path / name
            if not f.is_file():
                problems.append(f"{name} (written by rank {info['rank']}) is missing")
            elif f.stat().st_size != info["bytes"]:
                problems.append(
                    f"{name} (rank {info['rank']}) has {f.stat().st_size} bytes, the save wrote "
                    f"{info['bytes']}: truncated or overwritten"
                )
            elif i % world == rank and _sha256(f) != info["sha256"]:
                problems.append(f"{name} (rank {info['rank']}) does not match its checksum")
    merged = sorted({p for part in _all_gather(problems, group) for p in part})
    if merged:
        raise CheckpointError(
            f"checkpoint {path} is damaged: {'; '.join(merged)}. Load an earlier one (its "
            "sibling directories) or the source of a copy; nothing was loaded"
        )
    assert manifest is not None
    return manifest


def load_checkpoint(
    path: str | os.PathLike, model: Any, optimizer: Any = None, *, group: Any = None
) -> Any:
    """Loads a checkpoint into `model` (and `optimizer`) in place, whatever world size, mesh or
    plan wrote it, collectively. `path` is a checkpoint, or a directory of them: then the
    latest complete one loads (None is returned, and nothing loads, when there is none).
    Returns the `extra` given to save_checkpoint; RNG states are restored when the world size
    is the one that saved."""
    t0 = time.perf_counter()
    rank, world = _group_info(group)
    chosen = _resolve(Path(path)) if rank == 0 else None
    if dist.is_initialized():
        box = [str(chosen) if chosen is not None else None]
        dist.broadcast_object_list(
            box, src=dist.get_global_rank(group, 0) if group else 0, group=group
        )
        chosen = Path(box[0]) if box[0] is not None else None
    if chosen is None:
        log.warning(
            "torch_plugin checkpoint: no complete checkpoint under %s; nothing loaded", path
        )
        return None
    manifest = _verify(chosen, group)
    reader = dcp.FileSystemReader(str(chosen))
    saved = reader.read_metadata().state_dict_metadata
    layouts = _param_layouts(model, optimizer)
    state: dict[str, Any] = {}
    for n, t, lay in model_tensors(model):
        state[f"model.{n}"] = Chunks(lay.shape, lay, t.data)
    missing = sorted(k.removeprefix("model.") for k in state if k not in saved)
    if missing:
        raise CheckpointError(
            f"checkpoint {chosen} has no {', '.join(missing[:5])}"
            + (f" (+{len(missing) - 5} more)" if len(missing) > 5 else "")
            + ": it was saved from another model"
        )
    mine = chosen / f"extra_{rank}.pt"
    extra = torch.load(mine if mine.exists() else chosen / "extra_0.pt", weights_only=False)
    slots: list[tuple[torch.optim.Optimizer, nn.Parameter, str, torch.Tensor]] = []
    if optimizer is not None:
        if extra["param_groups"] is None:
            raise CheckpointError(f"checkpoint {chosen} was saved without an optimizer")
        for states_of, p, name, lay in _held(optimizer, layouts):
            prefix = f"optim.state.{name}."
            for key, md in saved.items():
                rest = key[len(prefix) :]
                if not key.startswith(prefix) or "." in rest:
                    continue
                assert isinstance(md, TensorStorageMetadata)
                scalar = len(md.size) == 0
                flat = lay.flat
                shape = (
                    () if scalar else lay.block_shape() if flat is None else (flat[1] - flat[0],)
                )
                t = torch.zeros(shape, dtype=md.properties.dtype)
                state[key] = Chunks(() if scalar else lay.shape, Layout(()) if scalar else lay, t)
                slots.append((states_of, p, rest, t))
    with torch.no_grad():
        dcp.load(
            state,
            storage_reader=reader,
            planner=_LoadPlanner(),
            process_group=group,
            no_dist=not dist.is_initialized(),
        )
    masters = {id(m): p for p, m in getattr(optimizer, "masters", ())}
    loaded_masters = set()
    for states_of, p, key, t in slots:
        if key == "master" and id(p) in masters:
            with torch.no_grad():
                p.copy_(t)  # the float32 master weight itself, not a state entry
            loaded_masters.add(id(p))
            continue
        states_of.state.setdefault(p, {})[key] = t
    for p, m in getattr(optimizer, "masters", ()):
        if id(m) not in loaded_masters:  # saved without master weights: start from the model's
            with torch.no_grad():
                m.copy_(p)
    if optimizer is not None:
        hparams = extra["param_groups"]
        for groups_of, _ in _optimizers(optimizer):
            for group_ in groups_of.param_groups:
                names = [layouts[id(p)][0] for p in group_["params"] if id(p) in layouts]
                saved_h = next((hparams[n] for n in names if n in hparams), None)
                if saved_h is not None:
                    group_.update({k: v for k, v in saved_h.items() if k in group_})
    if manifest["world"] == world:
        _set_rng_state(extra["rng"])
    else:
        log.info(
            "torch_plugin checkpoint: saved by %d ranks, loaded on %d: RNG states not restored",
            manifest["world"],
            world,
        )
    log.info("torch_plugin checkpoint: loaded %s in %.2f s", chosen, time.perf_counter() - t0)
    return extra["user"]


# ---- export -----------------------------------------------------------------------------------


def full_state_dict(model: Any, rank0_only: bool = True) -> dict[str, torch.Tensor]:
    """The unwrapped model's state_dict under its own keys (tied aliases included), gathered
    tensor by tensor (each a collective over the blocks' ranks); on rank 0 only by default
    (the other ranks get {}). It loads into the plain model: HF save_pretrained works on it."""
    gather = getattr(model, "full_state_dict", None)  # a ShardedModule, a PipelineParallel
    if gather is not None:
        return gather(rank0_only)
    return {k: v.detach().clone() for k, v in model.state_dict().items()}
