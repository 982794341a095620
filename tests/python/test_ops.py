"""torch.ops.torch_plugin.bias_gelu: the CPU kernel (twin of the CUDA one) against PyTorch.

Oracle (flash-attention's): our error against an fp64 reference must be at most twice the error
of PyTorch's own `gelu(x + b)` in the same dtype, plus a few ulps."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import torch_plugin
from torch_plugin.ops import bias_gelu

DTYPES = [torch.float32, torch.float64, torch.bfloat16, torch.float16]


def reference(x, b, approximate, dtype):
    return F.gelu(x.to(dtype) + b.to(dtype), approximate=approximate)


@pytest.mark.parametrize("approximate", ["none", "tanh"])
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", [(4, 64), (3, 5, 13), (1, 1), (7,), (0, 8), (257, 33)])
def test_forward_matches_pytorch(shape, dtype, approximate) -> None:
    x = torch.randn(shape, dtype=torch.float64) * 3
    b = torch.randn(shape[-1], dtype=torch.float64)
    exact = reference(x, b, approximate, torch.float64)
    ours = bias_gelu(x.to(dtype), b.to(dtype), approximate).double()
    theirs = reference(x, b, approximate, dtype).double()
    if exact.numel() == 0:
        assert ours.shape == exact.shape
        return
    eps = torch.finfo(dtype).eps
    our_err = (ours - exact).abs().max().item()
    their_err = (theirs - exact).abs().max().item()
    assert our_err <= 2 * their_err + 4 * eps * exact.abs().max().item() + 1e-12, (
        our_err,
        their_err,
    )


@pytest.mark.parametrize("approximate", ["none", "tanh"])
def test_gradients_match_autograd(approximate) -> None:
    x = torch.randn(6, 10, dtype=torch.float64, requires_grad=True)
    b = torch.randn(10, dtype=torch.float64, requires_grad=True)
    torch.autograd.gradcheck(lambda x, b: bias_gelu(x, b, approximate), (x, b))
    g = torch.randn(6, 10, dtype=torch.float64)
    gx, gb = torch.autograd.grad(bias_gelu(x, b, approximate), (x, b), g)
    rx, rb = torch.autograd.grad(reference(x, b, approximate, torch.float64), (x, b), g)
    torch.testing.assert_close(gx, rx, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(gb, rb, rtol=1e-12, atol=1e-12)


def test_opcheck() -> None:
    x = torch.randn(4, 8, requires_grad=True)
    b = torch.randn(8, requires_grad=True)
    torch.library.opcheck(torch.ops.torch_plugin.bias_gelu.default, (x, b, "tanh"))
    torch.library.opcheck(torch.ops.torch_plugin.bias_gelu.default, (x.detach(), b.detach()))


def test_non_contiguous_input() -> None:
    x = torch.randn(16, 8).t()  # [8, 16], not contiguous
    b = torch.randn(16)
    torch.testing.assert_close(bias_gelu(x, b), F.gelu(x + b))


def test_works_inside_torch_compile() -> None:
    x, b = torch.randn(4, 32, requires_grad=True), torch.randn(32, requires_grad=True)
    f = torch.compile(lambda x, b: bias_gelu(x, b) * 2, backend="torch_plugin")
    out = f(x, b)
    out.sum().backward()
    torch.testing.assert_close(out, F.gelu(x + b) * 2)
    gx = x.grad.clone()
    x.grad = None
    (F.gelu(x + b) * 2).sum().backward()
    torch.testing.assert_close(gx, x.grad)


@pytest.mark.parametrize(
    "args, fragment",
    [
        ((torch.randn(4, 8), torch.randn(7)), "bias must be 1-D with size x.size(-1) = 8"),
        ((torch.randn(4, 8), torch.randn(2, 4)), "bias must be 1-D"),
        ((torch.randn(4, 8), torch.randn(8, dtype=torch.float64)), "must share a dtype"),
        ((torch.ones(4, 8, dtype=torch.int64), torch.ones(8, dtype=torch.int64)), "not supported"),
        ((torch.randn(4, 8), torch.randn(8), "erf"), "approximate must be 'none' or 'tanh'"),
        ((torch.tensor(1.0), torch.randn(1)), "at least one dimension"),
    ],
)
def test_bad_inputs_raise_clear_errors(args, fragment) -> None:
    with pytest.raises(RuntimeError, match=fragment.replace("(", r"\(").replace(")", r"\)")):
        torch.ops.torch_plugin.bias_gelu(*args)


def test_backward_op_checks_grad_shape() -> None:
    with pytest.raises(RuntimeError, match="grad must have x's shape"):
        torch.ops.torch_plugin.bias_gelu_backward(
            torch.randn(3, 8), torch.randn(4, 8), torch.randn(8)
        )


def test_cuda_kernel_when_available() -> None:
    if not torch.cuda.is_available():
        pytest.skip("no GPU here: the CUDA kernel is compile-checked by `make cuda-check`")
    x = torch.randn(64, 1024, device="cuda")
    b = torch.randn(1024, device="cuda")
    torch.testing.assert_close(bias_gelu(x, b).cpu(), bias_gelu(x.cpu(), b.cpu()))
    assert torch_plugin  # imported for op registration


@pytest.mark.parametrize("shape", [(2, 16, 64), (5, 13), (3, 1)])
@pytest.mark.parametrize("residual", [False, True])
def test_add_layer_norm_stats_match_native_layer_norm(shape, residual) -> None:
    """The fused layer norm of training forwards: its sum, output, mean and rstd are ATen's
    (the backward consumes mean and rstd); opcheck covers both kernels' fake shapes."""
    x, r = torch.randn(shape), torch.randn(shape)
    w, b = torch.randn(shape[-1]), torch.randn(shape[-1])
    res = r if residual else None
    got = torch.ops.torch_plugin.add_layer_norm_stats(x, res, w, b, 1e-5)
    s = x + r if residual else x
    want = torch.native_layer_norm(s, [shape[-1]], w, b, 1e-5)
    assert got[0].numel() == (s.numel() if residual else 0)
    if residual:
        torch.testing.assert_close(got[0], s)
    for a, e in zip(got[1:], want, strict=True):
        assert a.shape == e.shape
        torch.testing.assert_close(a, e, rtol=1e-5, atol=1e-5)
    torch.library.opcheck(torch.ops.torch_plugin.add_layer_norm_stats.default, (x, res, w, b, 1e-5))
    torch.library.opcheck(torch.ops.torch_plugin.add_layer_norm.default, (x, res, w, b, 1e-5))
