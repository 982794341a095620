"""Graph -> IR -> text after importing a given module first (argv[1]; "none": nothing).

On the first GPU machine, PrintGraph crashed inside std::ostream << long once transformers and
its imports were loaded, but not in a process with only torch: this finds which import does it.
"""

import importlib
import sys

import torch
from torch.fx.experimental.proxy_tensor import make_fx

if len(sys.argv) > 1 and sys.argv[1] != "none":
    importlib.import_module(sys.argv[1])

from torch_plugin import fx_bridge  # noqa: E402


def f(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    return torch.nn.functional.linear(x, w).relu() * 2.5


gm = make_fx(f)(torch.randn(4, 8), torch.randn(16, 8))
g, ctx = fx_bridge.to_ir(gm, None)
text = str(g)
print(sys.argv[1:], "ok", len(text), flush=True)
