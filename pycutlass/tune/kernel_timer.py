"""Kernel time from the GPU's own timestamps (CUPTI activity records, what Nsight Systems shows).

CUDA events around a launch also time what the GPU's front end does between the start event and the kernel (2-4 us
on an H200), which is most of a 10 us kernel. CUPTI records each kernel's start and end on the GPU. The harness tags
every timed call with an external correlation id; a sample is the span from the first GPU activity (kernel, memset,
copy) of its call to the last, so an operation of several kernels (a split-K reduction, torch's cast) is timed whole,
gaps included.

    with KernelTimer.open() as timer:       # typed error when CUPTI is missing or taken (ncu, nsys)
        for i in range(n):
            with timer.sample(i):
                launch()
        torch.cuda.synchronize()
        spans = timer.spans(n)              # {i: seconds}

CUPTI's activity API is one per process: its buffer callbacks are registered once (``_channel``) and hand records
to the timer that is open, so timers do not nest and are not shared between threads (each sweep worker times its own
GPU in its own process).
"""
from __future__ import annotations

import functools
from contextlib import contextmanager
from dataclasses import dataclass

from ..errors import ArgumentError


class KernelTimerError(ArgumentError):
    """CUPTI cannot time kernels here; ``BenchConfig(timer="events")`` times with CUDA events instead."""


@dataclass(frozen=True)
class Activity:
    """One GPU activity: what CUPTI reported, reduced to what grouping needs."""

    correlation: int
    start: int  # ns
    end: int


def group_spans(activities, external: dict[int, int], expected: int) -> dict[int, float]:
    """Seconds per sample: ``external`` maps a CUDA API call's correlation id to the sample id it ran under; each
    sample's span runs from its first activity's start to its last one's end."""
    first: dict[int, int] = {}
    last: dict[int, int] = {}
    for activity in activities:
        sample = external.get(activity.correlation)
        if sample is None or activity.end <= 0:
            continue
        first[sample] = min(first.get(sample, activity.start), activity.start)
        last[sample] = max(last.get(sample, activity.end), activity.end)
    spans = {sample: (last[sample] - first[sample]) * 1e-9 for sample in first}
    missing = [i for i in range(expected) if i not in spans]
    if missing:
        raise KernelTimerError(f"CUPTI reported no GPU activity for {len(missing)} of {expected} timed calls "
                               f"(first: {missing[0]}); the timed call launched nothing, or activity records were "
                               f"dropped")
    return spans


class _Channel:
    """The process's one registration of CUPTI activity buffer callbacks; records go to the open timer."""

    def __init__(self, cupti):
        self.cupti = cupti
        self.timer: KernelTimer | None = None
        cupti.activity_register_callbacks(self._requested, self._completed)

    def _requested(self):
        return KernelTimer.BUFFER_BYTES, 0

    def _completed(self, activities) -> None:
        if self.timer is not None:
            self.timer._take(activities)


@functools.cache
def _channel(cupti) -> _Channel:
    # cached per bindings module: CUPTI holds one set of buffer callbacks per process, so this mirrors CUPTI's own
    # process-wide state rather than adding any
    return _Channel(cupti)


class KernelTimer:
    """Records GPU activity of the calls made inside ``sample(i)`` while open."""

    _KINDS = ("CONCURRENT_KERNEL", "MEMSET", "MEMCPY", "DRIVER", "RUNTIME", "EXTERNAL_CORRELATION")
    BUFFER_BYTES = 8 * 2**20

    def __init__(self, cupti):
        self._cupti = cupti
        self._activities: list[Activity] = []
        self._external: dict[int, int] = {}
        self._enabled: list = []
        self._channel: _Channel | None = None

    @classmethod
    @contextmanager
    def open(cls, cupti=None):
        """A timer recording until the block ends. ``cupti``: the bindings module (default: cupti-python's)."""
        if cupti is None:
            try:
                from cupti import cupti
            except ImportError as error:
                raise KernelTimerError(f"kernel timing needs CUPTI (pip install cupti-python): {error}; "
                                       f"BenchConfig(timer='events') times with CUDA events instead") from None
        timer = cls(cupti)
        timer._start()
        try:
            yield timer
        finally:
            timer._stop()

    # --- CUPTI plumbing --------------------------------------------------------------------------------------------
    def _start(self) -> None:
        cupti = self._cupti
        try:
            self._channel = _channel(cupti)
            self._channel.timer = self
            for name in self._KINDS:
                kind = getattr(cupti.ActivityKind, name)
                cupti.activity_enable(kind)
                self._enabled.append(kind)
        except Exception as error:  # noqa: BLE001 - cuptiError: another profiler holds CUPTI, or the driver is older
            self._disable()
            if self._channel is not None:
                self._channel.timer = None
            raise KernelTimerError(f"CUPTI could not record kernel activity ({type(error).__name__}: {error}); a "
                                   f"profiler such as ncu or nsys may hold it; BenchConfig(timer='events') times with "
                                   f"CUDA events instead") from None

    def _disable(self) -> None:
        for kind in self._enabled:
            try:
                self._cupti.activity_disable(kind)
            except Exception:  # noqa: BLE001 - best effort while unwinding
                pass
        self._enabled.clear()

    def _stop(self) -> None:
        try:
            self._cupti.activity_flush_all(1)  # forced: hand over the buffers still being filled
        finally:
            self._disable()
            if self._channel is not None and self._channel.timer is self:
                self._channel.timer = None

    def _take(self, activities) -> None:
        kinds = self._cupti.ActivityKind
        timed = (kinds.CONCURRENT_KERNEL, kinds.KERNEL, kinds.MEMSET, kinds.MEMCPY)
        for activity in activities:
            kind = activity.kind
            if kind == kinds.EXTERNAL_CORRELATION:
                self._external[int(activity.correlation_id)] = int(activity.external_id)
            elif kind in timed:
                self._activities.append(Activity(int(activity.correlation_id), int(activity.start),
                                                 int(activity.end)))

    # --- what the harness calls ------------------------------------------------------------------------------------
    @contextmanager
    def sample(self, index: int):
        custom = self._cupti.ExternalCorrelationKind.CUSTOM0
        self._cupti.activity_push_external_correlation_id(custom, index)
        try:
            yield
        finally:
            self._cupti.activity_pop_external_correlation_id(custom)

    def spans(self, expected: int) -> dict[int, float]:
        """Seconds per sample id; call after the timed stream synchronized."""
        self._cupti.activity_flush_all(1)
        return group_spans(self._activities, self._external, expected)
