"""The search's memory check: what each compiler's graph holds and what the process can take."""

from __future__ import annotations

import torch

from torch_plugin.placement import memory


def _write(path, text: str):  # noqa: ANN001, ANN202
    path.write_text(text)
    return str(path)


def test_free_bytes_is_the_lower_of_memavailable_and_the_cgroups_room(tmp_path) -> None:
    info = _write(tmp_path / "meminfo", "MemTotal: 100 kB\nMemAvailable:    8 kB\nCached: 1 kB\n")
    limit = _write(tmp_path / "max", "5000\n")
    usage = _write(tmp_path / "current", "1000\n")
    assert memory.free_bytes(info, [(limit, usage)]) == 4000.0  # the container's 4000 < 8192
    assert memory.free_bytes(info, [(_write(tmp_path / "m2", "max\n"), usage)]) == 8 * 1024.0
    # v1's "no limit" is a number near 2^63.
    assert memory.free_bytes(info, [(_write(tmp_path / "m3", str(2**63 - 4096)), usage)]) == 8192
    # The first cgroup version found is the one read; missing files are skipped.
    missing = (str(tmp_path / "none"), str(tmp_path / "none2"))
    assert memory.free_bytes(info, [missing, (limit, usage)]) == 4000.0
    # Nothing readable: unknown.
    assert memory.free_bytes(str(tmp_path / "none"), [missing]) == 0.0
    # Over the limit already: no room (not negative).
    assert memory.free_bytes(info, [(limit, _write(tmp_path / "c2", "9000"))]) == 0.0


def test_compile_bytes_are_the_frozen_weights_in_each_compilers_precision() -> None:
    frozen = {
        "w": torch.zeros(1000),  # 4000 bytes of f32
        "ids": torch.zeros(10, dtype=torch.int64),  # 80 bytes, kept as they are
        "meta": torch.zeros(4, device="meta"),  # not on the CPU: not counted
    }
    got = memory.compile_bytes(["inductor", "openvino"], frozen, {"openvino": "bf16"})
    assert got == {"inductor": 4080.0, "openvino": 2080.0}
    assert memory.compile_bytes(["inductor"], {}, {}) == {}
