"""PyCUTLASS 2.11's ``GpuTimer``: CUDA events around launches on a stream."""
from __future__ import annotations

from ...runtime import driver


class GpuTimer:
    """``start(stream)``, launches, ``stop_and_wait(stream)``, then ``duration(iterations)``: milliseconds per
    iteration. Events are created on first use (in the current context), not at construction."""

    def __init__(self) -> None:
        self._events = None

    def _pair(self):
        if self._events is None:
            cuda = driver._driver()
            flags = cuda.CUevent_flags.CU_EVENT_DEFAULT
            self._events = tuple(driver.check(cuda.cuEventCreate(flags), "cuEventCreate") for _ in range(2))
        return self._events

    def _record(self, event, stream) -> None:
        driver.check(driver._driver().cuEventRecord(event, int(stream)), "cuEventRecord")

    def start(self, stream=0) -> None:
        self._record(self._pair()[0], stream)

    def stop(self, stream=0) -> None:
        self._record(self._pair()[1], stream)

    def stop_and_wait(self, stream=0) -> None:
        self.stop(stream)
        driver.check(driver._driver().cuEventSynchronize(self._pair()[1]), "cuEventSynchronize")

    def duration(self, iterations: int = 1) -> float:
        start, stop = self._pair()
        milliseconds = driver.check(driver._driver().cuEventElapsedTime(start, stop), "cuEventElapsedTime")
        return float(milliseconds) / max(1, int(iterations))
