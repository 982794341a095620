"""What every results JSON records about the run that wrote it: the commit (and whether the tree
had uncommitted changes), the date, and the machine (CPU model, threads; torch)."""

from __future__ import annotations

import datetime
import os
import platform
import subprocess
from pathlib import Path
from typing import Any

import torch

ROOT = Path(__file__).resolve().parents[1]


def _git(*args: str) -> str:
    try:
        return subprocess.check_output(["git", *args], cwd=ROOT, text=True).strip()
    except (OSError, subprocess.CalledProcessError):
        return ""


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _cpu_id() -> str | None:
    """Family, model and stepping: clouds name several generations alike ("AMD EPYC"), and two
    of them ran this project's CPU benchmarks at f32 peaks about two times apart."""
    ids: dict[str, str] = {}
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            key, _, value = line.partition(":")
            key = key.strip()
            if key in ("cpu family", "model", "stepping") and key not in ids:
                ids[key] = value.strip()
    except OSError:
        return None
    if len(ids) < 3:
        return None
    return f"family {ids['cpu family']} model {ids['model']} stepping {ids['stepping']}"


def commit() -> str | None:
    """The measured tree's commit. A lent GPU machine gets the working tree with a stale .git:
    the command passes TP_COMMIT, which wins over git."""
    return os.environ.get("TP_COMMIT") or _git("rev-parse", "--short", "HEAD") or None


def provenance() -> dict[str, Any]:
    machine: dict[str, Any] = {
        "cpu": _cpu_model(),
        "cpu_id": _cpu_id(),
        "cpus": os.cpu_count(),
        "threads": torch.get_num_threads(),
        "torch": torch.__version__,
    }
    if torch.cuda.is_available():
        machine["gpu"] = torch.cuda.get_device_name(0)
        machine["cuda"] = torch.version.cuda
        try:
            machine["driver"] = subprocess.check_output(
                ["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"], text=True
            ).strip()
        except (OSError, subprocess.CalledProcessError):
            machine["driver"] = None
    return {
        "commit": commit(),
        # With TP_COMMIT (a lent GPU machine, stale .git), TP_DIRTY says whether it was dirty.
        "dirty": os.environ.get("TP_DIRTY") == "1"
        if "TP_COMMIT" in os.environ
        # Results files do not count: a run that merges into its own JSON (the HF suite writes
        # after every cell) would otherwise call its own code changed.
        else bool(
            _git("status", "--porcelain", "--untracked-files=no", "--", ".", ":!benchmarks/results")
        ),
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "machine": machine,
    }


def write_results(path: str | Path, payload: Any, **dump: Any) -> None:
    """Writes a results JSON with its provenance (commit, dirty flag, date, machine) in front of
    the payload's own keys: every benchmarks/results/*.json is written through here."""
    import json

    if isinstance(payload, dict):
        # Provenance wins over a payload key of the same name (a script's own "machine" or
        # "commit" would otherwise hide the recorded ones).
        prov = provenance()
        payload = {**prov, **{k: v for k, v in payload.items() if k not in prov}}
    Path(path).write_text(json.dumps(payload, indent=1, **dump))


def kept_rows(
    path: str | Path, measured: set[tuple[Any, ...]], key: tuple[str, ...] = ("model", "batch")
) -> list[dict[str, Any]]:
    """A --merge run's saved rows for what it does not measure again. Each names the run it was
    measured in (the file's commit, dirty flag and machine, unless the row says), since a merged
    table spans several runs."""
    import json

    path = Path(path)
    if not path.exists():
        return []
    old = json.loads(path.read_text())
    stamp = {k: old.get(k) for k in ("commit", "dirty", "machine", "device") if k in old}
    return [
        {**stamp, **r} for r in old.get("rows", []) if tuple(r.get(k) for k in key) not in measured
    ]
