"""Inductor's ISA probes run side by side: every pending probe made, two at a time."""

from __future__ import annotations

import threading
import time

import pytest

from torch_plugin.placement import vec_isa


class _Probe:
    """An ISA whose probe (its truth value) waits at `barrier` for another probe: it passes
    only when two run at once, and lasts `seconds` after."""

    def __init__(self, barrier: threading.Barrier, seconds: float, made: list[str]) -> None:
        self.barrier, self.seconds, self.made = barrier, seconds, made

    def __bool__(self) -> bool:
        self.barrier.wait(timeout=30)  # BrokenBarrierError where the probes ran in turn
        time.sleep(self.seconds)
        self.made.append(threading.current_thread().name)
        return True


def test_pending_probes_run_two_at_a_time_and_the_serial_surplus_is_returned(
    monkeypatch,
) -> None:
    made: list[str] = []
    barrier = threading.Barrier(2)
    monkeypatch.setattr(vec_isa, "_pending", lambda: [_Probe(barrier, 0.3, made) for _ in range(4)])
    saved = vec_isa.probe_side_by_side(workers=2)
    assert len(made) == 4 and all(n.startswith("torch_plugin_isa") for n in made), made
    # In turn: 4 x 0.3 s; two at a time: 2 x 0.3 s (and the barrier waits count in both).
    assert 0.3 < saved < 1.2, saved


@pytest.mark.parametrize("pending, workers", [(0, 2), (4, 1)])
def test_nothing_is_run_without_a_pending_probe_or_a_second_core(
    monkeypatch, pending: int, workers: int
) -> None:
    made: list[str] = []
    barrier = threading.Barrier(1)
    monkeypatch.setattr(
        vec_isa, "_pending", lambda: [_Probe(barrier, 0.0, made) for _ in range(pending)]
    )
    assert vec_isa.probe_side_by_side(workers=workers) == 0.0
    assert made == []


class _Failing:
    def __bool__(self) -> bool:
        raise TypeError("another probe API")


def test_a_probe_that_raises_leaves_the_probes_to_inductor(monkeypatch) -> None:
    """Our side-by-side probing must never fail Inductor's compile: Inductor probes again."""
    monkeypatch.setattr(vec_isa, "_pending", lambda: [_Failing(), _Failing()])
    assert vec_isa.probe_side_by_side(workers=2) == 0.0


def test_once_inductor_listed_the_valid_isas_nothing_is_pending() -> None:
    from torch._inductor import cpu_vec_isa

    cpu_vec_isa.valid_vec_isa_list()  # what Inductor's first CPU compile does
    assert vec_isa._pending() == []
