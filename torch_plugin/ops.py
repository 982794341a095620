"""Python side of torch.ops.torch_plugin.*: fake kernels (for tracing) and autograd formulas.

The schemas and CPU/CUDA kernels are registered in C++ (kernels/ops.cpp).
"""

from __future__ import annotations

import torch

from . import _C  # noqa: F401  (loads the library that defines the ops)


@torch.library.register_fake("torch_plugin::bias_gelu")
def _bias_gelu_fake(x: torch.Tensor, bias: torch.Tensor, approximate: str = "none") -> torch.Tensor:
    torch._check(bias.dim() == 1 and bias.shape[0] == x.shape[-1], lambda: "bias must match x[-1]")
    return torch.empty_like(x, memory_format=torch.contiguous_format)


@torch.library.register_fake("torch_plugin::bias_gelu_backward")
def _bias_gelu_backward_fake(
    grad: torch.Tensor, x: torch.Tensor, bias: torch.Tensor, approximate: str = "none"
) -> torch.Tensor:
    return torch.empty_like(x, memory_format=torch.contiguous_format)


def _bias_gelu_setup_context(ctx, inputs, output) -> None:  # type: ignore[no-untyped-def]
    x, bias, approximate = inputs
    ctx.save_for_backward(x, bias)
    ctx.approximate = approximate


def _bias_gelu_backward(ctx, grad: torch.Tensor):  # type: ignore[no-untyped-def]
    x, bias = ctx.saved_tensors
    grad_pre = torch.ops.torch_plugin.bias_gelu_backward(
        grad.contiguous(), x, bias, ctx.approximate
    )
    grad_bias = grad_pre.reshape(-1, grad_pre.shape[-1]).sum(0) if bias.requires_grad else None
    return grad_pre, grad_bias, None


torch.library.register_autograd(
    "torch_plugin::bias_gelu", _bias_gelu_backward, setup_context=_bias_gelu_setup_context
)


def bias_gelu(x: torch.Tensor, bias: torch.Tensor, approximate: str = "none") -> torch.Tensor:
    """gelu(x + bias) in one pass; bias is 1-D over x's last dimension."""
    return torch.ops.torch_plugin.bias_gelu(x, bias, approximate)
