"""Inductor's whole graph kept for a later compile (placement/inductor_artifact.py), served as a
known graph (known_graphs.py). Timings are stubbed (`fixed_profile`): Inductor is the pick on
any machine. The kept code must give the first compile's outputs bit for bit (same code, same
constants) and eager's within tolerance."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from test_default_compile import _close
from test_known_graphs import _compile

from torch_plugin import _C
from torch_plugin.backend import collect_stats
from torch_plugin.models import hf_suite, output_tensors
from torch_plugin.placement import inductor_artifact, known_graphs
from torch_plugin.placement.cache import ProfileCache


def _opts(tmp_path: Any, **extra: Any) -> dict[str, Any]:
    placement = {
        "cache_path": str(tmp_path / "profile.db"),
        "backends": ["aten", "inductor"],
        "samples": 1,
        "budget_factor": 100.0,
        "allow_refine": False,
    }
    return {"placement": placement, **extra}


class _Compiles:
    """Counts AOTAutograd's traces and Inductor's compiles."""

    def __init__(self, monkeypatch: Any) -> None:
        import torch._dynamo.backends.common as common
        import torch._inductor.compile_fx as compile_fx

        self.aot = self.inductor = 0
        aot, inductor = common.aot_module_simplified, compile_fx.compile_fx

        def traced(*a: Any, **k: Any) -> Any:
            self.aot += 1
            return aot(*a, **k)

        def compiled(*a: Any, **k: Any) -> Any:
            self.inductor += 1
            return inductor(*a, **k)

        monkeypatch.setattr(common, "aot_module_simplified", traced)
        monkeypatch.setattr(compile_fx, "compile_fx", compiled)


def _entries(tmp_path: Any) -> list[dict[str, Any]]:
    cache = ProfileCache(str(tmp_path / "profile.db"))
    try:
        rows = cache.conn.execute("SELECT payload FROM decision").fetchall()
    finally:
        cache.close()
    import json

    found = []
    for (payload,) in rows:
        try:
            entry = json.loads(payload)
        except ValueError:
            continue
        if isinstance(entry, dict) and entry.get("backend") == "inductor" and "inductor" in entry:
            found.append(entry)
    return found


def _twice(
    tmp_path: Any, monkeypatch: Any, model: torch.nn.Module, x: dict[str, Any], **extra: Any
) -> tuple[Any, Any, _Compiles]:
    """The first compile's outputs, a known graph's compile (checked to be one) and counts."""
    opts = _opts(tmp_path, **extra)
    with torch.no_grad(), collect_stats() as stats:
        first = [t.clone() for t in output_tensors(_compile(model, x, opts)(**x))]
    assert ": inductor (" in stats[0]["summary"], stats[0]["summary"]
    assert "(known graph)" not in stats[0]["summary"]
    counted = _Compiles(monkeypatch)
    with torch.no_grad(), collect_stats() as stats:
        f = _compile(model, x, opts)
        again = output_tensors(f(**x))
    (record,) = stats
    assert record["summary"].endswith("(known graph)"), record["summary"]
    assert ": inductor (" in record["summary"]
    assert counted.aot == 0 and counted.inductor == 0
    for a, b in zip(again, first, strict=True):
        assert torch.equal(a, b)
    return f, first, counted


def test_a_known_inductor_graph_runs_its_kept_code_without_compiling(
    tmp_path, fixed_profile, monkeypatch
) -> None:
    """BERT: the kept code reads the user's weights in place and packs MKL's matrices again;
    a weight changed in place after that sends the next call to the usual compile, with the
    new weights."""
    fixed_profile({"inductor": 1e-5})
    model, x = hf_suite.build("bert", batch=2)
    model.eval()
    f, _, counted = _twice(tmp_path, monkeypatch, model, x)
    (entry,) = _entries(tmp_path)
    kept = entry["inductor"]
    assert kept["views"] and not kept["packed"]
    if torch._C.has_mkl:  # Inductor packs f32 matmuls for MKL where torch has it
        assert kept["recipes"]
    with torch.no_grad():
        _close(f(**x), model(**x))
        linear = next(m for m in model.modules() if isinstance(m, torch.nn.Linear))
        linear.weight.mul_(-2.0)
        _close(f(**x), model(**x))
    assert counted.inductor == 1


def test_a_kept_inductor_graph_is_not_used_under_another_thread_count(
    tmp_path, fixed_profile, monkeypatch, caplog
) -> None:
    """Inductor's code is generated for the compiling process's thread count: a process with
    another count compiles the usual way, with eager's outputs (the profile cache's machine
    key holds the count); and a kept graph read under another count, whatever led to it, is
    refused and says why."""
    fixed_profile({"inductor": 1e-5})
    model, x = hf_suite.build("bert", batch=2)
    model.eval()
    opts = _opts(tmp_path)
    with torch.no_grad():
        _compile(model, x, opts)(**x)
    threads = torch.get_num_threads()
    other = 1 if threads > 1 else 2
    try:
        torch.set_num_threads(other)
        with torch.no_grad(), collect_stats() as stats, caplog.at_level("INFO"):
            f = _compile(model, x, opts)
            _close(f(**x), model(**x))
    finally:
        torch.set_num_threads(threads)
    assert not any(r["summary"].endswith("(known graph)") for r in stats), stats
    # One kept graph per thread count; the first compile's is read under another count.
    entry = next(e for e in _entries(tmp_path) if e["inductor"]["threads"] == threads)
    moved = dict(entry["inductor"], threads=threads + 1)
    with caplog.at_level("INFO"):
        assert inductor_artifact.load(str(tmp_path), entry["artifact"], moved, {}) is None
    assert f"compiled for {threads + 1} threads, this process runs {threads}" in caplog.text


def test_a_known_inductor_graph_keeps_packed_bf16_weights(
    tmp_path, fixed_profile, monkeypatch
) -> None:
    """A CNN at the bf16 precision option: oneDNN's packed convolution and matmul weights kept
    as their bytes, the outputs cast back to f32 as the compiled graph's were."""
    fixed_profile({"inductor": 1e-5})
    model, x = hf_suite.build("resnet", batch=2)
    model.eval()
    f, first, _ = _twice(tmp_path, monkeypatch, model, x, precision="bf16")
    (entry,) = _entries(tmp_path)
    assert entry["inductor"]["packed"]
    assert all(t.dtype == torch.float32 for t in first)
    with torch.no_grad():
        _close(f(**x), model(**x), tol=5e-2)


def test_a_kept_graph_whose_files_are_gone_compiles_the_usual_way(
    tmp_path, fixed_profile, monkeypatch
) -> None:
    fixed_profile({"inductor": 1e-5})
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.GELU(), torch.nn.Linear(16, 4))
    model.eval()
    x = torch.randn(3, 8)
    opts = _opts(tmp_path)
    with torch.no_grad():
        _compile(model, {}, opts)(x)
        (kept,) = list((tmp_path / "profile.artifacts").glob("*.pt"))
        kept.unlink()
        with collect_stats() as stats:
            _close(_compile(model, {}, opts)(x), model(x))
    assert "(known graph)" not in stats[0]["summary"]


def test_mkl_recipes_are_read_off_the_output_code() -> None:
    packed = torch.ops.mkl._mkl_reorder_linear_weight if torch._C.has_mkl else None
    if packed is None:
        pytest.skip("torch built without MKL")
    w = torch.randn(16, 8)
    constants = {"_frozen_param3": packed(w, 4), "_frozen_param2": w, "other": packed(w, 4)}
    source = "\n".join(
        [
            "def call(args):",
            "    buf1 = torch.ops.mkl._mkl_linear.default("
            "reinterpret_tensor(buf0, (4, 8), (8, 1), 0), _frozen_param3, _frozen_param2, None, 4)",
            # Seen with two batches: kept as bytes instead.
            "    buf2 = torch.ops.mkl._mkl_linear.default(buf1, other, _frozen_param2, None, 4)",
            "    buf3 = torch.ops.mkl._mkl_linear.default(buf1, other, _frozen_param2, None, 8)",
        ]
    )
    assert inductor_artifact._mkl_recipes(source, constants) == {
        "_frozen_param3": ["_frozen_param2", 4]
    }


def test_packed_weights_survive_their_bytes() -> None:
    """oneDNN's packed layouts rebuilt from bytes and descriptor compute what the originals do."""
    x = torch.randn(4, 32).bfloat16()
    w = torch.randn(16, 32).bfloat16()
    linear = torch.ops.mkldnn._reorder_linear_weight(w, 4)
    conv_w = torch.randn(8, 3, 3, 3)
    conv = torch.ops.mkldnn._reorder_convolution_weight(
        conv_w, [1, 1], [1, 1], [1, 1], 1, [2, 3, 10, 10]
    )
    for t in (linear, conv):
        assert t.is_mkldnn
        again = _C.mkldnn_from_bytes(
            inductor_artifact._mkldnn_bytes(t),
            list(t.shape),
            t.dtype,
            torch.ops.mkldnn._get_mkldnn_serialized_md(t),
        )
        assert again.is_mkldnn and torch.equal(again.to_dense(), t.to_dense())
    got = torch.ops.mkldnn._linear_pointwise(x, again_linear(linear), None, "none", [], "")
    assert torch.equal(got, torch.ops.mkldnn._linear_pointwise(x, linear, None, "none", [], ""))
    with pytest.raises(ValueError, match="contiguous uint8"):
        _C.mkldnn_from_bytes(torch.zeros(4), [4], torch.float32, torch.zeros(4, dtype=torch.uint8))


def test_packed_bytes_are_read_in_place_not_copied() -> None:
    """What save() writes of a packed weight is its memory, not a copy: a copy of the 1.2B
    Llama's bf16 packed weights was 2.45 GB of new memory, 32 s of its cold compile. The bytes
    rebuild it."""
    w = torch.randn(64, 32).bfloat16()
    packed = torch.ops.mkldnn._reorder_linear_weight(w, 4)
    md = torch.ops.mkldnn._get_mkldnn_serialized_md(packed)
    want = packed.to_dense()
    got = inductor_artifact._mkldnn_bytes(packed)
    assert got.dtype == torch.uint8 and got.numel() == torch.ops.mkldnn._nbytes(packed)
    assert got.data_ptr() == torch.ops.mkldnn.data_ptr(packed)
    again = _C.mkldnn_from_bytes(got, [64, 32], torch.bfloat16, md)
    assert torch.equal(again.to_dense(), want)


def again_linear(t: torch.Tensor) -> torch.Tensor:
    return _C.mkldnn_from_bytes(
        inductor_artifact._mkldnn_bytes(t),
        list(t.shape),
        t.dtype,
        torch.ops.mkldnn._get_mkldnn_serialized_md(t),
    )


def test_views_are_found_only_inside_a_weight() -> None:
    base = torch.randn(6, 4)
    weights = {3: base[:3], 5: base[3:]}  # two weights on one storage
    view = inductor_artifact._view_of(base[3:].t(), weights)
    assert view == {
        "input": 5,
        "dtype": "torch.float32",
        "size": [4, 3],
        "stride": [1, 4],
        "offset": 0,
    }
    assert inductor_artifact._view_of(base, weights) is None  # spans both
    assert inductor_artifact._view_of(torch.randn(3, 4), weights) is None
    assert known_graphs.INDUCTOR_SUFFIXES == (".py", ".pt")


_ISA_PROBE = """
import json, sys
from torch._inductor import config, cpu_vec_isa
from torch_plugin.placement import inductor_artifact
flags = cpu_vec_isa.x86_isa_checker()
isas = cpu_vec_isa.supported_vec_isa_list
named = [str(i) for i in isas if all(f in flags for f in str(i).split())]
inductor_artifact._vouch_for_isas(named[1:] + ["an ISA no CPU has"])  # not what was checked
skipped_other = cpu_vec_isa.valid_vec_isa_list.cache_info().currsize == 0
inductor_artifact._vouch_for_isas(named)
print(json.dumps({
    "named": named,
    "skipped_other": skipped_other,
    "listed": cpu_vec_isa.valid_vec_isa_list.cache_info().currsize == 1,
    "valid": [str(i) for i in cpu_vec_isa.valid_vec_isa_list()],
    "flag_restored": config.cpp.vec_isa_ok is None,
}))
"""


def test_the_isa_probe_is_vouched_for_only_by_a_matching_check() -> None:
    """In a new process (Inductor probes once per process): a list other than what this CPU's
    flags name leaves the probe to Inductor; the matching list computes it without the base
    probe, and Inductor's flag is back as it was."""
    import json
    import platform
    import subprocess
    import sys

    if platform.machine() not in ("x86_64", "AMD64"):
        pytest.skip("Inductor's x86 ISA list")
    out = subprocess.run(
        [sys.executable, "-c", _ISA_PROBE], capture_output=True, text=True, timeout=300, check=True
    )
    got = json.loads(out.stdout.strip().splitlines()[-1])
    assert got["skipped_other"] and got["listed"] and got["flag_restored"]
    # The ISAs' own feature probes (VNNI, bf16, AMX) still run: each may only drop out.
    assert set(got["valid"]) <= set(got["named"])
