"""Smoke test of an installed torch_plugin (a wheel in a fresh venv), run from outside the source
tree: every subpackage imports from site-packages, the torch.compile entry point is registered,
torch.compile with our backend matches eager, and a 2-rank `parallelize` trains like one process.

    python scripts/wheel_smoke.py            # run from any directory but the checkout
"""

from __future__ import annotations

import copy
import importlib
import importlib.metadata as metadata
import os
import pkgutil
import socket
import sys

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn as nn
import torch.nn.functional as F


def _check_install() -> None:
    import torch_plugin

    where = os.path.dirname(torch_plugin.__file__)
    if "site-packages" not in where:
        sys.exit(f"wheel smoke: torch_plugin imported from {where}, not an installed package")
    names = [m.name for m in pkgutil.walk_packages(torch_plugin.__path__, "torch_plugin.")]
    for name in names:
        importlib.import_module(name)
    subpackages = sorted(
        m.name for m in pkgutil.walk_packages(torch_plugin.__path__, "torch_plugin.") if m.ispkg
    )
    backends = {e.name for e in metadata.entry_points(group="torch_dynamo_backends")}
    if "torch_plugin" not in backends:
        sys.exit(f"wheel smoke: no torch_dynamo_backends entry point (found {sorted(backends)})")
    print(f"wheel smoke: {len(names)} modules import from {where}; subpackages {subpackages}")


def _check_compile() -> None:
    import torch_plugin

    torch.manual_seed(0)
    model, (tokens,) = torch_plugin.models.build("gpt", small=True, batch=1)
    model.eval()
    # The identity pipeline: the entry point and _C end to end, in seconds (the measured
    # default compile is the README's quick start, run by make demo).
    fast = torch.compile(model, backend="torch_plugin", options={"passes": []})
    with torch.no_grad():
        diff = (fast(tokens) - model(tokens)).abs().max().item()
    if not diff < 1e-4:
        sys.exit(f"wheel smoke: compiled output differs from eager by {diff}")
    print(f"wheel smoke: torch.compile(backend='torch_plugin') matches eager (max diff {diff:.1e})")


def _worker(rank: int, world: int, port: int, out: dict) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    os.environ.update(RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK=str(rank))
    import torch_plugin

    mesh = torch_plugin.DeviceMesh.from_torchrun(timeout_s=60)
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 64), nn.GELU(), nn.Linear(64, 16))
    x, y = torch.randn(8, 16), torch.randn(8, 16)
    reference = copy.deepcopy(model)
    sharded = torch_plugin.parallelize(model, mesh, (x,))
    losses = []
    for m in (sharded, reference):
        opt = torch.optim.SGD(m.parameters(), lr=0.1)
        run = []
        for _ in range(3):
            opt.zero_grad()
            loss = F.mse_loss(m(x), y)
            loss.backward()
            opt.step()
            run.append(float(loss.detach()))
        losses.append(run)
    if rank == 0:
        out["losses"] = losses
    dist.destroy_process_group()


def _check_parallelize() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with mp.Manager() as manager:
        out = manager.dict()
        mp.spawn(_worker, args=(2, port, out), nprocs=2, join=True)
        ours, ref = out["losses"]
    diff = max(abs(a - b) for a, b in zip(ours, ref, strict=True))
    if not diff < 1e-5 or ours[0] == ours[-1]:
        sys.exit(f"wheel smoke: 2-rank losses {ours} against one process {ref}")
    print(f"wheel smoke: 2-rank parallelize losses equal one process's (max diff {diff:.1e})")


if __name__ == "__main__":
    _check_install()
    _check_compile()
    _check_parallelize()
    print("wheel smoke: passed")
