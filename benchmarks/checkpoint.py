"""Checkpoints that resume exactly: save with one world size / mesh / plan, load into another.

    python benchmarks/checkpoint.py                  # every scenario
    python benchmarks/checkpoint.py --scenarios same,4to2

Each scenario trains an HF Llama config (hf_suite "llama", AdamW, cosine schedule, clipping)
on fresh gloo processes for STEPS steps, saving after SAVE_AT, then a second launch (possibly
another world size or mesh) loads the checkpoint and trains the remaining steps. The table gives
the largest loss difference against the uninterrupted run, save / load seconds, and the bytes
each rank wrote against its local state bytes. Fault scenarios: a rank killed during a save
(the previous checkpoint loads), a truncated file and a missing rank file (a clear error on
every rank). torchrun scenarios (a rank SIGKILLed mid-step under --max-restarts, single and
two-agent multi-node) run examples/train_with_checkpoints.py. Writes
benchmarks/results/checkpoint.{json,png}.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path
from typing import Any

import torch

ROOT = Path(__file__).resolve().parents[1]
MODEL = "llama"
PIPELINE_MODEL = "mmt"  # a multi-branch zoo model GraphPipe splits into 4 stages
STEPS = 6
SAVE_AT = 3
BATCH = 4
LR = 1e-2
TIMEOUT_S = 60


def _inputs(step: int) -> dict[str, Any]:
    from torch_plugin.models import hf_suite

    return hf_suite.make_inputs(MODEL, batch=BATCH, seed=100 + step)


def _build(kind: str, mesh_shape: tuple[int, ...], zero: int, timeout_s: float) -> tuple:
    """(model, optimizer, scheduler) as a training script builds them."""
    import torch_plugin
    from torch_plugin.models import hf_suite

    torch.manual_seed(0)
    if kind == "pipeline":
        from torch.nn import functional as F

        from torch_plugin import models

        model, inputs = models.build(PIPELINE_MODEL, small=True, batch=8)
        pp = torch_plugin.PipelineParallel(
            model, inputs, loss_fn=F.mse_loss, strategy="gpp", micro_batch_sizes=[2]
        )
        opt = torch.optim.AdamW(pp.parameters(), lr=LR)
        return pp, opt, torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=STEPS)
    model = hf_suite.build_model(MODEL, seed=0)
    mesh = torch_plugin.DeviceMesh(mesh_shape, timeout_s=timeout_s)
    example = _inputs(0)
    options: dict[str, Any] = {"level": "fast", "zero": zero}
    if zero == 2:  # a budget below what ZeRO-1 can meet: the planner must pick ZeRO-2
        least = {}
        for stage in (1, 2):
            try:
                torch_plugin.parallelize(
                    model, mesh, example, memory_budget_gb=1e-9, level="fast", zero=stage
                )
            except torch_plugin.PlanError as e:
                least[stage] = e.min_memory_bytes
        options["memory_budget_gb"] = (least[1] + least[2]) / 2 / 1e9
    sharded = torch_plugin.parallelize(model, mesh, example, **options)
    if zero == 2 and 2 not in sharded.plan.zero_stage.values():
        raise AssertionError("the plan chose no ZeRO-2 block")
    opt = sharded.optimizer(torch.optim.AdamW, lr=LR)
    return sharded, opt, torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=STEPS)


def _step(kind: str, model: Any, opt: Any, sched: Any, step: int) -> float:
    if kind == "pipeline":
        from torch_plugin import models

        _, inputs = models.build(PIPELINE_MODEL, small=True, batch=8)
        gen = torch.Generator().manual_seed(step)
        x = tuple(
            torch.randn(t.shape, generator=gen) if t.is_floating_point() else t for t in inputs
        )
        target = torch.randn(8, *_pipeline_out_shape(), generator=gen)
        loss = model.step(x, target)
    else:
        out = model(**_inputs(step))
        out.loss.backward()
        model.clip_grad_norm_(1.0)
        loss = float(out.loss)
    opt.step()
    sched.step()
    opt.zero_grad()
    return float(loss)


def _pipeline_out_shape() -> tuple[int, ...]:
    from torch_plugin import models

    model, inputs = models.build(PIPELINE_MODEL, small=True, batch=8)
    with torch.no_grad():
        return tuple(model(*inputs).shape[1:])


def _local_state_bytes(model: Any, opt: Any) -> int:
    """Bytes of this rank's parameters, buffers and optimizer state."""
    from torch_plugin.checkpoint.dcp import _optimizers
    from torch_plugin.checkpoint.layout import model_tensors

    total = sum(t.numel() * t.element_size() for _, t, _ in model_tensors(model))
    for _, states_of in _optimizers(opt):
        for st in states_of.state.values():
            total += sum(v.numel() * v.element_size() for v in st.values() if torch.is_tensor(v))
    return total


def phase(rank: int, world: int, cfg: dict[str, Any]) -> dict[str, Any]:
    """One launch: build, maybe load, train cfg['steps'], maybe save; its figures."""
    import torch_plugin

    kind = cfg.get("kind", "shard")
    model, opt, sched = _build(kind, tuple(cfg["mesh"]), cfg.get("zero", 1), cfg["timeout_s"])
    root = Path(cfg["root"])
    start, out = 0, {"losses": {}}
    if kind != "pipeline":  # what the checkpoint had to describe: specs and ZeRO stages
        out["specs"] = sorted(set(model.param_specs))
        out["zero_stages"] = sorted(set(model.plan.zero_stage.values()))
    if cfg.get("load"):
        t0 = time.perf_counter()
        extra = torch_plugin.load_checkpoint(root, model, opt)
        out["load_s"] = time.perf_counter() - t0
        sched.load_state_dict(extra["scheduler"])
        start = extra["step"]
    for step in range(start, cfg["steps"]):
        out["losses"][step] = _step(kind, model, opt, sched, step)
        done = step + 1
        if done in cfg.get("save_at", ()):
            if cfg.get("kill_in_save") == done and rank == world - 1:
                from torch_plugin.checkpoint import dcp as checkpoint

                def die(*_: Any) -> None:  # after DCP wrote this rank's data, before the manifest
                    os.kill(os.getpid(), signal.SIGKILL)

                checkpoint._write_durable = die
            t0 = time.perf_counter()
            handle = torch_plugin.save_checkpoint(
                root / f"step-{done}",
                model,
                opt,
                extra={"step": done, "scheduler": sched.state_dict()},
                async_save=cfg.get("async", True),
            )
            out["save_blocking_s"] = time.perf_counter() - t0  # training waits this long
            handle.wait()
            out["save_s"] = time.perf_counter() - t0
            out["bytes_written"] = handle.bytes_written
            out["payload_bytes"] = handle.payload_bytes
            out["local_state_bytes"] = _local_state_bytes(model, opt)
    return out


def _rank_main(rank: int, world: int, port: int, cfg: dict[str, Any], out: str) -> None:
    import warnings

    import torch.distributed as dist

    warnings.filterwarnings("ignore")
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    try:
        dist.init_process_group(
            "gloo",
            rank=rank,
            world_size=world,
            timeout=datetime.timedelta(seconds=cfg["timeout_s"]),
        )
        result = {"status": "pass", **phase(rank, world, cfg)}
    except Exception as e:  # noqa: BLE001 - every failure is reported
        result = {
            "status": "error",
            "error": f"{type(e).__name__}: {e}",
            "trace": traceback.format_exc(limit=-4),
        }
    Path(out, f"rank{rank}.json").write_text(json.dumps(result))
    try:
        dist.destroy_process_group()
    except Exception:  # noqa: BLE001, S110
        pass


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def launch(world: int, cfg: dict[str, Any], deadline_s: float = 300.0) -> list[dict[str, Any]]:
    """Runs `phase` on `world` fresh gloo processes; each rank's result (a dead rank: None)."""
    import torch.multiprocessing as mp

    cfg = {"timeout_s": TIMEOUT_S, **cfg}
    ctx = mp.get_context("spawn")
    port = _free_port()
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory() as out:
        procs = [
            ctx.Process(target=_rank_main, args=(r, world, port, cfg, out)) for r in range(world)
        ]
        for p in procs:
            p.start()
        for p in procs:
            p.join(max(0.0, deadline_s - (time.perf_counter() - t0)))
        for p in procs:
            if p.is_alive():
                p.kill()
                p.join()
        results = []
        for r in range(world):
            f = Path(out, f"rank{r}.json")
            results.append(json.loads(f.read_text()) if f.exists() else None)
    return results


def _passed(results: list[dict[str, Any] | None], what: str) -> list[dict[str, Any]]:
    for r, res in enumerate(results):
        if res is None:
            raise RuntimeError(f"{what}: rank {r} died")
        if res["status"] != "pass":
            raise RuntimeError(f"{what}: rank {r}: {res['error']}\n{res.get('trace', '')}")
    return results  # type: ignore[return-value]


def _diff(a: dict[str, float], b: dict[str, float]) -> float:
    common = sorted(set(a) & set(b), key=int)
    if not common:
        raise RuntimeError("no step in common between the resumed and the uninterrupted run")
    return max(abs(a[k] - b[k]) for k in common)


def resume(
    save_mesh: tuple[int, ...], load_mesh: tuple[int, ...], kind: str = "shard", zero: int = 1
) -> dict[str, Any]:
    """Train STEPS with a save after SAVE_AT; load on `load_mesh` and train the rest."""
    with tempfile.TemporaryDirectory() as root:
        base = {"root": root, "steps": STEPS, "kind": kind, "zero": zero}
        world = 4 if kind == "pipeline" else int(torch.tensor(save_mesh).prod())
        saved = _passed(launch(world, {**base, "mesh": save_mesh, "save_at": [SAVE_AT]}), "save")
        lworld = 4 if kind == "pipeline" else int(torch.tensor(load_mesh).prod())
        loaded = _passed(launch(lworld, {**base, "mesh": load_mesh, "load": True}), "load")
    return {
        "loss_diff": _diff(loaded[0]["losses"], saved[0]["losses"]),
        "save_s": max(r["save_s"] for r in saved),
        "save_blocking_s": max(r["save_blocking_s"] for r in saved),
        "load_s": max(r["load_s"] for r in loaded),
        "bytes_written": [r["bytes_written"] for r in saved],
        "payload_bytes": [r["payload_bytes"] for r in saved],
        "local_state_bytes": [r["local_state_bytes"] for r in saved],
        "specs_saved": saved[0].get("specs"),
        "specs_loaded": loaded[0].get("specs"),
        "zero_stages_saved": saved[0].get("zero_stages"),
    }


def killed_in_save() -> dict[str, Any]:
    """The last rank dies while the checkpoint after step 4 is written (its data on disk, no
    manifest yet); the others fail on their collective timeout. Loading the directory picks
    the checkpoint after step 2, and training from it equals the uninterrupted run."""
    with tempfile.TemporaryDirectory() as root:
        base = {"root": root, "steps": STEPS, "mesh": (2,)}
        whole = _passed(launch(2, {**base, "root": root + "/whole", "save_at": []}), "baseline")
        died = launch(2, {**base, "save_at": [2, 4], "kill_in_save": 4, "timeout_s": 10})
        if died[1] is not None:
            raise RuntimeError("the rank meant to die during the save survived")
        if died[0] is not None and died[0]["status"] == "pass":
            raise RuntimeError("rank 0 finished a save its peer died in")
        left = sorted(p.name for p in Path(root).iterdir())
        loaded = _passed(launch(2, {**base, "load": True}), "load")
    return {
        "loss_diff": _diff(loaded[0]["losses"], whole[0]["losses"]),
        "resumed_from_step": min(int(k) for k in loaded[0]["losses"]),
        "directories": left,
        "load_s": loaded[0]["load_s"],
    }


def damaged(how: str) -> dict[str, Any]:
    """A complete checkpoint with rank 1's data file truncated or deleted: every rank of the
    load raises the same clear error, naming the file."""
    with tempfile.TemporaryDirectory() as root:
        base = {"root": root, "steps": SAVE_AT, "mesh": (2,)}
        _passed(launch(2, {**base, "save_at": [SAVE_AT]}), "save")
        data = next(Path(root, f"step-{SAVE_AT}").glob("__1_*.distcp"))
        if how == "truncated":
            with open(data, "r+b") as f:
                f.truncate(data.stat().st_size // 2)
        else:
            data.unlink()
        t0 = time.perf_counter()
        results = launch(2, {**base, "steps": STEPS, "load": True}, deadline_s=120)
        seconds = time.perf_counter() - t0
    errors = [r["error"] if r else "died" for r in results]
    if any(r is None or r["status"] == "pass" for r in results):
        raise RuntimeError(f"a {how} checkpoint loaded: {errors}")
    if not all(data.name in e and "CheckpointError" in e for e in errors):
        raise RuntimeError(f"the error does not name {data.name}: {errors}")
    return {"error": errors[0].splitlines()[0][:200], "fail_s": seconds}


def torchrun(
    nnodes: int, kill: bool, out: Path, steps: int = 8, export: bool = False
) -> tuple[list[dict[str, Any]], str]:
    """examples/train_with_checkpoints.py under torchrun (--max-restarts 1), on one agent or
    `nnodes` agents meeting at a c10d rendezvous as real clusters do; with `kill` one rank
    SIGKILLs itself in the middle of step 5 on the first attempt. Rank 0's per-step log and
    the first agent's output."""
    port = _free_port()
    nproc = 2 // nnodes
    cmd = [
        sys.executable, "-m", "torch.distributed.run",
        f"--nnodes={nnodes}", f"--nproc-per-node={nproc}", "--max-restarts=1",
        "--rdzv-backend=c10d", f"--rdzv-endpoint=127.0.0.1:{port}", "--rdzv-id=ckpt",
        str(ROOT / "examples/train_with_checkpoints.py"),
        "--steps", str(steps), "--save-every", "2", "--out", str(out),
        "--export", str(out / "hf") if export else "none",
    ]  # fmt: skip
    if kill:
        cmd += ["--kill-rank", "1", "--kill-step", "5"]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
    agents = [
        subprocess.Popen(
            [*cmd[:3], f"--node-rank={i}", *cmd[3:]] if nnodes > 1 else cmd,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for i in range(nnodes)
    ]
    logs = [a.communicate(timeout=600)[0] for a in agents]
    if any(a.returncode for a in agents):
        raise RuntimeError(f"torchrun failed:\n{logs[0][-3000:]}")
    rows = [json.loads(line) for line in (out / "log.jsonl").read_text().splitlines()]
    return rows, logs[0]


def elastic(nnodes: int) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as d:
        whole, _ = torchrun(nnodes, False, Path(d, "whole"))
        killed, log = torchrun(nnodes, True, Path(d, "killed"), export=nnodes == 1)
    final = {}
    for row in killed:  # the restart replays the steps after the last checkpoint
        final[row["step"]] = row["loss"]
    want = {row["step"]: row["loss"] for row in whole}
    export = [line for line in log.splitlines() if "from_pretrained logits differ by" in line]
    return {
        "hf_export_logits_diff": float(export[0].split()[-1]) if export else None,
        "loss_diff": max(abs(final[k] - want[k]) for k in want),
        "restarts": max(row["restart"] for row in killed),
        "replayed_steps": len(killed) - len(whole),
        "steps": len(want),
    }


SCENARIOS: dict[str, Any] = {
    "same": ("same world size (2,) -> (2,)", lambda: resume((2,), (2,))),
    "4to2": ("4 -> 2 ranks", lambda: resume((4,), (2,))),
    "2to4": ("2 -> 4 ranks", lambda: resume((2,), (4,))),
    "2x2to4": ("(2, 2) -> (4,)", lambda: resume((2, 2), (4,))),
    "zero2": ("ZeRO-2 optimizer, (2, 2) -> (2, 2)", lambda: resume((2, 2), (2, 2), zero=2)),
    "pipeline": ("4-stage pipeline", lambda: resume((4,), (4,), kind="pipeline")),
    "killed_step": ("rank killed mid-step (torchrun)", lambda: elastic(1)),
    "killed_step_2nodes": ("rank killed mid-step, 2 torchrun agents", lambda: elastic(2)),
    "killed_save": ("rank killed during a save", killed_in_save),
    "truncated": ("truncated file", lambda: damaged("truncated")),
    "missing": ("missing rank file", lambda: damaged("missing")),
}
EXACT = ("same", "zero2", "pipeline", "killed_step", "killed_step_2nodes", "killed_save")


def save_png(rows: dict[str, dict[str, Any]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = [k for k, r in rows.items() if "save_s" in r.get("figures", {})]
    fig, ax = plt.subplots(1, 2, figsize=(11, 3.6))
    ax[0].bar(names, [rows[k]["figures"]["save_s"] for k in names], label="save")
    ax[0].bar(names, [rows[k]["figures"]["load_s"] for k in names], alpha=0.6, label="load")
    ax[0].set_ylabel("seconds")
    ax[0].legend()
    ratio = [
        max(
            w / s
            for w, s in zip(
                rows[k]["figures"]["bytes_written"],
                rows[k]["figures"]["local_state_bytes"],
                strict=True,
            )
        )
        for k in names
    ]
    ax[1].bar(names, ratio)
    ax[1].axhline(1.0, color="k", lw=0.8)
    ax[1].set_ylabel("max rank: bytes written / local state")
    for a in ax:
        a.tick_params(axis="x", rotation=30)
    fig.suptitle(f"torch_plugin checkpoints, HF {MODEL} config on gloo")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--scenarios", default=",".join(SCENARIOS))
    ap.add_argument("--out", default=str(ROOT / "benchmarks/results/checkpoint.json"))
    args = ap.parse_args()
    rows: dict[str, dict[str, Any]] = {}
    out = Path(args.out)
    head = f"{'scenario':44} {'status':7} {'loss diff':>10} {'save s':>7} {'load s':>7}"
    print(f"{head}  written/local bytes per rank")
    for key in args.scenarios.split(","):
        title, fn = SCENARIOS[key]
        t0 = time.perf_counter()
        try:
            rows[key] = {"title": title, "status": "pass", "figures": fn()}
        except Exception as e:  # noqa: BLE001 - a failed scenario is a row of the table
            rows[key] = {"title": title, "status": "error", "error": str(e)[:2000]}
        rows[key]["seconds"] = time.perf_counter() - t0
        f = rows[key].get("figures", {})
        over = [
            (p, s)
            for p, s in zip(f.get("payload_bytes", []), f.get("local_state_bytes", []), strict=True)
            if p > s
        ]
        if over:
            rows[key]["status"] = "mismatch"
            rows[key]["error"] = f"a rank wrote more tensor bytes than it holds: {over}"
        elif key in EXACT and f.get("loss_diff", 0.0) != 0.0:
            rows[key]["status"] = "mismatch"
        elif f.get("loss_diff", 0.0) > 1e-5:
            rows[key]["status"] = "mismatch"
        ratio = ""
        if "bytes_written" in f:
            ratio = " ".join(
                f"{w}/{s}" for w, s in zip(f["bytes_written"], f["local_state_bytes"], strict=True)
            )
        print(
            f"{title:44} {rows[key]['status']:7} "
            f"{f.get('loss_diff', float('nan')):>10.2e} {f.get('save_s', float('nan')):>7.2f} "
            f"{f.get('load_s', float('nan')):>7.2f}  "
            f"{ratio or f.get('error', rows[key].get('error', ''))[:90]}"
        )
        out.parent.mkdir(parents=True, exist_ok=True)
        merged = json.loads(out.read_text())["scenarios"] if out.exists() else {}
        merged.update(rows)
        meta = {"torch": torch.__version__, "model": MODEL, "steps": STEPS, "save_at": SAVE_AT}
        try:
            from benchmarks.provenance import write_results
        except ImportError:  # run as a script: benchmarks/ itself is on sys.path
            from provenance import write_results

        write_results(out, {"meta": meta, "scenarios": merged})
        save_png(merged, out.with_suffix(".png"))
    print(f"wrote {out} and {out.with_suffix('.png')}")


if __name__ == "__main__":
    main()
