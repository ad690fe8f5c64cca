"""The harness's kernel timer on a GPU: CUPTI spans of real kernels against their known length and CUDA events."""
from __future__ import annotations

import statistics

import pytest

from pycutlass.tune.bench import BenchConfig, GemmBench, measure_gemm, measure_torch
from pycutlass.tune.kernel_timer import KernelTimer
from pycutlass.tune.problems import GemmProblem
from tests.tune_helpers import f16_gemm

try:
    import torch
except ImportError:  # pragma: no cover
    torch = None
pytestmark = [pytest.mark.gpu, pytest.mark.skipif(torch is None, reason="needs torch")]


def test_a_sleep_kernel_is_timed_at_its_length_and_events_add_the_launch_gap():
    bench = GemmBench(BenchConfig(repetitions=20, warmup=3))
    cycles = int(100 * bench._cycles_per_us())  # a kernel of about 100 us at the measured clock
    kernel, _ = bench.time(lambda i: torch.cuda._sleep(cycles))
    events, _ = GemmBench(BenchConfig(repetitions=20, warmup=3, timer="events")).time(
        lambda i: torch.cuda._sleep(cycles))
    kernel_us, events_us = statistics.median(kernel) * 1e6, statistics.median(events) * 1e6
    assert 80 < kernel_us < 130, kernel_us
    assert 0 < events_us - kernel_us < 10, (events_us, kernel_us)  # events also time the front end's gap


def test_samples_span_every_kernel_of_a_call():
    """Two kernels in one timed call: the sample spans both (each about 50 us)."""
    bench = GemmBench(BenchConfig(repetitions=10, warmup=2))
    cycles = int(50 * bench._cycles_per_us())

    def twice(i):
        torch.cuda._sleep(cycles)
        torch.cuda._sleep(cycles)

    once, _ = bench.time(lambda i: torch.cuda._sleep(cycles))
    both, _ = bench.time(twice)
    assert 1.9 < statistics.median(both) / statistics.median(once) < 2.3


def test_gemm_and_torch_baseline_are_timed_by_kernel_below_their_event_times():
    import pycutlass as cutlass

    problem = GemmProblem(1024, 1024, 1024)
    by_kernel_bench = GemmBench(BenchConfig(repetitions=30))
    by_events_bench = GemmBench(BenchConfig(repetitions=30, timer="events"))
    operation = f16_gemm()
    cutlass.compiler.add_module([operation])
    by_kernel, _ = measure_gemm(by_kernel_bench, operation, problem)
    by_events, _ = measure_gemm(by_events_bench, operation, problem)
    assert by_kernel.status == by_events.status == "ok", (by_kernel.message, by_events.message)
    assert by_kernel.seconds < by_events.seconds
    torch_kernel = measure_torch(by_kernel_bench, problem, "float16", c_label="float16")
    torch_events = measure_torch(by_events_bench, problem, "float16", c_label="float16")
    assert torch_kernel.status == torch_events.status == "ok"
    assert torch_kernel.seconds < torch_events.seconds


def test_timer_records_nothing_outside_its_samples():
    with KernelTimer.open() as timer:
        torch.cuda._sleep(1000)  # not in a sample: not counted
        with timer.sample(0):
            torch.cuda._sleep(200_000)
        torch.cuda.synchronize()
        spans = timer.spans(1)
    assert set(spans) == {0} and spans[0] > 0


def test_launch_timer_adds_the_front_ends_launch_and_stays_below_events():
    """From the lead's end: a kernel's launch by the GPU front end counts (a little over the kernel timer), the
    start event does not (below events)."""
    problem = GemmProblem(1024, 1024, 1024)
    found = {}
    for timer in ("kernel", "launch", "events"):
        found[timer] = measure_torch(GemmBench(BenchConfig(repetitions=40, timer=timer)), problem, "float16",
                                     c_label="float16")
        assert found[timer].status == "ok", found[timer].message
    kernel, launch, events = (found[t].seconds * 1e6 for t in ("kernel", "launch", "events"))
    assert kernel < launch < events, (kernel, launch, events)
    assert launch - kernel < 5, (kernel, launch)


def test_after_heavy_work_the_harness_rests_the_gpu_and_times_as_on_a_rested_one():
    """Back-to-back 4096^3 GEMMs hold an H200 at its power limit, which lowers the SM clock for tens of milliseconds
    after; the leads show it, and the harness rests the GPU and times again, so the measurement reads as one on a
    rested GPU. Without settling the same measurement runs slower, and says so."""
    a = torch.randn(4096, 4096, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(4096, 4096, device="cuda", dtype=torch.bfloat16)
    problem = GemmProblem(4096, 4096, 4096)

    def after_heavy_work(config):
        for _ in range(400):  # about 70 ms of heavy work
            a @ b
        torch.cuda.synchronize()
        return measure_torch(GemmBench(config), problem, "bfloat16")

    rested = measure_torch(GemmBench(BenchConfig(repetitions=30, warmup=3)), problem, "bfloat16")
    settled = after_heavy_work(BenchConfig(repetitions=30, warmup=3))
    unsettled = after_heavy_work(BenchConfig(repetitions=30, warmup=3, settle_ms=0))
    assert rested.status == settled.status == unsettled.status == "ok"
    assert settled.seconds <= rested.seconds * 1.03, (settled.seconds, rested.seconds, settled.message)
    if unsettled.seconds > rested.seconds * 1.05:  # the GPU was held down: the measurement says by how much
        assert "of full speed" in unsettled.message, unsettled.message
