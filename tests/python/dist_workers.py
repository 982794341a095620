"""Worker functions for multi-rank tests (spawned processes, gloo, bounded timeouts)."""

from __future__ import annotations

import copy
import datetime
import json
import os
import socket
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn.functional as F

TIMEOUT_S = 60


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def spawn(fn: Any, world: int, *args: Any) -> None:
    """Runs fn(rank, world, port, *args) on `world` fresh processes; raises if any rank fails.
    For the tests that kill ranks or break the group on purpose; the others run on the
    kept-alive ranks of `pooled`."""
    mp.spawn(fn, args=(world, free_port(), *args), nprocs=world, join=True)


def pooled(pool: Any, fn: Any, *args: Any) -> list[Any]:
    """Runs fn(rank, world, port, *args) on the kept-alive ranks of a GlooPool (conftest's
    `gloo` fixture), whose process group is joined already (port unused)."""
    return pool.run(fn, 0, *args)


def _pooled() -> bool:
    return os.environ.get("TP_GLOO_POOL") == "1"


def _finish() -> None:
    """A spawned worker leaves its group; a pooled one keeps it for the next test."""
    if not _pooled():
        dist.destroy_process_group()


def _init(rank: int, world: int, port: int) -> None:
    if _pooled():
        return
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    torch.set_num_threads(1)
    dist.init_process_group(
        "gloo", rank=rank, world_size=world, timeout=datetime.timedelta(seconds=TIMEOUT_S)
    )


def _reference_step(
    model: torch.nn.Module, inputs: tuple[Any, ...]
) -> tuple[torch.nn.Module, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Single-process reference: a copy of `model` after forward + MSE backward against a seeded
    random target; returns (copy, output, target, loss)."""
    reference = copy.deepcopy(model)
    out = reference(*inputs)
    torch.manual_seed(123)
    target = torch.randn_like(out)
    ref_loss = F.mse_loss(out, target)
    ref_loss.backward()
    return reference, out, target, ref_loss


def pipeline_step_matches(
    rank: int,
    world: int,
    port: int,
    model_name: str,
    strategy: str,
    micro_batch_sizes: list[int] | None,
    batch: int,
    out_dir: str,
) -> None:
    """One training step under the pipeline runtime equals single-process training."""
    import torch_plugin
    from torch_plugin import models
    from torch_plugin.distributed import PipelineParallel

    _init(rank, world, port)
    try:
        model, inputs = models.build(model_name, small=True, batch=batch)
        reference, _, target, ref_loss = _reference_step(model, inputs)
        ref_grads = {n: p.grad for n, p in reference.named_parameters()}

        if micro_batch_sizes is None:  # the one-call API with a fixed micro-batch count
            pp = torch_plugin.parallelize(
                model, world, inputs, strategy="pipeline", loss_fn=F.mse_loss, num_microbatches=4
            )
        else:
            pp = PipelineParallel(
                model,
                inputs,
                loss_fn=F.mse_loss,
                strategy=strategy,
                micro_batch_sizes=micro_batch_sizes,
            )
        loss = pp.step(inputs, target)
        torch.testing.assert_close(torch.tensor(loss), ref_loss.detach(), rtol=1e-5, atol=1e-5)
        max_diff = 0.0
        names = []
        for name, p in pp.named_parameters():
            assert p.grad is not None, f"rank {rank}: no gradient for {name}"
            torch.testing.assert_close(p.grad, ref_grads[name], rtol=1e-5, atol=1e-5)
            max_diff = max(max_diff, float((p.grad - ref_grads[name]).abs().max()))
            names.append(name)
        # One optimizer step on the stage's parameters equals the reference step.
        opt = torch.optim.SGD(pp.parameters(), lr=0.1)
        opt.step()
        ref_params = dict(reference.named_parameters())
        with torch.no_grad():
            for name, p in pp.named_parameters():
                torch.testing.assert_close(p, ref_params[name] - 0.1 * ref_grads[name])
            for p in reference.parameters():
                p -= 0.1 * p.grad
                p.grad = None
        # A batch twice the example's runs as two chunks of the plan's schedule, gradients
        # accumulated: the step equals one process's on the whole batch.
        twice = tuple(torch.cat([x, x.flip(0)]) for x in inputs)
        out = reference(*twice)
        torch.manual_seed(321)
        twice_target = torch.randn_like(out)
        ref_loss = F.mse_loss(out, twice_target)
        ref_loss.backward()
        for p in pp.parameters():
            p.grad = None
        loss = pp.step(twice, twice_target)
        torch.testing.assert_close(torch.tensor(loss), ref_loss.detach(), rtol=1e-5, atol=1e-5)
        chunked_diff = 0.0
        for name, p in pp.named_parameters():
            assert p.grad is not None, f"rank {rank}: no gradient for {name} (chunked)"
            chunked_diff = max(chunked_diff, float((p.grad - ref_params[name].grad).abs().max()))
        # A batch that is no multiple of the example's leaves a stage split at module level a
        # micro-batch it was not traced for: refused on every rank before any message.
        try:
            rows = batch + batch // 2
            pp.step(tuple(x[:rows] for x in twice), twice_target[:rows])
            refused = ""
        except ValueError as e:
            refused = str(e)
        Path(out_dir, f"rank{rank}.json").write_text(
            json.dumps(
                {
                    "rank": rank,
                    "stage": pp.my_stage,
                    "params": names,
                    "max_grad_diff": max_diff,
                    "chunked_grad_diff": chunked_diff,
                    "refused": refused,
                    "loss": loss,
                    "ref_loss": float(ref_loss.detach()),
                    "stages": pp.plan.num_stages,
                    "depth": pp.plan.raw.depth,
                    "micro_batches": [s.micro_batch for s in pp.plan.stages],
                    "replicas": [s.replicas for s in pp.plan.stages],
                }
            )
        )
    finally:
        _finish()


def pipeline_fault(
    rank: int, world: int, port: int, scenario: str, timeout_s: float, out_dir: str
) -> None:
    """Rank `world - 1` misbehaves; every surviving rank must fail fast and say why."""
    import time

    from torch_plugin import models
    from torch_plugin.distributed import PipelineParallel

    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    torch.set_num_threads(1)
    dist.init_process_group(
        "gloo", rank=rank, world_size=world, timeout=datetime.timedelta(seconds=timeout_s)
    )
    bad = rank == world - 1
    model, inputs = models.build("candle_uno", small=True, batch=8)
    target = torch.zeros(8, 1)
    t0 = time.perf_counter()
    message = ""
    try:
        micro = [4] if scenario == "mismatch" and bad else [2]
        pp = PipelineParallel(model, inputs, loss_fn=F.mse_loss, micro_batch_sizes=micro)
        if bad and scenario == "dead":
            os._exit(0)  # dies without a word, as a killed process does
        if bad and scenario == "stall":
            # Stalled until every other rank has given up (at most 3 timeouts): waiting out the
            # whole stall after they reported would only slow the suite.
            deadline = time.perf_counter() + 3 * timeout_s
            while time.perf_counter() < deadline:
                if len(list(Path(out_dir).glob("rank*.json"))) == world - 1:
                    break
                time.sleep(0.2)
            os._exit(0)
        t0 = time.perf_counter()
        pp.step(inputs, target)
    except RuntimeError as e:
        message = str(e)
    elapsed = time.perf_counter() - t0
    Path(out_dir, f"rank{rank}.json").write_text(
        json.dumps({"rank": rank, "message": message, "seconds": elapsed})
    )
    os._exit(0)  # skip the process-group teardown, which would wait for the dead peer


def cp_decode_matches(
    rank: int, world: int, port: int, schemes: list[str], steps: int, out_dir: str
) -> None:
    """Greedy decoding with the KV cache split over ranks gives single-process eager's tokens,
    for each scheme in turn (one process group for all of them)."""
    import torch_plugin
    from torch_plugin import _C
    from torch_plugin.models.llama import build_llama

    _init(rank, world, port)
    try:
        torch.manual_seed(0)
        model = build_llama(small=True).eval()  # 2 layers, GQA 4/2 heads, cache 64
        cfg = model.config
        batch, prompt = 4, 8
        tokens = torch.randint(
            0, model.vocab_size, (batch, prompt), generator=torch.Generator().manual_seed(1)
        )
        reference = copy.deepcopy(model)
        ref_logits, ref_tokens = [], []
        with torch.no_grad():
            a = reference(tokens, 0)
            ref_logits.append(a)
            for i in range(steps):
                t = a[:, -1].argmax(-1, keepdim=True)
                ref_tokens.append(t.flatten().tolist())
                a = reference(t, prompt + i)
                ref_logits.append(a)
        for scheme in schemes:
            cp = torch_plugin.cache_parallel(
                copy.deepcopy(model), None, scheme=scheme, block_size=4
            )
            cp_tokens, max_diff, per_step_bytes = [], 0.0, []
            with torch.no_grad():
                b = cp(tokens, 0)
                for i in range(steps):
                    max_diff = max(max_diff, float((b - ref_logits[i]).abs().max()))
                    t = b[:, -1].argmax(-1, keepdim=True)
                    cp_tokens.append(t.flatten().tolist())
                    before = sum(v for k, v in cp.manager.comm.bytes_sent.items() if k != "output")
                    b = cp(t, prompt + i)
                    after = sum(v for k, v in cp.manager.comm.bytes_sent.items() if k != "output")
                    per_step_bytes.append(after - before)
                max_diff = max(max_diff, float((b - ref_logits[steps]).abs().max()))
            layer = {
                "batch": batch,
                "context": prompt + steps,
                "hidden": cfg.dim,
                "q_heads": cfg.n_heads,
                "kv_heads": cfg.n_kv_heads,
                "head_dim": cfg.dim // cfg.n_heads,
                "ffn_hidden": cfg.ffn_dim,
                "dtype_bytes": 4,
            }
            strategy = "cp_" + cp.manager.scheme
            modelled = _C.model_decode_layer(layer, world, strategy, "cpu")["bytes_sent_per_rank"]
            full_cache = 2 * cfg.n_layers * int(model.layers[0].attention.cache_k.nbytes)
            Path(out_dir, f"rank{rank}_{scheme}.json").write_text(
                json.dumps(
                    {
                        "rank": rank,
                        "scheme": cp.manager.scheme,
                        "sites": len(cp.plan.sites),
                        "ref_tokens": ref_tokens,
                        "cp_tokens": cp_tokens,
                        "max_logit_diff": max_diff,
                        "bytes_per_step": per_step_bytes,
                        "modelled_bytes_per_layer": modelled,
                        "layers": cfg.n_layers,
                        "cache_bytes": cp.manager.memory_bytes(),
                        "full_cache_bytes": full_cache,
                    }
                )
            )
    finally:
        _finish()


class CacheArgDecoder(torch.nn.Module):
    """One attention layer whose KV caches are forward arguments written in place (GQA by
    repeat_interleave), as hand-written decoders pass them."""

    def __init__(self) -> None:
        super().__init__()
        self.q, self.k = torch.nn.Linear(32, 32), torch.nn.Linear(32, 16)
        self.v, self.o = torch.nn.Linear(32, 16), torch.nn.Linear(32, 32)

    def qkv(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """[b, heads, s, 8] queries (4 heads), keys and values (2 heads)."""
        b, s, _ = x.shape
        q = self.q(x).view(b, s, 4, 8).transpose(1, 2)
        k = self.k(x).view(b, s, 2, 8).transpose(1, 2)
        return q, k, self.v(x).view(b, s, 2, 8).transpose(1, 2)

    def forward(
        self, x: torch.Tensor, pos: int, k_cache: torch.Tensor, v_cache: torch.Tensor
    ) -> torch.Tensor:
        b, s, _ = x.shape
        q, k, v = self.qkv(x)
        k_cache[:, :, pos : pos + s] = k
        v_cache[:, :, pos : pos + s] = v
        keys = k_cache[:, :, : pos + s].repeat_interleave(2, dim=1)
        values = v_cache[:, :, : pos + s].repeat_interleave(2, dim=1)
        mask = torch.ones(s, pos + s, dtype=torch.bool).tril(diagonal=pos)
        out = torch.nn.functional.scaled_dot_product_attention(q, keys, values, attn_mask=mask)
        return self.o(out.transpose(1, 2).reshape(b, s, 32))


class CatGrowDecoder(CacheArgDecoder):
    """The same layer, its cache grown DynamicCache-style: cat([past, new], 2), returned."""

    def forward(  # type: ignore[override]
        self, x: torch.Tensor, past_k: torch.Tensor, past_v: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        b, s, _ = x.shape
        q, k, v = self.qkv(x)
        k, v = torch.cat([past_k, k], dim=2), torch.cat([past_v, v], dim=2)
        out = torch.nn.functional.scaled_dot_product_attention(q, k, v, enable_gqa=True)
        return self.o(out.transpose(1, 2).reshape(b, s, 32)), k, v


def _cp_decoder(cls: type) -> tuple[torch.nn.Module, Any, torch.Generator, torch.Tensor]:
    """A seeded test decoder, eager and cache-parallel (world: the process group's, blocks of
    2), a generator for its inputs and a 5-token prompt [2, 5, 32]."""
    import torch_plugin

    torch._dynamo.reset()
    torch.manual_seed(0)
    model = cls().eval()
    ref = copy.deepcopy(model)
    cp = torch_plugin.cache_parallel(copy.deepcopy(model), None, block_size=2)
    gen = torch.Generator().manual_seed(1)
    return ref, cp, gen, torch.randn(2, 5, 32, generator=gen)


def cp_cat_growth(rank: int, world: int, port: int, steps: int) -> dict[str, Any]:
    """A cache grown by torch.cat and returned, split over the ranks: outputs equal eager's;
    what the step returns for the cache is a placeholder of the grown shape holding no memory;
    a cache other than the one returned is refused."""

    _init(rank, world, port)
    try:
        ref, cp, gen, x = _cp_decoder(CatGrowDecoder)
        with torch.no_grad():
            a, rk, rv = ref(x, torch.zeros(2, 2, 0, 8), torch.zeros(2, 2, 0, 8))
            b, pk, pv = cp(x, torch.zeros(2, 2, 0, 8), torch.zeros(2, 2, 0, 8))
            diff = float((a - b).abs().max())
            for _ in range(steps):
                t = torch.randn(2, 1, 32, generator=gen)
                a, rk, rv = ref(t, rk, rv)
                b, pk, pv = cp(t, pk, pv)
                diff = max(diff, float((a - b).abs().max()))
            refused = ""
            try:
                cp(t, rk[:, :, :3], rv[:, :, :3])  # not the cache it returned
            except RuntimeError as e:
                refused = str(e)
        return {
            "sites": len(cp.plan.sites),
            "grown": all(s.grown for s in cp.plan.sites),
            "max_diff": diff,
            "placeholder_shape": list(pk.shape),
            "placeholder_strides": list(pk.stride()),
            "local_positions": cp.manager.filled.get("past_k"),
            "refused": refused,
        }
    finally:
        _finish()


def cp_cache_arguments(rank: int, world: int, port: int, steps: int) -> dict[str, Any]:
    """Caches passed as forward arguments, split over the ranks: outputs equal eager's."""

    _init(rank, world, port)
    try:
        ref, cp, gen, x = _cp_decoder(CacheArgDecoder)
        caches = [torch.zeros(2, 2, 32, 8) for _ in range(4)]
        with torch.no_grad():
            diff = float((cp(x, 0, *caches[:2]) - ref(x, 0, *caches[2:])).abs().max())
            for p in range(5, 5 + steps):
                t = torch.randn(2, 1, 32, generator=gen)
                diff = max(
                    diff, float((cp(t, p, *caches[:2]) - ref(t, p, *caches[2:])).abs().max())
                )
        return {
            "sites": len(cp.plan.sites),
            "max_diff": diff,
            "local_bytes": cp.manager.memory_bytes(),
        }
    finally:
        _finish()


def cp_cache_variants(rank: int, world: int, port: int, steps: int) -> list[dict[str, Any]]:
    """Caches as users write them (issue 28): slice writes, StaticCache's index_copy_ and
    cache[:, :, pos] = k writes, attention over a prefix or over the whole cache under a
    mask, a sliding window, and left padding (an HF-style attention_mask), decoded greedily
    with the cache split over the ranks; per variant and scheme: the rewritten sites, the
    largest logit difference from single-process eager at real tokens, and whether the
    tokens are the same."""
    import torch_plugin
    from torch_plugin.models.llama import build_llama

    _init(rank, world, port)
    # Each write, read and mask once, and index_copy_ under both schemes (plain, then with a
    # window over the whole cache); slice writes under gather_qkv are cp_decode_matches'.
    variants = [
        ({"cache_write": "index_copy"}, "gather_partials"),
        ({"cache_write": "index_put", "cache_read": "whole"}, "gather_partials"),
        ({"sliding_window": 6}, "gather_partials"),
        ({"cache_write": "index_copy", "cache_read": "whole", "sliding_window": 5}, "gather_qkv"),
    ]
    results = []
    try:
        for kw, scheme in variants:
            torch._dynamo.reset()  # a new model each time: no recompile limit
            torch.manual_seed(0)
            model = build_llama(small=True, **kw).eval()
            batch, prompt = 4, 8
            gen = torch.Generator().manual_seed(1)
            tokens = torch.randint(0, model.vocab_size, (batch, prompt), generator=gen)
            mask = torch.ones(batch, 64, dtype=torch.long)
            mask[1, :3] = 0  # left padding: prompts of different lengths
            real = mask[:, :prompt].bool()
            ref = copy.deepcopy(model)
            cp = torch_plugin.cache_parallel(
                copy.deepcopy(model), None, scheme=scheme, block_size=4
            )
            with torch.no_grad():
                a, b = ref(tokens, 0, mask), cp(tokens, 0, mask)
                diff = float((a - b)[real].abs().max())
                same = True
                for i in range(steps):
                    ta, tb = a[:, -1:].argmax(-1), b[:, -1:].argmax(-1)
                    same = same and torch.equal(ta, tb)
                    a, b = ref(ta, prompt + i, mask), cp(ta, prompt + i, mask)
                    diff = max(diff, float((a - b).abs().max()))
            sites = cp.plan.sites if cp.plan is not None else []
            results.append(
                {
                    "variant": kw,
                    "scheme": scheme,
                    "sites": len(sites),
                    "masked": all(s.masked for s in sites),
                    "indexed": all(s.indexed_write for s in sites),
                    "max_logit_diff": diff,
                    "same_tokens": same,
                }
            )
        return results
    finally:
        _finish()


def cp_default_compile(rank: int, world: int, port: int, out_dir: str) -> None:
    """The default backend given a mesh (issue 27): the decode graph goes cache-parallel, and
    greedy decoding gives single-process eager's tokens."""
    import logging

    import torch_plugin
    from torch_plugin.models.llama import build_llama

    _init(rank, world, port)
    lines: list[str] = []

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            lines.append(record.getMessage())

    logger = logging.getLogger("torch_plugin")
    logger.addHandler(Keep())
    logger.setLevel(logging.INFO)
    try:
        torch.manual_seed(0)
        model = build_llama(small=True).eval()
        tokens = torch.randint(
            0, model.vocab_size, (2, 6), generator=torch.Generator().manual_seed(1)
        )
        reference = copy.deepcopy(model)
        mesh = torch_plugin.DeviceMesh((world,), timeout_s=TIMEOUT_S)
        compiled = torch.compile(
            model, backend="torch_plugin", options={"mesh": mesh}, dynamic=True
        )
        got, want = [], []
        with torch.no_grad():
            a, b = reference(tokens, 0), compiled(tokens, 0)
            for i in range(4):
                want.append(a[:, -1].argmax(-1).tolist())
                got.append(b[:, -1].argmax(-1).tolist())
                a = reference(a[:, -1:].argmax(-1), 6 + i)
                b = compiled(b[:, -1:].argmax(-1), 6 + i)
        Path(out_dir, f"rank{rank}.json").write_text(
            json.dumps({"got": got, "want": want, "log": lines})
        )
    finally:
        _finish()


def cp_fault(rank: int, world: int, port: int, timeout_s: float, out_dir: str) -> None:
    """The last rank dies mid-decode; the others' next collective must fail fast and say why.

    Drives the KV cache manager directly (what every cp_attention node calls), so no compile.
    """
    import time

    from torch_plugin.distributed import KVCacheManager

    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    torch.set_num_threads(1)
    dist.init_process_group(
        "gloo", rank=rank, world_size=world, timeout=datetime.timedelta(seconds=timeout_s)
    )
    m = KVCacheManager(block_size=4)
    q, kv = torch.randn(2, 4, 1, 16), torch.randn(2, 2, 1, 16)
    message, t0 = "", time.perf_counter()
    try:
        for pos in range(12):
            if rank == world - 1 and pos == 6:
                os._exit(0)  # dies without a word, as a killed process does
            t0 = time.perf_counter()
            m.attention(q, kv, kv, pos, pos + 1, True, 0.0, "layer.cache_k", 64, "gather_partials")
    except RuntimeError as e:
        message = str(e)
    Path(out_dir, f"rank{rank}.json").write_text(
        json.dumps({"rank": rank, "message": message, "seconds": time.perf_counter() - t0})
    )
    os._exit(0)  # the group is broken; skip its teardown


# The models of issue 5's acceptance: 4-layer GPT-2 and BERT configs (dropout off so the
# single-process reference is deterministic), and the zoo MLP.
SHARDING_MODELS: dict[str, dict[str, Any]] = {
    "mlp": {},
    "gpt2": dict(n_layer=4, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0),
    "bert": dict(num_hidden_layers=4, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0),
    # examples/sharding.py's shape: its CPU plan gathers transposed activations (a view of the
    # whole tensor is not a view of the gathered one; regression)
    "gpt": dict(dim=128, n_heads=8, seq_len=32, vocab_size=512, lm_head=False),
}
# BERT again, its word embedding vocabulary-parallel (pinned below): padding_idx 0 lies in rank
# 0's rows only.
SHARDING_MODELS["bert_vocab"] = SHARDING_MODELS["bert"]


# Pins that steer the plan through rules the free plans of these tiny models do not pick (all
# replicated: launch costs dominate), so those rules are checked numerically.
SHARDING_PINS: dict[str, dict[str, str]] = {
    "bert_vocab": {"model.embeddings.word_embeddings.weight": "S(0)", "embedding": "P"},
    "conv": {"conv1.weight": "S(0)", "conv2.weight": "S(1)", "permute": "S(3)"},
    "matmul_attn": {
        "qkv.0.weight": "S(0)",
        "qkv.1.weight": "S(0)",
        "qkv.2.weight": "S(0)",
        "emb.weight": "S(1)",
        # node outputs (make_fx names): embedding by features, scores by batch*heads, the
        # probabilities @ v by the contraction (partial sums), unsqueeze/clone split
        "embedding": "S(2)",
        "bmm": "S(0)",
        "bmm_1": "P",
        "unsqueeze": "S(2)",
        "clone_4": "S(2)",
    },
}


class MatmulAttention(torch.nn.Module):
    """Embedding + attention written with matmuls (bmm after tracing) + unsqueeze/clone: ops the
    zoo models' SDPA graphs do not reach."""

    def __init__(self, vocab: int = 256, dim: int = 32, heads: int = 4):
        super().__init__()
        self.vocab_size, self.seq_len, self.heads = vocab, 8, heads
        self.emb = torch.nn.Embedding(vocab, dim)
        self.qkv = torch.nn.ModuleList(torch.nn.Linear(dim, dim) for _ in range(3))
        self.out = torch.nn.Linear(dim, dim)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        x = self.emb(tokens)
        b, s, d = x.shape
        q, k, v = (lin(x).view(b, s, self.heads, -1).transpose(1, 2) for lin in self.qkv)
        scores = (q @ k.transpose(-1, -2)).softmax(-1) @ v
        y = self.out(scores.transpose(1, 2).reshape(b, s, d))
        return (y.unsqueeze(1).clone() + x.unsqueeze(1)).squeeze(1)


class ConvNet(torch.nn.Module):
    """Two convolutions (pinned: output-channel then input-channel split, Megatron's pattern in
    channels) and a channels-last permute into a linear head."""

    def __init__(self) -> None:
        super().__init__()
        self.conv1 = torch.nn.Conv2d(4, 8, 3, padding=1)
        self.conv2 = torch.nn.Conv2d(8, 8, 3, padding=1)
        self.head = torch.nn.Linear(8, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.conv2(torch.relu(self.conv1(x)))
        return self.head(y.permute(0, 2, 3, 1))


def _sharding_model(name: str, batch: int) -> tuple[torch.nn.Module, tuple[Any, ...]]:
    from torch_plugin import models

    if name == "conv":
        torch.manual_seed(0)
        return ConvNet(), (torch.randn(batch, 4, 8, 8),)
    if name == "matmul_attn":
        torch.manual_seed(0)
        model = MatmulAttention()
        return model, (torch.randint(0, model.vocab_size, (batch, model.seq_len)),)
    model, inputs = models.build(
        name.removesuffix("_vocab"), small=True, batch=batch, **SHARDING_MODELS.get(name, {})
    )
    if name == "bert_vocab":  # padded rows: token 0 is the embedding's padding_idx
        inputs[0][:, -3:] = 0
    return model, inputs


def _sharded_step_matches(
    name: str, mesh: Any, batch: int, **options: Any
) -> tuple[dict[str, Any], Any]:
    """One training step of `name` sharded on `mesh` equals single-process training (asserts);
    returns figures and the sharded module."""
    import torch_plugin

    model, inputs = _sharding_model(name, batch)
    model.train()
    reference, out, target, ref_loss = _reference_step(model, inputs)
    ref = dict(reference.named_parameters())

    sharded = torch_plugin.parallelize(
        model,
        mesh,
        inputs,
        constraints=SHARDING_PINS.get(name),
        # the tied-layer level run for real, on the CPU profile (other plans than A100's)
        **({"level": "fast", "device": "cpu"} if name == "gpt" else {}),
        **options,
    )
    del model
    dist_out = sharded(*inputs)
    loss = F.mse_loss(dist_out, target)
    loss.backward()
    torch.testing.assert_close(dist_out, out, rtol=1e-5, atol=1e-5)
    max_diff, sharded_params = 0.0, 0
    for pname, p, spec in sharded.named_local_parameters():
        assert p.grad is not None, f"{name}: no gradient for {pname} ({spec})"
        expect = sharded.shard(ref[pname].grad, spec)
        torch.testing.assert_close(
            p.grad, expect, rtol=1e-5, atol=1e-5, msg=lambda m, n=pname, s=spec: f"{n} {s}: {m}"
        )
        max_diff = max(max_diff, float((p.grad - expect).abs().max()))
        sharded_params += spec != "R"
    opt = torch.optim.SGD(sharded.parameters(), lr=0.1)
    opt.step()
    with torch.no_grad():
        for pname, p, spec in sharded.named_local_parameters():
            full = ref[pname] - 0.1 * ref[pname].grad
            torch.testing.assert_close(p, sharded.shard(full, spec), rtol=1e-5, atol=1e-5)
    whole = sum(p.numel() * p.element_size() for p in ref.values())
    return {
        "loss": float(loss.detach()),
        "ref_loss": float(ref_loss.detach()),
        "max_grad_diff": max_diff,
        "sharded_params": sharded_params,
        "params": len(ref),
        "param_bytes_local": sharded.local_parameter_bytes(),
        "param_bytes_whole": whole,
        "comm_calls": dict(sharded.comm.calls),
        "level": sharded.plan.level,
        "vocab_embeddings": str(sharded.local_graph).count("torch_plugin::vocab_embedding"),
    }, sharded


def _zero_adam_matches(mesh: Any, batch: int, zero: int) -> dict[str, Any]:
    """GPT-2 on a (dp, tp) mesh (level="fast": its repeated layers share ILP variables, which
    keeps four processes on two cores quick) under a memory budget below the least any plan
    needs with ZeRO stages below `zero`: the ILP shards some optimizer state (ZeRO-1; ZeRO-2
    also gradients), and three Adam steps through dist_model.optimizer equal single-process
    Adam (asserts);
    returns the state bytes this rank holds. eps=1e-4: with the default 1e-8, Adam turns the
    rounding noise of a near-zero gradient (an embedding row one token uses) into a whole
    lr-sized step's difference."""
    import torch_plugin

    model, inputs = _sharding_model("gpt2", batch)
    model.train()
    reference = copy.deepcopy(model)
    least = {}  # the least memory per rank any plan needs, up to each ZeRO stage
    for stage in (zero - 1, zero):
        try:
            torch_plugin.parallelize(
                model, mesh, inputs, memory_budget_gb=1e-9, zero=stage, level="fast"
            )
        except torch_plugin.PlanError as e:
            least[stage] = e.min_memory_bytes
    assert least[zero] < least[zero - 1], least
    budget = (least[zero - 1] + least[zero]) / 2  # no plan fits with the lower stages only
    sharded = torch_plugin.parallelize(
        model, mesh, inputs, memory_budget_gb=budget / 1e9, zero=zero, level="fast"
    )
    plan = sharded.plan
    assert zero in plan.zero_stage.values(), f"budget below stage {zero - 1}'s least:\n{plan}"
    assert plan.state_bytes_per_rank + plan.activation_bytes_per_rank <= budget * (1 + 1e-9)
    if zero == 2:  # flat shards need an elementwise optimizer: others are a clear error
        try:
            sharded.optimizer(torch.optim.LBFGS)
            raise AssertionError("LBFGS over ZeRO-2 shards was accepted")
        except ValueError as e:
            assert "elementwise optimizer" in str(e), e
    opt = sharded.optimizer(torch.optim.Adam, lr=1e-2, eps=1e-4)
    ref_opt = torch.optim.Adam(reference.parameters(), lr=1e-2, eps=1e-4)
    torch.manual_seed(7)
    target = torch.randn_like(reference(*inputs))
    grads_kept = 0
    for _ in range(3):
        ref_opt.zero_grad()
        F.mse_loss(reference(*inputs), target).backward()
        ref_opt.step()
        opt.zero_grad()
        F.mse_loss(sharded(*inputs), target).backward()
        grads_kept = sum(p.grad.numel() for p in sharded.parameters() if p.grad is not None)
        grads_kept += sum(z.shard.grad.numel() for z in opt.zero2 if z.shard.grad is not None)
        opt.step()
    if zero == 2:  # torch's clip cannot see the flat shards' gradients: a clear error
        try:
            torch.nn.utils.clip_grad_norm_(sharded.parameters(), 1.0)
            raise AssertionError("torch's clip over ZeRO-2 shards was accepted")
        except RuntimeError as e:
            assert "call dist_model.clip_grad_norm_" in str(e), e
    ref = dict(reference.named_parameters())
    max_diff = 0.0
    with torch.no_grad():
        for pname, p, spec in sharded.named_local_parameters():
            expect = sharded.shard(ref[pname], spec)
            torch.testing.assert_close(
                p, expect, rtol=1e-5, atol=1e-5, msg=lambda m, n=pname: f"{n} after Adam: {m}"
            )
            max_diff = max(max_diff, float((p - expect).abs().max()))
    local = sum(p.numel() for p in sharded.parameters())
    return {
        "zero_params": len(plan.zero_copies),
        "stages": sorted(set(plan.zero_stage.values())),
        "copies": sorted(set(plan.zero_copies.values())),
        "state_bytes": opt.state_bytes(),
        "plain_state_bytes": 2 * sharded.local_parameter_bytes(),  # Adam's two moments
        "grad_elements": grads_kept,  # after backward, before the step
        "param_elements": local,
        "max_param_diff": max_diff,
        "least_bytes": [least[zero - 1], least[zero]],
        "budget_bytes": budget,
        "table": plan.table() if mesh.rank == 0 else "",
    }


def sharding_step_matches(
    rank: int, world: int, port: int, model_names: list[str], batch: int, out_dir: str
) -> None:
    """Forward, gradients and one SGD step of the sharded model equal single-process training,
    on a 1-D mesh of the world and (4 ranks) on a 2 x 2 (dp, tp) mesh."""
    import torch_plugin

    _init(rank, world, port)
    report: dict[str, Any] = {"rank": rank}
    try:
        mesh = torch_plugin.DeviceMesh.from_torchrun()
        for name in model_names:
            report[name], sharded = _sharded_step_matches(name, mesh, batch)
            if rank == 0 and name == "gpt2":
                sharded.plan.save_png(str(Path(out_dir, "gpt2_plan.png")))
                report["gpt2_table"] = sharded.plan.table()
        if world == 4:  # a 2-D mesh: the "tp" group of rank r holds the ranks sharing r's row
            mesh2 = torch_plugin.DeviceMesh.from_torchrun((2, 2), ("dp", "tp"))
            for axis, expect in (
                ("tp", [rank // 2 * 2, rank // 2 * 2 + 1]),
                ("dp", [rank % 2, rank % 2 + 2]),
            ):
                t = torch.tensor([float(rank)])
                dist.all_reduce(t, group=mesh2.group(axis))
                assert t.item() == sum(expect), (axis, t.item(), expect)
            report["mesh2"] = list(mesh2.coordinate)
            for name in ("mlp", "gpt2"):
                report[f"{name}@dp2xtp2"], dp_tp = _sharded_step_matches(name, mesh2, batch)
                report[f"{name}@dp2xtp2"]["dp_calls"] = dict(dp_tp.dp_comm.calls)
            report["zero@dp2xtp2"] = _zero_adam_matches(mesh2, batch, 1)
            report["zero2@dp2xtp2"] = _zero_adam_matches(mesh2, batch, 2)
        if world == 2:  # the mesh shape searched: (1, 2) tensor or (2, 1) data parallel
            report["auto_mesh"], auto = _sharded_step_matches(
                "gpt2", mesh, batch, mesh_shape="auto"
            )
            report["auto_mesh"]["search"] = auto.mesh_search
            report["auto_mesh"]["shape"] = list(auto.mesh.shape)
            report["auto_mesh"]["dp"] = auto.dp
            # the (2, 1) shape the search may pick on larger meshes: pure data parallelism
            dp_only = torch_plugin.DeviceMesh.from_torchrun((2, 1), ("dp", "tp"))
            report["gpt2@dp2xtp1"], _ = _sharded_step_matches("gpt2", dp_only, batch)
        # Bad input is a clear error, not a wrong answer: an input the model itself refuses
        # (the conv net given a matrix) gets the model's own error, not a capture failure.
        bad = torch.zeros(batch + 1, 64)
        try:
            sharded(bad)
        except Exception as e:  # noqa: BLE001 - the test reads it
            report["bad_input"] = f"{type(e).__name__}: {e}"
        Path(out_dir, f"rank{rank}.json").write_text(json.dumps(report))
    finally:
        _finish()


def sharding_fault(rank: int, world: int, port: int, timeout_s: float, out_dir: str) -> None:
    """The last rank dies before a training step; the others must fail fast and say why."""
    import time

    import torch_plugin
    from torch_plugin import models

    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    torch.set_num_threads(1)
    dist.init_process_group(
        "gloo", rank=rank, world_size=world, timeout=datetime.timedelta(seconds=timeout_s)
    )
    model, inputs = models.build("mlp", small=True, batch=8)
    sharded = torch_plugin.parallelize(model, torch_plugin.DeviceMesh.from_torchrun(), inputs)
    message, t0 = "", time.perf_counter()
    if rank == world - 1:
        os._exit(0)  # dies without a word, as a killed process does
    try:
        sharded(*inputs).sum().backward()
    except RuntimeError as e:
        message = str(e)
    Path(out_dir, f"rank{rank}.json").write_text(
        json.dumps({"rank": rank, "message": message, "seconds": time.perf_counter() - t0})
    )
    os._exit(0)  # the group is broken; skip its teardown


def sharding_meta_init(rank: int, world: int, port: int, out_dir: str) -> None:
    """A model built on `meta` is materialised block by block, each block equal to the same
    slice of a single-process build with the same seed; its forward equals that build's."""
    import torch_plugin
    from torch_plugin.models import gpt

    _init(rank, world, port)
    try:
        with torch.device("meta"):
            model = gpt.build_gpt(small=True)
        torch.manual_seed(7)
        reference = gpt.build_gpt(small=True)
        tokens = torch.randint(0, reference.vocab_size, (4, reference.seq_len))
        mesh = torch_plugin.DeviceMesh.from_torchrun()
        sharded = torch_plugin.parallelize(model, mesh, (tokens,), init_seed=7)
        ref = dict(reference.named_parameters())
        sharded_count = 0
        for name, p, spec in sharded.named_local_parameters():
            assert torch.equal(p, sharded.shard(ref[name], spec)), f"{name} ({spec}) differs"
            sharded_count += spec != "R"
        torch.testing.assert_close(sharded(tokens), reference(tokens), rtol=1e-5, atol=1e-5)
        Path(out_dir, f"rank{rank}.json").write_text(
            json.dumps({"sharded": sharded_count, "params": len(ref)})
        )
    finally:
        _finish()


def sharding_plan_mismatch(rank: int, world: int, port: int, out_dir: str) -> None:
    """The last rank pins a parameter the others leave to the ILP: its plan differs, and every
    rank must say so before the first collective of the step."""
    import time

    import torch_plugin
    from torch_plugin import models

    _init(rank, world, port)
    model, inputs = models.build("mlp", small=True, batch=8)
    first = next(n for n, p in model.named_parameters() if p.dim() == 2)
    constraints = {first: "R"} if rank == world - 1 else None
    mesh = torch_plugin.DeviceMesh.from_torchrun(timeout_s=TIMEOUT_S)
    message, t0 = "", time.perf_counter()
    try:
        torch_plugin.parallelize(model, mesh, inputs, constraints=constraints)
    except RuntimeError as e:
        message = str(e)
    Path(out_dir, f"rank{rank}.json").write_text(
        json.dumps({"message": message, "seconds": time.perf_counter() - t0})
    )
    _finish()


def _example(name: str) -> Any:
    import importlib.util

    path = Path(__file__).parents[2] / "examples" / f"{name}.py"
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def schedule_gpt2_matches(rank: int, world: int, port: int, out_dir: str) -> None:
    """The example's Megatron schedule on GPT-2 (4 layers): verify passes; one SGD step's
    outputs, gradients and next loss equal single-process training; one all-reduce per
    attention and per MLP in forward; each rank holds 1/world of the sharded parameters."""
    import torch_plugin
    from torch_plugin.runtime.spmd_ops import _block

    _init(rank, world, port)
    try:
        ex = _example("slapo_style_gpt")
        model = ex.build_model(4)
        reference = copy.deepcopy(model)
        full_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
        tokens = torch.randint(0, model.vocab_size, (4, model.seq_len))
        mesh = torch_plugin.DeviceMesh.from_torchrun(timeout_s=TIMEOUT_S)
        sch = torch_plugin.create_schedule(model, mesh)
        ex.megatron_schedule(sch)
        report = sch.verify((tokens,))
        scheduled = torch_plugin.build(sch)
        comm = sch._state.comm
        comm.reset_counts()
        with torch.no_grad():
            scheduled(tokens)
        forward_all_reduces = comm.calls.copy()
        shards = {(s.path, s.name): s for s in sch._state.shards}

        def local(name: str, t: torch.Tensor) -> torch.Tensor:
            owner, _, pname = name.rpartition(".")
            info = shards.get((owner, pname))
            return t if info is None else _block(t, info.axis, info.sections, world, rank)

        def diffs(attr: str) -> float:
            ref = dict(reference.named_parameters())
            return max(
                float((getattr(p, attr) - local(n, getattr(ref[n], attr))).abs().max())
                for n, p in scheduled.named_parameters()
            )

        losses = ex.train(scheduled, tokens, 1)  # one step: gradients stay, then SGD
        expect = ex.train(reference, tokens, 1)
        max_grad_diff = diffs("grad")
        max_grad = max(float(p.grad.abs().max()) for p in reference.parameters())
        max_param_diff = diffs("data")
        losses += ex.train(scheduled, tokens, 1)
        expect += ex.train(reference, tokens, 1)
        local_bytes = sum(p.numel() * p.element_size() for p in scheduled.parameters())
        Path(out_dir, f"rank{rank}.json").write_text(
            json.dumps(
                {
                    "report": report,
                    "losses": losses,
                    "expect": expect,
                    "max_param_diff": max_param_diff,
                    "max_grad_diff": max_grad_diff,
                    "max_grad": max_grad,
                    "forward_all_reduces": forward_all_reduces,
                    "sharded": len(shards),
                    "local_bytes": local_bytes,
                    "full_bytes": full_bytes,
                    "steps": len(sch.steps),
                }
            )
        )
    finally:
        _finish()


def schedule_misuse(rank: int, world: int, port: int, out_dir: str) -> None:
    """Wrong schedules on GPT-2 give errors that name the module and say what to do."""
    import torch_plugin

    _init(rank, world, port)
    errors: dict[str, str] = {}

    def attempt(key: str, fn: Any) -> None:
        try:
            fn()
        except (torch_plugin.ScheduleError, ValueError) as e:
            errors[key] = str(e)

    try:
        ex = _example("slapo_style_gpt")
        mesh = torch_plugin.DeviceMesh.from_torchrun(timeout_s=TIMEOUT_S)
        tokens = torch.randint(0, 1000, (2, 16))
        sch = torch_plugin.create_schedule(ex.build_model(2), mesh)
        blk = sch["model.transformer.h.0"]
        attempt("wrong_path", lambda: sch["model.transformer.h.0.atn"])
        attempt("axis", lambda: blk["attn.c_proj"].shard("weight", axis=2))
        attempt("no_param", lambda: blk["attn.c_proj"].shard("weights", axis=0))
        attempt("divides", lambda: blk["attn.c_attn"].shard("weight", axis=1, sections=5))
        attempt("sync_unsharded", lambda: blk["mlp"].sync("fwd_post"))
        attempt("bad_mode", lambda: blk["attn.c_proj"].sync("after"))
        attempt("find_untraced", lambda: blk["mlp"].find("c_fc"))
        attempt("row_bias", lambda: blk["mlp.c_proj"].shard(["weight", "bias"], axis=0))
        # A row-parallel layer without its sum: the static check names it.
        blk["mlp.c_proj"].shard("weight", axis=0)
        attempt("missing_sync", sch.check)
        blk["mlp.c_proj"].sync("fwd_post")
        blk["mlp.c_fc"].shard(["weight", "bias"], axis=1)
        attempt("missing_bwd_sync", sch.check)
        blk["mlp"].sync("bwd_post")
        # Heads sharded, but the attention still splits q|k|v at the full width: it fails
        # inside verify, which names the module.
        blk["attn.c_attn"].shard(["weight", "bias"], axis=1, sections=3)
        blk["attn"].sync("bwd_post")
        blk["attn.c_proj"].shard("weight", axis=0)
        blk["attn.c_proj"].sync("fwd_post")
        attempt("verify_fails", lambda: sch.verify((tokens,)))
        # q|k|v split as one block (no sections): it runs, with other heads: verify names it.
        sch = torch_plugin.create_schedule(ex.build_model(2), mesh)
        attn = sch["model.transformer.h.1.attn"]
        attn["c_attn"].shard(["weight", "bias"], axis=1)
        attn.sync("bwd_post")
        attn["c_proj"].shard("weight", axis=0)
        attn["c_proj"].sync("fwd_post")
        attn.module.split_size //= world
        attempt("verify_differs", lambda: sch.verify((tokens,)))
        Path(out_dir, f"rank{rank}.json").write_text(json.dumps(errors))
    finally:
        _finish()


def _launched_mesh(out_dir: str, shape: list[int] | None, timeout_s: float) -> None:
    """A process started as torchrun starts one (RANK, WORLD_SIZE, MASTER_* in the environment)
    builds a mesh; it records the error it gets, if any, and how long that took."""
    import time

    import torch_plugin

    rank = os.environ["RANK"]
    torch.set_num_threads(1)
    message, t0 = "", time.perf_counter()
    try:
        torch_plugin.DeviceMesh.from_torchrun(shape, timeout_s=timeout_s)
    except RuntimeError as e:
        message = str(e)
    Path(out_dir, f"rank{rank}.json").write_text(
        json.dumps({"message": message, "seconds": time.perf_counter() - t0})
    )
    os._exit(0)


if __name__ == "__main__":
    import sys

    if sys.argv[1] == "launched_mesh":
        shape_arg = json.loads(sys.argv[3])
        _launched_mesh(sys.argv[2], shape_arg, float(sys.argv[4]))


def schedule_pipeline_composition(
    rank: int, world: int, port: int, out_dir: str, pinned: bool, placement: bool
) -> None:
    """4 ranks as (pp=2, tp=2): a Megatron schedule shards each block over 'tp', the
    graph-pipeline partitioner cuts the scheduled model into 2 stages over 'pp', and (with
    `placement`) the placement pass places each stage's compute between the schedule's syncs,
    forward and backward; 3 SGD steps whose losses must equal single-process training."""
    import sys

    import torch_plugin
    from torch_plugin.models import gpt

    sys.path.insert(0, str(Path(__file__).parents[2] / "benchmarks"))
    from schedule import megatron_schedule

    _init(rank, world, port)
    undo = None
    try:
        torch.manual_seed(0)
        cfg = gpt.GPTConfig(
            dim=64, n_layers=4, n_heads=4, vocab_size=256, seq_len=16, lm_head=False
        )
        model = gpt.GPT(cfg)
        reference = copy.deepcopy(model)
        tokens = torch.randint(0, cfg.vocab_size, (8, cfg.seq_len))
        target = torch.randn(8, cfg.seq_len, cfg.dim)
        mesh = torch_plugin.DeviceMesh.from_torchrun((2, 2), ("pp", "tp"), timeout_s=TIMEOUT_S)
        sch = torch_plugin.create_schedule(model, mesh)
        megatron_schedule(sch)
        if pinned:
            sch["blocks.0"].pipeline_split()  # stage 0: embeddings and block 0
        # A chain of 2 stages, 4 micro-batches of 2 (GraphPipe's own choice here is a
        # data-parallel stage: cheaper for a model this small).
        options: dict[str, Any] = {}
        if placement:
            import stub_profile

            # Decisions must not hang on this CPU's speed; undone when the case ends (the
            # pool's ranks run later cases too).
            undo = stub_profile.Undo()
            stub_profile.install({"fused": 1e-5}, undo)
            options["placement"] = {
                "backends": ["aten", "fused"],
                "cache_path": str(Path(out_dir, "profile.db")),  # one file, 4 writers
                "samples": 3,
            }
        pp = torch_plugin.build(
            sch,
            example_inputs=(tokens,),
            loss_fn=F.mse_loss,
            strategy="spp",
            micro_batch_sizes=[2],
            **options,
        )
        opt = torch.optim.SGD(pp.parameters(), lr=0.05)
        losses = []
        with torch_plugin.placement.record() as placed:
            for _ in range(3):
                opt.zero_grad()
                losses.append(pp.step((tokens,), target))
                opt.step()
        expect = _example("sharding").train(reference, tokens, target, 3)  # SGD 0.05, MSE
        Path(out_dir, f"rank{rank}.json").write_text(
            json.dumps(
                {
                    "losses": losses,
                    "expect": expect,
                    "stage": pp.my_stage,
                    "stages": pp.plan.num_stages,
                    "micro_batches": [st.micro_batch for st in pp.plan.stages],
                    "params": [n for n, _ in pp.named_parameters()],
                    "segments": [seg.nodes for seg in pp.placed_segments],
                    "placed": [(r.kind, r.backend_counts()) for r in placed],
                }
            )
        )
    finally:
        if undo is not None:
            undo.restore()
        _finish()


def schedule_auto_shard(rank: int, world: int, port: int, out_dir: str) -> None:
    """A schedule pins only the attention's sharding; the ILP plans the rest. The pins hold,
    and one training step equals single-process training."""
    import torch_plugin

    _init(rank, world, port)
    try:
        mesh = torch_plugin.DeviceMesh.from_torchrun(timeout_s=TIMEOUT_S)
        model, inputs = _sharding_model("gpt", 8)
        reference, out, target, _ = _reference_step(model, inputs)
        sch = torch_plugin.create_schedule(model, mesh)
        for attn in sch["blocks.*.attn"]:
            for name in ("q", "k", "v"):
                attn[name].shard(["weight", "bias"], axis=0)
            attn["o"].shard("weight", axis=1)
        sharded = torch_plugin.build(sch, auto="shard", example_inputs=inputs)
        got = sharded(*inputs)
        F.mse_loss(got, target).backward()
        torch.testing.assert_close(got, out, rtol=1e-5, atol=1e-5)
        ref = dict(reference.named_parameters())
        grad_diff = 0.0
        for name, p, spec in sharded.named_local_parameters():
            grad_diff = max(
                grad_diff, float((p.grad - sharded.shard(ref[name].grad, spec)).abs().max())
            )
        specs = {n: s for n, _, s in sharded.named_local_parameters()}
        Path(out_dir, f"rank{rank}.json").write_text(
            json.dumps({"specs": specs, "grad_diff": grad_diff})
        )
    finally:
        _finish()


def parallelize_decorator(rank: int, world: int, port: int, out_dir: str) -> None:
    """@torch_plugin.parallelize on a class: instances come out sharded and compute what the
    plain class computes."""
    import torch_plugin
    from torch_plugin.models import gpt

    _init(rank, world, port)
    try:
        mesh = torch_plugin.DeviceMesh.from_torchrun(timeout_s=TIMEOUT_S)
        cfg = gpt.GPTConfig(64, 2, 4, 1000, 16, lm_head=False)
        torch.manual_seed(1)  # every rank feeds the same batch (SPMD)
        tokens = torch.randint(0, 1000, (4, 16))

        @torch_plugin.parallelize(mesh, example_inputs=lambda m: (tokens,))
        class ShardedGPT(gpt.GPT):
            pass

        torch.manual_seed(0)
        model = ShardedGPT(cfg)
        torch.manual_seed(0)
        plain = gpt.GPT(cfg)
        torch.testing.assert_close(model(tokens), plain(tokens), rtol=1e-5, atol=1e-5)
        Path(out_dir, f"rank{rank}.json").write_text(
            json.dumps({"type": type(model).__name__, "sharded": model.plan.params[0][2]})
        )
    finally:
        _finish()


def schedule_dp_tp(rank: int, world: int, port: int, out_dir: str) -> None:
    """4 ranks as (dp=2, tp=2): the Megatron schedule over 'tp', replicas over 'dp'; 3 SGD steps
    equal single-process training on the whole batch."""
    import sys

    import torch_plugin
    from torch_plugin.models import gpt

    sys.path.insert(0, str(Path(__file__).parents[2] / "benchmarks"))
    from schedule import megatron_schedule

    _init(rank, world, port)
    try:
        torch.manual_seed(0)
        cfg = gpt.GPTConfig(
            dim=64, n_layers=2, n_heads=4, vocab_size=256, seq_len=16, lm_head=False
        )
        model = gpt.GPT(cfg)
        reference = copy.deepcopy(model)
        tokens = torch.randint(0, cfg.vocab_size, (8, cfg.seq_len))
        target = torch.randn(8, cfg.seq_len, cfg.dim)
        mesh = torch_plugin.DeviceMesh.from_torchrun((2, 2), ("dp", "tp"), timeout_s=TIMEOUT_S)
        sch = torch_plugin.create_schedule(model, mesh)
        megatron_schedule(sch)
        dp_model = torch_plugin.build(sch)

        train = _example("sharding").train  # SGD at lr 0.05 on the MSE loss, losses per step

        Path(out_dir, f"rank{rank}.json").write_text(
            json.dumps(
                {
                    "losses": train(dp_model, tokens, target, 3),
                    "expect": train(reference, tokens, target, 3),
                    "type": type(dp_model).__name__,
                    "dp_calls": dict(dp_model.comm.calls),
                }
            )
        )
    finally:
        _finish()


def sharding_dropout_matches(rank: int, world: int, port: int, out_dir: str) -> None:
    """GPT-2 with dropout 0.1, training mode, ranks seeded differently: the sharded forward and
    its gradients equal one process's drawing from tp rank 0's generator state."""
    import torch_plugin
    from torch_plugin import models

    _init(rank, world, port)
    try:
        torch.manual_seed(0)
        model, inputs = models.build("gpt2", small=True, batch=2, n_layer=2)
        model.train()
        reference = copy.deepcopy(model)
        mesh = torch_plugin.DeviceMesh.from_torchrun(timeout_s=TIMEOUT_S)
        sharded = torch_plugin.parallelize(model, mesh, inputs)
        torch.manual_seed(100 + rank)  # the ranks' generators now differ
        state = torch.get_rng_state()
        dist.broadcast(state, src=0)  # what rank 0 will draw from
        out = sharded(*inputs)
        torch.set_rng_state(state)
        expect = reference(*inputs)
        out.pow(2).mean().backward()
        expect.pow(2).mean().backward()
        ref = dict(reference.named_parameters())
        grad_diff = max(
            float((p.grad - sharded.shard(ref[n].grad, spec)).abs().max())
            for n, p, spec in sharded.named_local_parameters()
        )
        Path(out_dir, f"rank{rank}.json").write_text(
            json.dumps(
                {
                    "out_diff": float((out - expect).abs().max()),
                    "grad_diff": grad_diff,
                    "random": sharded._random_ops,
                    "sharded": sum(s != "R" for _, _, s in sharded.named_local_parameters()),
                }
            )
        )
    finally:
        _finish()


class ParameterDropout(torch.nn.Module):
    """Dropout on a weight of 8 rows (not along the batch: one mask for every sample) and on the
    activations (along it). With a batch of 4 on 2 dp replicas a replica has 2 rows, which 8
    divides: a rule guessing from divisibility took the weight's mask for 4 rows per sample."""

    def __init__(self, reduce: str = "mean") -> None:
        super().__init__()
        self.w = torch.nn.Parameter(torch.randn(8, 8))
        self.reduce = reduce

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        w = F.dropout(self.w, 0.5, training=self.training)
        if self.reduce == "native":  # ATen's fused dropout, what F.dropout is on CUDA
            y = torch.native_dropout(x @ w, 0.3, self.training)[0].pow(2)
        else:
            y = F.dropout(x @ w, 0.3, training=self.training).pow(2)
        return y.sum() if self.reduce == "sum" else y.mean()


def dp_parameter_dropout_matches(
    rank: int, world: int, port: int, reduce: str = "mean"
) -> dict[str, float]:
    """A (2, 1) mesh, a model with dropout on a weight and on activations returning a mean or a
    sum over the batch, ranks seeded alike: the loss and gradient of the dp replicas equal one
    process's with the same seed."""
    import torch_plugin

    _init(rank, world, port)
    try:
        torch.manual_seed(0)
        model = ParameterDropout(reduce).train()
        reference = copy.deepcopy(model)
        x = torch.randn(4, 8)
        mesh = torch_plugin.DeviceMesh((2, 1), ("dp", "tp"), timeout_s=TIMEOUT_S)
        sharded = torch_plugin.parallelize(model, mesh, (x,))
        torch.manual_seed(7)
        loss = sharded(x)
        loss.backward()
        after = float(torch.rand(()))  # the generator advanced as one process's does
        torch.manual_seed(7)
        expect = reference(x)
        expect.backward()
        expect_after = float(torch.rand(()))
        grad = next(p.grad for _, p, _ in sharded.named_local_parameters())
        return {
            "loss_diff": abs(float(loss) - float(expect)),
            "grad_diff": float((grad - reference.w.grad).abs().max()),
            "rng_diff": abs(after - expect_after),
            "loss": float(expect),
        }
    finally:
        _finish()


def dp_batch_refusal(rank: int, world: int, port: int) -> tuple[str, str]:
    """parallelize on a (2, 2) mesh with an example batch of 3, then (with a batch of 2) a call
    of 1 row: the error each rank raises for each."""
    import torch_plugin
    from torch_plugin.models import hf_suite

    _init(rank, world, port)
    errors = []
    try:
        mesh = torch_plugin.DeviceMesh((2, 2), ("dp", "tp"), timeout_s=TIMEOUT_S)
        model, inputs = hf_suite.build("llama", batch=3)
        try:
            torch_plugin.parallelize(model, mesh, inputs)
            errors.append("no error")
        except ValueError as e:
            errors.append(str(e))
        model, inputs = hf_suite.build("llama", batch=2)
        sharded = torch_plugin.parallelize(model, mesh, inputs)
        try:
            sharded(**{k: v[:1] for k, v in inputs.items()})
            errors.append("no error")
        except ValueError as e:
            errors.append(str(e))
        return errors[0], errors[1]
    finally:
        _finish()


class DropoutMLP(torch.nn.Module):
    """A positional model torch.fx traces at module level, with dropout between its layers."""

    def __init__(self, width: int = 16, depth: int = 4, fused: bool = False) -> None:
        super().__init__()
        self.layers = torch.nn.ModuleList(torch.nn.Linear(width, width) for _ in range(depth))
        self.drop = torch.nn.Dropout(0.2)
        self.fused = fused

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.layers:
            x = torch.relu(layer(x))
            # fused: ATen's native_dropout, the one kernel nn.Dropout becomes on CUDA (on CPU
            # it decomposes into bernoulli_), called directly so the CPU runs that path.
            x = torch.native_dropout(x, 0.2, self.training)[0] if self.fused else self.drop(x)
        return x


def pipeline_module_dropout(rank: int, world: int, port: int, fused: bool = False) -> dict:
    """A positional model with nn.Dropout (or native_dropout) through strategy="pipeline":
    split at ATen level (capture='auto'), so with one seed each step's loss and gradients equal
    one process's."""
    import torch_plugin

    _init(rank, world, port)
    try:
        torch.manual_seed(0)
        model = DropoutMLP(fused=fused)
        reference = copy.deepcopy(model)
        x = torch.randn(8, 16)
        pp = torch_plugin.parallelize(
            model, world, (x,), strategy="pipeline", loss_fn=F.mse_loss, num_microbatches=4
        )
        losses, expect, grad_diff = [], [], 0.0
        for i, rows in enumerate([8, 8, 16]):
            xs, target = torch.randn(rows, 16), torch.randn(rows, 16)
            for p in [*pp.parameters(), *reference.parameters()]:
                p.grad = None
            torch.manual_seed(10 + i)
            losses.append(pp.step((xs,), target))
            torch.manual_seed(10 + i)
            loss = F.mse_loss(reference(xs), target)
            loss.backward()
            expect.append(float(loss))
            ref = dict(reference.named_parameters())
            for name, p in pp.named_parameters():
                if p.grad is not None:
                    grad_diff = max(grad_diff, float((p.grad - ref[name].grad).abs().max()))
        return {
            "aten": pp.aten is not None,
            "draws": pp.replayed_draws,
            "losses": losses,
            "expect": expect,
            "grad_diff": grad_diff,
        }
    finally:
        _finish()


def pipeline_fails_fast(rank: int, world: int, port: int) -> dict:
    """A loss_fn that raises on the loss stage's rank at the second step: the failed rank
    sends zeros where its results are due, so every rank finishes the schedule and raises at
    once (the failed one its own error, the others naming it) instead of waiting out the
    process-group timeout; the step's gradients are discarded and the next step equals one
    process's."""
    import time

    import torch_plugin

    _init(rank, world, port)
    try:
        torch.manual_seed(0)
        model = DropoutMLP()
        reference = copy.deepcopy(model)
        x = torch.randn(8, 16)
        calls = [-1]  # armed for the second step: its second micro-batch raises

        def loss_fn(out: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
            if calls[0] >= 0:
                calls[0] += 1
                if calls[0] == 2:
                    raise ValueError("bad target in the user's loss")
            return F.mse_loss(out, target)

        pp = torch_plugin.parallelize(
            model, world, (x,), strategy="spp", loss_fn=loss_fn, num_microbatches=4
        )
        target = torch.randn(8, 16)
        pp.step((x,), target)
        calls[0] = 0
        t0 = time.perf_counter()
        try:
            pp.step((x,), target)
            error = ""
        except Exception as e:  # noqa: BLE001 - the test reads the error
            error = f"{type(e).__name__}: {e}"
        seconds = time.perf_counter() - t0
        grads_cleared = all(p.grad is None for p in pp.parameters())
        calls[0] = -1
        torch.manual_seed(3)
        loss = pp.step((x,), target)
        torch.manual_seed(3)
        expect = F.mse_loss(reference(x), target)
        expect.backward()
        ref = dict(reference.named_parameters())
        grad_diff = max(
            (float((p.grad - ref[n].grad).abs().max()) for n, p in pp.named_parameters()),
            default=0.0,
        )
        return {
            "error": error,
            "seconds": seconds,
            "grads_cleared": grads_cleared,
            "loss": (loss, float(expect)),
            "grad_diff": grad_diff,
            "loss_rank": pp.my_stage == pp.loss_stage,
            "stages": pp.plan.num_stages,
        }
    finally:
        _finish()
