"""Kernel time from the GPU's own timestamps (CUPTI activity records, what Nsight Systems shows).

CUDA events around a launch also time what the GPU's front end does between the start event and the kernel (2-4 us
on an H200), which is most of a 10 us kernel. CUPTI records each kernel's start and end on the GPU. The harness tags
every timed call with an external correlation id; a sample is the span from the first GPU activity (kernel, memset,
copy) of its call to the last, so an operation of several kernels (a split-K reduction, torch's cast) is timed whole,
gaps included. With the GPU-side lead tagged too (``lead(i)``), a sample can start where the lead ended instead
(``spans(n, from_lead=True)``): the GPU front end's launch of the call is then counted with its kernels, as Nsight
Compute's ``gpu__time_duration`` and a CUDA graph's period per launch count it.

    with KernelTimer.open() as timer:       # typed error when CUPTI is missing or taken (ncu, nsys)
        for i in range(n):
            with timer.lead(i):             # optional: the GPU-side lead before the call
                torch.cuda._sleep(cycles)
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


# External ids of the leads: sample i's lead is LEAD_ID + i (sample ids stay far below it).
LEAD_ID = 1 << 40


def group_spans(activities, external: dict[int, int], expected: int, from_lead: bool = False) -> dict[int, float]:
    """Seconds per sample: ``external`` maps a CUDA API call's correlation id to the sample id it ran under (or
    LEAD_ID + id for the sample's lead); each sample's span runs from its first activity's start to its last one's
    end. ``from_lead``: from the end of the sample's lead instead, where the call waited for it (a call on another
    stream that started before the lead ended keeps its own first start)."""
    first: dict[int, int] = {}
    last: dict[int, int] = {}
    lead_end: dict[int, int] = {}
    for activity in activities:
        sample = external.get(activity.correlation)
        if sample is None or activity.end <= 0:
            continue
        if sample >= LEAD_ID:
            lead_end[sample - LEAD_ID] = max(lead_end.get(sample - LEAD_ID, activity.end), activity.end)
            continue
        first[sample] = min(first.get(sample, activity.start), activity.start)
        last[sample] = max(last.get(sample, activity.end), activity.end)
    missing = [i for i in range(expected) if i not in first]
    if missing:
        raise KernelTimerError(f"CUPTI reported no GPU activity for {len(missing)} of {expected} timed calls "
                               f"(first: {missing[0]}); the timed call launched nothing, or activity records were "
                               f"dropped")
    if from_lead:
        missing = [i for i in range(expected) if i not in lead_end]
        if missing:
            raise KernelTimerError(f"CUPTI reported no lead before {len(missing)} of {expected} timed calls (first: "
                                   f"{missing[0]}); timing from the lead needs a lead tagged before every call")
        first = {sample: lead_end[sample] if lead_end[sample] <= start else start for sample, start in first.items()}
    return {sample: (last[sample] - first[sample]) * 1e-9 for sample in first}


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
    def _tagged(self, external_id: int):
        custom = self._cupti.ExternalCorrelationKind.CUSTOM0
        self._cupti.activity_push_external_correlation_id(custom, external_id)
        try:
            yield
        finally:
            self._cupti.activity_pop_external_correlation_id(custom)

    def sample(self, index: int):
        """The timed call of sample ``index`` runs inside."""
        return self._tagged(index)

    def lead(self, index: int):
        """The GPU-side lead before sample ``index`` runs inside (what ``spans(from_lead=True)`` starts from)."""
        return self._tagged(LEAD_ID + index)

    def spans(self, expected: int, from_lead: bool = False) -> dict[int, float]:
        """Seconds per sample id; call after the timed stream synchronized."""
        self._cupti.activity_flush_all(1)
        return group_spans(self._activities, self._external, expected, from_lead)

    def lead_spans(self, expected: int) -> dict[int, float]:
        """Seconds each of the first ``expected`` samples' leads ran on the GPU (those CUPTI reported)."""
        self._cupti.activity_flush_all(1)
        leads = {LEAD_ID + i: i for i in range(expected)}
        return group_spans(self._activities, {c: leads[x] for c, x in self._external.items() if x in leads}, 0)
