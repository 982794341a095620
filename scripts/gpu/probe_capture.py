"""Why the CUDA-graph candidate of the default compile is refused or fails on a decoder's graph
(issue 40, item 3: GPT-2's capture failed on the H100 with no reason recorded).

    python scripts/gpu/probe_capture.py            # on a GPU; on a CPU it checks the blockers only

Small library-default configs (sizes only) of GPT-2 and Llama: each Dynamo graph is compiled by
our Inductor candidate and captured by GraphReplay directly, and the first lines of any error's
traceback are printed, then the same model goes through the default compile and the search's
recorded failures are printed. Seconds, not minutes: it runs before the benchmarks.
"""

from __future__ import annotations

import traceback
from typing import Any

import torch
import transformers as tf

import torch_plugin  # noqa: F401  (registers the backend)
from torch_plugin import placement
from torch_plugin.placement import cuda_graphs
from torch_plugin.placement.backends import InductorBackend

DEV = "cuda" if torch.cuda.is_available() else "cpu"


def _models() -> dict[str, tuple[torch.nn.Module, torch.dtype]]:
    return {
        "gpt2": (tf.GPT2LMHeadModel(tf.GPT2Config(n_layer=2, n_embd=128, n_head=2)), torch.float32),
        "llama": (
            tf.LlamaForCausalLM(
                tf.LlamaConfig(
                    hidden_size=128,
                    intermediate_size=256,
                    num_hidden_layers=2,
                    num_attention_heads=4,
                    num_key_value_heads=2,
                    vocab_size=1000,
                )
            ),
            torch.bfloat16,
        ),
    }


def probe(name: str, model: torch.nn.Module, dtype: torch.dtype) -> None:
    model = model.to(DEV, dtype).eval()
    ids = torch.randint(5, 1000, (2, 32), device=DEV)
    mask = torch.ones(2, 32, dtype=torch.long, device=DEV)
    mask[1, 24:] = 0
    graphs: list[tuple[Any, list[Any]]] = []

    def grab(gm: Any, ex: list[Any]) -> Any:
        graphs.append((gm, list(ex)))
        return gm.forward

    torch._dynamo.reset()
    with torch.no_grad():
        torch.compile(model, backend=grab, dynamic=False)(input_ids=ids, attention_mask=mask)
        for i, (gm, ex) in enumerate(graphs):
            cpu = [
                f"{j}:{tuple(x.shape)}"
                for j, x in enumerate(ex)
                if isinstance(x, torch.Tensor) and x.device.type != "cuda"
            ]
            print(
                f"[{name} graph {i}] {len(gm.graph.nodes)} nodes, {len(ex)} inputs, "
                f"non-CUDA inputs {cpu[:6]}, blocker: {cuda_graphs.capture_blocker(gm, ex)}",
                flush=True,
            )
            if DEV != "cuda":
                continue
            try:
                fn = InductorBackend().compile(gm, ex, "graph")
                replay = cuda_graphs.GraphReplay(fn, ex)
                out = replay(*ex)
                print(f"[{name} graph {i}] captured; outputs {len(replay.outputs)}", flush=True)
                del out, replay
            except Exception:  # noqa: BLE001 - the probe's finding
                lines = traceback.format_exc().strip().splitlines()
                print(f"[{name} graph {i}] capture FAILED:\n  " + "\n  ".join(lines[-25:]))
        torch._dynamo.reset()
        with placement.record() as placed:
            torch.compile(model, backend="torch_plugin", dynamic=False)(
                input_ids=ids, attention_mask=mask
            )
    for r in placed:
        if r.whole_graph:
            print(f"[{name} default compile] pick {r.whole_graph['pick']}")
        for f in r.failures:
            print(f"[{name} default compile] failed: {f[:600]}")


def main() -> None:
    torch.manual_seed(0)
    print("device:", torch.cuda.get_device_name() if DEV == "cuda" else "cpu", flush=True)
    for name, (model, dtype) in _models().items():
        try:
            probe(name, model, dtype)
        except Exception:  # noqa: BLE001 - one model's crash leaves the other its say
            lines = traceback.format_exc().splitlines()[-15:]
            print(f"[{name}] probe crashed:\n  " + "\n  ".join(lines))


if __name__ == "__main__":
    main()
