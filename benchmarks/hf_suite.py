"""The HF model suite through every entry point: a pass-rate table, as users call their models.

Each architecture of `torch_plugin.models.hf_suite` (transformers, small random configs) is
called the HF way, `model(**inputs).loss` with `labels` inside `inputs`, through:

  roundtrip        torch.compile(backend="torch_plugin", options={"passes": []}): loss and
                   gradients bit-exact against AOTAutograd alone, within 1e-5 of eager
  default_compile  torch.compile(backend="torch_plugin") with no options: loss and gradients
                   within 1e-5 (relative to the largest) of eager
  placement        torch_plugin.place(model.eval(), inputs): every output within 1e-3 of eager
  shard2, shard4   torch_plugin.parallelize(model, DeviceMesh(n), inputs): 3 AdamW steps on
                   n gloo ranks, each loss within 1e-5 of one process's
  shard2x2         the same on a (dp=2, tp=2) mesh
  shard2_user      users' programs (issue 38): the library-default config (only sizes set:
                   use_cache, dropout as shipped), parallelize once, then AdamW steps on
                   padded batches of 4 rows x 16, 24, 12 tokens and a last batch of 2 x 20,
                   each loss within 1e-5 of one process's (same seed) and the losses moving
  shard2x2_user    the same on a (dp=2, tp=2) mesh, the last batch 3 x 20 (2 + 1 rows over the
                   dp replicas), dropout as shipped (each replica draws its rows of one mask)
  shard4_user      shard2_user on 4 tensor-parallel ranks
  shard2_lean      shard2 with the memory budget at the least any plan needs (what a model that
                   does not fit one device asks for): the parameter bytes each rank holds
  bf16_2           on decoders, 2 ranks: bf16 parameters with float32 master weights, and
                   float32 parameters with the forward under torch.autocast(bfloat16), each
                   within 1e-3 (fp16 5e-4) of one process running the same recipe
  bf16_2_user      bf16_2 as users run it: the library-default config (dropout as shipped) over
                   shard2_user's padded batches of changing length, one seed on both sides
  fp16_2           the same in fp16 with torch_plugin.ShardedGradScaler against one process with
                   torch.amp.GradScaler, and an overflow on one rank skipped by every rank
  pipeline4        torch_plugin.parallelize(model, 4, inputs, strategy="pipeline") on decoders:
                   3 AdamW steps, losses within 1e-5 of one process's
  pipeline4_user   pipeline4 as users run it: the library-default config (dropout as shipped:
                   each step replays one process's masks), shard2_user's padded batches of 16,
                   24, 12 tokens and a last batch of 2 x 20, clipped AdamW steps, each loss
                   within 1e-5 of one process's (same seed) and the losses moving
  cp_decode(4)     torch_plugin.cache_parallel(model, DeviceMesh(2 or 4)).generate(...) on
                   decoders, 32 tokens for prompts of mixed lengths (left padding): greedy
                   tokens equal eager generate(), each rank holds at most 1/N of the cache
                   plus a block, the split-KV kernel runs on every decode step
  helix4           cp_decode4 with helix=True: o_proj and the MLP tensor-parallel over the same
                   4 ranks (each holds 1/4 of them), one all-to-all of attention partials per
                   layer and step in place of the all-gather; same tokens, same cache bound

A failure records its first line. Multi-rank entries run each (model, entry) in fresh processes
with a deadline, so one hang or crash costs only its own cell.

    python benchmarks/hf_suite.py                      # everything (about an hour on 2 cores)
    python benchmarks/hf_suite.py --models llama gpt2 --entries roundtrip shard2
    python benchmarks/hf_suite.py --subset ci          # the CI cross-section

Prints the table; writes benchmarks/results/hf_suite.{json,png} (--merge keeps other cells).
"""

from __future__ import annotations

import argparse
import copy
import datetime
import json
import multiprocessing as mp
import os
import socket
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

# One way to name the measured commit (TP_COMMIT wins on a lent GPU machine).
try:
    from benchmarks.provenance import commit as _commit
    from benchmarks.provenance import write_results
except ImportError:  # run as a script: benchmarks/ itself is on sys.path
    from provenance import commit as _commit
    from provenance import write_results

RESULTS = Path(__file__).resolve().parent / "results"
LR = 1e-3
STEPS = 3
LOSS_RTOL = 1e-5
# Reduced-precision recipes against one process running the same recipe: the worst of the 51
# suite models measured 1.4e-4 (bf16) and 6.3e-5 (fp16) (hf_suite.json, 88c6a5a); the bounds
# keep about 7x of margin. Those comparisons also require the reference's losses to move by
# more than the bound, or an optimizer that never steps would pass (2e-2 once let it).
BF16_RTOL = 1e-3
FP16_RTOL = 5e-4
COLLECTIVE_TIMEOUT_S = 60
PLACEMENT_BOUNDS = {
    "cache_path": ":memory:",
    "samples": 3,
    "max_evaluations": 4,
    "time_budget_s": 10.0,
}

ENTRIES = [
    "roundtrip",
    "default_compile",
    "placement",
    "shard2",
    "shard4",
    "shard2x2",
    "shard2_lean",
    "shard2_user",
    "shard2x2_user",
    "shard4_user",
    "bf16_2",
    "bf16_2_user",
    "fp16_2",
    "pipeline4",
    "pipeline4_user",
    "cp_decode",
    "cp_decode4",
    "helix4",
]
# Entry -> (world size, mesh shape) for the multi-rank ones.
DISTRIBUTED: dict[str, tuple[int, tuple[int, ...] | None]] = {
    "shard2": (2, (2,)),
    "shard4": (4, (4,)),
    "shard2x2": (4, (2, 2)),
    "shard2_lean": (2, (2,)),
    "shard2_user": (2, (2,)),
    "shard2x2_user": (4, (2, 2)),
    "shard4_user": (4, (4,)),
    "pipeline4": (4, None),
    "pipeline4_user": (4, None),
    "cp_decode": (2, (2,)),
    "cp_decode4": (4, (4,)),
    "helix4": (4, (4,)),
    "recipe2x2": (4, (2, 2)),  # accumulation + clipping (tests; not a column of the table)
    "bf16_2": (2, (2,)),
    "bf16_2_user": (2, (2,)),
    "fp16_2": (2, (2,)),
}
DECODER_ONLY = {
    "bf16_2",
    "bf16_2_user",
    "fp16_2",
    "pipeline4",
    "pipeline4_user",
    "cp_decode",
    "cp_decode4",
    "helix4",
}


class Mismatch(AssertionError):
    """The entry point ran but its numbers differ from eager's."""


class NotMoving(Mismatch):
    """The numbers agree, but one process's losses move less than the tolerance: the check
    cannot tell training from an optimizer that never steps."""


def applies(entry: str, name: str) -> bool:
    from torch_plugin.models import hf_suite

    return entry not in DECODER_ONLY or hf_suite.ARCHS[name].generates


def first_line(e: BaseException) -> str:
    text = str(e).strip().splitlines()
    return f"{type(e).__name__}: {text[0] if text else ''}"[:300]


# ---- what one process checks ---------------------------------------------------------------


def _steps(inputs: dict[str, Any] | list[dict[str, Any]], steps: int = STEPS) -> list[Any]:
    """Each step's batch: `inputs` every step, or a list of batches (users' cells), which then
    start from one seed so that dropout draws the same masks on both sides."""
    if isinstance(inputs, list):
        torch.manual_seed(1)
        return inputs
    return [inputs] * steps


def _train(
    model: Any,
    inputs: dict[str, Any] | list[dict[str, Any]],
    make_optimizer: Callable[[], torch.optim.Optimizer],
    steps: int = STEPS,
    autocast: torch.dtype | None = None,
    scaler: torch.amp.GradScaler | None = None,
) -> list[float]:
    """`steps` AdamW steps (or one per batch of a list); autocast: the forward (only, as
    PyTorch's recipe has it) under torch.autocast to that dtype; scaler: fp16's loss scaling
    around backward and step."""
    import contextlib

    from torch_plugin.models import hf_suite

    opt = make_optimizer()
    losses = []
    for inputs in _steps(inputs, steps):  # noqa: B020 - each step's batch
        with torch.autocast("cpu", dtype=autocast) if autocast else contextlib.nullcontext():
            loss = hf_suite.loss_of(model(**inputs))
        if scaler is None:
            loss.backward()
            opt.step()
        else:  # fp16's recipe: scale, step unless an overflow, update the scale
            scaler.scale(loss).backward()
            scaler.step(opt)
            scaler.update()
        opt.zero_grad()
        losses.append(float(loss))
    return losses


def _reference_losses(
    model: torch.nn.Module,
    inputs: dict[str, Any] | list[dict[str, Any]],
    autocast: torch.dtype | None = None,
    scaler: torch.amp.GradScaler | None = None,
    lr: float = LR,
) -> list[float]:
    ref = copy.deepcopy(model)
    make = lambda: torch.optim.AdamW(ref.parameters(), lr=lr)  # noqa: E731
    return _train(ref, inputs, make, autocast=autocast, scaler=scaler)


def _compare_losses(
    got: list[float], want: list[float], rtol: float = LOSS_RTOL, must_move: bool = False
) -> float:
    diff = max(abs(a - b) / max(1.0, abs(b)) for a, b in zip(got, want, strict=True))
    if not diff <= rtol:
        raise Mismatch(f"losses {got} vs one process {want} (max rel diff {diff:.2e})")
    moved = max(abs(b - want[0]) / max(1.0, abs(want[0])) for b in want)
    if must_move and not moved > rtol:
        raise NotMoving(
            f"one process's losses {want} move by {moved:.2e}, within the tolerance {rtol:.0e}: "
            "the comparison cannot tell training from an optimizer that never steps"
        )
    return diff


def _step_grads(
    model: torch.nn.Module, inputs: dict[str, Any], fn: Callable[..., Any] | None = None
) -> tuple[torch.Tensor, dict[str, Any]]:
    """One forward + backward of `fn` (the model itself, or its compiled form) under its own
    parameter names."""
    from torch_plugin.models import hf_suite

    loss = hf_suite.loss_of((model if fn is None else fn)(**inputs))
    loss.backward()
    return loss.detach(), {n: p.grad for n, p in model.named_parameters() if p.grad is not None}


def _compiled_step(
    name: str, options: dict[str, Any] | None, exact: bool, tol: float = 1e-5
) -> dict[str, Any]:
    """One training step compiled with our backend against eager (loss and gradients within
    1e-5 of the largest). exact: also bit-exact against AOTAutograd alone (aot_eager), which is
    what an identity pipeline must reproduce (aot_eager itself is not always bit-exact against
    eager: CLIP's logit_scale gradient differs in its last bit)."""
    import torch._dynamo

    from torch_plugin.models import hf_suite

    model, inputs = hf_suite.build(name)
    ref = copy.deepcopy(model)
    want_loss, want_grads = _step_grads(ref, inputs)
    if exact:
        aot = copy.deepcopy(model)
        torch._dynamo.reset()
        exact_loss, exact_grads = _step_grads(aot, inputs, torch.compile(aot, backend="aot_eager"))
    torch._dynamo.reset()
    compiled = torch.compile(model, backend="torch_plugin", options=options)
    loss, grads = _step_grads(model, inputs, compiled)
    if grads.keys() != want_grads.keys():
        raise Mismatch(f"gradients for {sorted(set(grads) ^ set(want_grads))[:3]} differ")
    worst = 0.0
    for n, g in want_grads.items():
        d = float((grads[n] - g).abs().max()) / max(1.0, float(g.abs().max()))
        worst = max(worst, d)
        if d > tol:
            raise Mismatch(f"gradient of {n} differs from eager by {d:.2e}")
        if exact and not torch.equal(grads[n], exact_grads[n]):
            raise Mismatch(f"gradient of {n} is not bit-exact against aot_eager")
    if abs(float(loss - want_loss)) > tol * max(1.0, abs(float(want_loss))):
        raise Mismatch(f"loss {float(loss)} vs eager {float(want_loss)}")
    if exact and not torch.equal(loss, exact_loss):
        raise Mismatch(f"loss {float(loss)} is not bit-exact against aot_eager")
    return {"max_grad_diff": worst}


def check_roundtrip(name: str) -> dict[str, Any]:
    return _compiled_step(name, {"passes": []}, exact=True)


def check_default_compile(name: str) -> dict[str, Any]:
    """The default backend (issue 27): a training step (loss and gradients within 1e-4 of
    eager's) and inference in eval mode under no_grad (outputs within 1e-4 relative), with
    what it picked per graph."""
    from torch_plugin.backend import collect_stats
    from torch_plugin.models import hf_suite, output_tensors

    with collect_stats() as stats:
        out = _compiled_step(name, None, exact=False, tol=1e-4)
    model, inputs = hf_suite.build(name)
    model.eval()
    torch._dynamo.reset()
    compiled = torch.compile(model, backend="torch_plugin")
    with torch.no_grad(), collect_stats() as infer_stats:
        want = output_tensors(model(**inputs))
        got = output_tensors(compiled(**inputs))
    if len(got) != len(want):
        raise Mismatch(f"inference: {len(got)} outputs, eager returns {len(want)}")
    worst = 0.0
    for i, (a, b) in enumerate(zip(got, want, strict=True)):
        if a.shape != b.shape:
            raise Mismatch(f"inference output {i}: shape {tuple(a.shape)} vs {tuple(b.shape)}")
        if a.is_floating_point():
            d = float((a - b).abs().max()) / max(1.0, float(b.abs().max()))
            worst = max(worst, d)
            if d > 1e-4:
                raise Mismatch(f"inference output {i} differs from eager by {d:.2e}")
        elif not torch.equal(a, b):
            raise Mismatch(f"inference output {i} differs from eager")
    out["inference_max_diff"] = worst
    out["picked"] = [
        r["summary"].split(" (", 1)[0] + ": " + r["summary"].split(": ", 1)[1].split(" (", 1)[0]
        for r in stats + infer_stats
        if "summary" in r
    ]
    return out


def check_placement(name: str, **placement_options: Any) -> dict[str, Any]:
    import torch_plugin
    from torch_plugin.models import hf_suite, output_tensors

    model, inputs = hf_suite.build(name)
    model.eval()
    with torch.no_grad():
        want = output_tensors(model(**inputs))
    # Bounded so that the suite runs in an hour: the default search took 258 s on the suite's
    # Llama (issue 27 is about the default's compile time).
    for key, value in PLACEMENT_BOUNDS.items():
        placement_options.setdefault(key, value)
    placed = torch_plugin.place(model, inputs, **placement_options)
    with torch.no_grad():
        got = output_tensors(placed(**inputs))
    if len(got) != len(want):
        raise Mismatch(f"{len(got)} outputs, eager returns {len(want)}")
    for i, (a, b) in enumerate(zip(got, want, strict=True)):
        scale = max(1.0, float(b.abs().max()))
        if a.shape != b.shape or float((a - b).abs().max()) > 1e-3 * scale:
            raise Mismatch(f"output {i} differs from eager")
    return {"backends": placed.placement.backend_counts()}


LOCAL: dict[str, Callable[..., dict[str, Any]]] = {
    "roundtrip": check_roundtrip,
    "default_compile": check_default_compile,
    "placement": check_placement,
}


# ---- what each rank checks -----------------------------------------------------------------


def check_shard(name: str, mesh_shape: tuple[int, ...], lean: bool = False) -> dict[str, Any]:
    """lean: the memory budget set to the least any plan needs (the ILP's PlanError says it)."""
    import torch_plugin
    from torch_plugin.models import hf_suite

    model, inputs = hf_suite.build(name)
    want = _reference_losses(model, inputs)
    whole = sum(p.numel() * p.element_size() for p in model.parameters())
    mesh = torch_plugin.DeviceMesh(mesh_shape, timeout_s=COLLECTIVE_TIMEOUT_S)
    budget = None
    if lean:
        try:
            torch_plugin.parallelize(model, mesh, inputs, memory_budget_gb=1e-12, level="fast")
            raise Mismatch("a plan fitted a budget of 1e-12 GB")
        except torch_plugin.PlanError as e:
            budget = e.min_memory_bytes * 1.0001 / 1e9
    sharded = torch_plugin.parallelize(model, mesh, inputs, memory_budget_gb=budget)
    names = [n for n, _ in model.named_parameters()]
    if [n for n, _ in sharded.named_parameters()] != names:
        raise Mismatch("the sharded module does not keep the model's parameter names")
    if getattr(sharded, "config", None) is not getattr(model, "config", None):
        raise Mismatch("the sharded module does not keep the model's .config")
    got = _train(sharded, inputs, lambda: sharded.optimizer(torch.optim.AdamW, lr=LR))
    diff = _compare_losses(got, want)
    return {
        "max_loss_diff": diff,
        "param_fraction": sharded.local_parameter_bytes() / whole,
    }


# (rows, tokens, padded positions in row 1) of each step of shard2_user: the sequence length
# changes every step and the last batch is short, as a padding collator's batches do.
USER_SHAPES = [(4, 16, 3), (4, 24, 5), (4, 12, 2), (2, 20, 4)]
# On a dp axis of 2 the last batch does not divide: 2 + 1 rows.
USER_SHAPES_DP = [(4, 16, 3), (4, 24, 5), (4, 12, 2), (3, 20, 4)]


def check_shard_user(name: str, mesh_shape: tuple[int, ...]) -> dict[str, Any]:
    """A user's program: the library-default config, one parallelize on the first batch, then
    AdamW over batches of other lengths and a short last one, against one process with the
    same seed (dropout draws the same masks)."""
    import torch_plugin
    from torch_plugin.models import hf_suite

    model = hf_suite.build_model(name, library_defaults=True)
    shapes = USER_SHAPES_DP if len(mesh_shape) == 2 else USER_SHAPES
    batches = _user_batches(name, shapes)
    reference = copy.deepcopy(model)
    mesh = torch_plugin.DeviceMesh(mesh_shape, timeout_s=COLLECTIVE_TIMEOUT_S)
    sharded = torch_plugin.parallelize(model, mesh, batches[0])

    def run(m: Any, opt: torch.optim.Optimizer) -> list[float]:
        torch.manual_seed(1)
        losses = []
        for b in batches:
            loss = hf_suite.loss_of(m(**b))
            loss.backward()
            opt.step()
            opt.zero_grad()
            losses.append(float(loss.detach()))
        return losses

    got = run(sharded, sharded.optimizer(torch.optim.AdamW, lr=LR))
    want = run(reference, torch.optim.AdamW(reference.parameters(), lr=LR))
    diff = _compare_losses(got, want)
    if max(got) - min(got) <= LOSS_RTOL:
        raise Mismatch(f"the losses {got} do not move")
    return {
        "max_loss_diff": diff,
        "programs": len(sharded._programs),
        "capture_s": round(sum(sharded.capture_times_s.values()), 2),
        "use_cache": bool(getattr(model.config, "use_cache", False)),
    }


def check_recipe(name: str, mesh_shape: tuple[int, ...], micro: int = 4) -> dict[str, Any]:
    """Gradient accumulation and clipping as a training loop writes them: `micro` micro-steps
    of 2 rows, all but the last under `no_sync()`, then `clip_grad_norm_` and an AdamW step,
    against one process on the whole batch (no padding: each micro-batch's mean is then
    1/micro of the whole batch's). The norm equals one process's within 1e-6 relative, the
    loss after the step within 1e-5, and the micro-steps under no_sync() run no dp
    collective."""
    import contextlib

    import torch_plugin
    from torch_plugin.models import hf_suite

    model, inputs = hf_suite.build(name, batch=2 * micro, pad=0)
    chunks = [{k: v[2 * j : 2 * j + 2] for k, v in inputs.items()} for j in range(micro)]
    ref = copy.deepcopy(model)
    hf_suite.loss_of(ref(**inputs)).backward()
    want_norm = float(torch.nn.utils.clip_grad_norm_(ref.parameters(), 0.5))
    torch.optim.AdamW(ref.parameters(), lr=LR).step()
    with torch.no_grad():
        want_next = float(hf_suite.loss_of(ref(**inputs)))

    mesh = torch_plugin.DeviceMesh(mesh_shape, timeout_s=COLLECTIVE_TIMEOUT_S)
    sharded = torch_plugin.parallelize(model, mesh, chunks[0])
    opt = sharded.optimizer(torch.optim.AdamW, lr=LR)
    dp_comm = getattr(sharded, "dp_comm", None)

    def syncs() -> int:  # gradient collectives over dp (outputs are still assembled per step)
        return 0 if dp_comm is None else dp_comm.calls["grad_sync"] + dp_comm.calls["zero2_grad"]

    quiet = 0
    for j, chunk in enumerate(chunks):
        last = j == micro - 1
        before = syncs()
        with contextlib.nullcontext() if last else sharded.no_sync():
            (hf_suite.loss_of(sharded(**chunk)) / micro).backward()
        if not last and syncs() != before:
            raise Mismatch(f"micro-step {j} under no_sync() synced gradients over dp")
        if last and syncs() == before:
            raise Mismatch("the micro-step after no_sync() did not sync gradients over dp")
        quiet += not last
    norm = float(sharded.clip_grad_norm_(0.5))
    opt.step()
    opt.zero_grad()
    with torch.no_grad():
        got_next = sum(float(hf_suite.loss_of(sharded(**c))) for c in chunks) / micro
    norm_diff = abs(norm - want_norm) / want_norm
    if norm_diff > 1e-6:
        raise Mismatch(f"clip_grad_norm_ gives {norm}, one process {want_norm}")
    diff = _compare_losses([got_next], [want_next])
    return {"norm_rel_diff": norm_diff, "max_loss_diff": diff, "quiet_micro_steps": quiet}


def _masters_reference(
    model: torch.nn.Module,
    inputs: dict[str, Any] | list[dict[str, Any]],
    scaler: torch.amp.GradScaler | None = None,
    lr: float = LR,
) -> list[float]:
    """One process, low-precision parameters stepped as float32 masters (the bf16 recipe; with
    `scaler`, fp16's: the loss scaled, the step skipped on an overflow)."""
    from torch_plugin.models import hf_suite

    ref = copy.deepcopy(model)
    pairs = [(p, p.detach().float().requires_grad_()) for p in ref.parameters()]
    opt = torch.optim.AdamW([m for _, m in pairs], lr=lr)
    losses = []
    for inputs in _steps(inputs):  # noqa: B020 - each step's batch
        loss = hf_suite.loss_of(ref(**inputs))
        (loss if scaler is None else scaler.scale(loss)).backward()
        for p, m in pairs:
            m.grad = None if p.grad is None else p.grad.float()
            p.grad = None
        if scaler is None:
            opt.step()
        else:
            scaler.step(opt)
            scaler.update()
        opt.zero_grad()
        with torch.no_grad():
            for p, m in pairs:
                p.copy_(m)
        losses.append(float(loss))
    return losses


def _user_batches(name: str, shapes: list[tuple[int, int, int]]) -> list[dict[str, Any]]:
    from torch_plugin.models import hf_suite

    return [
        hf_suite.make_inputs(name, batch=b, seq=t, seed=10 + i, pad=p)
        for i, (b, t, p) in enumerate(shapes)
    ]


def check_bf16(name: str, mesh_shape: tuple[int, ...], user: bool = False) -> dict[str, Any]:
    """bf16 two ways on `mesh_shape`, each against one process running the same recipe (within
    BF16_RTOL relative, the reference moving by more): bf16 parameters with float32 master
    weights (`optimizer(..., master_weights=True)`), and float32 parameters with the forward
    under `torch.autocast("cpu", dtype=torch.bfloat16)` (the sharded program is captured again
    under it on its first such call, its specs pinned). user: the library-default config
    (dropout as shipped) over shard2_user's padded batches of changing length."""
    import torch_plugin
    from torch_plugin.models import hf_suite

    def build(dtype: torch.dtype | None = None) -> tuple[torch.nn.Module, Any]:
        if not user:
            return hf_suite.build(name, dtype=dtype)
        model = hf_suite.build_model(name, dtype=dtype, library_defaults=True)
        return model, _user_batches(name, USER_SHAPES)

    def first(inputs: Any) -> dict[str, Any]:
        return inputs[0] if isinstance(inputs, list) else inputs

    out: dict[str, Any] = {}
    mesh = torch_plugin.DeviceMesh(mesh_shape, timeout_s=COLLECTIVE_TIMEOUT_S)

    def params(lr: float) -> float:
        model, inputs = build(torch.bfloat16)
        want = _masters_reference(model, inputs, lr=lr)
        sharded = torch_plugin.parallelize(model, mesh, first(inputs))
        got = _train(
            sharded,
            inputs,
            lambda: sharded.optimizer(torch.optim.AdamW, lr=lr, master_weights=True),
        )
        return _compare_losses(got, want, rtol=BF16_RTOL, must_move=True)

    def autocast(lr: float) -> float:
        model, inputs = build()
        want = _reference_losses(model, inputs, autocast=torch.bfloat16, lr=lr)
        sharded = torch_plugin.parallelize(model, mesh, first(inputs))
        got = _train(
            sharded,
            inputs,
            lambda: sharded.optimizer(torch.optim.AdamW, lr=lr),
            autocast=torch.bfloat16,
        )
        return _compare_losses(got, want, rtol=BF16_RTOL, must_move=True)

    _moving(params, out, "bf16_params_loss_diff")
    _moving(autocast, out, "autocast_loss_diff")
    return out


def _moving(compare: Callable[[float], float], out: dict[str, Any], key: str) -> None:
    """out[key] = compare(LR); where one process's losses do not move by more than the tolerance
    at LR (Cohere's logit scale keeps its loss near log(vocab) over a few steps), the recipe runs
    again at 10x, 30x, then 100x LR, recorded as key + "_lr": the same strict check, on a run
    that trains measurably (Cohere: at 100x the bf16 runs drift 1.1e-3 apart, at 30x they agree
    to 2.9e-4 and move by more than 1e-3). Every rank decides alike (the reference is one
    process's on each)."""
    for scale in (1, 10, 30):
        try:
            out[key] = compare(scale * LR)
            if scale > 1:
                out[key + "_lr"] = scale * LR
            return
        except NotMoving:
            pass
    out[key] = compare(100 * LR)
    out[key + "_lr"] = 100 * LR


FP16_INIT_SCALE = 1024.0  # both sides start here; tiny models overflow fp16 at 65536


def check_fp16(name: str, mesh_shape: tuple[int, ...]) -> dict[str, Any]:
    """fp16 two ways on `mesh_shape` with torch_plugin.ShardedGradScaler, each against one process
    running the same recipe with torch.amp.GradScaler (within FP16_RTOL relative, the reference
    moving by more): fp16 parameters with float32 master weights, and float32 parameters with
    the forward under torch.autocast(float16). Then an overflow on one rank only (an inf written
    into rank 1's first gradient): every rank must skip that step and halve its scale
    (`overflow_disagreements` 0)."""
    import torch.distributed as dist

    import torch_plugin
    from torch_plugin.models import hf_suite

    out: dict[str, Any] = {}
    mesh = torch_plugin.DeviceMesh(mesh_shape, timeout_s=COLLECTIVE_TIMEOUT_S)
    model, inputs = hf_suite.build(name, dtype=torch.float16)
    want = _masters_reference(
        model, inputs, torch.amp.GradScaler("cpu", init_scale=FP16_INIT_SCALE)
    )
    sharded = torch_plugin.parallelize(model, mesh, inputs)
    scaler = torch_plugin.ShardedGradScaler("cpu", init_scale=FP16_INIT_SCALE)
    opt = sharded.optimizer(torch.optim.AdamW, lr=LR, master_weights=True)
    got = _train(sharded, inputs, lambda: opt, scaler=scaler)
    out["fp16_params_loss_diff"] = _compare_losses(got, want, rtol=FP16_RTOL, must_move=True)

    scale = scaler.get_scale()
    before = [p.detach().clone() for p in sharded.parameters()]
    scaler.scale(hf_suite.loss_of(sharded(**inputs))).backward()
    if dist.get_rank() == 1:
        with torch.no_grad():
            next(p for p in sharded.parameters() if p.grad is not None).grad.view(-1)[0] = float(
                "inf"
            )
    scaler.step(opt)
    scaler.update()
    opt.zero_grad()
    moved = any(not torch.equal(a, p) for a, p in zip(before, sharded.parameters(), strict=True))
    out["overflow_disagreements"] = int(moved or scaler.get_scale() != scale / 2)

    model, inputs = hf_suite.build(name)
    want = _reference_losses(
        model, inputs, torch.float16, torch.amp.GradScaler("cpu", init_scale=FP16_INIT_SCALE)
    )
    sharded = torch_plugin.parallelize(model, mesh, inputs)
    got = _train(
        sharded,
        inputs,
        lambda: sharded.optimizer(torch.optim.AdamW, lr=LR),
        autocast=torch.float16,
        scaler=torch_plugin.ShardedGradScaler("cpu", init_scale=FP16_INIT_SCALE),
    )
    out["autocast_loss_diff"] = _compare_losses(got, want, rtol=FP16_RTOL, must_move=True)
    return out


def check_pipeline(name: str, world: int, layers: int = 4) -> dict[str, Any]:
    """4 ranks, a decoder of `layers` layers (tied embeddings where the architecture ties),
    called the HF way: the losses of 3 AdamW steps (clipped at 1.0) equal one process's, and
    so does the clipped norm."""
    import torch_plugin
    from torch_plugin.models import hf_suite

    model, inputs = hf_suite.build(name, batch=4, layers=layers)
    ref = copy.deepcopy(model)
    ref_opt = torch.optim.AdamW(ref.parameters(), lr=LR)
    want, want_norms = [], []
    for _ in range(STEPS):
        loss = hf_suite.loss_of(ref(**inputs))
        loss.backward()
        want_norms.append(float(torch.nn.utils.clip_grad_norm_(ref.parameters(), 1.0)))
        ref_opt.step()
        ref_opt.zero_grad()
        want.append(float(loss))
    pp = torch_plugin.parallelize(
        model, world, inputs, strategy="pipeline", loss_fn=lambda out, _target: out.loss
    )
    opt = torch.optim.AdamW(pp.parameters(), lr=LR)
    got, norms = [], []
    for _ in range(STEPS):
        got.append(pp.step(inputs))
        norms.append(float(pp.clip_grad_norm_(1.0)))
        opt.step()
        opt.zero_grad()
    norm_diff = max(abs(a - b) / b for a, b in zip(norms, want_norms, strict=True))
    if norm_diff > 1e-5:
        raise Mismatch(f"clipped norms {norms} vs one process {want_norms}")
    return {
        "max_loss_diff": _compare_losses(got, want),
        "max_norm_rel_diff": norm_diff,
        "stages": pp.plan.num_stages,
        "tied": len(pp.tied),
    }


def check_pipeline_user(name: str, world: int, layers: int = 4) -> dict[str, Any]:
    """A user's pipeline: the library-default config, one parallelize on the first padded
    batch, then clipped AdamW steps over batches of other lengths and a short last one, against
    one process with the same seed (the pipeline replays its dropout masks)."""
    import torch_plugin
    from torch_plugin.models import hf_suite

    model = hf_suite.build_model(name, layers=layers, library_defaults=True)
    batches = _user_batches(name, USER_SHAPES)
    reference = copy.deepcopy(model)
    ref_opt = torch.optim.AdamW(reference.parameters(), lr=LR)
    torch.manual_seed(1)
    want = []
    for b in batches:
        loss = hf_suite.loss_of(reference(**b))
        loss.backward()
        torch.nn.utils.clip_grad_norm_(reference.parameters(), 1.0)
        ref_opt.step()
        ref_opt.zero_grad()
        want.append(float(loss))
    pp = torch_plugin.parallelize(
        model, world, batches[0], strategy="pipeline", loss_fn=lambda out, _target: out.loss
    )
    opt = torch.optim.AdamW(pp.parameters(), lr=LR)
    torch.manual_seed(1)
    got = []
    for b in batches:
        got.append(pp.step(b))
        pp.clip_grad_norm_(1.0)
        opt.step()
        opt.zero_grad()
    diff = _compare_losses(got, want)
    if max(got) - min(got) <= LOSS_RTOL:
        raise Mismatch(f"the losses {got} do not move")
    return {
        "max_loss_diff": diff,
        "stages": pp.plan.num_stages,
        "captures": len(pp.capture_times_s),
        "capture_s": round(sum(pp.capture_times_s.values()), 2),
        "replayed_draws": pp.replayed_draws,
    }


def left_padded_prompt(name: str, pad: int = 3) -> dict[str, torch.Tensor]:
    """The suite's token inputs as a decoder's prompt batch: row 1 is `pad` tokens shorter,
    left-padded as generate() wants."""
    from torch_plugin.models import hf_suite

    inputs = hf_suite.make_inputs(name, pad=0)
    ids, mask = inputs["input_ids"].clone(), inputs["attention_mask"].clone()
    ids[1, :pad] = hf_suite.PAD
    mask[1, :pad] = 0
    return {"input_ids": ids, "attention_mask": mask}


def check_cp_decode(
    name: str, mesh_shape: tuple[int, ...], new_tokens: int = 32, helix: bool = False
) -> dict[str, Any]:
    """generate() of `new_tokens` greedy tokens for prompts of mixed lengths with the KV cache
    split over the mesh: the tokens equal eager generate()'s, this rank holds at most 1/N of
    the single-process cache plus one block per layer, and every decode step of every layer
    ran torch_plugin::split_kv_attention. helix: o_proj and the MLP tensor-parallel as well
    (each rank holds 1/N of them), the partials exchanged by one all-to-all per layer and step."""
    import torch_plugin
    from torch_plugin.models import hf_suite

    model, _ = hf_suite.build(name)
    model.eval()
    prompt = left_padded_prompt(name)
    gen = dict(max_new_tokens=new_tokens, do_sample=False, pad_token_id=hf_suite.PAD)
    want = model.generate(**prompt, **gen, use_cache=True, return_dict_in_generate=True)
    full = 0
    for layer in getattr(want.past_key_values, "layers", []):
        if getattr(layer, "keys", None) is not None:
            full += layer.keys.nbytes + layer.values.nbytes
    mesh = torch_plugin.DeviceMesh(mesh_shape, timeout_s=COLLECTIVE_TIMEOUT_S)
    whole = {n: p.numel() for n, p in model.named_parameters()}
    cp = torch_plugin.cache_parallel(model, mesh, helix=helix)
    with torch.profiler.profile() as prof:
        got = cp.generate(**prompt, **gen)
    if not torch.equal(got, want.sequences):
        raise Mismatch("generated tokens differ from eager generate()")
    layers = cp.last_cache.layers
    held = sum(layer.local_bytes() for layer in layers)
    per_slot = held // max(1, sum(layer.n for layer in layers))
    world = cp.placement.world
    bound = full / world + per_slot * cp.placement.block_size * len(layers)
    if full and held > bound:
        raise Mismatch(
            f"this rank holds {held} B of KV cache; 1/{world} of {full} B + a block is {bound:.0f}"
        )
    calls = sum(e.count for e in prof.key_averages() if e.key.endswith("split_kv_attention"))
    if calls < cp.decode_steps * len(layers):
        raise Mismatch(
            f"torch_plugin::split_kv_attention ran {calls} times over {cp.decode_steps} decode "
            f"steps of {len(layers)} layers"
        )
    figures = {
        "tokens": int(got.shape[1] - prompt["input_ids"].shape[1]),
        "kv_fraction": held / full if full else float("nan"),
        "kernel_calls": calls,
    }
    if helix:
        local = dict(model.named_parameters())
        split = [n for n in whole if local[n].numel() != whole[n]]
        if not split:
            raise Mismatch("helix=True split no parameter")
        for n in split:
            if local[n].numel() * world != whole[n]:
                raise Mismatch(f"{n}: {local[n].numel()} of {whole[n]} elements on this rank")
        exchanges = cp.comm.calls["helix_partials"]
        if exchanges != cp.decode_steps * len(layers) or cp.comm.calls["partials"]:
            raise Mismatch(
                f"{exchanges} all-to-alls of partials (and {cp.comm.calls['partials']} "
                f"all-gathers) over {cp.decode_steps} decode steps of {len(layers)} layers"
            )
        figures["split_fraction"] = sum(local[n].numel() for n in split) / sum(
            whole[n] for n in split
        )
    return figures


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def rank_figures(rank: int, world: int, entry: str, name: str) -> dict[str, Any]:
    """One rank's share of a distributed cell, in a process group already joined (the suite's
    fresh processes, or the tests' kept-alive gloo pool). Raises Mismatch when numbers differ."""
    mesh = DISTRIBUTED[entry][1]
    if entry in ("shard2_user", "shard2x2_user", "shard4_user"):
        return check_shard_user(name, mesh)
    if entry.startswith("shard"):
        return check_shard(name, mesh, lean=entry.endswith("_lean"))
    if entry == "recipe2x2":
        return check_recipe(name, mesh)
    if entry in ("bf16_2", "bf16_2_user"):
        return check_bf16(name, mesh, user=entry.endswith("_user"))
    if entry == "fp16_2":
        return check_fp16(name, mesh)
    if entry == "pipeline4":
        return check_pipeline(name, world)
    if entry == "pipeline4_user":
        return check_pipeline_user(name, world)
    return check_cp_decode(name, mesh, helix=entry.startswith("helix"))


def merge_figures(ranks: list[dict[str, Any]]) -> dict[str, Any]:
    """The worst of the ranks' figures (largest difference), per figure."""
    figures: dict[str, Any] = {}
    for key in ranks[0]:
        values = [r[key] for r in ranks]
        figures[key] = max(values) if isinstance(values[0], (int, float)) else values[0]
    return figures


def run_on_pool(pool: Any, entry: str, name: str) -> dict[str, Any]:
    """A distributed cell on ranks already joined (the tests' kept-alive gloo pool: anything
    with run(fn, *args) -> each rank's result): the worst rank's figures."""
    return merge_figures(pool.run(rank_figures, entry, name))


def _rank_main(rank: int, world: int, port: int, entry: str, name: str, out: str) -> None:
    import warnings

    import torch.distributed as dist

    warnings.filterwarnings("ignore")
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    t0 = time.perf_counter()
    result: dict[str, Any]
    try:
        dist.init_process_group(
            "gloo",
            rank=rank,
            world_size=world,
            timeout=datetime.timedelta(seconds=COLLECTIVE_TIMEOUT_S),
        )
        result = {"status": "pass", "figures": rank_figures(rank, world, entry, name)}
    except Exception as e:  # noqa: BLE001 - every failure is a cell of the table
        result = {
            "status": "mismatch" if isinstance(e, Mismatch) else "error",
            "error": first_line(e),
            "trace": traceback.format_exc(limit=-4),
        }
    result["seconds"] = time.perf_counter() - t0
    Path(out, f"rank{rank}.json").write_text(json.dumps(result))
    try:
        if dist.is_initialized():
            dist.destroy_process_group()
    except Exception:  # noqa: BLE001, S110 - the result is written; teardown may fail after errors
        pass


def run_distributed(entry: str, name: str, deadline_s: float = 300.0) -> dict[str, Any]:
    """Runs one (entry, model) cell on fresh gloo processes; the worst rank's result."""
    world = DISTRIBUTED[entry][0]
    ctx = mp.get_context("spawn")
    port = free_port()
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory() as out:
        procs = [
            ctx.Process(target=_rank_main, args=(r, world, port, entry, name, out))
            for r in range(world)
        ]
        for p in procs:
            p.start()
        for p in procs:
            p.join(max(0.0, deadline_s - (time.perf_counter() - t0)))
        hung = [r for r, p in enumerate(procs) if p.is_alive()]
        for p in procs:
            if p.is_alive():
                p.kill()
                p.join()
        ranks = []
        for r in range(world):
            f = Path(out, f"rank{r}.json")
            ranks.append(json.loads(f.read_text()) if f.exists() else None)
    seconds = time.perf_counter() - t0
    if hung:
        return {
            "status": "error",
            "error": f"ranks {hung} still running after {deadline_s:.0f} s",
            "seconds": seconds,
        }
    for r, res in enumerate(ranks):
        if res is None:
            code = procs[r].exitcode
            return {
                "status": "error",
                "error": f"rank {r} died (exit code {code})",
                "seconds": seconds,
            }
    bad = [res for res in ranks if res["status"] != "pass"]
    if bad:
        # The cause, not its echo: a rank that failed on its own, before those that then
        # waited on it in vain.
        echoes = ("died or stalled", "Connection closed by peer", "Connection reset by peer")
        causes = [b for b in bad if not any(e in b.get("error", "") for e in echoes)] or bad
        worst = next((b for b in causes if b["status"] == "mismatch"), causes[0])
        return {**worst, "seconds": seconds}
    figures = merge_figures([res["figures"] for res in ranks])
    return {"status": "pass", "figures": figures, "seconds": seconds}


def run_cell(entry: str, name: str, **placement_options: Any) -> dict[str, Any]:
    if not applies(entry, name):
        return {"status": "n/a"}
    if entry in DISTRIBUTED:
        return run_distributed(entry, name)
    t0 = time.perf_counter()
    try:
        kw = placement_options if entry == "placement" else {}
        figures = LOCAL[entry](name, **kw)
        out: dict[str, Any] = {"status": "pass", "figures": figures}
    except Exception as e:  # noqa: BLE001
        out = {"status": "mismatch" if isinstance(e, Mismatch) else "error", "error": first_line(e)}
    out["seconds"] = time.perf_counter() - t0
    return out


# ---- report --------------------------------------------------------------------------------


def pass_rates(cells: dict[str, dict[str, dict[str, Any]]]) -> dict[str, dict[str, Any]]:
    rates = {}
    for entry in ENTRIES:
        ran = [c[entry] for c in cells.values() if entry in c and c[entry]["status"] != "n/a"]
        if ran:
            passed = sum(c["status"] == "pass" for c in ran)
            rates[entry] = {"passed": passed, "ran": len(ran), "rate": passed / len(ran)}
    return rates


def table(cells: dict[str, dict[str, dict[str, Any]]]) -> str:
    entries = [e for e in ENTRIES if any(e in c for c in cells.values())]
    mark = {"pass": "ok", "mismatch": "DIFF", "error": "FAIL", "n/a": "-"}
    lines = [f"{'model':14s}" + "".join(f"{e:>16s}" for e in entries)]
    for name, c in cells.items():
        lines.append(
            f"{name:14s}"
            + "".join(f"{mark[c[e]['status']] if e in c else '':>16s}" for e in entries)
        )
    rates = pass_rates(cells)
    summary = {e: f"{r['passed']}/{r['ran']}" for e, r in rates.items()}
    lines.append(f"{'pass rate':14s}" + "".join(f"{summary.get(e, ''):>16s}" for e in entries))
    failures = [
        f"  {name} / {e}: {c[e]['error']}"
        for name, c in cells.items()
        for e in entries
        if e in c and c[e]["status"] in ("error", "mismatch")
    ]
    if failures:
        lines += ["", "first line of each failure:", *failures]
    return "\n".join(lines)


def save_png(cells: dict[str, dict[str, dict[str, Any]]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.colors import ListedColormap

    entries = [e for e in ENTRIES if any(e in c for c in cells.values())]
    code = {"pass": 0, "mismatch": 1, "error": 2, "n/a": 3}
    names = list(cells)
    grid = [[code[cells[n][e]["status"]] if e in cells[n] else 4 for e in entries] for n in names]
    fig, ax = plt.subplots(figsize=(1.1 * len(entries) + 2, 0.22 * len(names) + 1.5))
    cmap = ListedColormap(["#3a9d5d", "#e0a030", "#c8423b", "#d0d0d0", "#ffffff"])
    ax.imshow(grid, cmap=cmap, vmin=0, vmax=4, aspect="auto")
    rates = pass_rates(cells)
    ax.set_xticks(range(len(entries)))
    ax.set_xticklabels(
        [f"{e}\n{rates[e]['passed']}/{rates[e]['ran']}" if e in rates else e for e in entries],
        fontsize=7,
    )
    ax.xaxis.tick_top()
    ax.set_yticks(range(len(names)))
    ax.set_yticklabels(names, fontsize=6)
    ax.set_title(
        "HF suite: pass (green), wrong numbers (amber), error (red), n/a (grey)", fontsize=8, pad=28
    )
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def _save(cells: dict[str, dict[str, dict[str, Any]]], out: Path) -> dict[str, Any]:
    from torch_plugin.models import hf_suite

    cells = {n: cells[n] for n in hf_suite.names() if n in cells}
    report = {
        "transformers": __import__("transformers").__version__,
        "torch": torch.__version__,
        "entries": ENTRIES,
        "pass_rates": pass_rates(cells),
        "cells": cells,
    }
    out.parent.mkdir(parents=True, exist_ok=True)
    write_results(out.with_suffix(".json"), report)
    save_png(cells, out.with_suffix(".png"))
    return cells


def main() -> None:
    from torch_plugin.models import hf_suite

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", nargs="*", default=None)
    parser.add_argument("--entries", nargs="*", default=None, choices=ENTRIES)
    parser.add_argument("--subset", choices=["ci"], default=None)
    parser.add_argument("--merge", action="store_true", help="keep other cells of the saved run")
    parser.add_argument("--out", default=str(RESULTS / "hf_suite"))
    args = parser.parse_args()
    names = args.models or (hf_suite.CI_SUBSET if args.subset == "ci" else hf_suite.names())
    entries = args.entries or ENTRIES
    out = Path(args.out)
    saved: dict[str, Any] = {}
    if args.merge and out.with_suffix(".json").exists():
        saved = json.loads(out.with_suffix(".json").read_text())
    cells: dict[str, dict[str, dict[str, Any]]] = saved.get("cells", {})
    t_run = time.perf_counter()
    for name in names:
        for entry in entries:
            cell = run_cell(entry, name)
            cell["commit"] = _commit()
            cells.setdefault(name, {})[entry] = cell
            status = cell["status"] + (f" ({cell['error']})" if "error" in cell else "")
            print(f"[{time.perf_counter() - t_run:7.1f} s] {name} / {entry}: {status}", flush=True)
        _save(cells, out)  # after each model: a long run that is stopped keeps what it measured
    cells = _save(cells, out)
    print(table(cells))
    print(f"wrote {out.with_suffix('.json')} and {out.with_suffix('.png')}")


if __name__ == "__main__":
    sys.exit(main())
