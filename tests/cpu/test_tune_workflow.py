"""Sweeps without a GPU: real compiles into a results DB with a compile memo, the tuning cache and Tuned dispatch
(timed by a deterministic stand-in for the GPU), merges and exports."""
from __future__ import annotations

import contextlib

import json
import math
import sqlite3
import threading

import pytest

import pycutlass as cutlass
from pycutlass.errors import ArgumentError
from pycutlass.tune.autotune import Tuned, autotune, bucket_of, next_pow2, tuning_key
from pycutlass.tune.db import ResultsDB, run_id
from pycutlass.tune.problems import GemmProblem
from pycutlass.tune.sweep import Sweep, error_class
from tests.tune_helpers import NamedOp, broken_gemm, f16_gemm as gemm

FACTS = {"device": "test GPU", "cc": 90, "driver": 13000, "toolkit": "13.0"}


# --- the results DB ---------------------------------------------------------------------------------------------
def test_db_schema_rows_and_idempotent_merge(tmp_path):
    first = ResultsDB(tmp_path / "a.db")
    device = first.add_device({"name": "GPU A", "uuid": "GPU-1", "driver": "580"})
    first.add_kernel(NamedOp("k1"), {"kind": "gemm", "threadblock_shape": [128, 128, 32], "stages": 3})
    first.add_problem(GemmProblem(256, 512, 128))
    first.record_run(sweep="s", device=device, kernel="k1", problem=GemmProblem(256, 512, 128).key, harness="h",
                     status="ok", seconds=2e-5, flops=GemmProblem(256, 512, 128).flops)
    row = first.query("select * from kernels")[0]
    assert row["threadblock_shape"] == "128x128x32" and row["stages"] == 3  # parameters are SQL columns
    run = first.query("select * from runs")[0]
    assert math.isclose(run["tflops"], 2 * 256 * 512 * 128 / 2e-5 / 1e12)

    second = ResultsDB(tmp_path / "b.db")
    second.add_kernel(NamedOp("k2"), {"kind": "gemm"})
    assert second.merge(tmp_path / "a.db") == {"devices": 1, "kernels": 1, "problems": 1, "compile_status": 0,
                                               "runs": 1, "resources": 0, "tuning": 0, "sweeps": 0}
    assert sum(second.merge(tmp_path / "a.db").values()) == 0  # merging again adds nothing
    assert second.counts()["kernels"] == 2
    assert second.results() == [("k1", GemmProblem(256, 512, 128).key, 2e-5)]

    csv_path = second.export("runs", tmp_path / "runs.csv")
    assert "k1" in csv_path.read_text()
    assert json.loads(second.export("kernels", tmp_path / "kernels.json").read_text())[0]["name"] in ("k1", "k2")
    with pytest.raises(ArgumentError, match="unknown table"):
        second.export("nope", tmp_path / "x.csv")
    with pytest.raises(ArgumentError, match="status"):
        second.record_run(sweep="s", device=device, kernel="k1", problem="p", harness="h", status="fast")


def test_db_refuses_foreign_files_and_read_only_writes(tmp_path):
    other = tmp_path / "other.db"
    conn = sqlite3.connect(other)
    conn.execute("create table stuff (x)")
    conn.commit()
    conn.close()
    with pytest.raises(ArgumentError, match="not a pycutlass results database"):
        ResultsDB(other)
    ResultsDB(tmp_path / "r.db").close()
    with ResultsDB(tmp_path / "r.db", read_only=True) as db:
        with pytest.raises(ArgumentError, match="read-only"):
            db.add_kernel(NamedOp("k"), {})
    with pytest.raises(ArgumentError, match="no results database"):
        ResultsDB(tmp_path / "missing.db", read_only=True)


def test_concurrent_writers_lose_no_rows(tmp_path):
    path = tmp_path / "shared.db"
    ResultsDB(path).close()

    def write(worker):
        db = ResultsDB(path)
        for i in range(40):
            db.record_run(sweep="s", device="d", kernel=f"k{worker}", problem=f"p{i}", harness="h", status="ok",
                          seconds=1e-3)
        db.close()

    threads = [threading.Thread(target=write, args=(w,)) for w in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    with ResultsDB(path, read_only=True) as db:
        assert db.counts()["runs"] == 160


def test_run_ids_are_deterministic():
    assert run_id("s", "d", "k", "p", "h") == run_id("s", "d", "k", "p", "h") != run_id("s", "d", "k", "p", "h2")


# --- compile stage: real NVRTC compiles, the memo ---------------------------------------------------------------
@pytest.fixture(scope="module")
def compile_session(tmp_path_factory):
    folder = tmp_path_factory.mktemp("tune-compile")
    return cutlass.Session(target=90, backend="nvrtc", cache_path=str(folder / "cache.db")), folder


@pytest.mark.slow
def test_sweep_compile_memo_skips_known_good_and_known_bad(compile_session):
    session, folder = compile_session
    good = [gemm((128, 128, 32), 3, (2, 2, 1)), gemm((64, 64, 32), 3, (2, 2, 1))]
    broken = broken_gemm()
    operations = [good[0], broken, good[1]]
    sweep = Sweep(operations, [GemmProblem(256, 256, 64)], db=folder / "results.db", name="memo", session=session)
    first = sweep.compile(jobs=2, progress=False)
    assert (first.compiled, first.known_bad, sum(first.failed.values())) == (2, 0, 1), str(first)
    [(cls, _)] = first.failed.items()
    assert cls.startswith("CompilationError") and "#" in cls or "error" in cls.lower()
    rows = {r["kernel"]: r for r in sweep.db.query("select * from compile_status")}
    assert rows[broken.name]["status"] == "failed" and "deliberately broken" in rows[broken.name]["log"]
    assert {rows[op.name]["status"] for op in good} == {"ok"}
    assert [op.name for op in sweep.ready_operations()] == [good[0].name, good[1].name]

    # A re-run compiles nothing: the good ones come from the cache, the broken one is not tried again.
    again = Sweep(operations, db=folder / "results.db", name="memo",
                  session=cutlass.Session(target=90, backend="nvrtc", cache_path=session.options["cache_path"]))
    second = again.compile(jobs=2, progress=False)
    assert (second.compiled, second.from_cache, second.known_bad) == (0, 2, 1), str(second)


def test_error_class_groups_like_failures():
    one = cutlass.CompilationError("unit failed", log='x.cu(12): error: identifier "foo" is undefined')
    two = cutlass.CompilationError("unit failed", log='y.cu(99): error: identifier "bar" is undefined')
    assert error_class(one) == error_class(two)
    assert error_class(one).startswith("CompilationError")


def test_sweep_rejects_empty_and_foreign_inputs(tmp_path):
    with pytest.raises(ArgumentError, match="no valid operation"):
        Sweep([], db=tmp_path / "r.db")
    with pytest.raises(ArgumentError, match="problems"):
        Sweep([gemm()], [(1, 2, 3)], db=tmp_path / "r.db")


def test_benchmark_without_gpu_says_so(tmp_path, monkeypatch):
    from pycutlass.tune import runner

    monkeypatch.setattr(runner, "visible_gpus", lambda: [])
    sweep = Sweep([gemm()], [GemmProblem(128, 128, 128)], db=tmp_path / "r.db")
    with pytest.raises(cutlass.NoGpuError, match="needs a GPU"):
        sweep.benchmark()


# --- autotune and Tuned, with a stand-in for the GPU ------------------------------------------------------------
CANDIDATES = [gemm((128, 128, 32), 3, (2, 2, 1)), gemm((64, 64, 32), 3, (2, 2, 1)), gemm((128, 64, 32), 4, (2, 2, 1))]


def model_seconds(operation, problem):
    """A deterministic cost model: tiles that waste less of the problem win; stands in for GPU timings."""
    tm, tn, _ = operation.tile_description.threadblock_shape
    tiles = math.ceil(problem.m / tm) * math.ceil(problem.n / tn)
    waves = math.ceil(tiles / 132)
    return 1e-6 * (5 + waves * tm * tn * problem.k / 4e5)


class CountingMeasure:
    def __init__(self):
        self.calls = 0
        self.lock = threading.Lock()

    def __call__(self, operation, problem):
        with self.lock:
            self.calls += 1
        return model_seconds(operation, problem)


def exhaustive_best(problem):
    return min(CANDIDATES, key=lambda op: model_seconds(op, problem))


def test_autotune_picks_the_best_and_caches_it(tmp_path):
    measure = CountingMeasure()
    problem = GemmProblem(4096, 4096, 4096)
    result = autotune(CANDIDATES, problem, db=tmp_path / "t.db", measure=measure, device_facts=FACTS)
    assert result.operation == exhaustive_best(problem) and not result.from_cache
    assert measure.calls == len(CANDIDATES) and result.candidates == 3
    again = autotune(CANDIDATES, problem, db=tmp_path / "t.db", measure=measure, device_facts=FACTS)
    assert again.from_cache and again.operation == result.operation and measure.calls == 3
    # Another device is another key.
    other = autotune(CANDIDATES, problem, db=tmp_path / "t.db", measure=measure,
                     device_facts={**FACTS, "device": "other GPU"})
    assert not other.from_cache and measure.calls == 6
    row = ResultsDB(tmp_path / "t.db").query("select * from tuning")[0]
    assert json.loads(row["key"])["bucket"] == [4096, 4096, 4096, 1]


def test_key_policies():
    p = GemmProblem(100, 3000, 4096)
    assert bucket_of(p, "exact") == (100, 3000, 4096, 1)
    assert bucket_of(p, "pow2") == (128, 4096, 4096, 1)
    assert bucket_of(p, lambda q: ("small" if q.m <= 128 else "large", q.n)) == ("small", 3000)
    assert [next_pow2(v) for v in (0, 1, 2, 3, 1025)] == [1, 1, 2, 4, 2048]
    with pytest.raises(ArgumentError, match="key policy"):
        bucket_of(p, "log10")
    with pytest.raises(ArgumentError, match="JSON"):
        bucket_of(p, lambda q: object())
    sig = {"kind": "GemmOperationUniversal"}
    assert tuning_key(FACTS, sig, (1, 2), "pow2") != tuning_key(FACTS, sig, (1, 2), "exact")


def test_autotune_rejects_mixed_candidates(tmp_path):
    bf16 = cutlass.MathInstruction([16, 8, 16], cutlass.bfloat16, cutlass.bfloat16, cutlass.float32,
                                   cutlass.OpClass.TensorOp, cutlass.MathOperation.multiply_add)
    t = cutlass.TensorDescription(cutlass.bfloat16, cutlass.RowMajor, 8)
    other = cutlass.GemmOperationUniversal(80, cutlass.TileDescription([128, 128, 32], 3, [2, 2, 1], bf16), t, t, t,
                                           cutlass.LinearCombination(cutlass.bfloat16, 8, cutlass.float32,
                                                                     cutlass.float32))
    with pytest.raises(ArgumentError, match="share types") as raised:
        autotune([CANDIDATES[0], other], GemmProblem(64, 64, 64), db=tmp_path / "t.db", measure=model_seconds,
                 device_facts=FACTS)
    # a typed error naming both operation classes
    from pycutlass.tune.select import MixedClassesError

    assert isinstance(raised.value, MixedClassesError) and len(raised.value.classes) == 2
    assert any("A=bf16/row/8" in c for c in raised.value.classes) and "A=f16/row/8" in str(raised.value)
    with pytest.raises(MixedClassesError):
        Tuned([other, CANDIDATES[1]], db=tmp_path / "t.db", measure=model_seconds, device_facts=FACTS)
    result = autotune(CANDIDATES, GemmProblem(64, 64, 64), db=tmp_path / "t.db", measure=model_seconds,
                      device_facts=FACTS)
    assert result.op_class == Tuned(CANDIDATES, db=tmp_path / "t.db", measure=model_seconds,
                                    device_facts=FACTS).op_class
    assert result.op_class.startswith("gemm A=f16/row/8 B=f16/col/8 C=f16/row/8 D=f16/row/8 acc=f32")


def test_tuned_dispatch_pow2_buckets_are_thread_safe(tmp_path):
    measure = CountingMeasure()
    tuned = Tuned(CANDIDATES, db=tmp_path / "t.db", policy="pow2", measure=measure, device_facts=FACTS)
    shapes = [(100, 4000, 4096), (120, 4096, 4000), (128, 3000, 4096)]  # one pow2 bucket
    chosen = []

    def call(shape):
        chosen.append(tuned.select(*shape))

    threads = [threading.Thread(target=call, args=(shapes[i % 3],)) for i in range(12)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len({op.name for op in chosen}) == 1
    assert measure.calls == len(CANDIDATES)  # tuned once for the whole bucket, despite 12 racing callers
    assert tuned.select(4096, 4096, 4096) == exhaustive_best(GemmProblem(4096, 4096, 4096))


def test_tuned_without_tuning_falls_back_to_the_nearest_bucket(tmp_path):
    db = tmp_path / "t.db"
    for shape in [(16, 4096, 4096), (4096, 4096, 4096)]:
        autotune(CANDIDATES, GemmProblem(*shape), db=db, policy="pow2", measure=model_seconds, device_facts=FACTS)
    offline = Tuned(CANDIDATES, db=db, policy="pow2", tune=False, device_facts=FACTS)
    assert offline.select(3000, 4096, 4096) == exhaustive_best(GemmProblem(4096, 4096, 4096))
    assert offline.select(24, 4096, 4096) == exhaustive_best(GemmProblem(16, 4096, 4096))
    stranger = Tuned(CANDIDATES, db=db, policy="pow2", tune=False, device_facts={**FACTS, "device": "other"})
    with pytest.raises(ArgumentError, match="tuning is off"):
        stranger.select(64, 64, 64)


def test_tuned_call_checks_shapes(tmp_path):
    import numpy as np

    tuned = Tuned(CANDIDATES, db=tmp_path / "t.db", measure=model_seconds, device_facts=FACTS)
    with pytest.raises(ArgumentError, match="do not form"):
        tuned(np.zeros((64, 32), np.float16), np.zeros((16, 64), np.float16), np.zeros((64, 64), np.float16))



def test_tuning_into_a_directory_is_a_typed_error(tmp_path):
    from pycutlass.errors import ResultsDatabaseError

    with pytest.raises(ResultsDatabaseError, match="is a directory"):
        Tuned(CANDIDATES, db=tmp_path, measure=model_seconds, device_facts=FACTS)
    with pytest.raises(ResultsDatabaseError, match="is a directory"):
        autotune(CANDIDATES, GemmProblem(64, 64, 64), db=str(tmp_path), measure=model_seconds, device_facts=FACTS)
    assert list(tmp_path.iterdir()) == []


def test_autotune_without_a_gpu_creates_no_database(tmp_path):
    from pycutlass.compiler.target import detected_compute_capability
    from pycutlass.errors import NoGpuError

    if detected_compute_capability() is not None:
        pytest.skip("this machine has a GPU")
    with pytest.raises(NoGpuError):
        autotune(CANDIDATES, GemmProblem(64, 64, 64), db=tmp_path / "t.db", measure=model_seconds)
    assert not (tmp_path / "t.db").exists()


def test_sweep_takes_a_preset_name_and_creates_the_db_only_when_valid(tmp_path):
    from pycutlass.tune.space import SearchSpace

    by_name = Sweep("sm80-f16-small", [GemmProblem(64, 64, 64)], db=tmp_path / "a.db")
    preset = SearchSpace.preset("sm80-f16-small")
    assert by_name.space == preset and [op.name for op in by_name.operations] == [
        op.name for op in preset.build().operations]
    assert by_name.db.counts()["kernels"] == len(by_name.operations) > 0
    with pytest.raises(ArgumentError, match="sm80-f16-small"):  # the error names the presets
        Sweep("sm80-f16-tiny", db=tmp_path / "b.db")
    with pytest.raises(ArgumentError, match="not an operation"):
        Sweep([CANDIDATES[0], "gemm"], db=tmp_path / "c.db")
    with pytest.raises(ArgumentError, match="problems must be"):
        Sweep(CANDIDATES, ["square:64"], db=tmp_path / "d.db")
    assert sorted(p.name for p in tmp_path.iterdir() if not p.name.startswith("a.db")) == []
    with pytest.raises(ArgumentError, match="jobs must be a positive integer"):
        Sweep(CANDIDATES, db=tmp_path / "a.db").compile(jobs=0)


# --- the runner's robustness, with a stand-in worker (no GPU) ---------------------------------------------------
def test_runner_survives_faults_and_hangs_and_resumes(tmp_path, monkeypatch):
    from pycutlass.tune.runner import run_sweep
    from tests.tune_helpers import fake_worker_main

    ops = [gemm((128, 128, 32)), gemm((64, 64, 32)), gemm((128, 64, 32), 4), gemm((64, 128, 32))]
    monkeypatch.setenv("FAKE_WORKER_MARKERS", "fault:64x64 hang:128x64")
    problems = [GemmProblem(256, 512, 128), GemmProblem(1024, 1024, 1024)]
    sweep = Sweep(ops, problems, db=tmp_path / "r.db", name="robust")
    summary = run_sweep(sweep, devices=[0, 1], timeout=3, operations=ops, worker_main=fake_worker_main,
                        progress=False)
    status = {(r["kernel"], r["problem"]): r for r in sweep.db.query("select * from runs")}
    for p in problems:
        assert status[(ops[1].name, p.key)]["status"] == "failed"
        assert "died" in status[(ops[1].name, p.key)]["message"]
        assert status[(ops[2].name, p.key)]["status"] == "timeout"
        for op in (ops[0], ops[3]):
            assert status[(op.name, p.key)]["status"] == "ok" and status[(op.name, p.key)]["seconds"] > 0
        assert status[("torch.matmul[float16->float16]", p.key)]["status"] == "ok"
    assert summary.done == len(status) == 10 and summary.restarts >= 4, str(summary)
    assert {r["uuid"] for r in sweep.db.query("select uuid from devices")} == {"GPU-fake-0", "GPU-fake-1"}
    assert len(sweep.db.query("select * from resources")) >= 2
    # A re-run measures nothing again, on the devices that measured it.
    again = run_sweep(Sweep(ops, problems, db=tmp_path / "r.db", name="robust"), devices=[0, 1], timeout=3,
                      operations=ops, worker_main=fake_worker_main, progress=False)
    assert again.done == 0 and again.skipped == 10


def test_runner_gives_each_gpu_model_every_pair(tmp_path, monkeypatch):
    """Two GPUs of different models each measure every pair (rankings never mix); GPUs of one model share them."""
    from pycutlass.tune.runner import run_sweep
    from tests.tune_helpers import fake_worker_main

    monkeypatch.setenv("FAKE_WORKER_MODELS", "0:H100,1:H200,2:H200")
    ops = [gemm((128, 128, 32)), gemm((64, 64, 32))]
    problems = [GemmProblem(256, 512, 128), GemmProblem(1024, 1024, 1024), GemmProblem(64, 64, 64)]
    sweep = Sweep(ops, problems, db=tmp_path / "r.db", name="mixed")
    summary = run_sweep(sweep, devices=[0, 1, 2], timeout=5, operations=ops, worker_main=fake_worker_main,
                        progress=False, baseline=False)
    rows = sweep.db.query("select r.kernel, r.problem, d.name from runs r join devices d on d.id = r.device")
    by_model = {}
    for row in rows:
        by_model.setdefault(row["name"], []).append((row["kernel"], row["problem"]))
    pairs = {(op.name, p.key) for op in ops for p in problems}
    for model in ("fake H100", "fake H200"):
        assert sorted(by_model[model]) == sorted(pairs), model  # every pair once per model
    assert summary.done == 2 * len(pairs)


def test_bench_config_and_statistics():
    from pycutlass.tune.bench import BenchConfig, summarize

    assert summarize([3.0, 1.0, 2.0, 4.0, 5.0]) == (3.0, 1.0, 3.0)  # quartiles 1.5 and 4.5 (exclusive method)
    assert summarize([2.0]) == (2.0, 2.0, 0.0)
    config = BenchConfig(repetitions=60, cuda_graph=4)
    assert BenchConfig.from_json(config.fingerprint) == config
    assert BenchConfig().fingerprint != config.fingerprint  # different harnesses never share run rows
    for bad in ({"repetitions": 0}, {"arg_pool": 0}, {"warmup": -1}, {"cuda_graph": True}, {"max_seconds": 0},
                {"lead_us": -1}, {"lead_us": True}, {"lead_us": 1e9}):
        with pytest.raises(ArgumentError):
            BenchConfig(**bad)
    # a device-sleep lead is part of the harness; without one the fingerprint is what it was before the field
    led = BenchConfig(lead_us=200)
    assert BenchConfig.from_json(led.fingerprint) == led and led.fingerprint != BenchConfig().fingerprint
    assert "lead_us" not in BenchConfig(lead_us=0).fingerprint
    with pytest.raises(ArgumentError, match="timer"):
        BenchConfig(timer="wallclock")


def test_default_harness_leads_every_launch_and_never_shares_rows_with_lead_less_ones():
    """The default harness times kernels on the GPU at every size: a device-side lead longer than the host's launch
    path (torch.matmul's measured about 24 us on an H200) is on by default, for the torch baseline too (same
    BenchConfig), and it is in the fingerprint, so rows timed without a lead (the old default) are not reused."""
    from pycutlass.tune.bench import DEFAULT_LEAD_US, BenchConfig

    assert BenchConfig().lead_us == DEFAULT_LEAD_US and 30 <= DEFAULT_LEAD_US <= 100
    lead_less = ('{"arg_pool":1,"cuda_graph":0,"flush_l2":true,"max_seconds":2.0,"repetitions":50,"seed":0,'
                 '"verify":true,"warmup":5}')  # what every default-harness row before the lead was keyed by
    assert BenchConfig(lead_us=0, timer="events", settle_ms=0).fingerprint == lead_less
    assert BenchConfig.from_json(lead_less) == BenchConfig(lead_us=0, timer="events", settle_ms=0)
    assert BenchConfig().fingerprint != lead_less and json.loads(BenchConfig().fingerprint)["lead_us"] == 50
    assert run_id("s", "d", "k", "p", BenchConfig().fingerprint) != run_id("s", "d", "k", "p", lead_less)
    assert BenchConfig.from_json(BenchConfig().fingerprint) == BenchConfig()


class _FakeTorch:
    """Stands in for torch (no GPU): records what the harness enqueues on the stream, in order."""

    def __init__(self):
        log = self.log = []

        class Event:
            def __init__(self, enable_timing=False):
                pass

            def record(self):
                log.append("event")

            def synchronize(self):
                pass

            def elapsed_time(self, other):
                return 0.01

        class CUDAGraph:
            def replay(self):
                log.append("replay")

        class Cuda:
            pass

        cuda = self.cuda = Cuda()
        cuda.Event, cuda.CUDAGraph = Event, CUDAGraph
        cuda._sleep = lambda cycles: log.append(("sleep", cycles))
        cuda.synchronize = lambda device=None: None
        cuda.graph = lambda graph, stream=None: _Capture(log)


class _Capture:
    def __init__(self, log):
        self.log = log

    def __enter__(self):
        self.log.append("capture")

    def __exit__(self, *exc):
        self.log.append("captured")


class _TaggingTimer:
    """A kernel timer that logs where its tags open and close (CUPTI's external correlation ids)."""

    def __init__(self, log):
        self.log = log

    @contextlib.contextmanager
    def _tag(self, what):
        self.log.append(f"{what}[")
        yield
        self.log.append(f"]{what}")

    def lead(self, index):
        return self._tag("lead")

    def sample(self, index):
        return self._tag("sample")

    def spans(self, expected, from_lead=False):
        return {i: 1e-6 for i in range(expected)}

    def lead_spans(self, expected):
        return {}


def _timed_stream(config, cycles_per_us=1500.0):
    """What GemmBench.time enqueues for 3 timed samples, after the warm-up (and capture)."""
    from pycutlass.tune.bench import GemmBench

    fake = _FakeTorch()
    bench = object.__new__(GemmBench)
    bench.open_kernel_timer = lambda: contextlib.nullcontext(_TaggingTimer(fake.log))
    bench.torch, bench.config, bench.device = fake, config, None
    bench._flush = object()
    bench.flush_l2 = lambda: fake.log.append("flush")
    bench._sleep_cycles_per_us = cycles_per_us  # as measured on the device
    from pycutlass.tune.breakdown import PhaseClock

    bench.clock = PhaseClock()
    samples, _ = bench.time(lambda i: fake.log.append("launch"))
    assert len(samples) == 3
    first = fake.log.index("flush")
    # each timed sample starts with the L2 flush (with a CUPTI timer, the start event just before it)
    return fake.log[first - 1 if config.timer != "events" else first:]


def test_every_timed_launch_waits_behind_a_gpu_side_lead_by_default():
    from pycutlass.tune.bench import BenchConfig

    lead = ("sleep", int(50 * 1500.0))  # 50 us at the device's sleep rate
    events = {"timer": "events"}
    assert _timed_stream(BenchConfig(repetitions=3, warmup=2, **events)) == ["flush", lead, "event", "launch",
                                                                             "event"] * 3
    # graph replays get it too (their replay call would otherwise be timed)
    graph = _timed_stream(BenchConfig(repetitions=3, warmup=2, cuda_graph=4, **events))
    assert graph == ["flush", lead, "event", "replay", "event"] * 3, graph
    # lead_us=0: the launch directly after the flush, as harnesses timed before the lead
    assert _timed_stream(BenchConfig(repetitions=3, warmup=2, lead_us=0, **events)) == ["flush", "event", "launch",
                                                                                        "event"] * 3


def test_cupti_timers_tag_the_lead_and_leave_nothing_between_it_and_the_call():
    from pycutlass.tune.bench import BenchConfig

    lead = ("sleep", int(50 * 1500.0))
    for timer in ("launch", "kernel"):  # the launch timer starts where the tagged lead ends
        stream = _timed_stream(BenchConfig(repetitions=3, warmup=2, timer=timer))
        assert stream == ["event", "flush", "lead[", lead, "]lead", "sample[", "launch", "]sample", "event"] * 3, stream
    assert _timed_stream(BenchConfig(repetitions=3, warmup=2, lead_us=0)) == [
        "event", "flush", "sample[", "launch", "]sample", "event"] * 3


def test_grouped_problems_pair_with_grouped_operations_and_their_own_baseline():
    """A sweep's benchmark tasks: GEMM problems go to GEMM operations with the torch.matmul baseline, grouped problems
    to grouped operations with the grouped baseline; nothing crosses kinds."""
    import types

    from pycutlass.tune.problems import GroupedGemmProblem
    from pycutlass.tune.runner import _tasks, baseline_name, grouped_baseline_name

    plain = gemm()
    tile = plain.tile_description
    grouped = cutlass.GemmOperationGrouped(80, tile, plain.A, plain.B, plain.C, plain.epilogue_functor,
                                           cutlass.IdentitySwizzle1)
    problems = [GemmProblem(64, 128, 256), GroupedGemmProblem(((64, 128, 256), (32, 128, 256)))]
    added = []
    sweep = types.SimpleNamespace(problems=problems, db=types.SimpleNamespace(
        add_baseline=lambda name, description: added.append(name) or name))
    tasks = _tasks(sweep, [plain, grouped], baseline=True)
    by_problem = {}
    for name, problem, message in tasks:
        by_problem.setdefault(problem.kind, []).append((name, message[0]))
    assert by_problem["gemm"] == [(baseline_name("float16", "float16"), "baseline"), (plain.name, "kernel")]
    assert by_problem["grouped_gemm"] == [(grouped_baseline_name("float16", "float16"), "baseline"),
                                          (grouped.name, "kernel")]
    assert baseline_name("float16", "float16") != grouped_baseline_name("float16", "float16")


def test_masked_problems_pair_with_sm90_grouped_operations_only():
    """Masked (decode) problems go to the SM90 grouped operations that can take the layout (row-major A and C), with
    the grouped baseline over the same counts packed; the CUTLASS 2.x grouped kernel and column-major C stay out."""
    import types

    from pycutlass.tune.bench import packed_problem
    from pycutlass.tune.problems import MaskedGroupedProblem
    from pycutlass.tune.runner import _tasks, grouped_baseline_name

    plain = gemm()
    sm80 = cutlass.GemmOperationGrouped(80, plain.tile_description, plain.A, plain.B, plain.C, plain.epilogue_functor,
                                        cutlass.IdentitySwizzle1)
    math = cutlass.MathInstruction([64, 128, 16], cutlass.float16, cutlass.float16, cutlass.float32,
                                   cutlass.OpClass.TensorOp)
    tile = cutlass.TileDescription([128, 128, 64], 0, None, math)
    f16 = [cutlass.TensorDescription(cutlass.float16, layout, 8) for layout in
           (cutlass.RowMajor, cutlass.ColumnMajor, cutlass.RowMajor, cutlass.ColumnMajor)]
    epilogue = cutlass.LinearCombination(cutlass.float16, 8, cutlass.float32, cutlass.float32)
    sm90 = cutlass.GemmOperationGrouped(90, tile, f16[0], f16[1], f16[2], epilogue)
    sm90_cm = cutlass.GemmOperationGrouped(90, tile, f16[0], f16[1], f16[3], epilogue)
    masked = MaskedGroupedProblem(4, 128, 256, 64, (100, 0, 128, 7))
    sweep = types.SimpleNamespace(problems=[masked], db=types.SimpleNamespace(add_baseline=lambda name, _: name))
    tasks = _tasks(sweep, [plain, sm80, sm90, sm90_cm], baseline=True)
    assert [(name, message[0]) for name, _, message in tasks] == [
        (grouped_baseline_name("float16", "float16"), "baseline"), (sm90.name, "kernel")]
    assert packed_problem(masked).shapes == ((100, 256, 64), (128, 256, 64), (7, 256, 64))


def test_grouped_check_samples_rows_of_every_group_against_float64():
    torch = pytest.importorskip("torch")
    import types

    from pycutlass.tune.bench import sampled_grouped_error

    bench = types.SimpleNamespace(torch=torch, device=torch.device("cpu"))
    generator = torch.Generator().manual_seed(0)
    As = [torch.randn(m, 32, generator=generator).half() for m in (100, 7, 0)]
    Bs = [torch.randn(32, 16, generator=generator).half() for _ in As]
    exact = [(a.double() @ b.double()).half() for a, b in zip(As, Bs)]
    assert sampled_grouped_error(bench, As, Bs, exact) < 1e-3  # only fp16 rounding of the output
    wrong = [d.clone() for d in exact]
    wrong[1][3] += 1.0  # one row of the small group (all of its 7 rows are sampled)
    assert sampled_grouped_error(bench, As, Bs, wrong) > 1e-2
    assert sampled_grouped_error(bench, As, Bs, [torch.full_like(d, float("nan")) for d in exact]) == math.inf


def test_conv_problems_pair_with_conv_operations_and_torch_per_kind():
    import types

    from pycutlass.conv import IteratorAlgorithm, Operator, StrideSupport
    from pycutlass.tune.problems import Conv2dProblem
    from pycutlass.tune.runner import _tasks, conv_baseline_name

    def conv(kind):
        f16 = cutlass.float16
        math = cutlass.MathInstruction([16, 8, 16], f16, f16, cutlass.float32, cutlass.OpClass.TensorOp,
                                       cutlass.MathOperation.multiply_add)
        tile = cutlass.TileDescription([128, 128, 32], 3, [2, 2, 1], math)
        nhwc = cutlass.TensorDescription(f16, cutlass.LayoutType.TensorNHWC, 8)
        return cutlass.Conv2dOperation(kind, IteratorAlgorithm.analytic, 80, tile, nhwc, nhwc, nhwc,
                                       StrideSupport.Strided, cutlass.LinearCombination(f16, 8, cutlass.float32),
                                       cutlass.IdentitySwizzle1)

    fprop, wgrad, plain = conv(Operator.fprop), conv(Operator.wgrad), gemm()
    problems = [Conv2dProblem(2, 8, 8, 64, 64, 3, 3, pad=(1, 1)), GemmProblem(64, 64, 64)]
    sweep = types.SimpleNamespace(problems=problems, db=types.SimpleNamespace(add_baseline=lambda n, d: n))
    tasks = _tasks(sweep, [fprop, wgrad, plain], baseline=True)
    conv_tasks = [(name, message) for name, problem, message in tasks if problem.kind == "conv2d"]
    assert [name for name, _ in conv_tasks] == [conv_baseline_name("fprop", "float16", "float16"),
                                                conv_baseline_name("wgrad", "float16", "float16"),
                                                fprop.name, wgrad.name]
    assert conv_tasks[0][1][-1] == "fprop" and conv_tasks[1][1][-1] == "wgrad"
    assert plain.name in [name for name, problem, _ in tasks if problem.kind == "gemm"]


@pytest.mark.parametrize("pad,stride,dilation", [((1, 1), (1, 1), (1, 1)), ((0, 1), (2, 1), (1, 2))])
def test_conv_reference_calls_are_adjoint(pad, stride, dilation):
    """The harness's torch calls for the three kinds, on NHWC / KRSC operands: <fprop(x, w), dy> = <x, dgrad(dy, w)>
    = <w, wgrad(dy, x)> in float64, and each result has the implicit GEMM's output extent."""
    torch = pytest.importorskip("torch")
    from pycutlass.tune.bench import _conv_call
    from pycutlass.tune.problems import Conv2dProblem

    problem = Conv2dProblem(2, 9, 7, 3, 4, 3, 2, pad=pad, stride=stride, dilation=dilation)
    p, q = problem.output_size
    g = torch.Generator().manual_seed(1)
    x = torch.randn(2, 9, 7, 3, generator=g, dtype=torch.float64)
    w = torch.randn(4, 3, 2, 3, generator=g, dtype=torch.float64)
    dy = torch.randn(2, p, q, 4, generator=g, dtype=torch.float64)
    y = _conv_call(torch, problem, "fprop", x, w)
    dx = _conv_call(torch, problem, "dgrad", dy, w)
    dw = _conv_call(torch, problem, "wgrad", dy, x)
    assert y.shape == (2, p, q, 4) and dx.shape == x.shape and dw.shape == w.shape
    inner = (y * dy).sum().item()
    assert inner == pytest.approx((x * dx).sum().item(), rel=1e-10)
    assert inner == pytest.approx((w * dw).sum().item(), rel=1e-10)
