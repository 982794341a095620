"""The schedule language's error: a leaf module, so the verifier that raises it need not import
the schedule that calls the verifier."""

from __future__ import annotations


class ScheduleError(ValueError):
    """A primitive used where its rules do not hold; the message says what to do instead."""
