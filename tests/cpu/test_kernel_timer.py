"""The harness's kernel timer: CUPTI activity records grouped into one span per timed call (a stand-in CUPTI)."""
from __future__ import annotations

import json
import types

import pytest

from pycutlass.errors import ArgumentError
from pycutlass.tune.bench import BenchConfig, GemmBench
from pycutlass.tune.kernel_timer import Activity, KernelTimer, KernelTimerError, group_spans


class FakeCupti:
    """CUPTI's activity API as the timer uses it: the GPU work a test 'launches' becomes kernel records with the
    correlation id of their API call, and an external-correlation record when a sample id is pushed."""

    class ActivityKind:
        CONCURRENT_KERNEL, KERNEL, MEMSET, MEMCPY, DRIVER, RUNTIME, EXTERNAL_CORRELATION = range(7)

    class ExternalCorrelationKind:
        CUSTOM0 = 5

    def __init__(self, refuse: bool = False):
        self.refuse = refuse
        self.enabled: set = set()
        self.stack: list[int] = []
        self.pending: list = []
        self.clock = 1_000_000
        self.correlation = 0
        self.callbacks = None

    # the API the timer calls
    def activity_register_callbacks(self, requested, completed):
        self.callbacks = (requested, completed)

    def activity_enable(self, kind):
        if self.refuse:
            raise RuntimeError("CUPTI_ERROR_MULTIPLE_SUBSCRIBERS_NOT_SUPPORTED")
        self.enabled.add(kind)

    def activity_disable(self, kind):
        self.enabled.discard(kind)

    def activity_push_external_correlation_id(self, kind, value):
        assert kind == self.ExternalCorrelationKind.CUSTOM0
        self.stack.append(value)

    def activity_pop_external_correlation_id(self, kind):
        return self.stack.pop()

    def activity_flush_all(self, flag):
        records, self.pending = self.pending, []
        if records:
            self.callbacks[1](records)

    # the 'GPU': one API call running kernels of the given durations (ns) back to back, gap ns apart
    def launch(self, name: str, *durations: int, gap: int = 0):
        if not self.enabled:
            return
        self.correlation += 1
        if self.stack:
            self.pending.append(types.SimpleNamespace(kind=self.ActivityKind.EXTERNAL_CORRELATION,
                                                      correlation_id=self.correlation, external_id=self.stack[-1]))
        for duration in durations:
            self.pending.append(types.SimpleNamespace(kind=self.ActivityKind.CONCURRENT_KERNEL, name=name,
                                                      correlation_id=self.correlation, start=self.clock,
                                                      end=self.clock + duration))
            self.clock += duration + gap
        self.clock += 5_000  # the front end's gap before the next call: never part of a sample


def test_spans_group_each_calls_activity_first_start_to_last_end():
    activities = [Activity(1, 100, 300), Activity(1, 350, 400), Activity(2, 1000, 1900), Activity(3, 5, 9)]
    assert group_spans(activities, {1: 0, 2: 1}, expected=2) == pytest.approx({0: 300e-9, 1: 900e-9})
    with pytest.raises(KernelTimerError, match="1 of 3"):
        group_spans(activities, {1: 0, 2: 1}, expected=3)


def test_spans_from_the_lead_start_where_the_calls_lead_ended():
    lead = 1 << 40
    activities = [Activity(7, 0, 90), Activity(1, 100, 300), Activity(1, 350, 400),   # lead 0 ends at 90
                  Activity(8, 500, 990), Activity(2, 1000, 1900),                    # lead 1 ends at 990
                  Activity(9, 2000, 2500), Activity(3, 2100, 2200)]                  # call 2 ran beside its lead
    external = {7: lead, 1: 0, 8: lead + 1, 2: 1, 9: lead + 2, 3: 2}
    assert group_spans(activities, external, expected=3) == pytest.approx({0: 300e-9, 1: 900e-9, 2: 100e-9})
    # from the lead: the front end's 10 ns before each call count; a call that did not wait keeps its own start
    assert group_spans(activities, external, expected=3, from_lead=True) == pytest.approx(
        {0: 310e-9, 1: 910e-9, 2: 100e-9})
    with pytest.raises(KernelTimerError, match="no lead before 1 of 3"):
        group_spans(activities, {k: v for k, v in external.items() if k != 8}, expected=3, from_lead=True)


class _Torch:
    """Just enough torch for GemmBench.time: events, sleep, synchronize (the harness's own GPU work is logged)."""

    def __init__(self, cupti):
        class Event:
            def __init__(self, enable_timing=False):
                pass

            def record(self):
                pass

            def synchronize(self):
                pass

            def elapsed_time(self, other):
                return 0.123  # ms: what events would say; the kernel timer must not use it

        cuda = types.SimpleNamespace(Event=Event, synchronize=lambda device=None: None,
                                     _sleep=lambda cycles: cupti.launch("spin_kernel", 50_000))
        self.cuda = cuda


def _bench(config: BenchConfig, cupti: FakeCupti) -> GemmBench:
    for replaced in ("flush_l2", "open_kernel_timer", "_cycles_per_us"):  # stand-ins only for what the class has
        assert callable(getattr(GemmBench, replaced, None)), replaced
    bench = object.__new__(GemmBench)
    bench.torch, bench.config, bench.device = _Torch(cupti), config, None
    bench._flush = object()
    bench.flush_l2 = lambda: cupti.launch("reduce_kernel", 80_000)
    bench._sleep_cycles_per_us = 1500.0
    bench.open_kernel_timer = lambda: KernelTimer.open(cupti)
    from pycutlass.tune.breakdown import PhaseClock

    bench.clock = PhaseClock()
    return bench


def test_harness_samples_are_the_calls_gpu_spans_not_events_nor_the_flush_or_lead():
    cupti = FakeCupti()
    bench = _bench(BenchConfig(repetitions=4, warmup=2, timer="kernel"), cupti)
    samples, _ = bench.time(lambda i: cupti.launch("gemm", 10_000 + 1_000 * i))
    # the warm-up runs before recording starts; the timed calls count from 0 again
    assert samples == pytest.approx([10e-6, 11e-6, 12e-6, 13e-6])
    assert not cupti.enabled and not cupti.stack  # recording stops with the timing; every push popped
    # an operation of two kernels (torch's matmul then a cast) is timed from the first's start to the last's end
    samples, _ = bench.time(lambda i: cupti.launch("two", 7_000, 2_000, gap=500))
    assert samples == pytest.approx([9.5e-6] * 4)


def test_launch_timer_counts_the_front_ends_gap_after_the_lead_and_not_the_flush():
    cupti = FakeCupti()
    config = BenchConfig(repetitions=3, warmup=1, timer="launch")
    samples, _ = _bench(config, cupti).time(lambda i: cupti.launch("gemm", 10_000))
    # FakeCupti leaves 5 us between two calls (the lead's end and the call's start): counted, unlike the flush's
    assert samples == pytest.approx([15e-6] * 3)
    assert not cupti.enabled and not cupti.stack
    kernel, _ = _bench(BenchConfig(repetitions=3, warmup=1, timer="kernel"), cupti).time(
        lambda i: cupti.launch("gemm", 10_000))
    assert kernel == pytest.approx([10e-6] * 3)
    # the default: from the lead when there is one, from the first kernel without
    assert BenchConfig().timer == "launch" and BenchConfig(lead_us=0).timer == "kernel"
    with pytest.raises(ArgumentError, match="lead_us > 0"):
        BenchConfig(timer="launch", lead_us=0)


def test_events_timer_keeps_the_event_times():
    cupti = FakeCupti()
    samples, _ = _bench(BenchConfig(repetitions=3, warmup=1, timer="events"), cupti).time(
        lambda i: cupti.launch("gemm", 10_000))
    assert samples == pytest.approx([0.123e-3] * 3)
    assert cupti.callbacks is None  # CUPTI never touched


def test_kernel_timer_refuses_with_the_way_out_when_cupti_is_taken_or_launches_nothing():
    with pytest.raises(KernelTimerError, match="timer='events'") as caught:
        _bench(BenchConfig(repetitions=3, warmup=1), FakeCupti(refuse=True)).time(lambda i: None)
    assert isinstance(caught.value, ArgumentError)
    cupti = FakeCupti()
    with pytest.raises(KernelTimerError, match="no GPU activity"):
        _bench(BenchConfig(repetitions=3, warmup=1), cupti).time(lambda i: None)
    assert not cupti.enabled and not cupti.stack


def test_timer_is_part_of_the_fingerprint():
    kernel, launch, events = BenchConfig(timer="kernel"), BenchConfig(timer="launch"), BenchConfig(timer="events")
    assert json.loads(kernel.fingerprint)["timer"] == "kernel" and "timer" not in events.fingerprint
    assert json.loads(launch.fingerprint)["timer"] == "launch"
    for config in (kernel, launch, events):
        assert BenchConfig.from_json(config.fingerprint) == config


def _slowed_leads(cupti, torch_stand_in, lead_ns):
    """Leads of ``lead_ns`` ns each, one value per lead from the iterable (the last repeats): a 50 us lead taking
    longer ran at a lowered SM clock."""
    lengths = iter(lead_ns)
    last = [None]

    def sleep(cycles):
        last[0] = next(lengths, last[0])
        cupti.launch("spin_kernel", last[0])

    torch_stand_in.cuda._sleep = sleep


def _fake_clock(monkeypatch) -> list:
    """The harness's clock and rests, simulated: a rest advances the clock by its length. Returns the rests."""
    import pycutlass.tune.bench as bench_module

    now, rests = [0.0], []

    def sleep(seconds):
        rests.append(seconds)
        now[0] += seconds

    monkeypatch.setattr(bench_module, "time", types.SimpleNamespace(perf_counter=lambda: now[0], sleep=sleep))
    return rests


def test_samples_at_a_lowered_clock_are_timed_again_after_a_rest(monkeypatch):
    import pycutlass.tune.bench as bench_module

    rests = _fake_clock(monkeypatch)
    cupti = FakeCupti()
    bench = _bench(BenchConfig(repetitions=3, warmup=1, timer="launch"), cupti)
    _slowed_leads(cupti, bench.torch, [70_000] * 3 + [50_500])  # first timing at 71% of full speed, then 99%
    launched = []
    samples, note = bench.time(lambda i: launched.append(i) or cupti.launch("gemm", 12_000 if len(launched) < 5 else
                                                                            10_000))
    assert rests == [bench_module.SETTLE_IDLE_S] and note == ""
    assert samples == pytest.approx([15e-6] * 3)  # the second timing's (its warm-up ran again first)
    assert len(launched) == 1 + 3 + 1 + 3


def test_a_clock_that_stays_low_is_timed_within_the_budget_and_said(monkeypatch):
    rests = _fake_clock(monkeypatch)
    cupti = FakeCupti()
    bench = _bench(BenchConfig(repetitions=3, warmup=1, timer="launch", settle_ms=250), cupti)
    _slowed_leads(cupti, bench.torch, [80_000] * 3 + [65_000] * 3 + [70_000])  # best: the second timing
    samples, note = bench.time(lambda i: cupti.launch("gemm", 10_000))
    assert len(rests) == 2  # 250 ms holds two rests of 100 ms
    assert "SM clock at 77% of full speed" in note and samples == pytest.approx([15e-6] * 3)
    # settle_ms=0: the first timing stands, said
    rests.clear()
    bench = _bench(BenchConfig(repetitions=3, warmup=1, timer="launch", settle_ms=0), cupti)
    _slowed_leads(cupti, bench.torch, [80_000])
    assert "62% of full speed" in bench.time(lambda i: cupti.launch("gemm", 10_000))[1] and not rests
    # CUDA events know no clock: timed once
    bench = _bench(BenchConfig(repetitions=3, warmup=1, timer="events"), cupti)
    assert bench.time(lambda i: cupti.launch("gemm", 10_000))[1] == "" and not rests


def test_settling_is_part_of_the_fingerprint_and_checked():
    assert json.loads(BenchConfig().fingerprint)["settle_ms"] == 300.0
    assert "settle_ms" not in BenchConfig(settle_ms=0).fingerprint  # what harnesses before the field did
    old = json.loads(BenchConfig(settle_ms=0).fingerprint)
    assert BenchConfig.from_json(json.dumps(old)).settle_ms == 0
    for config in (BenchConfig(), BenchConfig(settle_ms=0), BenchConfig(settle_ms=200)):
        assert BenchConfig.from_json(config.fingerprint) == config
    for bad in (-1, True, "50", 20_000):
        with pytest.raises(ArgumentError, match="settle_ms"):
            BenchConfig(settle_ms=bad)
