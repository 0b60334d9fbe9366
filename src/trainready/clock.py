"""The one clock the long-lived objects read (CheckpointManager, Session, Launcher, the stop request), passed
in so a test can drive deadlines, grace periods and billing without waiting for them."""

from __future__ import annotations

import time
from typing import Protocol


class Clock(Protocol):
    def time(self) -> float:
        """Wall-clock seconds since the epoch (what is billed and written in records)."""

    def monotonic(self) -> float:
        """Seconds for deadlines and grace periods (never jumps)."""

    def perf_counter(self) -> float:
        """Seconds for measuring short durations (step times, stalls)."""

    def sleep(self, seconds: float) -> None:
        """Wait (polling loops, retry back-off)."""


class SystemClock:
    """The process's real clocks."""

    def time(self) -> float:
        return time.time()

    def monotonic(self) -> float:
        return time.monotonic()

    def perf_counter(self) -> float:
        return time.perf_counter()

    def sleep(self, seconds: float) -> None:
        time.sleep(seconds)


SYSTEM_CLOCK = SystemClock()
