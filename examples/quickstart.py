"""Quick start (`make demo`): GPT-2 small through torch.compile(backend="torch_plugin").

The model is built from a `transformers` config with random weights (nothing downloaded),
captured at ATen level, sent through the C++ IR and pass pipeline, rebuilt as FX, and run.
Prints whether the compiled output matches eager and the time of each.
"""

from __future__ import annotations

import statistics
import time

import torch

import torch_plugin
from torch_plugin.backend import collect_stats


def median_ms(fn, reps: int = 5) -> float:
    times = []
    for _ in range(reps):
        t = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t) * 1e3)
    return statistics.median(times)


def main() -> None:
    torch.set_num_threads(2)
    model, (tokens,) = torch_plugin.models.build("gpt2", batch=1)  # GPT-2 small, 124M params
    model.eval()
    n_params = sum(p.numel() for p in model.parameters()) / 1e6
    print(f"GPT-2 small: {n_params:.1f}M parameters, input {tuple(tokens.shape)}")

    compiled = torch.compile(model, backend="torch_plugin", options={"passes": []})
    with torch.no_grad(), collect_stats() as stats:
        t = time.perf_counter()
        out = compiled(tokens)
        first_call_s = time.perf_counter() - t
        ref = model(tokens)
        eager_ms = median_ms(lambda: model(tokens))
        compiled_ms = median_ms(lambda: compiled(tokens))

    # Under no_grad the backend compiles an inference graph (no backward to plan for).
    (rec,) = [r for r in stats if r["kind"] in ("forward", "inference")]
    print(
        f"captured ATen graph: {rec['nodes']} FX nodes -> {rec['ir_nodes']} C++ IR nodes, "
        f"{rec['flops'] / 1e9:.1f} GFLOP modelled"
    )
    print(
        f"bridge: export {rec['export_ms']:.1f} ms, C++ verify {rec['verify_ms']:.2f} ms, "
        f"import {rec['import_ms']:.1f} ms (first call incl. Dynamo: {first_call_s:.1f} s)"
    )
    exact = torch.equal(out, ref)
    print(
        f"compiled output matches eager: {exact} (bit-exact: {exact}, "
        f"max abs diff {(out - ref).abs().max().item():.3g})"
    )
    print(f"eager    : {eager_ms:8.1f} ms / forward")
    print(f"compiled : {compiled_ms:8.1f} ms / forward  (ratio {compiled_ms / eager_ms:.3f})")
    if not exact:
        raise SystemExit("compiled output does not match eager")


if __name__ == "__main__":
    main()
