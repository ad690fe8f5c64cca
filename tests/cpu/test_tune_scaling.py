"""How a sweep's benchmark phase spreads over GPUs, with stand-in GPU workers (no GPU): workers start together,
each kernel stays on one GPU until the tail, the tail is one pair long, and the time breakdown adds up."""
from __future__ import annotations

import heapq

import pytest

from pycutlass.tune.breakdown import PhaseClock, WORKER_PHASES
from pycutlass.tune.problems import GemmProblem
from pycutlass.tune.runner import PairPlan, run_sweep
from pycutlass.tune.sweep import Sweep
from tests.tune_helpers import f16_gemm as gemm, fake_worker_main

TILES = [(128, 128, 32), (64, 64, 32), (128, 64, 32), (64, 128, 32), (256, 128, 32)]
PROBLEMS = [GemmProblem(256, 512, 128), GemmProblem(1024, 1024, 1024), GemmProblem(16, 4096, 4096),
            GemmProblem(512, 512, 512)]


def simulate(plan: PairPlan, durations: dict, workers: int):
    """Run ``plan`` on ``workers`` simulated GPUs; ``durations[kernel]`` seconds per pair. Returns the pairs each
    worker measured, in order, and when each worker ran out of work."""
    ready = [(0.0, w) for w in range(workers)]
    measured = {w: [] for w in range(workers)}
    finished = {}
    while ready:
        now, worker = heapq.heappop(ready)
        task = plan.next(worker)
        if task is None:
            finished[worker] = now
            continue
        measured[worker].append((task[0], task[1]))
        heapq.heappush(ready, (now + durations[task[0]], worker))
    return measured, finished


def test_plan_keeps_kernels_on_one_worker_and_ends_within_one_pair():
    kernels = [f"k{i}" for i in range(7)]
    problems = [f"p{j}" for j in range(9)]
    durations = {k: 0.1 * (1 + i % 3) for i, k in enumerate(kernels)}  # kernels of unequal cost
    tasks = [(k, p, None) for p in problems for k in kernels]  # problem-major, as the sweep lists them
    for workers in (2, 3, 4):
        plan = PairPlan(tasks)
        assert len(plan) == len(tasks)
        measured, finished = simulate(plan, durations, workers)
        pairs = [pair for done in measured.values() for pair in done]
        assert sorted(pairs) == sorted((k, p) for k, p, _ in tasks), "every pair exactly once"
        # Whole kernels per worker: kernels shared by two workers only at the tail, at most one per extra worker.
        owners = {k: {w for w, done in measured.items() for kernel, _ in done if kernel == k} for k in kernels}
        assert sum(len(o) for o in owners.values()) <= len(kernels) + workers - 1, owners
        # The tail: every worker runs out of work within one pair of the others.
        assert max(finished.values()) - min(finished.values()) <= max(durations.values()) + 1e-9, finished
        assert sum(plan.stolen.values()) >= 1  # the tail was shared
        assert plan.next(0) is None and len(plan) == 0


def test_plan_alternates_problem_order_so_the_last_problems_come_back_first():
    tasks = [(k, p, None) for p in ("p0", "p1", "p2") for k in ("a", "b")]
    plan = PairPlan(tasks)
    order = [plan.next(0)[:2] for _ in range(6)]
    assert order == [("a", "p0"), ("a", "p1"), ("a", "p2"), ("b", "p2"), ("b", "p1"), ("b", "p0")]


def test_phase_clock_counts_nested_phases_once():
    import time

    clock = PhaseClock()
    with clock.phase("verify"):
        time.sleep(0.02)
        with clock.phase("reference"):
            time.sleep(0.05)
    taken = clock.take()
    assert taken["reference"] >= 0.05 and 0.02 <= taken["verify"] < 0.05, taken
    assert clock.take() == {}


@pytest.fixture
def sweep_of(tmp_path):
    def make(name, tiles=TILES, problems=PROBLEMS):
        ops = [gemm(t) for t in tiles]
        return Sweep(ops, problems, db=tmp_path / "r.db", name=name), ops
    return make


def test_breakdown_adds_up_and_kernels_stay_on_their_worker(sweep_of, monkeypatch):
    monkeypatch.setenv("FAKE_WORKER_STARTUP", "0.3")
    monkeypatch.setenv("FAKE_WORKER_LOAD", "0.05")
    monkeypatch.setenv("FAKE_WORKER_DELAY", "0.03")
    sweep, ops = sweep_of("breakdown")
    summary = run_sweep(sweep, devices=[0, 1], timeout=20, operations=ops, worker_main=fake_worker_main,
                        progress=False, baseline=False)
    pairs = len(ops) * len(PROBLEMS)
    rows = sweep.db.query("select kernel, problem, status, worker from runs")
    assert summary.done == len(rows) == len({(r["kernel"], r["problem"]) for r in rows}) == pairs
    breakdown = summary.breakdown
    assert breakdown.wall == pytest.approx(summary.seconds) and breakdown.rows_written == pairs
    assert 1 <= breakdown.commits <= pairs
    assert [w.label.rsplit("/", 1)[1] for w in breakdown.workers] == ["gpu0", "gpu1"]
    for worker in breakdown.workers:
        # every moment of the phase is accounted once: round trips, the parent's handling, waiting
        assert worker.requests + worker.parent + worker.idle == pytest.approx(worker.wall, abs=1e-6)
        assert worker.wall + breakdown.teardown == pytest.approx(breakdown.wall, abs=1e-6)
        assert sum(worker.phases.values()) <= worker.requests + 1e-3 and worker.transport >= 0
        assert set(worker.phases) <= set(WORKER_PHASES)
        assert worker.startup >= 0.3
        assert worker.phases["timing"] == pytest.approx(0.03 * worker.tasks, rel=0.5, abs=0.05)
        assert worker.phases["load"] >= 0.05 * worker.kernels
        assert 0 <= worker.tail <= worker.idle
        row = worker.row()
        assert row["busy_s"] == pytest.approx(worker.requests - worker.startup, abs=2e-3)
    assert sum(w.tasks for w in breakdown.workers) == pairs
    # each kernel's module loads on one GPU (plus at most one kernel shared at the tail)
    assert sum(w.kernels for w in breakdown.workers) <= len(ops) + 1
    per_worker = {}
    for row in rows:
        per_worker.setdefault(row["kernel"], set()).add(row["worker"])
    assert sum(len(w) for w in per_worker.values()) <= len(ops) + 1, per_worker
    assert "startup_s" in str(breakdown) and "gpu1" in str(breakdown)


def test_workers_start_together_and_finish_together(sweep_of, monkeypatch):
    """Two workers that each take 2 s to start: the phase costs one start-up, not two, and neither waits long for
    the other at the end (pairs of 0.1 s: the tail is one pair)."""
    monkeypatch.setenv("FAKE_WORKER_STARTUP", "2.0")
    monkeypatch.setenv("FAKE_WORKER_DELAY", "0.1")
    sweep, ops = sweep_of("together", tiles=TILES[:3])
    summary = run_sweep(sweep, devices=[0, 1], timeout=20, operations=ops, worker_main=fake_worker_main,
                        progress=False, baseline=False)
    pairs = len(ops) * len(PROBLEMS)
    assert summary.done == pairs
    work = 0.1 * pairs / 2
    assert summary.seconds < 2.0 + work + 1.5, str(summary.breakdown)  # serial start-ups would add another 2 s
    tasks = sorted(w.tasks for w in summary.breakdown.workers)
    assert tasks[1] - tasks[0] <= 2, tasks
    for worker in summary.breakdown.workers:
        assert worker.tail <= 0.1 + 0.5, str(summary.breakdown)


def test_a_gpu_slot_adopts_kernels_again_in_a_fresh_process(monkeypatch):
    """A Dask worker's GPU process that faulted is replaced: the kernels it had adopted are sent to the new one."""
    from pycutlass.tune.distributed import GpuSlots, benchmark_task
    import pycutlass.tune.distributed as distributed_module

    monkeypatch.setenv("FAKE_WORKER_MARKERS", "fault:64x64")
    slots = GpuSlots("fake-worker", 1)
    monkeypatch.setattr(distributed_module, "_worker_slots", lambda: slots)
    good, faulting = gemm((128, 128, 32)), gemm((64, 64, 32))
    kernels = [{"name": op.name, "key": f"key-{op.name}", "operation": op, "target": "sm_90", "backend": "nvrtc",
                "kernel_symbol": "k", "builder_symbol": "b", "binary": b"cubin"} for op in (good, faulting)]
    problems = [p.to_dict() for p in PROBLEMS[:2]]
    config = '{"arg_pool": 1, "cuda_graph": 0, "flush_l2": true, "max_seconds": 2.0, "repetitions": 50, ' \
             '"seed": 0, "verify": true, "warmup": 5}'
    try:
        first = benchmark_task(kernels, problems, config, 10, fake_worker_main)
        statuses = [(r["kernel"], r["measurement"]["status"]) for r in first["rows"]]
        assert statuses == [(good.name, "ok")] * 2 + [(faulting.name, "failed")] * 2, statuses
        runner = slots.runner(0, next(iter(slots._runners.values())).signature, None)
        assert runner.worker.generation == 2  # started, then started again after the first fault
        # the next task (binaries held from the first, none sent) adopts its kernel in the fresh process again
        second = benchmark_task([{k: v for k, v in kernels[0].items() if k != "binary"}], problems, config, 10,
                                fake_worker_main)
        assert [r["measurement"]["status"] for r in second["rows"]] == ["ok", "ok"]
        assert runner.adopted == {good.name} and runner.generation == runner.worker.generation == 3
        assert second["times"]["phases"]["startup"] > 0  # the replacement's start-up shows in the task that met it
    finally:
        slots.close()
