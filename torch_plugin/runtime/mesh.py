"""DeviceMesh: ranks arranged in a 1-D or 2-D grid with named axes, one process group per axis.

    mesh = torch_plugin.DeviceMesh.from_torchrun((2, 4), ("dp", "tp"))
    mesh.group("tp")   # the ranks that share this rank's dp coordinate

Groups are gloo on CPU and NCCL on GPU, created from the torchrun environment (or an already
initialised default group) with a timeout on every collective, so a dead or hung peer makes
the others fail with a message instead of waiting forever.
"""

from __future__ import annotations

import datetime
import itertools
import math
import os
import time
from collections.abc import Sequence

import torch
import torch.distributed as dist

from .agreement import handshake
from .collectives import hold_groups


class DeviceMesh:
    """A grid of ranks; axis k of the grid has a name and a process group per line of ranks."""

    def __init__(
        self,
        shape: int | Sequence[int],
        axis_names: Sequence[str] | None = None,
        *,
        timeout_s: float = 300.0,
        backend: str | None = None,
    ) -> None:
        shape = (int(shape),) if isinstance(shape, int) else tuple(int(s) for s in shape)
        if not 1 <= len(shape) <= 2 or any(s < 1 for s in shape):
            raise ValueError(f"mesh shape {shape}: give 1 or 2 positive axis sizes")
        names = (
            tuple(axis_names)
            if axis_names is not None
            else (("tp",) if len(shape) == 1 else ("dp", "tp"))
        )
        if len(names) != len(shape) or len(set(names)) != len(names):
            raise ValueError(f"axis names {names} do not name the {len(shape)} axes of {shape}")
        if not dist.is_initialized():
            raise RuntimeError(
                "torch.distributed is not initialised: run under torchrun and build the mesh with "
                "DeviceMesh.from_torchrun(...), or call dist.init_process_group first"
            )
        world = dist.get_world_size()
        if math.prod(shape) != world:
            raise ValueError(
                f"mesh {dict(zip(names, shape, strict=True))} has {math.prod(shape)} ranks but "
                f"the world has {world}; launch with torchrun --nproc-per-node {math.prod(shape)}"
            )
        self.shape = shape
        self.axis_names = names
        self.timeout_s = float(timeout_s)
        self.backend = backend or dist.get_backend()
        # Before any group or collective: every rank must be in this world with this mesh.
        handshake(
            "mesh",
            {
                "world": world,
                "mesh": dict(zip(names, shape, strict=True)),
                "backend": self.backend,
                "torch": torch.__version__,
                "torch_plugin": _version(),
            },
            self.timeout_s,
        )
        self.rank = dist.get_rank()
        self.coordinate = tuple(int(c) for c in _unravel(self.rank, shape))
        self._groups: dict[str, dist.ProcessGroup] = {}
        hold_groups(self)
        timeout = datetime.timedelta(seconds=self.timeout_s)
        for axis, name in enumerate(names):
            if shape == (world,):  # the whole world: reuse the default group
                self._groups[name] = dist.group.WORLD
                continue
            # Every rank creates every group, in the same order (torch.distributed requires it).
            others = [range(s) for a, s in enumerate(shape) if a != axis]
            for fixed in itertools.product(*others):
                ranks = []
                for i in range(shape[axis]):
                    coord = list(fixed)
                    coord.insert(axis, i)
                    ranks.append(_ravel(coord, shape))
                group = dist.new_group(ranks, timeout=timeout, backend=self.backend)
                if self.rank in ranks:
                    self._groups[name] = group

    @classmethod
    def from_torchrun(
        cls,
        shape: int | Sequence[int] | None = None,
        axis_names: Sequence[str] | None = None,
        *,
        timeout_s: float = 300.0,
    ) -> DeviceMesh:
        """Initialises torch.distributed from the torchrun environment (if not yet) and builds the
        mesh; `shape` defaults to the whole world on one axis."""
        if not dist.is_initialized():
            if "RANK" not in os.environ or "WORLD_SIZE" not in os.environ:
                raise RuntimeError(
                    "no torchrun environment (RANK, WORLD_SIZE): launch with "
                    "torchrun --nproc-per-node N your_script.py"
                )
            backend = "nccl" if torch.cuda.is_available() else "gloo"
            if backend == "nccl":
                torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
            _init_from_env(backend, timeout_s)
        if shape is None:
            shape = dist.get_world_size()
        return cls(shape, axis_names, timeout_s=timeout_s)

    def __getitem__(self, axis: str) -> DeviceMesh:
        """The 1-D mesh of this rank's line along `axis` (as torch's mesh["tp"]): for the entry
        points that split over one axis (cache_parallel, the compile option)."""
        i = self._axis(axis)
        line = object.__new__(DeviceMesh)
        line.shape, line.axis_names = (self.shape[i],), (axis,)
        line.timeout_s, line.backend, line.rank = self.timeout_s, self.backend, self.rank
        line.coordinate = (self.coordinate[i],)
        line._groups = {axis: self._groups[axis]}
        return line

    def _release_groups(self) -> None:
        self._groups.clear()

    def size(self, axis: str | None = None) -> int:
        """Ranks along `axis` (all ranks when None)."""
        if axis is None:
            return math.prod(self.shape)
        return self.shape[self._axis(axis)]

    def group(self, axis: str | None = None) -> dist.ProcessGroup:
        """This rank's process group along `axis` (the only axis of a 1-D mesh by default)."""
        if axis is None:
            if len(self.shape) != 1:
                raise ValueError(
                    f"a {len(self.shape)}-D mesh needs an axis name: {self.axis_names}"
                )
            axis = self.axis_names[0]
        return self._groups[self.axis_names[self._axis(axis)]]

    def local_rank(self, axis: str | None = None) -> int:
        """This rank's coordinate along `axis`."""
        return self.coordinate[self._axis(axis) if axis is not None else 0]

    def _axis(self, axis: str) -> int:
        if axis not in self.axis_names:
            raise ValueError(f"mesh has no axis {axis!r}; axes: {', '.join(self.axis_names)}")
        return self.axis_names.index(axis)

    def __repr__(self) -> str:
        axes = ", ".join(f"{n}={s}" for n, s in zip(self.axis_names, self.shape, strict=True))
        return f"DeviceMesh({axes}; rank {self.rank} at {self.coordinate}, {self.backend})"


def _unravel(rank: int, shape: tuple[int, ...]) -> list[int]:
    coord = []
    for s in reversed(shape):
        coord.append(rank % s)
        rank //= s
    return list(reversed(coord))


def _ravel(coord: Sequence[int], shape: tuple[int, ...]) -> int:
    r = 0
    for c, s in zip(coord, shape, strict=True):
        r = r * s + c
    return r


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("torch_plugin")
    except PackageNotFoundError:  # a source checkout that was never installed
        return "source"


def _init_from_env(backend: str, timeout_s: float) -> None:
    """torchrun's env:// rendezvous, then a launch handshake on its store, then the default group.

    The handshake runs before gloo/NCCL connect their meshes: a rank launched with another
    WORLD_SIZE is named at once instead of surfacing as a connect timeout (gloo's takes several
    times the process-group timeout) or as a hang in the first collective.
    """
    started = time.monotonic()  # connecting to the store counts against the timeout too
    env = {k: os.environ.get(k) for k in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")}
    timeout = datetime.timedelta(seconds=timeout_s)
    try:
        if os.environ.get("TORCHELASTIC_USE_AGENT_STORE") == "True":
            # Under torchrun the agent hosts the store; its rendezvous knows the prefixes.
            store, rank, world = next(dist.rendezvous("env://", timeout=timeout))
            # The agent's store outlives a restart (torchrun --max-restarts): keys the dead
            # attempt wrote (gloo's peer addresses) would be read as this attempt's. Every
            # worker of an attempt joins once, so the join count numbers the attempts alike
            # on every node, where TORCHELASTIC_RESTART_COUNT is per agent.
            joined = store.add("torch_plugin/joined", 1)
            store = dist.PrefixStore(f"torch_plugin/attempt{(joined - 1) // world}", store)
        else:
            # Plain env:// launch: rank 0 hosts the store without waiting for the others there
            # (torch's wait adds a second to the timeout); the handshake below waits and names.
            rank, world = int(env["RANK"] or 0), int(env["WORLD_SIZE"] or 1)
            store = dist.TCPStore(
                env["MASTER_ADDR"] or "127.0.0.1",
                int(env["MASTER_PORT"] or 29500),
                world,
                is_master=rank == 0,
                timeout=timeout,
                wait_for_workers=False,
            )
    except Exception as e:  # the rendezvous's own errors name keys and counts, not the cause
        raise RuntimeError(
            f"torch_plugin: this rank ({env}) could not join the rendezvous within {timeout_s:g} s "
            f"({type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}); a rank is "
            "missing or was launched with another WORLD_SIZE / MASTER_ADDR / MASTER_PORT: launch "
            "every rank with the same torchrun command"
        ) from e
    handshake(
        "launch",
        {"world": world, "master": f"{env['MASTER_ADDR']}:{env['MASTER_PORT']}"},
        timeout_s,
        store=store,
        rank=rank,
        world=world,
        started=started,
    )
    dist.init_process_group(backend, store=store, rank=rank, world_size=world, timeout=timeout)
