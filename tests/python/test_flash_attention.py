"""torch_plugin::attention (kernels/cpu/flash_attention.cc), the fused backend's prefill
attention, against ATen's _scaled_dot_product_flash_attention_for_cpu, the op it replaces."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import torch_plugin  # noqa: F401 - registers torch.ops.torch_plugin

ours = torch.ops.torch_plugin.attention.default
aten = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu.default


def qkv(b, h, hkv, sq, sk, d, dv=None, seed=0, transposed=False):  # type: ignore[no-untyped-def]
    """Random q, k, v; transposed: stored as [B, S, H, D] and viewed as [B, H, S, D], which is
    what a transformer's head split gives SDPA."""
    g = torch.Generator().manual_seed(seed)
    dv = d if dv is None else dv
    if transposed:
        q = torch.randn(b, sq, h, d, generator=g).transpose(1, 2)
        k = torch.randn(b, sk, hkv, d, generator=g).transpose(1, 2)
        v = torch.randn(b, sk, hkv, dv, generator=g).transpose(1, 2)
        return q, k, v
    return (
        torch.randn(b, h, sq, d, generator=g),
        torch.randn(b, hkv, sk, d, generator=g),
        torch.randn(b, hkv, sk, dv, generator=g),
    )


@pytest.mark.parametrize(
    "b,h,sq,sk,d,transposed",
    [
        (1, 12, 128, 128, 64, True),  # BERT-base's shape, as the model lays it out
        (2, 4, 45, 45, 20, False),  # a partial query block; head_dim off the 8/16 lanes
        (2, 3, 70, 300, 64, True),  # keys over several online-softmax steps; Sq != Sk
        (1, 2, 1, 257, 32, False),  # one query row; a one-key last step
        (3, 2, 5, 7, 8, False),  # tiny
    ],
)
@pytest.mark.parametrize("masked", ["none", "causal", "padding", "full"])
def test_matches_aten_flash_attention(b, h, sq, sk, d, transposed, masked) -> None:  # type: ignore[no-untyped-def]
    q, k, v = qkv(b, h, h, sq, sk, d, transposed=transposed)
    kwargs: dict = {}
    causal = masked == "causal"
    if masked == "padding":  # HF's padding mask: [B, 1, 1, Sk], finfo.min past each length
        mask = torch.zeros(b, 1, 1, sk)
        for i in range(b):
            mask[i, ..., max(1, sk - 3 * i - 1) :] = torch.finfo(torch.float32).min
        kwargs["attn_mask"] = mask
    elif masked == "full":  # GPT-2's merged causal + padding mask, [B, 1, Sq, Sk]
        mask = torch.randn(b, 1, sq, sk)
        mask.masked_fill_(torch.ones(sq, sk, dtype=torch.bool).triu(1), float("-inf"))
        kwargs["attn_mask"] = mask
    want_out, want_lse = aten(q, k, v, 0.0, causal, scale=0.3, **kwargs)
    got_out, got_lse = ours(q, k, v, kwargs.get("attn_mask"), causal, 0.3)
    torch.testing.assert_close(got_out, want_out, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(got_lse, want_lse, rtol=1e-5, atol=1e-5)
    assert got_out.stride() == want_out.stride() and got_lse.stride() == want_lse.stride()


def test_default_scale_grouped_heads_and_other_value_width() -> None:
    q, k, v = qkv(2, 8, 2, 33, 40, 24, dv=40)
    got, _ = ours(q, k, v)
    want = F.scaled_dot_product_attention(q, k, v, enable_gqa=True)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    q, k, v = qkv(1, 3, 3, 9, 17, 16, dv=48)
    got, _ = ours(q, k, v, None, True)
    want = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


def test_rows_that_see_no_key_are_zero_as_in_aten() -> None:
    q, k, v = qkv(1, 2, 2, 6, 9, 16)
    mask = torch.zeros(1, 1, 6, 9)
    mask[..., 2, :] = float("-inf")  # row 2 sees nothing
    mask[..., 4, :5] = float("-inf")  # row 4 sees only the last keys
    want_out, want_lse = aten(q, k, v, attn_mask=mask)
    got_out, got_lse = ours(q, k, v, mask)
    assert torch.isfinite(got_out).all()
    assert (got_out[:, :, 2] == 0).all()
    torch.testing.assert_close(got_out, want_out, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(got_lse, want_lse, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize(
    "make,fragment",
    [
        (lambda q, k, v: (q.double(), k.double(), v.double(), None), "float32 only"),
        (lambda q, k, v: (q, k[..., :8], v, None), "head_dim"),
        (lambda q, k, v: (q, k, v[:, :, :3], None), "differ in heads or length"),
        (lambda q, k, v: (q[:, :3], k[:, :2], v[:, :2], None), "multiple of key/value heads"),
        (lambda q, k, v: (q, k, v, torch.zeros(1, 1, 4, 3)), "does not broadcast"),
        (lambda q, k, v: (q, k, v, torch.zeros(5, 7, dtype=torch.bool)), "additive float32"),
        (lambda q, k, v: (q[0], k[0], v[0], None), "[batch, heads, seq, head_dim]"),
    ],
)
def test_bad_inputs_name_the_op_and_the_problem(make, fragment: str) -> None:  # type: ignore[no-untyped-def]
    q, k, v = qkv(1, 4, 4, 5, 7, 16)
    with pytest.raises(RuntimeError, match="torch_plugin::attention") as e:
        ours(*make(q, k, v))
    assert fragment in str(e.value)


def test_opcheck() -> None:
    q, k, v = qkv(1, 2, 2, 5, 7, 16)
    mask = torch.zeros(1, 1, 5, 7)
    torch.library.opcheck(ours, (q, k, v, mask, False, 0.5))
