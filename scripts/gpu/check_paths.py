"""The GPU paths that CI (no GPU) cannot run, checked on a lent GPU under torchrun:

    torchrun --nproc-per-node 1 scripts/gpu/check_paths.py --out DIR

1. placement on CUDA tensors (aten, fused, inductor candidates), against eager: each backend's
   whole graph, then with the finer search within its budget (placement_refine), and HF BERT
   called with keyword arguments (placement_bert: the direct path against Inductor);
2. the default `torch.compile(backend="torch_plugin")` on CUDA against eager and Inductor;
3. NCCL: `parallelize` on a torch_plugin DeviceMesh over NCCL, 3 AdamW steps of an HF Llama
   called the HF way, against one process;
4. NCCL: `cache_parallel(hf_model, mesh).generate()` against eager `generate()`.

One GPU allows one NCCL rank (NCCL refuses two ranks on one device), so the collectives run
at world 1: the code paths, dtypes and devices are checked, not the traffic. Each check prints
one line and its figures go to DIR/gpu_paths.json.
"""

from __future__ import annotations

import argparse
import copy
import json
import logging
import statistics
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

import torch_plugin
from torch_plugin.models import hf_suite

DEV = "cuda" if torch.cuda.is_available() else "cpu"  # cpu: a dry run of this script


def sync() -> None:
    if DEV == "cuda":
        torch.cuda.synchronize()


def ms(fn: Callable[[], Any], seconds: float = 0.5) -> float:
    for _ in range(3):
        fn()
    sync()
    times = []
    end = time.perf_counter() + seconds
    while time.perf_counter() < end or len(times) < 5:
        t = time.perf_counter()
        fn()
        sync()
        times.append((time.perf_counter() - t) * 1e3)
    return statistics.median(times)


def kernels(fn: Callable[[], Any], calls: int = 10) -> dict[str, Any]:
    """Device kernels per call and their time, and the five costliest: why two callables that
    run the same compiled graph differ (extra copies, another kernel choice)."""
    from torch.profiler import ProfilerActivity, profile

    fn()
    sync()
    act = [ProfilerActivity.CUDA] if DEV == "cuda" else [ProfilerActivity.CPU]
    with profile(activities=act) as prof:
        for _ in range(calls):
            fn()
        sync()
    attr = "device_time_total" if DEV == "cuda" else "self_cpu_time_total"
    rows = [e for e in prof.key_averages() if getattr(e, attr) > 0]
    if DEV == "cuda":
        rows = [e for e in rows if e.device_type == torch.autograd.DeviceType.CUDA]
    rows.sort(key=lambda e: -getattr(e, attr))
    return {
        "kernels_per_call": sum(e.count for e in rows) / calls,
        "device_us_per_call": sum(getattr(e, attr) for e in rows) / calls,
        "top": [
            f"{e.key[:60]} x{e.count // calls}: {getattr(e, attr) / calls:.1f} us" for e in rows[:5]
        ],
    }


def on_cuda(inputs: dict[str, Any]) -> dict[str, Any]:
    return {k: v.to(DEV) if isinstance(v, torch.Tensor) else v for k, v in inputs.items()}


def inference_case(name: str, seq: int) -> tuple[torch.nn.Module, dict[str, Any]]:
    """A suite model at width 4 in eval mode on the device, and its inputs without labels."""
    model = hf_suite.build_model(name, width=4).eval().to(DEV)
    inputs = on_cuda(hf_suite.make_inputs(name, batch=8, seq=seq, pad=0))
    inputs.pop("labels")
    return model, inputs


def check_placement(name: str = "gpt2", refine: bool = False) -> dict[str, Any]:
    """Each backend's whole graph (bounded time); with `refine`, also the finer search within
    whole_graph_first's budget (2.5x Inductor's compile of the same graph). `direct`: whether
    the HF keyword call skips Dynamo (not for GPT-2, whose output holds its KV cache)."""
    model, inputs = inference_case(name, 64)
    with torch.no_grad():
        want = model(**inputs).logits
        t0 = time.perf_counter()
        placed = torch_plugin.place(
            model,
            inputs,
            backends=("aten", "fused", "inductor"),
            search="whole_graph_first",
            allow_refine=refine,
        )
        search_s = time.perf_counter() - t0
        got = placed(**inputs).logits
        err = float((got - want).abs().max())
        compiled = torch.compile(model)
        compiled(**inputs)
        out = {
            "max_abs_diff": err,
            "search_s": search_s,
            "eager_ms": ms(lambda: model(**inputs)),
            "inductor_ms": ms(lambda: compiled(**inputs)),
            "placed_ms": ms(lambda: placed(**inputs)),
            "backends": placed.placement.backend_counts(),
            "direct": placed.direct is not None,
            "search": placed.placement.summary(),
            "inductor_kernels": kernels(lambda: compiled(**inputs)),
            "placed_kernels": kernels(lambda: placed(**inputs)),
        }
    out["ok"] = err < 1e-3
    return out


def check_default_compile() -> dict[str, Any]:
    model, inputs = inference_case("llama", 128)
    with torch.no_grad():
        want = model(**inputs).logits
        t0 = time.perf_counter()
        ours = torch.compile(model, backend="torch_plugin")
        got = ours(**inputs).logits
        first_s = time.perf_counter() - t0
        ind = torch.compile(copy.deepcopy(model))
        ind(**inputs)
        out = {
            "max_abs_diff": float((got - want).abs().max()),
            "first_call_s": first_s,
            "eager_ms": ms(lambda: model(**inputs)),
            "inductor_ms": ms(lambda: ind(**inputs)),
            "ours_ms": ms(lambda: ours(**inputs)),
            "inductor_kernels": kernels(lambda: ind(**inputs)),
            "ours_kernels": kernels(lambda: ours(**inputs)),
        }
    out["ok"] = out["max_abs_diff"] < 1e-3
    return out


def check_parallelize(mesh: Any) -> dict[str, Any]:
    model, inputs = hf_suite.build("llama")
    model = model.to(DEV)
    inputs = on_cuda(inputs)
    ref = copy.deepcopy(model)
    sharded = torch_plugin.parallelize(model, mesh, inputs)
    opt = torch.optim.AdamW(sharded.parameters(), lr=1e-3)
    ref_opt = torch.optim.AdamW(ref.parameters(), lr=1e-3)
    losses, ref_losses = [], []
    for _ in range(3):
        loss = sharded(**inputs).loss
        loss.backward()
        opt.step()
        opt.zero_grad()
        losses.append(float(loss))
        r = ref(**inputs).loss
        r.backward()
        ref_opt.step()
        ref_opt.zero_grad()
        ref_losses.append(float(r))
    diff = max(abs(a - b) for a, b in zip(losses, ref_losses, strict=True))
    return {"losses": losses, "ref_losses": ref_losses, "max_diff": diff, "ok": diff < 1e-4}


def check_generate(mesh: Any) -> dict[str, Any]:
    model = hf_suite.build_model("llama").eval().to(DEV)
    model.config.use_cache = True
    gen = torch.Generator().manual_seed(3)
    ids = torch.randint(3, 100, (2, 12), generator=gen).to(DEV)
    mask = torch.ones_like(ids)
    ids[1, :4] = 0
    mask[1, :4] = 0  # left padding: prompts of different lengths
    kw = dict(max_new_tokens=32, do_sample=False, pad_token_id=0)
    with torch.no_grad():
        want = model.generate(input_ids=ids, attention_mask=mask, **kw)
        cp = torch_plugin.cache_parallel(copy.deepcopy(model), mesh)
        got = cp.generate(input_ids=ids, attention_mask=mask, **kw)
    same = bool(torch.equal(got.cpu(), want.cpu()))
    return {"same_tokens": same, "ok": same}


def check_dropout_replay() -> dict[str, Any]:
    """What the pipeline and dp-replica replay of dropout assumes on this device: a traced
    nn.Dropout is one native_dropout here, and the rows native_dropout_rows gives two replicas
    (each from the same generator state) are one process's F.dropout over the whole batch."""
    import torch.nn.functional as F

    from torch_plugin.runtime.capture import trace_call
    from torch_plugin.runtime.spmd_ops import native_dropout_rows

    drop = torch.nn.Dropout(0.1).to(DEV)
    traced = trace_call(drop, ((torch.randn(4, 16, device=DEV),), {}))
    ops = sorted({str(n.target) for n in traced.gm.graph.nodes if n.op == "call_function"})
    x = torch.randn(8, 128, 768, device=DEV)
    torch.manual_seed(1)
    want = F.dropout(x, 0.1, training=True)
    parts = []
    for offset in (0, 4):
        torch.manual_seed(1)
        part = native_dropout_rows(
            x[offset : offset + 4].clone(), 0.1, True, total=8, offset=offset, batch=4
        )
        parts.append(part[0])
    diff = float((torch.cat(parts) - want).abs().max())
    fused = any("native_dropout" in op for op in ops)
    return {"traced_ops": ops, "max_abs_diff": diff, "ok": diff < 1e-6 and (fused or DEV == "cpu")}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="build/gpu")
    ap.add_argument("--only", default=None, help="run one check (run.sh runs each alone)")
    args = ap.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    name = torch.cuda.get_device_name() if DEV == "cuda" else "cpu (dry run)"
    results: dict[str, Any] = {"device": name, "torch": torch.__version__}
    # Timestamped progress: a check cut off by its time limit shows where it was.
    logging.basicConfig(format="%(relativeCreated)8.0f ms %(name)s: %(message)s")
    logging.getLogger("torch_plugin").setLevel(logging.INFO)
    mesh = torch_plugin.DeviceMesh.from_torchrun(timeout_s=120)
    results["mesh_backend"] = torch.distributed.get_backend()
    checks = [
        ("placement", check_placement),
        ("placement_refine", lambda: check_placement(refine=True)),
        ("placement_bert", lambda: check_placement("bert")),
        ("default_compile", check_default_compile),
        ("parallelize_nccl", lambda: check_parallelize(mesh)),
        ("generate_nccl", lambda: check_generate(mesh)),
        ("dropout_replay", check_dropout_replay),
    ]
    for name, fn in checks:
        if args.only is not None and name != args.only:
            continue
        t0 = time.perf_counter()
        try:
            res = fn()
        except Exception as e:  # noqa: BLE001  (every check reports, none stops the others)
            res = {"ok": False, "error": f"{type(e).__name__}: {str(e)[:400]}"}
            traceback.print_exc()
        res["seconds"] = round(time.perf_counter() - t0, 1)
        results[name] = res
        shown = {k: v for k, v in res.items() if k not in ("losses", "ref_losses")}
        print(f"[{'ok' if res['ok'] else 'FAIL'}] {name}: {shown}", flush=True)
        (out / f"gpu_paths_{name}.json").write_text(json.dumps(results, indent=1, default=str))
    torch.distributed.destroy_process_group()


if __name__ == "__main__":
    main()
