"""The persistent profile cache: measured seconds per (backend, group, shapes, machine) in SQLite.

Default path ~/.cache/torch_plugin/profile.db; `TORCH_PLUGIN_PROFILE_DB` or the placement option
`cache_path` override it (":memory:" keeps nothing). A corrupted file is moved aside and rebuilt
with a warning; a database locked by another process past the timeout is replaced by an
in-memory one for this run, with a warning. Neither ever fails the compile.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import platform
import sqlite3
import time
from dataclasses import dataclass
from typing import Any

log = logging.getLogger("torch_plugin")

_SCHEMA = """
CREATE TABLE IF NOT EXISTS profile (
    key TEXT PRIMARY KEY,
    backend TEXT NOT NULL,
    signature_hash TEXT NOT NULL,
    seconds REAL,
    ok INTEGER NOT NULL,
    note TEXT,
    compile_seconds REAL,
    created REAL NOT NULL
)
"""


# Whole-graph decisions of the evolutionary search (its fitness is end-to-end, so it is the
# expensive part of a warm compile): graph signature + options + machine -> JSON.
_DECISIONS = """
CREATE TABLE IF NOT EXISTS decision (
    key TEXT PRIMARY KEY,
    payload TEXT NOT NULL,
    created REAL NOT NULL
)
"""


def default_path() -> str:
    env = os.environ.get("TORCH_PLUGIN_PROFILE_DB")
    if env:
        return env
    return os.path.join(os.path.expanduser("~"), ".cache", "torch_plugin", "profile.db")


def device_key(values: Any) -> str:
    """The device a graph's timings are taken on: "cpu", or a GPU's model ("cuda:NVIDIA H200"),
    so that a host's CPU and GPU timings, or two GPU models', never stand in for each other."""
    import torch

    items = values.values() if isinstance(values, dict) else values
    for x in items:
        if isinstance(x, torch.Tensor) and x.device.type == "cuda":
            return f"cuda:{torch.cuda.get_device_name(x.device)}"
    return "cpu"


def machine_key(device: str, versions: dict[str, str]) -> str:
    """Host, CPU model, thread count, device and library versions: what a timing depends on."""
    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    cpu = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    import torch

    parts = [platform.node(), cpu, f"threads={torch.get_num_threads()}", device]
    parts += [f"{k}={v}" for k, v in sorted(versions.items())]
    return "|".join(parts)


@dataclass
class Entry:
    seconds: float | None  # None when the backend failed or gave wrong numbers on the group
    ok: bool
    note: str
    compile_seconds: float


class ProfileCache:
    def __init__(self, path: str | None = None, timeout_s: float = 5.0) -> None:
        self.path = path or default_path()
        self.timeout_s = timeout_s
        self.hits = 0
        self.misses = 0
        self.conn = self._open()

    def _connect(self, path: str) -> sqlite3.Connection:
        conn = sqlite3.connect(path, timeout=self.timeout_s, isolation_level=None)
        conn.execute(_SCHEMA)
        conn.execute(_DECISIONS)
        conn.execute("SELECT COUNT(*) FROM profile").fetchone()
        return conn

    def _open(self) -> sqlite3.Connection:
        if self.path == ":memory:":
            return self._connect(":memory:")
        os.makedirs(os.path.dirname(os.path.abspath(self.path)), exist_ok=True)
        try:
            conn = self._connect(self.path)
            conn.execute("PRAGMA quick_check").fetchone()
            return conn
        except sqlite3.OperationalError as e:
            if "locked" in str(e) or "busy" in str(e):
                log.warning(
                    "torch_plugin placement: profile cache %s is locked by another process (%s); "
                    "using an in-memory cache for this run",
                    self.path,
                    e,
                )
                return self._connect(":memory:")
            return self._rebuild(e)
        except sqlite3.DatabaseError as e:
            return self._rebuild(e)

    def _rebuild(self, error: Exception) -> sqlite3.Connection:
        aside = f"{self.path}.corrupt-{int(time.time())}"
        log.warning(
            "torch_plugin placement: profile cache %s is damaged (%s); moved it to %s and "
            "started a fresh one",
            self.path,
            error,
            aside,
        )
        try:
            os.replace(self.path, aside)
        except OSError:
            pass
        try:
            return self._connect(self.path)
        except sqlite3.Error as e:
            log.warning(
                "torch_plugin placement: cannot recreate %s (%s); using memory", self.path, e
            )
            return self._connect(":memory:")

    @staticmethod
    def key(backend: str, signature: str, machine: str) -> str:
        digest = hashlib.sha256(f"{backend}\n{signature}\n{machine}".encode()).hexdigest()
        return digest

    def get(self, key: str) -> Entry | None:
        try:
            row = self.conn.execute(
                "SELECT seconds, ok, note, compile_seconds FROM profile WHERE key = ?", (key,)
            ).fetchone()
        except sqlite3.Error as e:
            log.warning("torch_plugin placement: profile cache read failed (%s); measuring", e)
            return None
        if row is None:
            self.misses += 1
            return None
        self.hits += 1
        return Entry(row[0], bool(row[1]), row[2] or "", row[3] or 0.0)

    def put(self, key: str, backend: str, signature: str, entry: Entry) -> None:
        try:
            self.conn.execute(
                "INSERT OR REPLACE INTO profile VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                (
                    key,
                    backend,
                    hashlib.sha1(signature.encode()).hexdigest(),
                    entry.seconds,
                    int(entry.ok),
                    entry.note,
                    entry.compile_seconds,
                    time.time(),
                ),
            )
        except sqlite3.Error as e:
            log.warning("torch_plugin placement: profile cache write failed (%s); not cached", e)

    def get_decision(self, key: str) -> dict | None:
        try:
            row = self.conn.execute("SELECT payload FROM decision WHERE key = ?", (key,)).fetchone()
            return None if row is None else json.loads(row[0])
        except (sqlite3.Error, ValueError) as e:
            log.warning("torch_plugin placement: cached decision unreadable (%s); searching", e)
            return None

    def put_decision(self, key: str, payload: dict) -> None:
        try:
            self.conn.execute(
                "INSERT OR REPLACE INTO decision VALUES (?, ?, ?)",
                (key, json.dumps(payload), time.time()),
            )
        except sqlite3.Error as e:
            log.warning("torch_plugin placement: decision not cached (%s)", e)

    def close(self) -> None:
        try:
            self.conn.close()
        except sqlite3.Error:
            pass
