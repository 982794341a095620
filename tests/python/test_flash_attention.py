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


def _sdpa_reference(q, k, v, mask=None, causal=False, scale=None):  # type: ignore[no-untyped-def]
    """SDPA's math path in float64 (grouped heads repeated, causal top-left as an -inf mask)."""
    group = q.shape[1] // k.shape[1]
    k = k.double().repeat_interleave(group, 1)
    v = v.double().repeat_interleave(group, 1)
    s = q.double() @ k.transpose(-1, -2) * (q.shape[-1] ** -0.5 if scale is None else scale)
    if mask is not None:
        s = s + mask.double()
    if causal:
        s = s.masked_fill(torch.ones(s.shape[-2:], dtype=torch.bool).triu(1), float("-inf"))
    return (s.softmax(-1) @ v).float()


@pytest.mark.parametrize("threads", [1, 2])
def test_masks_layouts_and_blocks_the_zoo_does_not_reach(threads: int) -> None:
    """Per-head, 2-D and transposed masks (their strides index the mask), causal together with
    a mask and with more queries than keys, grouped heads with all of them, one KV head over
    several batches (the per-thread packed head must change with the batch), a non-unit last
    stride, and 1 or 2 threads (chunk boundaries between tasks)."""
    old = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        g = torch.Generator().manual_seed(1)
        q, k, v = qkv(3, 4, 4, 37, 150, 24, transposed=True)
        per_head = torch.randn(3, 4, 37, 150, generator=g)
        two_d = torch.randn(37, 150, generator=g)
        transposed = torch.randn(3, 1, 150, 37, generator=g).transpose(-1, -2)
        for mask in (per_head, two_d, transposed):
            for causal in (False, True):
                got, _ = ours(q, k, v, mask, causal, None)
                want = _sdpa_reference(q, k, v, mask, causal)
                torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
        q, k, v = qkv(2, 6, 2, 200, 70, 32, transposed=True)  # Sq > Sk, grouped heads
        mask = torch.randn(2, 1, 200, 70, generator=g)
        got, _ = ours(q, k, v, mask, True, 0.2)
        torch.testing.assert_close(
            got, _sdpa_reference(q, k, v, mask, True, 0.2), rtol=1e-5, atol=1e-5
        )
        q, k, v = qkv(4, 3, 1, 9, 20, 16)  # one KV head, four batches
        got, _ = ours(q, k, v)
        torch.testing.assert_close(got, _sdpa_reference(q, k, v), rtol=1e-5, atol=1e-5)
        q, k, v = qkv(1, 2, 2, 8, 8, 16)
        q_strided = q.transpose(-1, -2).contiguous().transpose(-1, -2)  # last stride 8
        assert q_strided.stride(-1) != 1
        torch.testing.assert_close(ours(q_strided, k, v)[0], ours(q, k, v)[0])
    finally:
        torch.set_num_threads(old)


def test_rows_masked_in_early_key_blocks_and_in_all_of_them() -> None:
    """The online softmax over 128-key blocks: a row that sees nothing in its first blocks
    and keys later, a row that sees nothing in any block, and -inf only in a later block."""
    q, k, v = qkv(1, 2, 2, 4, 300, 16)
    mask = torch.zeros(1, 1, 4, 300)
    mask[..., 0, :260] = float("-inf")  # sees only keys 260..299 (third block)
    mask[..., 1, :] = float("-inf")  # sees nothing
    mask[..., 2, 130:] = float("-inf")  # sees the first block and two keys of the second
    want_out, want_lse = aten(q, k, v, attn_mask=mask)
    got_out, got_lse = ours(q, k, v, mask)
    torch.testing.assert_close(got_out, want_out, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(got_lse, want_lse, rtol=1e-5, atol=1e-5)
    assert (got_out[:, :, 1] == 0).all()


def test_nan_propagates_as_in_aten() -> None:
    """A NaN in a query row makes that row NaN (not 0: a max that skips NaN would take the
    'no key seen' path); a NaN key makes every row that sees it NaN."""
    q, k, v = qkv(1, 1, 1, 3, 200, 16)
    q[0, 0, 1, 0] = float("nan")
    out, lse = ours(q, k, v)
    assert torch.isnan(out[0, 0, 1]).all() and torch.isnan(lse[0, 0, 1])
    assert torch.isfinite(out[0, 0, [0, 2]]).all()
    q, k, v = qkv(1, 1, 1, 3, 200, 16)
    k[0, 0, 5, 0] = float("nan")  # in the first 128-key block
    out, _ = ours(q, k, v)
    want, _ = aten(q, k, v)
    assert torch.isnan(out).all() and torch.isnan(want).all()


@pytest.mark.parametrize("b,sq,sk", [(0, 4, 5), (1, 0, 5), (1, 4, 0)])
def test_empty_batch_queries_or_keys(b: int, sq: int, sk: int) -> None:
    """Empty shapes return empty (or, with no keys, zero) results. ATen's kernel stops the
    process with a floating point exception on no queries or no keys (torch 2.13), so it is
    not called here."""
    q, k, v = qkv(b, 2, 2, sq, sk, 16)
    out, lse = ours(q, k, v)
    assert out.shape == (b, 2, sq, 16) and lse.shape == (b, 2, sq)
    assert (out == 0).all() and (lse == 0).all()


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


@pytest.mark.parametrize(
    "layout", ["contiguous", "transposed", "value width", "grouped", "strided last dim"]
)
def test_opcheck(layout: str) -> None:
    """The fake kernel's shapes and strides equal the kernel's for each input layout."""
    q, k, v = qkv(
        1, 4, 2 if layout == "grouped" else 4, 5, 7, 16, transposed=layout != "contiguous"
    )
    if layout == "value width":
        v = torch.randn(1, 4, 7, 24)
    if layout == "strided last dim":
        q = q.transpose(-1, -2).contiguous().transpose(-1, -2)
    mask = torch.zeros(1, 1, 5, 7)
    torch.library.opcheck(ours, (q, k, v, mask, False, 0.5))
