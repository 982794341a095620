"""Decode attention at Llama-3-8B heads, 8 x 32K, bf16: ours (torch_plugin::decode_attention)
and PyTorch's SDPA, twice each, for Nsight Compute (scripts/gpu/profile_decode.sh) to read the
second launch of each: where the time goes when the kernel streams below the read bandwidth."""

from __future__ import annotations

import torch
import torch.nn.functional as F

import torch_plugin  # noqa: F401  (registers torch.ops.torch_plugin)

B, HQ, HKV, D, S = 8, 32, 8, 128, 32768
q = torch.randn(B, HQ, D, device="cuda", dtype=torch.bfloat16)
k = torch.randn(B, HKV, S, D, device="cuda", dtype=torch.bfloat16)
v = torch.randn(B, HKV, S, D, device="cuda", dtype=torch.bfloat16)
lengths = torch.full((B,), S, device="cuda", dtype=torch.long)
for _ in range(2):
    torch.ops.torch_plugin.decode_attention(q, k, v, lengths, 0)
    F.scaled_dot_product_attention(q[:, :, None], k, v, enable_gqa=True)
torch.cuda.synchronize()
print("profile_decode: done")
