"""Writes docs/results/<name>.md from benchmarks/results/<name>.json, so the figures in the docs
are the figures of the last run: `python scripts/results_pages.py` (after any benchmark).

Each page names the command that produced it, renders the JSON's scalars as a list and its
tables (lists of records, records of records) as Markdown tables, and shows the PNG."""

from __future__ import annotations

import json
import math
from collections import Counter
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks/results"
DOCS = ROOT / "docs/results"
MAX_ROWS = 60
MAX_COLS = 14

# name -> (title, the benchmark that writes it (under benchmarks/), its notes page under docs/)
PLACE, PIPE, OVERHEAD = (
    "features/backend_placement",
    "features/graph_pipeline_parallelism",
    ("features/roundtrip_and_compile_overhead"),
)
PAGES = {
    "hf_suite": ("HF model suite", "hf_suite.py", None),
    "default_compile": ("Default torch.compile", "default_compile.py", "features/default_compile"),
    "real_size_inference": (
        "CPU inference at real sizes: f32 and bf16 against Inductor, OpenVINO, ONNX Runtime",
        "real_size_inference.py",
        "features/default_compile",
    ),
    "real_size_inference_xeon": (
        "CPU inference at real sizes on the 2-core Xeon (AMX): f32 and bf16",
        "real_size_inference.py --name real_size_inference_xeon",
        "features/default_compile",
    ),
    "bf16x3_linear": (
        'f32 linears as three bf16 products (matmul precision "high") against f32',
        "bf16x3_linear.py",
        "features/default_compile",
    ),
    "varying_lengths": (
        "CPU inference on padded batches of changing lengths",
        "varying_lengths.py",
        "features/default_compile",
    ),
    "static_cache_generate": (
        "HF generate() with a static cache and a compiled forward, on CPU",
        "static_cache_generate.py",
        "features/default_compile",
    ),
    "training_lengths": (
        "Fine-tuning under the default compile: dropout on, batches of changing length",
        "training_lengths.py",
        "features/default_compile",
    ),
    "checkpoint": ("Checkpoints and restarts", "checkpoint.py", "reliability"),
    "placement": ("Backend placement", "placement.py", PLACE),
    "placement_full": ("Backend placement, published shapes", "placement.py --full-size", PLACE),
    "placement_mix": ("Placement across graph compilers", "placement_mix.py", PLACE),
    "fused_attention": ("Fused attention kernel", "fused_attention.py", "features/fused_attention"),
    "sharding": ("Automatic sharding", "sharding.py", "features/automatic_sharding"),
    "hf_sharding": (
        "HF Llama on 4 ranks: ours vs DTensor TP and FSDP2",
        "hf_sharding.py",
        "features/automatic_sharding",
    ),
    "pretrained_load": (
        "Pretrained weights into rank blocks: a 1B Llama on 4 ranks",
        "pretrained_load.py",
        "features/automatic_sharding",
    ),
    "user_programs": (
        "Users' training programs: new lengths after one parallelize",
        "user_programs.py",
        "features/automatic_sharding",
    ),
    "scale_model": (
        "Published large-scale training runs against our layout model",
        "scale_model.py",
        "features/scale_model",
    ),
    "graphpipe_search": ("Graph pipelines: search", "graphpipe_search.py", PIPE),
    "graphpipe_throughput": ("Graph pipelines: throughput", "graphpipe_throughput.py", PIPE),
    "cache_parallel": ("Cache parallelism", "cache_parallel.py", "features/cache_parallelism"),
    "hf_decode": (
        "HF Llama decoding on 4 ranks: CP, Helix, DTensor TP, one process",
        "hf_decode.py",
        "features/cache_parallelism",
    ),
    "schedule": ("Schedule language", "schedule.py", "features/schedule_language"),
    "compile_overhead": ("Compile overhead", "compile_overhead.py", OVERHEAD),
    "compile_overhead_small": ("Compile overhead, small shapes", "compile_overhead.py", OVERHEAD),
    "gpu_kernels": ("CUDA kernels on a GPU", "gpu_kernels.py", "features/fused_attention"),
    "gpu_generate": (
        "Cache-parallel generate() on one GPU",
        "torchrun --nproc-per-node 1 benchmarks/gpu_generate.py",
        "features/cache_parallelism",
    ),
    "gpu_default_compile": (
        "Default compile on a GPU",
        "gpu_default_compile.py",
        "features/default_compile",
    ),
}


def fmt(v: Any) -> str:
    if isinstance(v, float):
        if math.isnan(v) or math.isinf(v):
            return str(v)
        if v != 0 and (abs(v) < 1e-3 or abs(v) >= 1e6):
            return f"{v:.3g}"
        return f"{v:.4g}"
    if isinstance(v, list) and all(not isinstance(x, (dict, list)) for x in v):
        text = ", ".join(fmt(x) for x in v[:8]) + (" ..." if len(v) > 8 else "")
        return text
    if isinstance(v, (dict, list)):
        return "…"
    return str(v).replace("|", "/").replace("\n", " ")[:160]


def flatten(record: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """One level of nesting as "a.b" columns; deeper values are left out."""
    out: dict[str, Any] = {}
    for k, v in record.items():
        if isinstance(v, dict) and not prefix:
            out.update(flatten(v, f"{k}."))
        elif not isinstance(v, dict):
            out[prefix + k] = v
    return out


def _provenance_col(c: str) -> bool:
    """A merged row's run stamp (benchmarks/provenance.kept_rows) other than its commit and
    device: after the measured columns, which it otherwise pushed off the table."""
    return c in ("dirty", "date") or c.startswith("machine.")


def table(rows: list[dict[str, Any]], key: str | None = None, first: Any = None) -> str:
    flat = [flatten(r) for r in rows[:MAX_ROWS]]
    cols: list[str] = []
    for r in flat:
        cols += [c for c in r if c not in cols and c not in ("trace", "__key__")]
    # The columns the benchmark names as its figures ("columns" in its JSON) lead.
    lead = [c for c in first or [] if c in cols]
    cols = lead + [c for c in cols if c not in lead]
    cols = [c for c in cols if not _provenance_col(c)] + [c for c in cols if _provenance_col(c)]
    cols = cols[:MAX_COLS]
    head = ([key] if key else []) + cols
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r, orig in zip(flat, rows, strict=False):
        cells = ([fmt(orig.get("__key__", ""))] if key else []) + [fmt(r.get(c, "")) for c in cols]
        lines.append("| " + " | ".join(cells) + " |")
    if len(rows) > MAX_ROWS:
        lines.append(f"\n({len(rows) - MAX_ROWS} more rows in the JSON)")
    return "\n".join(lines) + "\n"


def is_records(v: Any) -> bool:
    return isinstance(v, list) and bool(v) and all(isinstance(x, dict) for x in v)


def is_keyed_records(v: Any) -> bool:
    return isinstance(v, dict) and len(v) > 1 and all(isinstance(x, dict) for x in v.values())


def render(name: str, data: Any, depth: int = 1) -> str:
    """Scalars first, then one table per list/record of records, recursively by key."""
    if is_records(data):
        return table(data)
    if not isinstance(data, dict):
        return f"{fmt(data)}\n"
    out = []
    # A benchmark's "columns" says which of its rows' figures lead their table; not shown.
    first = data.get("columns")
    data = {k: v for k, v in data.items() if k != "columns"}
    scalars = {k: v for k, v in data.items() if not isinstance(v, (dict, list)) or fmt(v) != "…"}
    for k, v in scalars.items():
        out.append(f"- **{k}**: {fmt(v)}")
    if scalars:
        out.append("")
    for k, v in data.items():
        if k in scalars:
            continue
        out.append(f"{'#' * min(depth + 1, 6)} {k}\n")
        if is_records(v):
            out.append(table(v, first=first))
        elif is_keyed_records(v):
            out.append(table([{"__key__": rk, **rv} for rk, rv in v.items()], key="name"))
        else:
            out.append(render(k, v, depth + 1))
    return "\n".join(out)


# What each result measures, for the staleness flag: a result is flagged when a later commit
# changed any of these paths (besides its own benchmark script).
DEFAULT_CODE = ["torch_plugin", "csrc", "kernels"]
SHARDING = [
    "torch_plugin/sharding",
    "torch_plugin/runtime",
    "csrc/passes/sharding_ilp.cc",
    "csrc/passes/sharding_materialize.cc",
    "csrc/ir/sharding.cc",
]
CODE = {
    "gpu_kernels": ["kernels/cuda"],
    "gpu_generate": ["kernels/cuda", "torch_plugin/cache_parallelism/hf.py"],
    "gpu_default_compile": ["torch_plugin/placement", "torch_plugin/backend.py"],
    "fused_attention": ["kernels/cpu"],
    "pretrained_load": ["torch_plugin/checkpoint", "torch_plugin/sharding"],
    "schedule": ["torch_plugin/schedule", "torch_plugin/runtime", "csrc/passes/schedule_tune.cc"],
    "checkpoint": [
        "torch_plugin/checkpoint",
        "torch_plugin/sharding",
        "torch_plugin/pipeline",
        "torch_plugin/runtime",
    ],
    "hf_sharding": SHARDING,
    "sharding": SHARDING,
    "graphpipe_search": ["csrc/passes/pipeline_graph.cc", "csrc/passes/pipeline_partition.cc"],
    "graphpipe_throughput": [
        "torch_plugin/pipeline",
        "torch_plugin/runtime",
        "csrc/passes/pipeline_graph.cc",
        "csrc/passes/pipeline_partition.cc",
        "csrc/passes/pipeline_schedule.cc",
        "csrc/passes/pipeline_plan.cc",
        "csrc/sim/pipeline_sim.cc",
    ],
    "scale_model": [
        "csrc/cost/cluster_profile.cc",
        "csrc/passes/layout_plan.cc",
        "csrc/sim/interleaved_pipeline.cc",
        "torch_plugin/scale",
    ],
    "user_programs": [
        "torch_plugin/runtime",
        "torch_plugin/sharding",
        "torch_plugin/pipeline",
        "csrc/passes/sharding_ilp.cc",
    ],
}


def _git(*args: str) -> str:
    import subprocess

    try:
        return subprocess.check_output(["git", *args], cwd=ROOT, text=True).strip()
    except (OSError, subprocess.CalledProcessError):
        return ""


def provenance_note(data: Any, command: str, code: list[str]) -> str:
    """Where a result comes from (commit, date, machine) and whether the code it measures has
    changed since; a result that records none says so."""
    if not isinstance(data, dict) or not data.get("commit"):
        return (
            "> **No provenance recorded**: this JSON was written before results recorded their "
            f"commit, date and machine. Rerun `{command}` to regenerate it.\n"
        )
    commit = str(data["commit"])
    machine = data.get("machine") or {}
    keys = ("gpu", "cpu", "cpu_id", "threads", "torch")
    where = ", ".join(str(machine[k]) for k in keys if machine.get(k) is not None)
    dirty = " (uncommitted changes)" if data.get("dirty") else ""
    lines = [f"> Commit `{commit}`{dirty}, {data.get('date', 'date not recorded')}; {where}."]
    # A run that merges the saved rows (--merge) keeps their own commits: name them all. Rows
    # that record their CPU (a cloud names several generations alike): say where they differ.
    rows = [r for r in data.get("rows") or [] if isinstance(r, dict)]
    per_row = Counter(str(r["commit"]) for r in rows if r.get("commit"))
    recorded = any("cpu_id" in r for r in rows)
    cpus = Counter(str(r.get("cpu_id") or "not recorded") for r in rows if recorded)

    def tally(counts: Counter[str], quote: str = "") -> str:
        return ", ".join(f"{quote}{k}{quote} ({n})" for k, n in counts.most_common())

    commits = [commit, *(c for c in per_row if c != commit)]
    if len(commits) > 1:
        lines.append(
            "> Rows measured at several commits (rows per commit; see each row's `commit`): "
            f"{tally(per_row, '`')}."
        )
    if len(cpus) > 1:
        lines.append(
            "> Rows ran on different CPUs (rows per CPU; see each row's `cpu_id`): "
            f"{tally(cpus)}. Compare ratios, not times, across them."
        )
    # A command's script ("python benchmarks/placement.py --full-size"), or a path as it is.
    paths = [next((w for w in c.split() if w.endswith(".py")), c) for c in code]
    paths = [p if "/" in p or p in DEFAULT_CODE else f"benchmarks/{p}" for p in paths]
    # What the code is now, not which commits touched it: a change and its revert leave the
    # result current.
    stale = [c for c in commits if _git("diff", "--name-only", c, "HEAD", "--", *paths)]
    if stale:
        lines.append(
            f"> **Possibly stale**: the code it measures has changed (since "
            f"{', '.join(f'`{c}`' for c in stale)}: `git diff {stale[0]} HEAD -- <paths>`) "
            f"({', '.join(paths)}); rerun `{command}`."
        )
    missing = [c for c in commits if not _git("cat-file", "-t", c)]
    if missing:
        lines.append(
            f"> Commit {', '.join(f'`{c}`' for c in missing)} not in this clone's history."
        )
    return "\n>\n".join(lines) + "\n"


def hf_suite_page(data: dict[str, Any]) -> str:
    """The suite's status grid: one row per architecture, one column per entry point."""
    entries = data["entries"]
    lines = ["| architecture | " + " | ".join(entries) + " |", "|---|" + "---|" * len(entries)]
    for arch, cells in data["cells"].items():
        row = [cells.get(e, {}).get("status", "") for e in entries]
        lines.append(f"| {arch} | " + " | ".join(row) + " |")
    rates = data.get("pass_rates", {})
    summary = [
        f"- **{e}**: {fmt(r.get('passed'))} of {fmt(r.get('ran'))}"
        if isinstance(r, dict)
        else f"- **{e}**: {fmt(r)}"
        for e, r in rates.items()
    ]
    first_errors = {}
    for cells in data["cells"].values():
        for e, c in cells.items():
            if c.get("status") not in ("pass", "n/a", None) and e not in first_errors:
                first_errors[e] = fmt(c.get("error", ""))
    errs = [f"- **{e}**: {msg}" for e, msg in first_errors.items()]
    # Cells are run entry by entry over many sessions: say which commits they span, and name
    # the entry points with no cell run at all.
    commits: dict[str, int] = {}
    for cells in data["cells"].values():
        for c in cells.values():
            if isinstance(c, dict) and c.get("status") not in (None, "n/a"):
                key = str(c.get("commit") or "not recorded")
                commits[key] = commits.get(key, 0) + 1
    spans = ", ".join(f"`{k}` ({v})" for k, v in sorted(commits.items(), key=lambda kv: -kv[1]))
    not_run = [
        e
        for e in entries
        if not any(
            isinstance(c.get(e), dict) and c[e].get("status") not in (None, "n/a")
            for c in data["cells"].values()
        )
    ]
    # Parameter bytes each rank holds, as a fraction of one process's, per sharding entry.
    fractions = []
    for e in entries:
        vals = sorted(
            c[e]["figures"]["param_fraction"]
            for c in data["cells"].values()
            if c.get(e, {}).get("status") == "pass" and "param_fraction" in c[e].get("figures", {})
        )
        if vals:
            small = sum(v <= 0.6 for v in vals)
            fractions.append(
                f"- **{e}**: {small} of {len(vals)} passing architectures at most 0.6; median "
                f"{vals[len(vals) // 2]:.3f}, largest {vals[-1]:.3f}"
            )
    return (
        f"- **transformers**: {data.get('transformers')}, **torch**: {data.get('torch')}\n\n"
        "## Pass rates\n\n"
        + "\n".join(summary)
        + "\n\n## Parameter bytes per rank (fraction of one process's)\n\n"
        + ("\n".join(fractions) or "none recorded")
        + "\n\n## Every cell\n\n"
        + "\n".join(lines)
        + "\n\n## First failure per entry point\n\n"
        + ("\n".join(errs) or "none")
        + "\n\n## Commits the cells were run at (cells per commit)\n\n"
        + (spans or "none")
        + "\n\n## Entry points with no cell run\n\n"
        + (", ".join(not_run) or "none")
        + "\n"
    )


def main(out: Path = DOCS) -> None:
    out.mkdir(parents=True, exist_ok=True)
    index = [
        "# Results",
        "",
        "Generated by `python scripts/results_pages.py` from `benchmarks/results/*.json`; "
        "each page names the benchmark that wrote its JSON. Do not edit by hand.",
        "",
        "| page | produced by |",
        "|---|---|",
    ]
    for path in sorted(RESULTS.glob("*.json")):
        name = path.stem
        title, script, notes = PAGES.get(name, (name, f"{name}.py", None))
        command = script if " " in script else f"python benchmarks/{script}"
        data = json.loads(path.read_text())
        body = hf_suite_page(data) if name == "hf_suite" else render(name, data)
        png = RESULTS / f"{name}.png"
        parts = [
            f"# {title}",
            "",
            f"Produced by `{command}` (`benchmarks/results/{name}.json`); generated page, do "
            "not edit.",
        ]
        if notes:
            parts.append(
                f"What the figures mean and how they were measured: [notes](../{notes}.md)."
            )
        if png.exists():
            parts += ["", f"![{title}](../../benchmarks/results/{name}.png)"]
        parts += ["", provenance_note(data, command, CODE.get(name, DEFAULT_CODE) + [script]), body]
        (out / f"{name}.md").write_text("\n".join(parts))
        index.append(f"| [{title}]({name}.md) | `{command}` |")
    (out / "README.md").write_text("\n".join(index) + "\n")
    print(f"wrote {len(index) - 6} pages under {out}")


if __name__ == "__main__":
    main()
