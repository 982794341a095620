"""Split-KV decode attention (CPU twin of the CUDA kernel) against scaled_dot_product_attention."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from torch_plugin.ops import split_kv_decode_attention


@pytest.fixture(autouse=True, params=["auto", "avx2"])
def cpu_path(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Every test on both CPU forms where the CPU has both: the AVX-512 one (groups of 4 query
    heads per KV head, head_dim a multiple of 16) and the AVX2 one (TP_SPLIT_KV_CPU=avx2)."""
    if request.param == "avx2":
        monkeypatch.setenv("TP_SPLIT_KV_CPU", "avx2")
    else:
        monkeypatch.delenv("TP_SPLIT_KV_CPU", raising=False)
    return str(request.param)


def reference(q, k, v, lengths, scale=None):  # type: ignore[no-untyped-def]
    """SDPA per sequence over its valid cache entries, GQA by repeating kv heads."""
    group = q.shape[1] // k.shape[1]
    outs = []
    for b in range(q.shape[0]):
        n = int(lengths[b])
        kb = k[b, :, :n].repeat_interleave(group, 0).float()
        vb = v[b, :, :n].repeat_interleave(group, 0).float()
        qb = q[b, :, None, :].float()
        if n == 0:
            outs.append(torch.zeros_like(qb[:, 0]))
            continue
        outs.append(F.scaled_dot_product_attention(qb, kb, vb, scale=scale)[:, 0])
    return torch.stack(outs)


def make(b, hq, hkv, s, d, dtype=torch.float32, seed=0):  # type: ignore[no-untyped-def]
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(b, hq, d, generator=g).to(dtype)
    k = torch.randn(b, hkv, s, d, generator=g).to(dtype)
    v = torch.randn(b, hkv, s, d, generator=g).to(dtype)
    return q, k, v


@pytest.mark.parametrize(
    "b,hq,hkv,s,d,lengths,splits",
    [
        (2, 4, 4, 37, 64, [37, 23], 4),  # odd lengths, MHA
        (3, 8, 2, 129, 128, [1, 129, 64], 8),  # GQA 4:1, one-token sequence, head_dim 128
        (1, 4, 1, 5, 64, [5], 16),  # more splits than tokens: empty splits
        (2, 2, 2, 300, 64, [300, 299], 1),  # one split
        (2, 6, 2, 70, 44, [70, 3], 3),  # head_dim not a multiple of 8 or 32: the scalar tails
        (1, 3, 3, 200, 8, [200], 2),  # head_dim 8: no 32-lane block at all
        (2, 16, 2, 67, 80, [67, 30], 3),  # GQA 8:1, head_dim 80 (a 16-lane tail), odd rows
        (1, 8, 2, 2049, 128, [2049], 8),  # Llama-3's 4:1 at more than a block per split
    ],
)
def test_matches_sdpa_fp32(b, hq, hkv, s, d, lengths, splits) -> None:  # type: ignore[no-untyped-def]
    q, k, v = make(b, hq, hkv, s, d)
    lens = torch.tensor(lengths, dtype=torch.int64)
    got = split_kv_decode_attention(q, k, v, lens, num_splits=splits)
    torch.testing.assert_close(got, reference(q, k, v, lens), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_half_precision(dtype: torch.dtype) -> None:
    q, k, v = make(2, 8, 2, 65, 64, dtype)
    lens = torch.tensor([65, 40])
    got = split_kv_decode_attention(q, k, v, lens, num_splits=4)
    assert got.dtype == dtype
    torch.testing.assert_close(got.float(), reference(q, k, v, lens), rtol=2e-2, atol=2e-2)


def test_merging_rank_partials_equals_whole_cache() -> None:
    # Cache parallelism: each of 3 "ranks" holds a slice of the sequence; merging their partial
    # (out, lse) gives attention over the whole cache.
    q, k, v = make(2, 4, 2, 90, 64)
    lens = torch.tensor([90, 90])
    parts = []
    for lo, hi in [(0, 31), (31, 60), (60, 90)]:
        out, lse = torch.ops.torch_plugin.split_kv_attention(
            q, k[:, :, lo:hi], v[:, :, lo:hi], torch.full((2,), hi - lo), 2, 0.0
        )
        parts.append((out, lse))
    out = torch.cat([p[0] for p in parts], dim=2)
    lse = torch.cat([p[1] for p in parts], dim=2)
    merged, merged_lse = torch.ops.torch_plugin.merge_attention_partials(out, lse)
    torch.testing.assert_close(merged, reference(q, k, v, lens), rtol=1e-5, atol=1e-5)
    scores = torch.einsum("bhd,bhsd->bhs", q, k.repeat_interleave(2, 1)) / 8.0
    torch.testing.assert_close(merged_lse, torch.logsumexp(scores, -1), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("splits", [1, 3, 8])
def test_starts_skip_a_leading_run_of_entries(splits: int) -> None:
    """`starts` (left padding, keys out of a sliding window): entries [start, length) only;
    start == length gives an empty row (out 0, lse -inf)."""
    q, k, v = make(3, 8, 2, 50, 64)
    lens = torch.tensor([50, 41, 9])
    starts = torch.tensor([7, 0, 9])
    out, lse = torch.ops.torch_plugin.split_kv_attention(q, k, v, lens, splits, 0.0, starts)
    got, got_lse = torch.ops.torch_plugin.merge_attention_partials(out, lse)
    for b in range(2):
        lo, hi = int(starts[b]), int(lens[b])
        want = reference(q[b : b + 1], k[b : b + 1, :, lo:hi], v[b : b + 1, :, lo:hi], [hi - lo])
        torch.testing.assert_close(got[b : b + 1], want, rtol=1e-5, atol=1e-5)
    assert torch.equal(got[2], torch.zeros_like(got[2])) and bool(torch.isinf(got_lse[2]).all())
    with pytest.raises(RuntimeError, match="starts"):
        torch.ops.torch_plugin.split_kv_attention(q, k, v, lens, splits, 0.0, lens + 1)
    # Gemma-2's cap on the scaled scores: cap * tanh(s / cap) before the softmax.
    cap = 0.7
    out, lse = torch.ops.torch_plugin.split_kv_attention(q, k, v, lens, splits, 0.0, starts, cap)
    capped, _ = torch.ops.torch_plugin.merge_attention_partials(out, lse)
    kk, vv = k[0:1, :, 7:50].repeat_interleave(4, 1), v[0:1, :, 7:50].repeat_interleave(4, 1)
    s = (q[0:1, :, None] @ kk.transpose(-1, -2)) / 8.0
    want = (torch.tanh(s / cap) * cap).softmax(-1) @ vv
    torch.testing.assert_close(capped[0:1], want[:, :, 0], rtol=1e-5, atol=1e-5)
    torch.library.opcheck(
        torch.ops.torch_plugin.split_kv_attention, (q, k, v, lens, splits, 0.0, starts)
    )


def test_empty_sequence_gives_zeros() -> None:
    q, k, v = make(2, 2, 2, 8, 64)
    got = split_kv_decode_attention(q, k, v, torch.tensor([0, 8]), num_splits=2)
    assert torch.equal(got[0], torch.zeros_like(got[0]))
    assert torch.isfinite(got).all()


@pytest.mark.parametrize(
    "mutate,match",
    [
        (lambda q, k, v, n: (q[0], k, v, n), "q must be"),
        (lambda q, k, v, n: (q, k, v[..., :32], n), "shapes differ"),
        (lambda q, k, v, n: (q[:, :3], k, v, n), "multiple of kv heads"),
        (lambda q, k, v, n: (q.double(), k.double(), v.double(), n), "not supported"),
        (lambda q, k, v, n: (q, k.half(), v, n), "share a dtype"),
        (lambda q, k, v, n: (q, k, v, n.int()), "lengths must be int64"),
        (lambda q, k, v, n: (q, k, v, torch.tensor([9, 1])), "outside the cache"),
    ],
)
def test_bad_input_is_a_clear_error(mutate, match) -> None:  # type: ignore[no-untyped-def]
    q, k, v = make(2, 4, 2, 8, 64)
    args = mutate(q, k, v, torch.tensor([8, 3]))
    with pytest.raises(RuntimeError, match=match):
        torch.ops.torch_plugin.split_kv_attention(*args, 2, 0.0)
    with pytest.raises(RuntimeError, match="num_splits must be"):
        torch.ops.torch_plugin.split_kv_attention(q, k, v, torch.tensor([8, 3]), 0, 0.0)


def test_opcheck() -> None:
    q, k, v = make(2, 4, 2, 16, 64)
    torch.library.opcheck(
        torch.ops.torch_plugin.split_kv_attention, (q, k, v, torch.tensor([16, 7]), 3, 0.0)
    )
    out, lse = torch.ops.torch_plugin.split_kv_attention(q, k, v, torch.tensor([16, 7]), 3, 0.0)
    torch.library.opcheck(torch.ops.torch_plugin.merge_attention_partials, (out, lse))


def test_default_split_count_follows_the_device() -> None:
    """CPU: up to 8 chunks of >= 512 entries; CUDA (an H200's 132 SMs given, no GPU needed):
    the counts the GPU benchmark measured best, and never a chunk under 1024 entries."""
    from torch_plugin.ops import default_num_splits

    cpu, gpu = torch.device("cpu"), torch.device("cuda")
    assert default_num_splits(cpu, 1, 8, 32768) == 8
    assert default_num_splits(cpu, 1, 8, 700) == 1
    picks = [default_num_splits(gpu, b, 8, n, sms=132) for b, n in ((1, 32768), (4, 32768))]
    assert picks == [32, 32]
    assert default_num_splits(gpu, 8, 8, 32768, sms=132) == 17
    assert default_num_splits(gpu, 1, 8, 131072, sms=132) == 128
    assert default_num_splits(gpu, 1, 8, 100, sms=132) == 1


@pytest.mark.parametrize("splits", [0, 1, 5])
def test_decode_attention_is_split_then_merge(splits: int) -> None:
    """decode_attention (one call; the CUDA kernel fuses the merge) equals the two ops, with
    starts and a soft cap, returns q's dtype, and has a working fake kernel."""
    q, k, v = make(3, 8, 2, 700, 64, dtype=torch.bfloat16, seed=3)
    lens = torch.tensor([700, 3, 0])
    starts = torch.tensor([100, 0, 0])
    out, lse = torch.ops.torch_plugin.decode_attention(q, k, v, lens, splits, 0.0, starts, 2.0)
    used = splits or 1  # 0: min(8, 700 // 512) on the CPU
    part, part_lse = torch.ops.torch_plugin.split_kv_attention(
        q, k, v, lens, used, 0.0, starts, 2.0
    )
    want, want_lse = torch.ops.torch_plugin.merge_attention_partials(part, part_lse)
    assert out.dtype == torch.bfloat16 and out.shape == q.shape and lse.shape == (3, 8)
    torch.testing.assert_close(out, want.to(torch.bfloat16), rtol=0, atol=0)
    torch.testing.assert_close(lse, want_lse)
    assert torch.equal(out[2], torch.zeros_like(out[2])) and bool(torch.isinf(lse[2]).all())
    torch.library.opcheck(
        torch.ops.torch_plugin.decode_attention, (q, k, v, lens, splits, 0.0, starts, 2.0)
    )
    with pytest.raises(RuntimeError, match="num_splits must be >= 0"):
        torch.ops.torch_plugin.decode_attention(q, k, v, lens, -1)
