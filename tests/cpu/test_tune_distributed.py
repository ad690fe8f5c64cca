"""Sweeps through Dask on this CPU-only machine: compile-only through a LocalCluster of 2 workers equals a
single-process sweep, a worker killed mid-sweep loses nothing, and distributed benchmarking (with a stand-in GPU
worker) partitions work, isolates a faulting kernel and resumes."""
from __future__ import annotations

import os
import signal
import threading
import time

import pytest

import pycutlass as cutlass
from pycutlass.tune.db import ResultsDB
from pycutlass.tune.problems import GemmProblem
from pycutlass.tune.sweep import Sweep
from tests.tune_helpers import broken_gemm, f16_conv, f16_gemm as gemm, fake_worker_main

distributed = pytest.importorskip("distributed")
from pycutlass.tune.distributed import DaskExecutor  # noqa: E402



OPS = [gemm((128, 128, 32)), gemm((64, 64, 32)), gemm((128, 64, 32), 4), gemm((64, 128, 32), 4), broken_gemm()]


def memo(db_path):
    with ResultsDB(db_path, read_only=True) as db:
        rows = db.query("select kernel, status, error_class from compile_status")
    assert len(rows) == len({r["kernel"] for r in rows}), "one memo row per kernel"
    return {r["kernel"]: (r["status"], r["error_class"]) for r in rows}


def session(path):
    return cutlass.Session(target=90, backend="nvrtc", cache_path=str(path))


@pytest.fixture(scope="module")
def single_process(tmp_path_factory):
    folder = tmp_path_factory.mktemp("single")
    sweep = Sweep(OPS, db=folder / "r.db", name="s", session=session(folder / "cache.db"))
    sweep.compile(jobs=1, progress=False)
    return memo(folder / "r.db")


@pytest.mark.slow
def test_dask_compile_only_equals_a_single_process_sweep(single_process, tmp_path):
    sweep = Sweep(OPS, db=tmp_path / "r.db", name="s", session=session(tmp_path / "client-cache.db"))
    with DaskExecutor("local:2", worker_cache_path=str(tmp_path / "worker-cache.db")) as executor:
        summary = executor.compile(sweep, progress=False)
    assert memo(tmp_path / "r.db") == single_process
    assert summary.statuses == {"ok": 4, "failed": 1} and len(summary.workers) == 2, str(summary)
    assert [op.name for op in sweep.ready_operations()] == [op.name for op in OPS[:4]]
    # The binaries arrived in the client's cache, verified: a local sweep now compiles nothing.
    again = Sweep(OPS, db=tmp_path / "r.db", name="s", session=session(tmp_path / "client-cache.db"))
    local = again.compile(jobs=1, progress=False)
    assert (local.compiled, local.from_cache, local.known_bad) == (0, 4, 1), str(local)


@pytest.mark.slow
def test_killing_a_worker_mid_sweep_loses_nothing(single_process, tmp_path):
    sweep = Sweep(OPS, db=tmp_path / "r.db", name="s", session=session(tmp_path / "client-cache.db"))
    with DaskExecutor("local:2", worker_cache_path=str(tmp_path / "worker-cache.db")) as executor:
        pids = executor.client.run(os.getpid)
        killed = []

        def kill_one_when_busy():
            deadline = time.monotonic() + 120
            while time.monotonic() < deadline and not killed:
                processing = executor.client.processing()
                busy = [address for address, tasks in processing.items() if tasks]
                if busy:
                    time.sleep(1.0)  # let it start compiling
                    os.kill(pids[busy[0]], signal.SIGKILL)
                    killed.append(busy[0])
                time.sleep(0.2)

        killer = threading.Thread(target=kill_one_when_busy, daemon=True)
        killer.start()
        summary = executor.compile(sweep, progress=False)
        killer.join()
    assert killed, "the test must have killed a worker"
    assert memo(tmp_path / "r.db") == single_process, str(summary)
    assert summary.done == summary.submitted == len(OPS)


@pytest.mark.slow
def test_dask_benchmark_partitions_isolates_faults_and_resumes(tmp_path, monkeypatch):
    monkeypatch.setenv("FAKE_WORKER_MARKERS", "fault:64x64")
    ops = OPS[:4]
    problems = [GemmProblem(256, 512, 128), GemmProblem(1024, 1024, 1024), GemmProblem(16, 4096, 4096)]
    sweep = Sweep(ops, problems, db=tmp_path / "r.db", name="b", session=session(tmp_path / "cache.db"))
    sweep.compile(jobs=2, progress=False)
    cluster = distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=True, dashboard_address=None,
                                       resources={"GPU": 1})
    with distributed.Client(cluster) as client, DaskExecutor(client) as executor:
        summary = executor.benchmark(sweep, timeout=20, kernels_per_task=2, worker_main=fake_worker_main,
                                     progress=False)
        assert summary.done == summary.submitted == len(ops) * len(problems), str(summary)
        rows = sweep.db.query("select kernel, problem, status, worker from runs")
        assert len({(r["kernel"], r["problem"]) for r in rows}) == len(rows) == 12
        for row in rows:
            expected = "failed" if row["kernel"] == ops[1].name else "ok"
            assert row["status"] == expected, row
        again = executor.benchmark(sweep, timeout=20, worker_main=fake_worker_main, progress=False)
        assert again.submitted == 0 and again.skipped == 12
    cluster.close()


@pytest.mark.slow
def test_dask_benchmark_times_every_kind_beside_its_torch_baseline_and_resumes(tmp_path, monkeypatch):
    """GEMM, grouped and Conv2d operations each on the problems of their kind (nothing crosses kinds), and with
    baseline=True one torch row per problem and class, in tasks any GPU takes; a second run submits nothing."""
    from pycutlass.conv import Operator
    from pycutlass.tune.problems import Conv2dProblem, GroupedGemmProblem
    from pycutlass.tune.runner import baseline_name, conv_baseline_name, grouped_baseline_name

    log = tmp_path / "measured.log"
    monkeypatch.setenv("FAKE_WORKER_LOG", str(log))
    plain = OPS[1]
    grouped = cutlass.GemmOperationGrouped(80, plain.tile_description, plain.A, plain.B, plain.C,
                                           plain.epilogue_functor, cutlass.IdentitySwizzle1)
    conv = f16_conv(Operator.fprop)
    problems = [GemmProblem(256, 512, 128), GroupedGemmProblem(((64, 128, 256), (32, 128, 256))),
                Conv2dProblem(2, 8, 8, 64, 64, 3, 3, pad=(1, 1)), GemmProblem(64, 64, 64)]
    sweep = Sweep([plain, grouped, conv], problems, db=tmp_path / "r.db", name="kinds",
                  session=session(tmp_path / "cache.db"))
    sweep.compile(jobs=2, progress=False)
    cluster = distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=True, dashboard_address=None,
                                       resources={"GPU": 1})
    with distributed.Client(cluster) as client, DaskExecutor(client) as executor:
        summary = executor.benchmark(sweep, timeout=30, baseline=True, worker_main=fake_worker_main, progress=False)
        rows = sweep.db.query("select kernel, problem, status from runs")
        pairs = {(r["kernel"], r["problem"]) for r in rows}
        keys = [p.key for p in problems]
        expected = {(plain.name, keys[0]), (plain.name, keys[3]), (grouped.name, keys[1]), (conv.name, keys[2]),
                    (baseline_name("float16", "float16"), keys[0]), (baseline_name("float16", "float16"), keys[3]),
                    (grouped_baseline_name("float16", "float16"), keys[1]),
                    (conv_baseline_name("fprop", "float16", "float16"), keys[2])}
        assert pairs == expected and len(rows) == len(expected), sorted(pairs ^ expected)
        assert all(r["status"] == "ok" for r in rows)
        assert summary.done == summary.submitted == len(expected), str(summary)
        measured = log.read_text().splitlines()
        assert sorted(line for line in measured if line.startswith("baseline")) == [
            "baseline conv2d float16 float16 fprop", "baseline gemm float16 float16", "baseline gemm float16 float16",
            "baseline grouped_gemm float16 float16"]
        again = executor.benchmark(sweep, timeout=30, baseline=True, worker_main=fake_worker_main, progress=False)
        assert again.submitted == 0 and again.skipped == len(expected), str(again)
    cluster.close()


@pytest.mark.slow
def test_a_local_cluster_benchmarks_on_this_hosts_gpus(tmp_path, monkeypatch):
    """"local:N" is N compile workers plus, where GPUs are visible, one benchmark worker declaring them all; without
    GPUs the benchmark phase says that no worker declares one."""
    from pycutlass.tune import runner

    sweep = Sweep(OPS[:2], [GemmProblem(64, 64, 64), GemmProblem(128, 256, 64)], db=tmp_path / "r.db", name="l",
                  session=session(tmp_path / "cache.db"))
    sweep.compile(jobs=2, progress=False)
    monkeypatch.setattr(runner, "visible_gpus", lambda: [])
    with DaskExecutor("local:1") as executor:
        assert not executor._resources("GPU", 1)
        with pytest.raises(cutlass.ArgumentError, match="GPU resource"):
            executor.benchmark(sweep, worker_main=fake_worker_main, progress=False)
    monkeypatch.setattr(runner, "visible_gpus", lambda: [0, 1])
    with DaskExecutor("local:1") as executor:
        workers = executor.client.scheduler_info()["workers"].values()
        assert sorted(sorted((w.get("resources") or {}).items()) for w in workers) == [[("GPU", 2)],
                                                                                       [("MEMORY_GB", 3)]]
        summary = executor.benchmark(sweep, timeout=30, baseline=True, worker_main=fake_worker_main, progress=False)
        assert summary.done == summary.submitted == 4 + 2 and summary.statuses["ok"] == 6, str(summary)


@pytest.mark.slow
def test_compile_workers_never_take_benchmark_tasks(tmp_path, monkeypatch):
    """With workers that have no GPU beside one that has two, stealing (many short tasks, a GPU process that has to
    start) must not hand a benchmark task to a worker without the GPU resource: Dask lets any worker steal a task
    placed loosely on a holder, and such a worker fails on the resource it lacks. Every pair is measured on the GPU
    worker and no worker is lost."""
    from pycutlass.tune import runner

    monkeypatch.setenv("FAKE_WORKER_DELAY", "0.02")
    monkeypatch.setenv("FAKE_WORKER_STARTUP", "1")
    monkeypatch.setenv("FAKE_WORKER_UUID_PARENT", "1")
    problems = [GemmProblem(64 * i, 256, 128) for i in range(1, 9)]
    sweep = Sweep(OPS[:4], problems, db=tmp_path / "r.db", name="s", session=session(tmp_path / "cache.db"))
    sweep.compile(jobs=2, progress=False)
    monkeypatch.setattr(runner, "visible_gpus", lambda: [0, 1])
    with DaskExecutor("local:3") as executor:
        before = set(executor.client.scheduler_info()["workers"])
        summary = executor.benchmark(sweep, timeout=30, problems_per_task=1, worker_main=fake_worker_main,
                                     progress=False)
        assert summary.done == summary.submitted == 4 * 8 and summary.statuses["ok"] == 32, str(summary)
        assert set(executor.client.scheduler_info()["workers"]) == before  # no worker died
        gpu = [a for a, w in executor.client.scheduler_info()["workers"].items() if "GPU" in (w["resources"] or {})]
        measured = {r["worker"].split("-")[-1] for r in sweep.db.query("select worker from runs")}
        pid = executor.client.run(os.getpid, workers=gpu)[gpu[0]]
        assert measured == {str(pid)}, measured  # the fake's uuid ends with its parent's pid: the GPU worker's


def test_executor_rejects_bad_schedulers_and_gpu_less_clusters(tmp_path):
    with pytest.raises(cutlass.ArgumentError, match="local:N"):
        DaskExecutor("local:many")
    with pytest.raises(cutlass.ArgumentError, match="scheduler"):
        DaskExecutor(42)
    cluster = distributed.LocalCluster(n_workers=1, threads_per_worker=1, processes=False, dashboard_address=None)
    with distributed.Client(cluster) as client:
        sweep = Sweep(OPS[:1], [GemmProblem(64, 64, 64)], db=tmp_path / "r.db")
        with pytest.raises(cutlass.ArgumentError, match="GPU resource"):
            DaskExecutor(client).benchmark(sweep)
    cluster.close()


# --- placement, stealing and lost workers in the benchmark phase (stand-in GPU workers) --------------------------
PROBLEMS = [GemmProblem(256, 512, 128), GemmProblem(1024, 1024, 1024), GemmProblem(16, 4096, 4096)]


@pytest.fixture(scope="module")
def worker_cache(tmp_path_factory):
    """A worker-side artifact cache holding OPS[:4]: compile tasks through Dask then cost a cache read each, and
    the kernels still come from (and stay on) the worker that ran the task."""
    folder = tmp_path_factory.mktemp("workers")
    Sweep(OPS[:4], db=folder / "r.db", name="warm", session=session(folder / "cache.db")).compile(jobs=2,
                                                                                                  progress=False)
    return str(folder / "cache.db")


def gpu_cluster(workers: int, **config):
    import dask

    with dask.config.set(config):  # the scheduler reads its settings when it starts
        return distributed.LocalCluster(n_workers=workers, threads_per_worker=2, processes=True,
                                        dashboard_address=None, resources={"GPU": 1, "MEMORY_GB": 3})


def measured_by(sweep, client):
    """(kernel, problem) -> the Dask worker address whose GPU process measured it (its parent pid in the uuid)."""
    address_of = {pid: address for address, pid in client.run(os.getpid).items()}
    rows = sweep.db.query("select r.kernel, r.problem, r.status, d.uuid from runs r join devices d on d.id = r.device")
    assert all(r["status"] == "ok" for r in rows), rows
    return {(r["kernel"], r["problem"]): address_of.get(int(r["uuid"].rsplit("-", 1)[1])) for r in rows}


@pytest.mark.slow
def test_benchmark_tasks_run_on_the_worker_that_compiled_their_kernels(tmp_path, worker_cache, monkeypatch):
    monkeypatch.setenv("FAKE_WORKER_UUID_PARENT", "1")
    monkeypatch.setenv("FAKE_WORKER_DELAY", "0.05")
    ops = OPS[:4]
    sweep = Sweep(ops, PROBLEMS, db=tmp_path / "r.db", name="placed", session=session(tmp_path / "client.db"))
    cluster = gpu_cluster(2, **{"distributed.scheduler.work-stealing": False})
    with distributed.Client(cluster) as client, DaskExecutor(client, worker_cache_path=worker_cache) as executor:
        compiled = executor.compile(sweep, progress=False)
        assert compiled.statuses == {"ok": 4}, str(compiled)
        compiled_on = dict(executor.holders)
        assert sorted(compiled_on) == sorted(op.name for op in ops)
        summary = executor.benchmark(sweep, timeout=20, worker_main=fake_worker_main, progress=False)
        assert summary.done == summary.submitted == len(ops) * len(PROBLEMS), str(summary)
        # every task ran where its kernel was compiled, and no binary travelled
        assert summary.tasks >= len(ops)  # one kernel per task, the problems split so each GPU gets several
        assert (summary.placed, summary.binaries_sent, summary.resent) == (summary.tasks, 0, 0), str(summary)
        where = measured_by(sweep, client)
        assert len(where) == len(ops) * len(PROBLEMS)
        for (kernel, _), address in where.items():
            assert address == compiled_on[kernel], (kernel, address, compiled_on)
        # the breakdown names each (worker, GPU) and adds up from the client's side
        labels = {w.label.rsplit("/", 1)[0] for w in summary.breakdown.workers}
        assert labels == set(compiled_on.values())
        for line in summary.breakdown.workers:
            assert line.requests + line.idle == pytest.approx(line.wall, abs=1e-6)
            assert line.phases["timing"] >= 0.05 * line.tasks and line.startup > 0
        assert sum(w.tasks for w in summary.breakdown.workers) == summary.done
        # a second run in the same cluster reuses each GPU's process: no start-up at all
        again = executor.benchmark(Sweep(ops, PROBLEMS, db=tmp_path / "r.db", name="placed again",
                                         session=session(tmp_path / "client.db")),
                                   timeout=20, worker_main=fake_worker_main, progress=False)
        assert again.done == len(ops) * len(PROBLEMS) and again.binaries_sent == 0
        assert all(w.startup == 0 for w in again.breakdown.workers), str(again.breakdown)
    cluster.close()


@pytest.mark.slow
def test_kernels_compiled_elsewhere_are_sent_once_each(tmp_path, worker_cache, monkeypatch):
    """Kernels the client compiled itself: each goes to one worker with its first task, and its other tasks follow
    it there without a binary."""
    monkeypatch.setenv("FAKE_WORKER_UUID_PARENT", "1")
    ops = OPS[:4]
    sweep = Sweep(ops, PROBLEMS, db=tmp_path / "r.db", name="sent", session=session(worker_cache))
    sweep.compile(jobs=1, progress=False)  # all from the cache: nothing compiles on the workers
    cluster = gpu_cluster(2, **{"distributed.scheduler.work-stealing": False})
    with distributed.Client(cluster) as client, DaskExecutor(client) as executor:
        summary = executor.benchmark(sweep, timeout=20, problems_per_task=1, worker_main=fake_worker_main,
                                     progress=False)
        assert summary.done == len(ops) * len(PROBLEMS) and summary.tasks == len(ops) * len(PROBLEMS)
        assert (summary.binaries_sent, summary.resent) == (len(ops), 0), str(summary)
        assert summary.placed == summary.tasks - len(ops)
        where = measured_by(sweep, client)
        for op in ops:  # every pair of a kernel on the worker its binary went to
            assert len({where[(op.name, p.key)] for p in PROBLEMS}) == 1
        assert len(set(where.values())) == 2  # spread over both workers
    cluster.close()


@pytest.mark.slow
def test_an_idle_worker_takes_tasks_with_their_binaries(tmp_path, worker_cache, monkeypatch):
    """Every kernel compiled on one worker; a second joins: it steals tasks, which are sent again with their
    binaries (once per task), and every pair is measured once."""
    monkeypatch.setenv("FAKE_WORKER_UUID_PARENT", "1")
    monkeypatch.setenv("FAKE_WORKER_DELAY", "0.3")
    ops = OPS[:4]
    sweep = Sweep(ops, PROBLEMS, db=tmp_path / "r.db", name="stolen", session=session(tmp_path / "client.db"))
    cluster = gpu_cluster(1)
    with distributed.Client(cluster) as client, DaskExecutor(client, worker_cache_path=worker_cache) as executor:
        compiled = executor.compile(sweep, progress=False)
        assert len(set(executor.holders.values())) == 1
        # (a failure below with fewer pairs than kernels x problems: was a kernel left out of the benchmark?)
        assert len(sweep.ready_operations()) == len(ops), (str(compiled), [op.name for op in sweep.ready_operations()])
        cluster.scale(2)
        client.wait_for_workers(2)
        summary = executor.benchmark(sweep, timeout=20, worker_main=fake_worker_main, progress=False)
        assert summary.done == summary.submitted == len(ops) * len(PROBLEMS), str(summary)
        where = measured_by(sweep, client)
        assert len(set(where.values())) == 2, where  # both GPUs measured
        assert summary.resent >= 1 and summary.binaries_sent == summary.resent, str(summary)
        # the rest ran where an earlier task had already brought their kernel
        assert summary.placed + summary.resent <= summary.tasks and summary.placed >= 1
    cluster.close()


@pytest.mark.slow
def test_a_killed_gpu_worker_loses_no_pair_and_repeats_only_its_running_task(tmp_path, worker_cache, monkeypatch):
    log = tmp_path / "measured.log"
    monkeypatch.setenv("FAKE_WORKER_LOG", str(log))
    monkeypatch.setenv("FAKE_WORKER_DELAY", "0.3")
    ops = OPS[:4]
    sweep = Sweep(ops, PROBLEMS, db=tmp_path / "r.db", name="killed", session=session(tmp_path / "client.db"))
    cluster = gpu_cluster(2)
    with distributed.Client(cluster) as client, DaskExecutor(client, worker_cache_path=worker_cache) as executor:
        executor.compile(sweep, progress=False)
        pids = client.run(os.getpid)
        killed = []

        def kill_one_when_busy():
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline and not killed:
                busy = [a for a, tasks in client.processing().items()
                        if any("benchmark_task" in str(t) for t in tasks)]
                if busy and log.exists():
                    time.sleep(0.4)  # into its task
                    os.kill(pids[busy[0]], signal.SIGKILL)
                    killed.append(busy[0])
                time.sleep(0.05)

        killer = threading.Thread(target=kill_one_when_busy, daemon=True)
        killer.start()
        summary = executor.benchmark(sweep, timeout=20, worker_main=fake_worker_main, progress=False)
        killer.join()
    cluster.close()
    assert killed, "the test must have killed a worker"
    pairs = len(ops) * len(PROBLEMS)
    rows = sweep.db.query("select kernel, problem, status from runs")
    assert len(rows) == len({(r["kernel"], r["problem"]) for r in rows}) == pairs == summary.done
    assert all(r["status"] == "ok" for r in rows)
    measured = log.read_text().splitlines()
    repeats = len(measured) - len(set(measured))
    # only the killed worker's running task (one kernel on every problem) is measured again, once
    assert len(set(measured)) == pairs and repeats <= len(PROBLEMS), measured
    assert summary.resent >= 1, str(summary)  # its other kernels went elsewhere, with their binaries
