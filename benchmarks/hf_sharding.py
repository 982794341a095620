"""An HF Llama trained on 4 gloo ranks the way a user would otherwise shard it, in one run.

The model (transformers' LlamaForCausalLM, random weights: 4 layers, hidden 256, 8 query / 4 KV
heads, MLP 688, vocabulary 2048) is called the HF way, `model(**inputs).loss`, on a batch of
8 x 128 tokens, and trained with AdamW by:

  single process     one process, 2 threads (the whole machine)
  ours               torch_plugin.parallelize(model, DeviceMesh(4), inputs): the ILP's plan
  ours, mesh auto    the same with mesh_shape="auto": the (dp, tp) shape it models fastest
  DTensor TP         torch.distributed.tensor.parallel.parallelize_module with Megatron's
                     column/row plan on every layer (embedding and LM head replicated)
  FSDP2              torch.distributed.fsdp.fully_shard on every layer and the root

Each distributed run has 4 ranks of 1 thread on this 2-core machine (oversubscribed alike for
all). Reported per contender: tokens/s (median step after 2 warm-up steps) and its ratio to
each other contender, the parameter bytes one rank holds, and the first step's loss against
one process's.

    python benchmarks/hf_sharding.py [--steps 6]

Prints a table; writes benchmarks/results/hf_sharding.{json,png}.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch
import torch.multiprocessing as mp

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results"
WORLD = 4
BATCH, SEQ = 8, 128
CONFIG = dict(
    vocab_size=2048,
    hidden_size=256,
    intermediate_size=688,
    num_hidden_layers=4,
    num_attention_heads=8,
    num_key_value_heads=4,
    max_position_embeddings=SEQ,
    use_cache=False,
    attn_implementation="sdpa",
)
CONTENDERS = ["ours", "ours_auto", "dtensor_tp", "fsdp2"]


def build() -> tuple[torch.nn.Module, dict[str, torch.Tensor]]:
    import transformers

    torch.manual_seed(0)
    config = transformers.LlamaConfig(**CONFIG)
    model = transformers.LlamaForCausalLM(config).train()
    gen = torch.Generator().manual_seed(1)
    ids = torch.randint(0, CONFIG["vocab_size"], (BATCH, SEQ), generator=gen)
    return model, {"input_ids": ids, "attention_mask": torch.ones_like(ids), "labels": ids}


def _timed_steps(model: Any, inputs: dict[str, Any], opt: Any, steps: int) -> dict[str, Any]:
    """2 warm-up steps, then `steps` timed; the first step's loss."""
    losses, times = [], []
    for i in range(2 + steps):
        t0 = time.perf_counter()
        loss = model(**inputs).loss
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        if torch.distributed.is_initialized():
            torch.distributed.barrier()
        if i >= 2:
            times.append(time.perf_counter() - t0)
        losses.append(float(loss.detach()))
    step_s = statistics.median(times)
    return {"step_s": step_s, "tokens_per_s": BATCH * SEQ / step_s, "first_loss": losses[0]}


def _local_bytes(model: torch.nn.Module) -> int:
    total = 0
    for p in model.parameters():
        t = p.to_local() if hasattr(p, "to_local") else p
        total += t.numel() * t.element_size()
    return total


def dtensor_megatron(model: torch.nn.Module, mesh: Any) -> torch.nn.Module:
    """What a user hand-writes for an HF Llama with DTensor: Megatron's column / row plan on
    every layer (q/k/v/gate/up column-parallel, o/down row-parallel), the rest replicated."""
    from torch.distributed.tensor.parallel import (
        ColwiseParallel,
        RowwiseParallel,
        parallelize_module,
    )

    plan: dict[str, Any] = {}
    for i in range(model.config.num_hidden_layers):
        p = f"model.layers.{i}."
        for col in ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj"):
            plan[p + col] = ColwiseParallel()
        plan[p + "self_attn.o_proj"] = RowwiseParallel()
        plan[p + "mlp.gate_proj"] = ColwiseParallel()
        plan[p + "mlp.up_proj"] = ColwiseParallel()
        plan[p + "mlp.down_proj"] = RowwiseParallel()
    return parallelize_module(model, mesh, plan)


def _rank(rank: int, port: int, contender: str, steps: int, out: str) -> None:
    import warnings

    import torch.distributed as dist

    warnings.filterwarnings("ignore")
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    dist.init_process_group(
        "gloo", rank=rank, world_size=WORLD, timeout=datetime.timedelta(seconds=300)
    )
    try:
        model, inputs = build()
        if contender.startswith("ours"):
            import torch_plugin

            mesh = torch_plugin.DeviceMesh((WORLD,))
            shape = "auto" if contender == "ours_auto" else None
            dm = torch_plugin.parallelize(model, mesh, inputs, mesh_shape=shape)
            opt = dm.optimizer(torch.optim.AdamW, lr=1e-3)
            local = dm.local_parameter_bytes()
            extra = {"mesh": list(dm.mesh.shape), "plan_comm_ms": dm.plan.comm_s * 1e3}
        else:
            from torch.distributed.device_mesh import init_device_mesh

            mesh = init_device_mesh("cpu", (WORLD,))
            if contender == "dtensor_tp":
                dm = dtensor_megatron(model, mesh)
            else:
                from torch.distributed.fsdp import fully_shard

                for layer in model.model.layers:
                    fully_shard(layer, mesh=mesh)
                dm = fully_shard(model, mesh=mesh)
            opt = torch.optim.AdamW(dm.parameters(), lr=1e-3)
            local = _local_bytes(dm)
            extra = {}
        r = {**_timed_steps(dm, inputs, opt, steps), "param_bytes_per_rank": local, **extra}
    except Exception as e:  # noqa: BLE001 - a contender that fails is a row saying why
        r = {"error": f"{type(e).__name__}: {str(e).splitlines()[0][:200]}"}
    Path(out, f"{contender}.{rank}.json").write_text(json.dumps(r))
    dist.destroy_process_group()


def run_distributed(contender: str, steps: int) -> dict[str, Any]:
    from hf_suite import free_port

    port = free_port()
    with tempfile.TemporaryDirectory() as out:
        mp.spawn(_rank, args=(port, contender, steps, out), nprocs=WORLD, join=True)
        ranks = [json.loads(Path(out, f"{contender}.{r}.json").read_text()) for r in range(WORLD)]
    errors = [r["error"] for r in ranks if "error" in r]
    if errors:
        return {"error": errors[0]}
    # The slowest rank's step is the step; the largest rank's bytes are the memory.
    row = dict(ranks[0])
    row["step_s"] = max(r["step_s"] for r in ranks)
    row["tokens_per_s"] = BATCH * SEQ / row["step_s"]
    row["param_bytes_per_rank"] = max(r["param_bytes_per_rank"] for r in ranks)
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=6)
    args = parser.parse_args()
    torch.set_num_threads(2)
    model, inputs = build()
    whole = sum(p.numel() * p.element_size() for p in model.parameters())
    rows: dict[str, dict[str, Any]] = {
        "single": {
            **_timed_steps(
                model, inputs, torch.optim.AdamW(model.parameters(), lr=1e-3), args.steps
            ),
            "param_bytes_per_rank": whole,
        }
    }
    for c in CONTENDERS:
        print(f"running {c} on {WORLD} ranks ...", flush=True)
        rows[c] = run_distributed(c, args.steps)
    ref_loss = rows["single"]["first_loss"]
    for r in rows.values():
        if "error" not in r:
            r["param_fraction"] = r["param_bytes_per_rank"] / whole
            r["loss_rel_diff"] = abs(r["first_loss"] - ref_loss) / abs(ref_loss)
    ratios = {
        f"{a}_vs_{b}": rows[a]["tokens_per_s"] / rows[b]["tokens_per_s"]
        for a in ("ours", "ours_auto")
        for b in ("single", "dtensor_tp", "fsdp2")
        if "error" not in rows[a] and "error" not in rows[b]
    }
    print(
        f"\n{'contender':12s} {'tokens/s':>10s} {'step ms':>9s} {'params/rank':>12s} "
        f"{'fraction':>9s} {'loss diff':>10s}"
    )
    for name, r in rows.items():
        if "error" in r:
            print(f"{name:12s} {r['error']}")
            continue
        print(
            f"{name:12s} {r['tokens_per_s']:10.0f} {r['step_s'] * 1e3:9.1f} "
            f"{r['param_bytes_per_rank']:12,d} {r['param_fraction']:9.3f} "
            f"{r['loss_rel_diff']:10.1e}"
        )
    for k, v in ratios.items():
        print(f"{k}: {v:.2f}x tokens/s")
    RESULTS.mkdir(parents=True, exist_ok=True)
    data = {
        "config": CONFIG,
        "batch": BATCH,
        "seq": SEQ,
        "world": WORLD,
        "ranks": f"{WORLD} gloo ranks of 1 thread on {os.cpu_count()} cores",
        "torch": torch.__version__,
        "contenders": rows,
        "ratios": ratios,
    }
    try:
        from benchmarks.provenance import write_results
    except ImportError:  # run as a script: benchmarks/ itself is on sys.path
        from provenance import write_results

    write_results(RESULTS / "hf_sharding.json", data)
    _png(rows, RESULTS / "hf_sharding.png")
    print(f"wrote {RESULTS / 'hf_sharding.json'}")


def _png(rows: dict[str, dict[str, Any]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = [n for n, r in rows.items() if "error" not in r]
    fig, axes = plt.subplots(1, 2, figsize=(9, 3.2))
    axes[0].bar(names, [rows[n]["tokens_per_s"] for n in names], color="#3a7dc9")
    axes[0].set_ylabel("tokens/s (training)")
    axes[1].bar(names, [rows[n]["param_fraction"] for n in names], color="#3a9d5d")
    axes[1].set_ylabel("parameter bytes per rank / whole")
    for ax in axes:
        ax.tick_params(axis="x", labelsize=7, rotation=20)
    fig.suptitle(f"HF Llama on {WORLD} gloo ranks (2 cores), batch {BATCH} x {SEQ}", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT))
    main()
