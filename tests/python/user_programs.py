"""Workers for test_user_programs.py: HF causal LMs from library-default configs (only sizes
set: use_cache=True, the library's dropout), trained the way users' loops do (collated batches
with right padding and labels at -100, a length that changes every step, a short last batch,
AdamW), through one `parallelize`, against the same loop in one process."""

from __future__ import annotations

import copy
from typing import Any

import dist_workers
import torch
import torch.distributed as dist
import transformers

VOCAB = 256


def default_config_model(kind: str) -> torch.nn.Module:
    """A library-default config with only the size fields set (and what a size needs)."""
    torch.manual_seed(0)
    sizes = dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=2)
    if kind == "llama":
        cfg = transformers.LlamaConfig(**sizes, num_attention_heads=4, num_key_value_heads=2)
        return transformers.LlamaForCausalLM(cfg)
    if kind == "qwen2":
        cfg = transformers.Qwen2Config(**sizes, num_attention_heads=4, num_key_value_heads=2)
        return transformers.Qwen2ForCausalLM(cfg)
    if kind == "gpt2":
        cfg = transformers.GPT2Config(vocab_size=VOCAB, n_embd=64, n_layer=2, n_head=4)
        return transformers.GPT2LMHeadModel(cfg)
    raise ValueError(kind)


def padded_batch(rows: int, length: int, seed: int) -> dict[str, torch.Tensor]:
    from torch_plugin.models import hf_suite

    return hf_suite.collated_batch(rows, length, seed, vocab=VOCAB)


# A short batch, then a last batch that does not divide over 2 dp replicas (3 + 2 rows).
SHAPES = [(8, 16), (8, 24), (8, 13), (4, 20), (5, 20)]


def _train(model: Any, batches: list[dict[str, torch.Tensor]], seed: int) -> list[float]:
    torch.manual_seed(seed)  # dropout draws the same masks in both runs
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    losses = []
    for batch in batches:
        loss = model(**batch).loss
        loss.backward()
        opt.step()
        opt.zero_grad()
        losses.append(float(loss.detach()))
    return losses


def train_like_a_user(rank: int, world: int, port: int, kind: str, shape: list[int]) -> dict:
    """parallelize once on the first batch; train on batches of other lengths and sizes; then
    the same shapes again (no capture may happen) and other keyword sets."""
    import torch_plugin

    dist_workers._init(rank, world, port)
    try:
        model = default_config_model(kind)
        model.train()
        reference = copy.deepcopy(model)
        batches = [padded_batch(b, t, i) for i, (b, t) in enumerate(SHAPES)]
        names = ("dp", "tp") if len(shape) == 2 else ("tp",)
        mesh = torch_plugin.DeviceMesh(tuple(shape), names, timeout_s=dist_workers.TIMEOUT_S)
        sharded = torch_plugin.parallelize(model, mesh, batches[0])
        ours = _train(sharded, batches, seed=1)
        programs = len(sharded._programs)
        again = _train(sharded, [padded_batch(b, t, 10 + i) for i, (b, t) in enumerate(SHAPES)], 2)
        expect = _train(reference, batches, seed=1)
        expect_again = _train(
            reference, [padded_batch(b, t, 10 + i) for i, (b, t) in enumerate(SHAPES)], 2
        )
        after_warmup = len(sharded._programs)
        # Another keyword set (no mask), in eval mode (dropout off: another program), no grad.
        batch = padded_batch(8, 12, 99)
        sharded.eval()
        reference.eval()
        with torch.no_grad():
            call = {"input_ids": batch["input_ids"], "labels": batch["labels"]}
            no_mask, ref_no_mask = float(sharded(**call).loss), float(reference(**call).loss)
        return {
            "ours": ours + again,
            "expect": expect + expect_again,
            "programs": programs,
            "after_warmup": after_warmup,
            "capture_s": list(sharded.capture_times_s.values()),
            "plans": list(sharded.program_plans.values()),
            "no_mask": (no_mask, ref_no_mask),
            "config_use_cache": bool(model.config.use_cache),
        }
    finally:
        dist_workers._finish()


def _saved_bytes(fn: Any) -> tuple[Any, int]:
    """fn()'s result and the bytes of the tensors autograd saved for the backward while it ran."""
    total = [0]

    def pack(t: torch.Tensor) -> torch.Tensor:
        total[0] += t.numel() * t.element_size()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = fn()
    return out, total[0]


def checkpointed_training(rank: int, world: int, port: int, kind: str) -> dict:
    """HF's gradient_checkpointing_enable, then parallelize: the activations saved for the
    backward per rank (with it and without), and the losses of a loop over changing lengths
    against one process with checkpointing."""
    import torch_plugin

    dist_workers._init(rank, world, port)
    try:
        mesh = torch_plugin.DeviceMesh((world,), ("tp",), timeout_s=dist_workers.TIMEOUT_S)
        batches = [padded_batch(b, t, i) for i, (b, t) in enumerate(SHAPES)]
        saved = {}
        for on in (False, True):
            model = default_config_model(kind)
            if on:
                model.gradient_checkpointing_enable()
            model.train()
            reference = copy.deepcopy(model)
            sharded = torch_plugin.parallelize(model, mesh, batches[0])
            torch.manual_seed(0)
            loss, saved[on] = _saved_bytes(lambda s=sharded: s(**batches[0]).loss)
            torch.manual_seed(0)
            _, saved[f"one process {on}"] = _saved_bytes(lambda r=reference: r(**batches[0]).loss)
            del loss
        # `sharded` and `reference` are now the checkpointed pair.
        return {
            "saved": saved,
            "ours": _train(sharded, batches, seed=1),
            "expect": _train(reference, batches, seed=1),
        }
    finally:
        dist_workers._finish()


def _pipeline_step_as_one_process(
    step: Any, pp: Any, reference: torch.nn.Module, batch: dict, seed: int
) -> tuple[float, float, float]:
    """`step()` (a pipeline step on `batch`, returning its loss) and one process's step of
    `reference` on it, from the same seed, gradients cleared first: the two losses and the
    largest difference of this rank's gradients from one process's."""
    for p in [*pp.parameters(), *reference.parameters()]:
        p.grad = None
    torch.manual_seed(seed)
    loss = float(step())
    torch.manual_seed(seed)
    want = reference(**batch).loss
    want.backward()
    ref = dict(reference.named_parameters())
    diff = max(
        (
            float((p.grad - ref[name].grad).abs().max())
            for name, p in pp.named_parameters()
            if p.grad is not None
        ),
        default=0.0,
    )
    return loss, float(want), diff


def pipeline_checkpointed(rank: int, world: int, port: int, kind: str) -> dict:
    """HF's gradient_checkpointing_enable, then strategy="pipeline": this rank's activations
    saved for the backward in a step (with checkpointing and without), and with it each step's
    loss and this rank's gradients against one process's over batches of changing length."""
    import torch_plugin

    dist_workers._init(rank, world, port)
    try:
        batches = [padded_batch(8, t, i) for i, t in enumerate((16, 12, 16))]
        saved, losses, expect, grad_diff = {}, [], [], {}
        for on in (False, True):
            grad_diff[on] = 0.0
            model = default_config_model(kind)
            if on:
                model.gradient_checkpointing_enable()
            model.train()
            reference = copy.deepcopy(model)
            pp = torch_plugin.parallelize(
                model, world, batches[0], strategy="pipeline", num_microbatches=4
            )
            for i, b in enumerate(batches):
                loss, want, diff = _pipeline_step_as_one_process(
                    lambda pp=pp, b=b: pp.step(b), pp, reference, b, 100 + i
                )
                losses.append(loss)
                expect.append(want)
                grad_diff[on] = max(grad_diff[on], diff)
            _, saved[on] = _saved_bytes(lambda pp=pp: pp.step(batches[0]))
        return {"saved": saved, "losses": losses, "expect": expect, "grad_diff": grad_diff}
    finally:
        dist_workers._finish()


def pipeline_under_autocast(rank: int, world: int, port: int, kind: str, built_under: bool) -> dict:
    """A pipeline built as usual (or `built_under` autocast), then stepped the way
    mixed-precision loops run (HF Trainer's bf16=True, a hand-written torch.autocast): steps
    under torch.autocast("cpu", bfloat16) at the example's length and another, one without
    autocast, one under it again. Each step's
    loss and this rank's gradients against one process's step under the same autocast state,
    and how far that step is from the same step in f32 (the scale autocast changes things by)."""
    import torch_plugin

    dist_workers._init(rank, world, port)
    try:
        model = default_config_model(kind)
        model.train()
        reference = copy.deepcopy(model)
        f32 = copy.deepcopy(model)
        steps = [(16, True), (12, True), (12, False), (16, True)]
        batches = [padded_batch(8, t, i) for i, (t, _) in enumerate(steps)]
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=built_under):
            pp = torch_plugin.parallelize(
                model, world, batches[0], strategy="pipeline", num_microbatches=4
            )
        out: dict[str, list] = {k: [] for k in ("loss", "expect", "grad_diff", "f32_loss")}
        for i, ((_, on), b) in enumerate(zip(steps, batches, strict=True)):
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=on):
                loss, want, diff = _pipeline_step_as_one_process(
                    lambda b=b: pp.step(b), pp, reference, b, 100 + i
                )
            out["loss"].append(loss)
            out["expect"].append(want)
            out["grad_diff"].append(diff)
            torch.manual_seed(100 + i)
            with torch.no_grad():
                out["f32_loss"].append(float(f32(**b).loss))
        out["captures"] = sorted(pp.capture_times_s)
        return out
    finally:
        dist_workers._finish()


def pipeline_under_saved_tensors_hooks(rank: int, world: int, port: int) -> dict:
    """A training loop whose steps run under saved-tensor hooks (what save_on_cpu installs),
    over batches of changing length: a new length is traced while they are on. Per step the
    loss, this rank's largest gradient difference from one process's, and the bytes the hooks
    were handed."""
    import torch_plugin

    dist_workers._init(rank, world, port)
    try:
        batches = [padded_batch(8, t, i) for i, t in enumerate((16, 12, 20))]
        model = default_config_model("gpt2").train()
        reference = copy.deepcopy(model)
        pp = torch_plugin.parallelize(
            model, world, batches[0], strategy="pipeline", num_microbatches=4
        )
        losses, expect, grad_diff, saved = [], [], [], []
        for i, b in enumerate(batches):

            def step(b: dict = b) -> Any:  # the step's loss; the bytes it saved kept
                loss, nbytes = _saved_bytes(lambda: pp.step(b))
                saved.append(nbytes)
                return loss

            loss, want, diff = _pipeline_step_as_one_process(step, pp, reference, b, 100 + i)
            losses.append(loss)
            expect.append(want)
            grad_diff.append(diff)
        return {"losses": losses, "expect": expect, "grad_diff": grad_diff, "saved": saved}
    finally:
        dist_workers._finish()


def positional_then_keywords(rank: int, world: int, port: int) -> dict:
    """parallelize with a positional example (input ids), then the HF keyword call with labels:
    Dynamo would compile the new signature, and so does the sharded model."""
    import torch_plugin

    dist_workers._init(rank, world, port)
    try:
        model = default_config_model("llama")
        reference = copy.deepcopy(model)
        batch = padded_batch(4, 10, 0)
        mesh = torch_plugin.DeviceMesh((world,), ("tp",), timeout_s=dist_workers.TIMEOUT_S)
        sharded = torch_plugin.parallelize(model, mesh, (batch["input_ids"],))
        logits = sharded(batch["input_ids"]).logits
        loss = sharded(**batch).loss
        loss.backward()
        ref_loss = reference(**batch).loss
        ref_loss.backward()
        grads = dict(reference.named_parameters())
        grad_diff = max(
            float((p.grad - sharded.shard(grads[n].grad, spec)).abs().max())
            for n, p, spec in sharded.named_local_parameters()
        )
        return {
            "logits": float((logits - reference(batch["input_ids"]).logits).abs().max()),
            "loss": (float(loss), float(ref_loss)),
            "grad_diff": grad_diff,
        }
    finally:
        dist_workers._finish()


def bad_calls(rank: int, world: int, port: int) -> dict:
    """What a user sees for calls that cannot run: each error's type and message."""
    import torch_plugin

    dist_workers._init(rank, world, port)
    try:
        model = default_config_model("llama")
        batch = padded_batch(4, 10, 0)
        mesh = torch_plugin.DeviceMesh((world,), ("tp",), timeout_s=dist_workers.TIMEOUT_S)
        sharded = torch_plugin.parallelize(model, mesh, batch)
        seen: dict[str, Any] = {}
        attempts = {
            "short_mask": {**batch, "attention_mask": batch["attention_mask"][:2]},
            "short_labels": {**batch, "labels": batch["labels"][:3]},
            # input ids and embeddings both: LlamaModel itself refuses the call.
            "model_refuses": {**batch, "inputs_embeds": torch.zeros(4, 10, 64)},
        }
        for key, call in attempts.items():
            try:
                sharded(**call)
                seen[key] = None
            except Exception as e:  # noqa: BLE001 - the test reads the error
                seen[key] = (type(e).__name__, str(e))
        try:
            model_error: Any = None
            reference = default_config_model("llama")
            reference(**attempts["model_refuses"])
        except Exception as e:  # noqa: BLE001 - the model's own error, for comparison
            model_error = (type(e).__name__, str(e))
        seen["model_error"] = model_error
        dist.barrier()
        return seen
    finally:
        dist_workers._finish()


def pipeline_default_config(rank: int, world: int, port: int, kind: str) -> dict:
    """A library-default model (use_cache=True; GPT-2's dropout 0.1) through
    strategy="pipeline", then padded batches of other lengths (a stage captured again at each,
    the plan kept) and short last batches (partial or empty micro-batches): with one seed each
    step's loss, this rank's gradients and the generator's state after the step equal one
    process's. Bigger batches than the example's (12 and 16 rows) run as chunks of the
    example's and equal one process's too. A batch whose last chunk leaves a micro-batch of one
    sample, where the model's graph differs, is refused on every rank before anything runs and
    the ranks stay in step for the next batch."""
    import torch_plugin

    dist_workers._init(rank, world, port)
    try:
        model = default_config_model(kind)
        reference = copy.deepcopy(model)
        shapes = [(8, 12), (8, 16), (8, 9), (6, 16), (12, 12), (16, 16), (8, 12), (2, 9)]
        batches = [padded_batch(rows, t, i) for i, (rows, t) in enumerate(shapes)]
        pp = torch_plugin.parallelize(
            model, world, batches[0], strategy="pipeline", num_microbatches=4
        )
        losses, expect, grad_diff, same_generator = [], [], 0.0, True
        for i, b in enumerate(batches):
            for p in [*pp.parameters(), *reference.parameters()]:
                p.grad = None
            torch.manual_seed(100 + i)
            losses.append(pp.step(b))
            after = torch.rand(4)
            torch.manual_seed(100 + i)
            loss = reference(**b).loss
            loss.backward()
            expect.append(float(loss))
            same_generator &= bool(torch.equal(after, torch.rand(4)))
            ref = dict(reference.named_parameters())
            for name, p in pp.named_parameters():
                if p.grad is not None:
                    grad_diff = max(grad_diff, float((p.grad - ref[name].grad).abs().max()))
        try:
            pp.step(padded_batch(9, 12, 1))
            refused = None
        except RuntimeError as e:
            refused = str(e)
        again = padded_batch(8, 12, 2)
        torch.manual_seed(7)
        losses.append(pp.step(again))
        torch.manual_seed(7)
        expect.append(float(reference(**again).loss))
        return {
            "losses": losses,
            "expect": expect,
            "grad_diff": grad_diff,
            "grads": sum(p.grad is not None for p in pp.parameters()),
            "same_generator": same_generator,
            "draws": pp.replayed_draws,
            "refused": refused,
            "captures": list(pp.capture_times_s),
        }
    finally:
        dist_workers._finish()


def _backward(model: torch.nn.Module, batch: dict, seed: int) -> float:
    """One process's forward and backward on `batch` from `seed`: its loss."""
    torch.manual_seed(seed)
    loss = model(**batch).loss
    loss.backward()
    return float(loss)


def _reloaded_diff(reference: torch.nn.Module, path: str, batch: dict) -> float:
    """The largest logit difference of from_pretrained(path) from `reference`, both in eval
    mode."""
    again = type(reference).from_pretrained(path).eval()
    reference.eval()
    with torch.no_grad():
        return float((again(**batch).logits - reference(**batch).logits).abs().max())


def pretrained_round_trip(rank: int, world: int, port: int, kind: str, src: str, out: str) -> dict:
    """A `meta` model parallelized with pretrained=<save_pretrained dir> (sharded, with its
    index): each rank reads its blocks; the loss equals one process's on the same weights; then
    save_pretrained from the blocks, which HF's from_pretrained loads (rank 0 compares)."""
    import torch_plugin

    dist_workers._init(rank, world, port)
    try:
        reference = default_config_model(kind)  # the weights save_pretrained wrote (seed 0)
        batch = padded_batch(4, 10, 0)
        with torch.device("meta"):
            meta = type(reference)(reference.config)
        mesh = torch_plugin.DeviceMesh((world,), ("tp",), timeout_s=dist_workers.TIMEOUT_S)
        sharded = torch_plugin.parallelize(meta, mesh, batch, pretrained=src)
        sharded.eval()  # dropout off (GPT-2's library default is 0.1): another program
        reference.eval()
        with torch.no_grad():
            loss, expect = float(sharded(**batch).loss), float(reference(**batch).loss)
        files = torch_plugin.save_pretrained(sharded, out, max_shard_size=100_000)
        result = {"loss": (loss, expect), "report": sharded.pretrained_report, "files": files}
        if rank == 0:
            result["reloaded"] = _reloaded_diff(reference, out, batch)
        dist.barrier()
        return result
    finally:
        dist_workers._finish()


class SelfCheckpointing(torch.nn.Module):
    """A user's own model that checkpoints its blocks in its forward with torch.utils.checkpoint
    (use_reentrant=False, as torch recommends), not through HF's layers."""

    def __init__(
        self, width: int = 32, depth: int = 4, checkpointing: bool = True, dropout: float = 0.1
    ) -> None:
        super().__init__()
        torch.manual_seed(0)
        nn = torch.nn
        self.blocks = nn.ModuleList(
            nn.Sequential(
                nn.LayerNorm(width),
                nn.Linear(width, 4 * width),
                nn.GELU(),
                nn.Linear(4 * width, width),
                nn.Dropout(dropout) if dropout else nn.Identity(),
            )
            for _ in range(depth)
        )
        self.head = nn.Linear(width, width)
        self.checkpointing = checkpointing

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for block in self.blocks:
            if self.checkpointing and self.training:
                x = x + torch.utils.checkpoint.checkpoint(block, x, use_reentrant=False)
            else:
                x = x + block(x)
        return self.head(x)


def self_checkpointed_training(
    rank: int, world: int, port: int, strategy: str, dropout: float
) -> dict:
    """SelfCheckpointing through parallelize (strategy "tp": a tensor-parallel mesh, or
    "pipeline"): the activations this rank saves for a step's backward, with the model's
    checkpointing and without; and with it each step's loss and this rank's largest gradient
    difference from one process's, over batches of changing size."""
    import torch.nn.functional as F

    import torch_plugin

    dist_workers._init(rank, world, port)
    try:
        rows = (16, 8, 16)
        data = [(torch.randn(b, 10, 32), torch.randn(b, 10, 32)) for b in rows]
        saved: dict[bool, int] = {}
        losses, expect, grad_diff = [], [], 0.0
        for on in (False, True):
            model = SelfCheckpointing(checkpointing=on, dropout=dropout).train()
            reference = copy.deepcopy(model)
            x0 = data[0][0]
            if strategy == "pipeline":
                pp = torch_plugin.parallelize(
                    model, world, (x0,), strategy="pipeline", loss_fn=F.mse_loss, num_microbatches=4
                )
                params = {n: (p, None) for n, p in pp.named_parameters()}

                def step(x: torch.Tensor, y: torch.Tensor, pp: Any = pp) -> Any:
                    return pp.step((x,), y)
            else:
                mesh = torch_plugin.DeviceMesh((world,), ("tp",), timeout_s=dist_workers.TIMEOUT_S)
                sharded = torch_plugin.parallelize(model, mesh, (x0,))
                params = {n: (p, spec) for n, p, spec in sharded.named_local_parameters()}

                def step(x: torch.Tensor, y: torch.Tensor, sharded: Any = sharded) -> Any:
                    loss = F.mse_loss(sharded(x), y)
                    loss.backward()
                    return loss.detach()

            torch.manual_seed(0)
            _, saved[on] = _saved_bytes(lambda step=step: step(*data[0]))
            if not on:
                continue
            for i, (x, y) in enumerate(data):
                for p in [*(p for p, _ in params.values()), *reference.parameters()]:
                    p.grad = None
                torch.manual_seed(10 + i)
                losses.append(float(step(x, y)))
                torch.manual_seed(10 + i)
                want = F.mse_loss(reference(x), y)
                want.backward()
                expect.append(float(want))
                ref = dict(reference.named_parameters())
                for name, (p, spec) in params.items():
                    full = ref[name].grad
                    block = full if spec is None else sharded.shard(full, spec)
                    grad_diff = max(grad_diff, float((p.grad - block).abs().max()))
        warned: list[str] = []
        if strategy == "pipeline":  # a module-level split asked for runs through the calls
            import logging

            handler = logging.Handler(logging.WARNING)
            handler.emit = lambda r: warned.append(r.getMessage())  # type: ignore[method-assign]
            logging.getLogger("torch_plugin").addHandler(handler)
            try:
                torch_plugin.PipelineParallel(
                    SelfCheckpointing(dropout=dropout),
                    (data[0][0],),
                    loss_fn=F.mse_loss,
                    capture="module",
                )
            finally:
                logging.getLogger("torch_plugin").removeHandler(handler)
        return {
            "saved": saved,
            "losses": losses,
            "expect": expect,
            "grad_diff": grad_diff,
            "warned": warned,
        }
    finally:
        dist_workers._finish()


def clipped_with_torch(rank: int, world: int, port: int, strategy: str, kind: str) -> dict:
    """A loop that clips with torch's own function, as HF Trainer (through accelerate),
    Lightning and most hand-written loops do: `torch.nn.utils.clip_grad_norm_(model.parameters(),
    max_norm)` on what parallelize returned, with a max_norm that clips every step. Each step's
    norm, the norm torch.nn.utils.get_total_norm gives over the same gradients, and the loss
    against one process's; and how far this rank's replicated blocks (tp) are from rank 0's."""
    from torch.nn.utils import clip_grad_norm_, get_total_norm  # bound before parallelize

    import torch_plugin

    dist_workers._init(rank, world, port)
    try:
        model = default_config_model(kind)
        model.train()
        reference = copy.deepcopy(model)
        batches = [padded_batch(8, t, i) for i, t in enumerate((16, 12, 16, 9))]
        if strategy == "pipeline":
            pp = torch_plugin.parallelize(
                model, world, batches[0], strategy="pipeline", num_microbatches=4
            )
            params, step = pp.parameters, pp.step
        else:
            mesh = torch_plugin.DeviceMesh((world,), ("tp",), timeout_s=dist_workers.TIMEOUT_S)
            sharded = torch_plugin.parallelize(model, mesh, batches[0])
            params = sharded.parameters

            def step(b: dict) -> float:
                loss = sharded(**b).loss
                loss.backward()
                return float(loss)

        out: dict[str, list[float]] = {k: [] for k in ("loss", "norm", "total", "expect")}
        out["expect_loss"] = []
        opt = torch.optim.AdamW(params(), lr=1e-2)
        ref_opt = torch.optim.AdamW(reference.parameters(), lr=1e-2)
        for i, b in enumerate(batches):
            torch.manual_seed(100 + i)
            out["loss"].append(float(step(b)))
            grads = [p.grad for p in params() if p.grad is not None]
            out["total"].append(float(get_total_norm(grads)))
            out["norm"].append(float(clip_grad_norm_(params(), 0.05)))
            opt.step()
            opt.zero_grad()
            out["expect_loss"].append(_backward(reference, b, 100 + i))
            out["expect"].append(float(clip_grad_norm_(reference.parameters(), 0.05)))
            ref_opt.step()
            ref_opt.zero_grad()
        drift = 0.0
        if strategy != "pipeline":
            for _, p, spec in sharded.named_local_parameters():
                if spec == "R":
                    first = p.detach().clone()
                    dist.broadcast(first, 0)
                    drift = max(drift, float((p.detach() - first).abs().max()))
        return {**out, "replicated_drift": drift}
    finally:
        dist_workers._finish()


def pipeline_frozen_stage(rank: int, world: int, port: int) -> dict:
    """Fine-tuning the last layer only (embeddings and the first layer frozen, as users freeze
    a pretrained trunk) through a pipeline, clipping with torch's own function over
    pp.parameters() as HF Trainer does: whether each stage trains, torch's norm on this rank,
    pp.clip_grad_norm_'s, the loss, and one process's norm and loss."""
    from torch.nn.utils import clip_grad_norm_

    import torch_plugin

    dist_workers._init(rank, world, port)
    try:
        model = default_config_model("gpt2")
        model.train()
        for name, p in model.named_parameters():
            p.requires_grad_(name.startswith(("transformer.h.1.", "transformer.ln_f.")))
        reference = copy.deepcopy(model)
        batches = [padded_batch(8, t, i) for i, t in enumerate((16, 12, 9))]
        pp = torch_plugin.parallelize(
            model, world, batches[0], strategy="pipeline", num_microbatches=4
        )
        trains = [any(p.requires_grad for p in ps.values()) for ps in pp.params_of]
        out: dict[str, Any] = {"trains": trains, "my_stage": pp.my_stage}
        for k in ("loss", "torch_norm", "pp_norm", "expect_loss", "expect"):
            out[k] = []
        trainable = [p for p in pp.parameters() if p.requires_grad]
        opt = torch.optim.AdamW(trainable, lr=1e-2) if trainable else None
        ref_opt = torch.optim.AdamW([p for p in reference.parameters() if p.requires_grad], lr=1e-2)
        for i, b in enumerate(batches):
            torch.manual_seed(100 + i)
            out["loss"].append(float(pp.step(b)))
            out["torch_norm"].append(float(clip_grad_norm_(pp.parameters(), 1e9)))
            out["pp_norm"].append(float(pp.clip_grad_norm_(1e9)))
            if opt is not None:
                opt.step()
                opt.zero_grad()
            out["expect_loss"].append(_backward(reference, b, 100 + i))
            out["expect"].append(float(clip_grad_norm_(reference.parameters(), 1e9)))
            ref_opt.step()
            ref_opt.zero_grad()
        # Unfrozen after parallelize: the frozen stage's rank now has gradients to total.
        for p in pp.parameters():
            p.requires_grad_(True)
        pp.step(batches[0])
        try:
            clip_grad_norm_(pp.parameters(), 1e9)
            out["unfrozen"] = ""
        except RuntimeError as e:
            out["unfrozen"] = str(e)
        return out
    finally:
        dist_workers._finish()


def pipeline_evaluation(rank: int, world: int, port: int, kind: str) -> dict:
    """A training loop with an evaluation pass after each step's backward, before the
    optimizer's step: pp.eval() (or the user's own model.eval()) and pp.step under
    torch.no_grad() on validation batches of other lengths and sizes, then pp.train(). Each
    evaluation loss against one process's model.eval() loss; whether the evaluation left this
    rank's gradients and the generator as they were; the training losses against one
    process's; then the model's outputs (pp(**batch) under torch.inference_mode(): logits and
    loss on every rank) against one process's; and a no_grad step in training mode (dropout
    replayed) against one process's."""
    import torch_plugin

    dist_workers._init(rank, world, port)
    try:
        model = default_config_model(kind)
        model.train()
        reference = copy.deepcopy(model)
        train = [padded_batch(8, t, i) for i, t in enumerate((16, 12, 16))]
        valid = [padded_batch(r, t, 50 + i) for i, (r, t) in enumerate(((8, 16), (8, 9), (6, 16)))]
        pp = torch_plugin.parallelize(
            model, world, train[0], strategy="pipeline", num_microbatches=4
        )
        opt = torch.optim.AdamW(pp.parameters(), lr=1e-2)
        ref_opt = torch.optim.AdamW(reference.parameters(), lr=1e-2)
        out: dict[str, Any] = {k: [] for k in ("train", "expect_train", "eval", "expect_eval")}
        grads_kept, same_generator, modes = True, True, []
        for i, b in enumerate(train):
            torch.manual_seed(100 + i)
            out["train"].append(pp.step(b))
            before = {n: p.grad.clone() for n, p in pp.named_parameters() if p.grad is not None}
            if i == 1:
                model.eval()  # the user's own model, as a loop holding it would
            else:
                pp.eval()
            modes.append(pp.training)
            torch.manual_seed(7)
            with torch.no_grad():
                out["eval"].append([pp.step(v) for v in valid])
            after = torch.rand(4)
            pp.train()
            grads_kept &= all(
                torch.equal(p.grad, before[n]) for n, p in pp.named_parameters() if n in before
            )
            grads_kept &= len(before) == sum(p.grad is not None for p in pp.parameters())
            opt.step()
            opt.zero_grad()

            out["expect_train"].append(_backward(reference, b, 100 + i))
            reference.eval()
            torch.manual_seed(7)
            with torch.no_grad():
                out["expect_eval"].append([float(reference(**v).loss) for v in valid])
            same_generator &= bool(torch.equal(after, torch.rand(4)))
            reference.train()
            ref_opt.step()
            ref_opt.zero_grad()
        # Outputs on every rank, as an evaluation loop reading logits calls the model.
        pp.eval()
        reference.eval()
        logits_diff, loss_diff = 0.0, 0.0
        with torch.inference_mode():  # a new length, first seen there, captured too
            for v in [*valid, padded_batch(8, 11, 60)]:
                got, want = pp(**v), reference(**v)
                scale = float(want.logits.abs().max())
                logits_diff = max(
                    logits_diff, float((got.logits - want.logits).abs().max()) / scale
                )
                loss_diff = max(loss_diff, abs(float(got.loss) - float(want.loss)))
        try:
            pp(**valid[0])
            with_grad = None
        except RuntimeError as e:
            with_grad = str(e)
        pp.train()
        reference.train()
        torch.manual_seed(5)
        with torch.no_grad():  # training mode: dropout on, replayed as one process draws it
            dropout_on = pp.step(valid[0])
        torch.manual_seed(5)
        with torch.no_grad():
            expect_dropout_on = float(reference(**valid[0]).loss)
            eval_now = float(reference.eval()(**valid[0]).loss)
        return {
            **out,
            "grads_kept": grads_kept,
            "same_generator": same_generator,
            "modes": modes,
            "dropout_on": (dropout_on, expect_dropout_on, eval_now),
            "outputs": {"logits": logits_diff, "loss": loss_diff, "with_grad": with_grad},
        }
    finally:
        dist_workers._finish()


def _parallelized(model: Any, world: int, batch: dict, strategy: str) -> tuple[Any, Any]:
    """What parallelize returns for `strategy` ("tp": a sharded model on a tp mesh of the
    world; "pipeline": four micro-batches) and a training step on a batch (forward and
    backward; it returns the loss)."""
    import torch_plugin

    if strategy == "pipeline":
        pp = torch_plugin.parallelize(model, world, batch, strategy="pipeline", num_microbatches=4)
        return pp, pp.step
    mesh = torch_plugin.DeviceMesh((world,), ("tp",), timeout_s=dist_workers.TIMEOUT_S)
    dm = torch_plugin.parallelize(model, mesh, batch)

    def step(b: dict) -> torch.Tensor:
        loss = dm(**b).loss
        loss.backward()
        return loss

    return dm, step


def generate_while_training(rank: int, world: int, port: int, strategy: str, kind: str) -> dict:
    """A training script sampling from the model it trains: model.generate(...) on what
    parallelize returned, greedy, before and after an optimizer step, against one process's
    model after the same step; and a sampled generate with each rank's generator seeded
    apart (the tokens every rank returns)."""

    dist_workers._init(rank, world, port)
    try:
        model = default_config_model(kind).train()
        reference = copy.deepcopy(model)
        batch = padded_batch(8, 16, 0)
        dm, step = _parallelized(model, world, batch, strategy)
        opt = torch.optim.SGD(dm.parameters(), lr=1.0)
        ref_opt = torch.optim.SGD(reference.parameters(), lr=1.0)
        prompt = batch["input_ids"][:2, :6]
        same = []
        for _ in range(2):
            dm.eval()
            reference.eval()
            got = dm.generate(prompt, max_new_tokens=5, do_sample=False)
            want = reference.generate(prompt, max_new_tokens=5, do_sample=False)
            same.append(torch.equal(got, want))
            dm.train()
            reference.train()
            torch.manual_seed(5)
            step(batch)
            _backward(reference, batch, 5)
            opt.step()
            ref_opt.step()
            opt.zero_grad()
            ref_opt.zero_grad()
        torch.manual_seed(rank)
        sampled = dm.generate(prompt, max_new_tokens=5, do_sample=True).tolist()
        return {"same": same, "sampled": sampled}
    finally:
        dist_workers._finish()


def cast_after_parallelize(rank: int, world: int, port: int, strategy: str) -> dict:
    """model.to(torch.bfloat16) on what parallelize returned, after a step in f32, as scripts
    that cast late do: the loss, this rank's largest gradient difference and greedy generate's
    tokens and logits against one process's model cast alike, in bf16 and after .float()
    again; for a pipeline, what .to raises."""
    import torch_plugin

    dist_workers._init(rank, world, port)
    try:
        model = default_config_model("llama").train()
        reference = copy.deepcopy(model)
        batch = padded_batch(8, 16, 0)
        out: dict[str, Any] = {"losses": [], "expect": [], "grad_diff": []}
        if strategy == "pipeline":
            pp = torch_plugin.parallelize(
                model, world, batch, strategy="pipeline", num_microbatches=4
            )
            same = pp.to(pp.device) is pp and pp.to(torch.float32) is pp
            try:
                pp.to(torch.bfloat16)
                return {"refused": None, "same": same}
            except ValueError as e:
                return {"refused": str(e), "same": same}
        mesh = torch_plugin.DeviceMesh((world,), ("tp",), timeout_s=dist_workers.TIMEOUT_S)
        dm = torch_plugin.parallelize(model, mesh, batch)
        ref = dict(reference.named_parameters())
        for cast in (None, torch.bfloat16, torch.float32):
            if cast is not None:
                dm.to(cast)
                reference.to(cast)
            for p in [*dm.parameters(), *reference.parameters()]:
                p.grad = None
            torch.manual_seed(1)
            loss = dm(**batch).loss
            loss.backward()
            out["losses"].append(float(loss))
            out["expect"].append(_backward(reference, batch, 1))
            out["grad_diff"].append(
                max(
                    float((p.grad.float() - dm.shard(ref[n].grad, spec).float()).abs().max())
                    for n, p, spec in dm.named_local_parameters()
                    if p.grad is not None
                )
            )
            # generate's gathered copy follows the cast (casts keep tensor versions).
            prompt = batch["input_ids"][:2, :6]
            kw = dict(max_new_tokens=4, do_sample=False, return_dict_in_generate=True)
            got = dm.generate(prompt, output_logits=True, **kw)
            want = reference.generate(prompt, output_logits=True, **kw)
            out.setdefault("generated_alike", []).append(torch.equal(got.sequences, want.sequences))
            out.setdefault("logit_diff", []).append(
                max(
                    float((a.float() - b.float()).abs().max())
                    for a, b in zip(got.logits, want.logits, strict=True)
                )
            )
        out["dtype"] = str(dm.dtype)
        return out
    finally:
        dist_workers._finish()


def compiled_before_parallelize(rank: int, world: int, port: int, strategy: str, how: str) -> dict:
    """A script that compiles its model first (torch.compile(model), or model.compile() in
    place) and then parallelizes it: two steps' losses against one process's, the graphs Dynamo
    captured in them, what parallelize returned and the warnings it logged."""
    import logging

    import torch._dynamo.utils

    import torch_plugin

    dist_workers._init(rank, world, port)
    try:
        torch._dynamo.reset()
        kind = "llama" if strategy == "tp" else "gpt2"
        model = default_config_model(kind).train()
        reference = copy.deepcopy(model)
        batches = [padded_batch(8, t, i) for i, t in enumerate((16, 12))]
        if how == "wrap":
            model = torch.compile(model, backend="aot_eager")
        else:
            model.compile(backend="aot_eager")
        warned: list[str] = []
        handler = logging.Handler()
        handler.emit = lambda r: warned.append(r.getMessage())  # type: ignore[method-assign]
        handler.setLevel(logging.WARNING)
        logging.getLogger("torch_plugin").addHandler(handler)
        try:
            if strategy == "tp":
                mesh = torch_plugin.DeviceMesh((world,), ("tp",), timeout_s=dist_workers.TIMEOUT_S)
                dist_model = torch_plugin.parallelize(model, mesh, batches[0])

                def step(b: dict) -> torch.Tensor:
                    loss = dist_model(**b).loss
                    loss.backward()
                    return loss

            else:
                dist_model = torch_plugin.parallelize(
                    model, world, batches[0], strategy="pipeline", num_microbatches=4
                )
                step = dist_model.step
        finally:
            logging.getLogger("torch_plugin").removeHandler(handler)
        torch._dynamo.utils.counters.clear()
        losses, expect = [], []
        for i, b in enumerate(batches):
            torch.manual_seed(100 + i)
            losses.append(float(step(b)))
            expect.append(_backward(reference, b, 100 + i))
        return {
            "losses": losses,
            "expect": expect,
            "graphs": int(torch._dynamo.utils.counters["stats"]["unique_graphs"]),
            "returned": type(dist_model).__name__,
            "warned": warned,
        }
    finally:
        dist_workers._finish()


def compiled_by_the_user(rank: int, world: int, port: int) -> dict:
    """torch.compile(dist_model), as a loop compiling its model would: the graphs Dynamo
    made, the seconds its first step took, and two steps' losses against one process's."""
    import time

    import torch._dynamo.utils

    import torch_plugin

    dist_workers._init(rank, world, port)
    try:
        model = default_config_model("llama").train()
        reference = copy.deepcopy(model)
        batches = [padded_batch(8, t, i) for i, t in enumerate((16, 12))]
        mesh = torch_plugin.DeviceMesh((world,), ("tp",), timeout_s=dist_workers.TIMEOUT_S)
        compiled = torch.compile(torch_plugin.parallelize(model, mesh, batches[0]))
        torch._dynamo.utils.counters.clear()
        t0 = time.perf_counter()
        losses = []
        for b in batches:
            loss = compiled(**b).loss
            loss.backward()
            losses.append(float(loss))
        return {
            "graphs": int(torch._dynamo.utils.counters["stats"]["unique_graphs"]),
            "seconds": time.perf_counter() - t0,
            "losses": losses,
            "expect": [float(reference(**b).loss) for b in batches],
        }
    finally:
        dist_workers._finish()


def hf_model_methods(rank: int, world: int, port: int, strategy: str, kind: str, out: str) -> dict:
    """What an HF training script reads off its model, on what parallelize returned: batches
    moved with `.to(model.device)`, `model.dtype`, `model.num_parameters()` logged, and
    `model.save_pretrained(out)` after a step (every rank calls it), which rank 0 loads back
    with from_pretrained and compares with one process's model after the same step; then
    `model.load_state_dict(plain_model.state_dict())` of other weights, `model.zero_grad()`,
    and the eval loss against the plain model's."""

    dist_workers._init(rank, world, port)
    try:
        model = default_config_model(kind).train()
        reference = copy.deepcopy(model)
        batch = padded_batch(8, 16, 0)
        dm, _ = _parallelized(model, world, batch, strategy)
        moved = {k: v.to(dm.device) for k, v in batch.items()}
        counts = [
            (dm.num_parameters(**kw), reference.num_parameters(**kw))
            for kw in ({}, {"only_trainable": True}, {"exclude_embeddings": True})
        ]
        opt = torch.optim.SGD(dm.parameters(), lr=0.1)
        ref_opt = torch.optim.SGD(reference.parameters(), lr=0.1)
        torch.manual_seed(3)
        if strategy == "pipeline":
            dm.step(moved)
        else:
            dm(**moved).loss.backward()
        torch.manual_seed(3)
        reference(**batch).loss.backward()
        opt.step()
        ref_opt.step()
        try:
            dm.save_pretrained(out, state_dict={})
            refused = None
        except TypeError as e:
            refused = str(e)
        files = dm.save_pretrained(out, max_shard_size="200KB")
        result = {"counts": counts, "dtype": str(dm.dtype), "refused": refused, "files": files}
        if rank == 0:
            result["reloaded"] = _reloaded_diff(reference, out, batch)
        dist.barrier()
        # The plain model's state dict (tied alias included), loaded as a script loads one.
        torch.manual_seed(9)
        with torch.no_grad():
            for p in reference.parameters():
                p.add_(0.01 * torch.randn_like(p))
        loaded = dm.load_state_dict(reference.state_dict())
        dm.zero_grad()
        dm.eval()
        reference.eval()
        with torch.no_grad():
            got, want = float(dm(**moved).loss), float(reference(**batch).loss)
        result["after_load"] = (got, want)
        result["load_result"] = [list(loaded.missing_keys), list(loaded.unexpected_keys)]
        result["grads_cleared"] = all(p.grad is None for p in dm.parameters())
        result["refusals"] = _refused_loads_and_calls(dm, reference, strategy, kind, moved)
        return result
    finally:
        dist_workers._finish()


def _refused_loads_and_calls(
    dm: Any, reference: torch.nn.Module, strategy: str, kind: str, batch: dict
) -> dict[str, Any]:
    """What a script's mistakes raise on what parallelize returned, each error's type and
    message (None where nothing was raised): strict loads of a state dict with a key too many
    or the final norm's missing (a tensor of the last stage: only that rank misses it), and
    per strategy, load_state_dict(assign=True) (sharded) or a call with positional and
    keyword inputs, or with gradients on (pipeline); and a DistributedDataParallel around it.
    Every load reloads the same values."""
    state = reference.state_dict()
    norm = "transformer.ln_f.weight" if kind == "gpt2" else "model.norm.weight"
    attempts: dict[str, Any] = {
        "unexpected": lambda: dm.load_state_dict({**state, "extra.weight": torch.zeros(2)}),
        "missing": lambda: dm.load_state_dict({k: v for k, v in state.items() if k != norm}),
    }
    if strategy == "pipeline":
        ids = batch["input_ids"]
        attempts["args_and_kwargs"] = lambda: dm(ids, attention_mask=batch["attention_mask"])

        def with_grad() -> None:
            with torch.enable_grad():
                dm(**batch)

        attempts["grad_enabled"] = with_grad
    else:
        attempts["assign"] = lambda: dm.load_state_dict(state, assign=True)
    # Last: a DDP that was let through has broadcast rank 0's blocks over this rank's.
    attempts["ddp"] = lambda: torch.nn.parallel.DistributedDataParallel(dm)
    seen: dict[str, Any] = {}
    for key, attempt in attempts.items():
        try:
            with torch.no_grad():
                attempt()
            seen[key] = None
        except Exception as e:  # noqa: BLE001 - the test reads the error
            seen[key] = (type(e).__name__, str(e))
    return seen


def pipeline_accumulation(rank: int, world: int, port: int, kind: str) -> dict:
    """Gradient accumulation over steps, as loops with gradient_accumulation_steps write it:
    pp.step on two batches of other lengths before one optimizer step. Per parameter, the
    largest difference of this rank's gradients from one process's accumulated over the same
    batches, relative to the gradient's largest element; and the parameters read in several
    stages (tied)."""
    import torch_plugin

    dist_workers._init(rank, world, port)
    try:
        model = default_config_model(kind).train()
        reference = copy.deepcopy(model)
        batches = [padded_batch(8, t, i) for i, t in enumerate((16, 12))]
        pp = torch_plugin.parallelize(
            model, world, batches[0], strategy="pipeline", num_microbatches=4
        )
        for i, b in enumerate(batches):
            torch.manual_seed(10 + i)
            pp.step(b)
            torch.manual_seed(10 + i)
            reference(**b).loss.backward()
        ref = dict(reference.named_parameters())
        diffs = {
            n: float((p.grad - ref[n].grad).abs().max() / ref[n].grad.abs().max())
            for n, p in pp.named_parameters()
            if p.grad is not None
        }
        return {"diffs": diffs, "tied": pp.tied}
    finally:
        dist_workers._finish()
