"""One model's measurement in a process of its own, with fresh caches: a first pass there
counts every compile, and a contender that crashes or runs out of memory fails its row only."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from typing import Any


def run_child(script: str, name: str, passes: int, only: str | None = None) -> dict[str, Any]:
    """`script --one name --passes N [--only contender]` in a fresh process, with Inductor's
    cache and our profile cache empty: the last JSON line it prints, or {"model": name,
    "failed": {"run": its last error line}}."""
    cmd = [sys.executable, script, "--one", name, "--passes", str(passes)]
    cmd += ["--only", only] if only else []
    with tempfile.TemporaryDirectory() as tmp:
        env = {
            **os.environ,
            "TORCHINDUCTOR_CACHE_DIR": f"{tmp}/inductor",
            "TORCH_PLUGIN_PROFILE_DB": f"{tmp}/profile.db",
        }
        res = subprocess.run(cmd, capture_output=True, text=True, timeout=3600, env=env)
    lines = [ln for ln in res.stdout.splitlines() if ln.startswith("{")]
    if res.returncode != 0 or not lines:
        tail = res.stderr.strip().splitlines()[-1:] or [f"rc {res.returncode}"]
        print(f"{name} {only or 'all'}: failed: {tail[0][:300]}", file=sys.stderr, flush=True)
        return {"model": name, "failed": {"run": tail[0][:300]}}
    return json.loads(lines[-1])
