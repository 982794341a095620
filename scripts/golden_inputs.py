"""Writes the inputs (`*.before.ir`) of the C++ golden tests (tests/cpp/passes/golden_test.cc)
from real models' ATen graphs. The expected outputs (`*.after.txt`) are the tests' own:
refresh them with `TP_UPDATE_GOLDEN=1 build/core/tp_core_tests --gtest_filter='Golden*'`.

Run from the repository root: python scripts/golden_inputs.py
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests" / "python"))

from aten_graphs import forward_ir  # noqa: E402

from torch_plugin.models import hf_suite  # noqa: E402
from torch_plugin.models.llama import build_llama  # noqa: E402

DATA = ROOT / "tests" / "cpp" / "testdata"


def write(pass_name: str, case: str, text: str, header: list[str]) -> None:
    d = DATA / pass_name
    d.mkdir(parents=True, exist_ok=True)
    lines = [f"// {h}" for h in header]
    (d / f"{case}.before.ir").write_text("\n".join(lines) + "\n" + text)
    print(d / f"{case}.before.ir", len(text.splitlines()), "lines")


def main() -> None:
    torch.manual_seed(0)
    # HF Llama (1 layer, hidden 64, 4 heads / 2 kv heads), called the HF way, batch 2 x 8.
    model, inputs = hf_suite.build("llama", layers=1, pad=0)
    inputs = {k: v for k, v in inputs.items() if k != "labels"}
    llama = str(_hf_forward(model, inputs))
    origin = "HF LlamaForCausalLM, 1 layer, hidden 64, heads 4/2, batch 2 x 16 (inference)"
    for p in ("dead_code_elimination", "pipeline_partition", "placement_dp"):
        write(p, "hf_llama", llama, [origin, "made by scripts/golden_inputs.py"])
    # The same at width 16 (hidden 1024, 4 heads of 256, MLP 2048): big enough to shard.
    model = hf_suite.build_model("llama", layers=1, width=16).eval()
    wide = str(_hf_forward(model, inputs))
    origin = "HF LlamaForCausalLM, 1 layer, hidden 1024, heads 4/2, batch 2 x 16 (inference)"
    for p in ("sharding_ilp", "sharding_materialize"):
        header = [origin, "made by scripts/golden_inputs.py", "option world=4"]
        write(p, "hf_llama_wide", wide, header)
    # One decode step of the zoo's Llama with its KV caches as buffers (the cache_parallel site).
    zoo = build_llama(small=True).eval()
    decode = str(forward_ir(zoo, torch.zeros(2, 1, dtype=torch.long), 5))
    write(
        "cache_parallel",
        "llama_decode",
        decode,
        [
            "torch_plugin.models.llama (small), one decode step at position 5, batch 2",
            "made by scripts/golden_inputs.py",
        ],
    )


def _hf_forward(model: torch.nn.Module, inputs: dict) -> object:
    """forward_ir for a keyword call."""

    class Call(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.model = model

        def forward(self, input_ids, attention_mask):  # type: ignore[no-untyped-def]
            return self.model(input_ids=input_ids, attention_mask=attention_mask).logits

    return forward_ir(Call().eval(), inputs["input_ids"], inputs["attention_mask"])


if __name__ == "__main__":
    main()
