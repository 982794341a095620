"""Pretrained weights into rank blocks at the size that needs sharding (issue 38 item 4): a Llama
config of about 1B parameters (hidden 2048, 16 layers, vocab 32000, intermediate 5632) saved
with HF's save_pretrained (sharded safetensors + index), then read by 4 gloo ranks from a model
built on the meta device with `parallelize(..., pretrained=dir)`. Per rank: the peak RSS above
the process's own baseline (measured after imports and joining the group) against the whole
model's bytes, the load time, and the forward loss against one process's on the same weights.
Writes benchmarks/results/pretrained_load.json.

    python benchmarks/pretrained_load.py [--layers 16] [--world 4]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

sys.path.insert(0, str(Path(__file__).resolve().parent))
from provenance import provenance  # noqa: E402

OUT = Path(__file__).resolve().parent / "results" / "pretrained_load.json"


def _config(layers: int) -> Any:
    import transformers

    return transformers.LlamaConfig(
        vocab_size=32000,
        hidden_size=2048,
        intermediate_size=5632,
        num_hidden_layers=layers,
        num_attention_heads=32,
    )


def _batch() -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(1, 32000, (2, 16), generator=g)
    return {"input_ids": ids, "labels": ids}


def _peak_mb() -> float:
    """This process's peak resident set (VmHWM). Not getrusage's ru_maxrss: Linux carries the
    parent's high-water mark across the spawn's fork + exec into it."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    return float("nan")


def _current_mb() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def _worker(rank: int, world: int, port: int, args: Any, path: str, out: Any) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    os.environ.update(RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK=str(rank))
    torch.set_num_threads(1)
    import transformers

    import torch_plugin

    mesh = torch_plugin.DeviceMesh.from_torchrun(timeout_s=600)
    batch = _batch()
    baseline = _current_mb()
    baseline_peak = _peak_mb()
    with torch.device("meta"):
        model = transformers.LlamaForCausalLM(_config(args.layers))
    t = time.perf_counter()
    sharded = torch_plugin.parallelize(model, mesh, batch, pretrained=path)
    parallelize_s = time.perf_counter() - t
    sharded.eval()
    with torch.no_grad():
        loss = float(sharded(**batch).loss)
    out[rank] = {
        "rank": rank,
        "baseline_mb": baseline,
        "baseline_peak_mb": baseline_peak,
        "peak_mb": _peak_mb(),
        "peak_above_baseline_mb": _peak_mb() - baseline,
        "local_param_mb": sharded.local_parameter_bytes() / 2**20,
        "load_s": sharded.pretrained_report["seconds"],
        "read_mb": sharded.pretrained_report["bytes_read"] / 2**20,
        "parallelize_s": parallelize_s,
        "loss": loss,
    }
    dist.destroy_process_group()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--layers", type=int, default=16)
    ap.add_argument("--world", type=int, default=4)
    args = ap.parse_args()
    import transformers

    tmp = Path(tempfile.mkdtemp(prefix="tp_pretrained_"))
    try:
        torch.manual_seed(0)
        model = transformers.LlamaForCausalLM(_config(args.layers)).eval()
        params = sum(p.numel() for p in model.parameters())
        model_mb = sum(p.numel() * p.element_size() for p in model.parameters()) / 2**20
        with torch.no_grad():
            expect = float(model(**_batch()).loss)
        t = time.perf_counter()
        model.save_pretrained(tmp, max_shard_size="1GB")
        save_s = time.perf_counter() - t
        del model
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        with mp.Manager() as manager:
            out = manager.dict()
            mp.spawn(
                _worker, args=(args.world, port, args, str(tmp), out), nprocs=args.world, join=True
            )
            ranks = [dict(out[r]) for r in range(args.world)]
        files = sorted(p.name for p in tmp.iterdir())
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    worst = max(r["peak_above_baseline_mb"] for r in ranks)
    data = {
        "benchmark": "pretrained_load",
        "command": "python benchmarks/pretrained_load.py " + " ".join(sys.argv[1:]),
        **provenance(),
        "model": f"Llama hidden 2048, {args.layers} layers, vocab 32000, intermediate 5632",
        "params": params,
        "model_mb": model_mb,
        "checkpoint_files": files,
        "save_pretrained_s": save_s,
        "ranks": args.world,
        "one_process_loss": expect,
        "max_loss_diff": max(abs(r["loss"] - expect) for r in ranks),
        "worst_peak_above_baseline_of_model": worst / model_mb,
        "per_rank": ranks,
    }
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text(json.dumps(data, indent=2) + "\n")
    print(f"{params / 1e9:.2f}B parameters, {model_mb:.0f} MB; files {files}")
    for r in ranks:
        print(
            f"rank {r['rank']}: peak {r['peak_mb']:.0f} MB, baseline {r['baseline_mb']:.0f} MB, "
            f"above baseline {r['peak_above_baseline_mb']:.0f} MB "
            f"({r['peak_above_baseline_mb'] / model_mb:.2f} of the model), blocks "
            f"{r['local_param_mb']:.0f} MB, read {r['read_mb']:.0f} MB in {r['load_s']:.1f} s, "
            f"parallelize {r['parallelize_s']:.1f} s, loss {r['loss']:.6f} (one process "
            f"{expect:.6f})"
        )
    print(f"wrote {OUT}")


if __name__ == "__main__":
    main()
