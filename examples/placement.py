"""Backend placement: run each part of a model on the backend that is fastest for it.

    python examples/placement.py [--model bert] [--batch 1] [--backends aten,fused,onnxruntime]

Builds a zoo model (random weights), places it (`torch_plugin.place`: candidates from the C++
pattern rules, each measured on every backend with the model's real inputs, the C++ dynamic
program, then the evolutionary search over graph compilers), checks the outputs against eager,
prints which backend runs which ops and the latencies, and saves the picture to placement.png.
A second call shows the warm path: every measurement and decision comes from the profile cache.
"""

from __future__ import annotations

import argparse
import time

import torch

import torch_plugin
from torch_plugin.models import build
from torch_plugin.placement.planner import time_call


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="bert")
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--backends", default="aten,fused,openvino,onnxruntime")
    ap.add_argument("--cache", default=None, help="profile cache path (default: ~/.cache/...)")
    ap.add_argument("--png", default="placement.png")
    args = ap.parse_args()

    model, inputs = build(args.model, small=True, batch=args.batch)
    model.eval()
    for attempt in ("first call", "second call (warm cache)"):
        torch._dynamo.reset()
        t0 = time.perf_counter()
        placed = torch_plugin.place(
            model, inputs, backends=args.backends.split(","), cache_path=args.cache, progress=True
        )
        print(f"{attempt}: placement took {time.perf_counter() - t0:.1f} s")
    with torch.no_grad():
        want, got = model(*inputs), placed(*inputs)
        want = want.logits if hasattr(want, "logits") else want
        got = got.logits if hasattr(got, "logits") else got
        torch.testing.assert_close(got, want, rtol=1e-3, atol=1e-3)
        eager_ms = time_call(model, inputs, 9) * 1e3
        placed_ms = time_call(placed, inputs, 9) * 1e3
    print(placed.placement.table())
    print(f"eager {eager_ms:.3f} ms, placed {placed_ms:.3f} ms ({eager_ms / placed_ms:.2f}x)")
    placed.placement.save_png(args.png)
    print(f"wrote {args.png}")


if __name__ == "__main__":
    main()
