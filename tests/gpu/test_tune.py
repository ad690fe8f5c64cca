"""Sweeps and autotuning on a GPU: a real sweep, kernels that fault or hang, resume after Ctrl-C, autotune, Tuned."""
from __future__ import annotations

import math
import os
import signal
import subprocess
import sys
import time

import pytest

import pycutlass as cutlass
from pycutlass.tune.bench import BenchConfig
from pycutlass.tune.db import ResultsDB
from pycutlass.tune.problems import GemmProblem
from pycutlass.tune.space import SearchSpace
from pycutlass.tune.sweep import Sweep
from tests.tune_helpers import FaultingGemm, HangingGemm, f16_conv, f16_gemm as gemm

try:
    import torch
except ImportError:  # pragma: no cover
    torch = None
pytestmark = [pytest.mark.gpu, pytest.mark.skipif(torch is None, reason="needs torch")]

QUICK = BenchConfig(repetitions=10, max_seconds=0.5, warmup=2)
PROBLEMS = [GemmProblem(256, 512, 128), GemmProblem(1000, 3000, 520), GemmProblem(512, 1024, 1024, batch=2)]


def _tolerance_ok(row):
    return row["rel_error"] is not None and row["rel_error"] < 5e-3


def test_small_real_sweep_records_verified_timings_baselines_and_resources(tmp_path):
    space = SearchSpace.preset("sm80-f16-small")
    sweep = Sweep(space, PROBLEMS, db=tmp_path / "r.db", name="small")
    compiled = sweep.compile()
    assert compiled.ready == compiled.valid and not compiled.failed, str(compiled)
    summary = sweep.benchmark(config=QUICK, timeout=120)
    kernels = len(sweep.ready_operations())
    assert summary.statuses == {"ok": kernels * len(PROBLEMS) + len(PROBLEMS)}, str(summary)
    db = sweep.db
    rows = db.query("select r.*, k.kind from runs r join kernels k on k.name = r.kernel")
    for row in rows:
        assert row["seconds"] > 0 and row["seconds_min"] <= row["seconds"] and row["repetitions"] >= 10
        if row["kind"] != "baseline":
            assert _tolerance_ok(row), row
    assert len(db.query("select * from resources")) == kernels
    assert all(r["registers"] and r["threads"] for r in db.query("select * from resources"))
    device = db.query("select * from devices")[0]
    assert device["name"] and device["compute_capability"] >= 80 and device["cutlass"]
    from pycutlass.tune.select import select_kernels

    chosen = select_kernels(db.results(), 0.95)
    assert set(chosen.assignment) == {p.key for p in PROBLEMS}
    # Re-running measures nothing new.
    again = Sweep(space, PROBLEMS, db=tmp_path / "r.db", name="small").benchmark(config=QUICK)
    assert again.done == 0 and again.skipped == summary.done


def _grouped_ops():
    """A GEMM and the grouped operations of its tile (both scheduler modes)."""
    plain = gemm((128, 128, 32))
    tile = plain.tile_description
    return [plain] + [cutlass.GemmOperationGrouped(80, tile, plain.A, plain.B, plain.C, plain.epilogue_functor,
                                                   cutlass.IdentitySwizzle1, mode)
                      for mode in (cutlass.SchedulerMode.Host, cutlass.SchedulerMode.Device)]


GROUPED_OPS = _grouped_ops()


def test_sweep_times_grouped_problems_against_the_torch_grouped_baseline(tmp_path):
    """Grouped problems are verified (float64 on sampled rows of every group) and timed like GEMMs, each beside the
    torch grouped baseline; a GEMM problem in the same sweep keeps its own kernels and baseline."""
    from pycutlass.tune.problems import grouped_problems
    from pycutlass.tune.runner import baseline_name, grouped_baseline_name

    plain, grouped = GROUPED_OPS[0], GROUPED_OPS[1:]
    problems = list(grouped_problems(6, (16, 300), 256, 128, seed=3, sets=2)) + [PROBLEMS[0]]
    sweep = Sweep([plain, *grouped], problems, db=tmp_path / "r.db", name="grouped")
    compiled = sweep.compile()
    assert not compiled.failed, str(compiled)
    summary = sweep.benchmark(config=QUICK, timeout=120)
    # 2 grouped problems x (2 kernels + baseline) + 1 GEMM problem x (1 kernel + baseline)
    assert summary.statuses == {"ok": 2 * 3 + 2}, str(summary)
    rows = sweep.db.query("select r.kernel, r.problem, r.seconds, r.rel_error from runs r")
    grouped_rows = [r for r in rows if r["problem"].startswith("grouped_gemm")]
    assert {r["kernel"] for r in grouped_rows} == {op.name for op in grouped} | {grouped_baseline_name("float16",
                                                                                                     "float16")}
    assert {r["kernel"] for r in rows if not r["problem"].startswith("grouped_gemm")} == {
        plain.name, baseline_name("float16", "float16")}
    for row in grouped_rows:
        assert row["seconds"] > 0
        if not row["kernel"].startswith("torch"):
            assert row["rel_error"] is not None and row["rel_error"] < 5e-3, row


def test_sweep_times_masked_problems_against_the_packed_baseline(tmp_path):
    """Masked (decode) problems run the SM90 grouped kernel with the counts on the device, verified on sampled rows of
    every expert (and no row past a count written), beside torch's grouped GEMM over the same counts packed."""
    from pycutlass.tune.problems import MaskedGroupedProblem
    from pycutlass.tune.runner import grouped_baseline_name

    from .test_gemm_grouped_sm90 import OPS as SM90_GROUPED

    op = SM90_GROUPED["f16_tnt_coop"]
    problems = [MaskedGroupedProblem(6, 256, 256, 128, (200, 0, 256, 17, 64, 1)),
                MaskedGroupedProblem(2, 128, 384, 64, (128, 5))]
    sweep = Sweep([op], problems, db=tmp_path / "r.db", name="masked")
    compiled = sweep.compile()
    assert not compiled.failed, str(compiled)
    summary = sweep.benchmark(config=QUICK, timeout=120)
    assert summary.statuses == {"ok": 2 * 2}, str(summary)  # per problem: the kernel and the baseline
    rows = sweep.db.query("select kernel, seconds, rel_error from runs")
    assert {r["kernel"] for r in rows} == {op.name, grouped_baseline_name("float16", "float16")}
    for row in rows:
        assert row["seconds"] > 0
        if row["kernel"] == op.name:
            assert row["rel_error"] is not None and row["rel_error"] < 5e-3, row


def _conv_ops():
    from pycutlass.conv import Operator

    return [f16_conv(kind) for kind in (Operator.fprop, Operator.wgrad)]


CONV_OPS = _conv_ops()


def test_sweep_times_conv_problems_against_torch_per_kind(tmp_path):
    """Conv2d problems are verified against torch's float64 convolution and timed beside cuDNN for each kind."""
    from pycutlass.tune.problems import Conv2dProblem

    problems = [Conv2dProblem(4, 16, 16, 64, 128, 3, 3, pad=(1, 1)), Conv2dProblem(4, 15, 15, 64, 64, 1, 1,
                                                                                    stride=(2, 2))]
    sweep = Sweep(CONV_OPS, problems, db=tmp_path / "r.db", name="conv")
    compiled = sweep.compile()
    assert not compiled.failed, str(compiled)
    summary = sweep.benchmark(config=QUICK, timeout=120)
    assert summary.statuses == {"ok": 2 * (2 + 2)}, str(summary)  # per problem: 2 kernels + 2 baselines
    for row in sweep.db.query("select kernel, seconds, rel_error from runs"):
        assert row["seconds"] > 0
        if not row["kernel"].startswith("torch"):
            assert row["rel_error"] is not None and row["rel_error"] < 5e-3, row


def test_a_dask_sweep_times_every_kind_as_a_local_sweep_does(tmp_path):
    """GEMM, grouped and Conv2d operations and their torch baselines through a local Dask cluster (compile workers
    without a GPU beside the benchmark worker): the pairs a local sweep measures, all verified and ok, at times
    within 20% of the local sweep's. The float16 grouped baseline is the CUDA graph of torch.matmul per group
    (torch._grouped_mm loops over float16 groups on the host)."""
    pytest.importorskip("distributed")
    from pycutlass.tune.distributed import DaskExecutor
    from pycutlass.tune.problems import Conv2dProblem, grouped_problems

    problems = [PROBLEMS[1], *grouped_problems(4, (16, 300), 256, 128, seed=5, sets=1),
                Conv2dProblem(4, 16, 16, 64, 128, 3, 3, pad=(1, 1))]
    ops = [*GROUPED_OPS, CONV_OPS[0]]
    found = {}
    for mode in ("local", "dask"):
        sweep = Sweep(ops, problems, db=tmp_path / f"{mode}.db", name=mode)
        assert not sweep.compile().failed
        if mode == "local":
            summary = sweep.benchmark(config=QUICK, timeout=120, baseline=True)
        else:
            with DaskExecutor("local:2") as executor:
                summary = executor.benchmark(sweep, config=QUICK, timeout=120, baseline=True)
        assert summary.statuses == {"ok": 2 + 3 + 2}, str(summary)
        found[mode] = {(r["kernel"], r["problem"]): r for r in sweep.db.query("select * from runs")}
    assert set(found["local"]) == set(found["dask"])
    for pair, local in found["local"].items():
        remote = found["dask"][pair]
        if not pair[0].startswith("torch"):
            assert remote["rel_error"] is not None and remote["rel_error"] < 5e-3, remote
        assert abs(remote["seconds"] / local["seconds"] - 1) < 0.2, (pair, local["seconds"], remote["seconds"])
        if pair[0].startswith("torch.grouped"):
            assert "torch._grouped_mm" not in (remote["message"] or "") and remote["seconds"] < 60e-6, remote


def test_faulting_and_hanging_kernels_are_recorded_and_the_sweep_goes_on(tmp_path):
    good = [gemm((128, 128, 32)), gemm((64, 64, 32))]
    faulting, hanging = gemm((128, 64, 32), cls=FaultingGemm), gemm((64, 128, 32), cls=HangingGemm)
    sweep = Sweep([good[0], faulting, hanging, good[1]], PROBLEMS[:2], db=tmp_path / "r.db", name="faults")
    sweep.compile()
    summary = sweep.benchmark(config=QUICK, timeout=20, baseline=False)
    status = {(r["kernel"], r["problem"]): r["status"] for r in sweep.db.query("select * from runs")}
    for problem in PROBLEMS[:2]:
        assert status[(faulting.name, problem.key)] == "failed"
        assert status[(hanging.name, problem.key)] == "timeout"
        for op in good:
            assert status[(op.name, problem.key)] == "ok"
    assert summary.restarts >= 3, str(summary)


def test_interrupted_sweep_resumes_without_losing_or_repeating_rows(tmp_path):
    db_path = tmp_path / "r.db"
    command = [sys.executable, "-m", "pycutlass", "sweep", "--space", "sm80-f16-small", "--problems",
               "gemm:256x512x128,1000x3000x520,2048x2048x2048,4096x1024x512", "--db", str(db_path),
               "--repetitions", "10", "--name", "resume"]
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    process = subprocess.Popen(command, env=env)
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        time.sleep(0.5)
        try:
            with ResultsDB(db_path, read_only=True) as db:
                if db.counts()["runs"] >= 3:
                    break
        except cutlass.ArgumentError:  # not created yet, or its schema not yet written
            continue
    process.send_signal(signal.SIGINT)
    started = time.monotonic()
    process.wait(timeout=30)
    assert time.monotonic() - started < 5, "Ctrl-C must stop a sweep within seconds"
    with ResultsDB(db_path, read_only=True) as db:
        done_before = db.counts()["runs"]
    assert done_before >= 3
    finished = subprocess.run(command, env=env, capture_output=True, text=True, timeout=600)
    assert finished.returncode == 0, finished.stderr
    assert f"{done_before} already in the DB" in finished.stdout, finished.stdout
    with ResultsDB(db_path, read_only=True) as db:
        rows = db.query("select kernel, problem, count(*) as n from runs group by kernel, problem")
        assert all(r["n"] == 1 for r in rows)
        kernels = db.query("select count(*) as n from kernels where kind != 'baseline'")[0]["n"]
        assert len(rows) == (kernels + 1) * 4


def test_autotune_and_tuned_compute_correct_results(tmp_path):
    from pycutlass.tune.autotune import Tuned, autotune

    space = SearchSpace.preset("sm80-f16-small")
    problem = GemmProblem(1024, 2048, 512)
    first = autotune(space, problem, db=tmp_path / "t.db")
    assert not first.from_cache and first.candidates >= 2
    assert first.seconds == min(t for t in first.timings.values() if t is not None)
    assert autotune(space, problem, db=tmp_path / "t.db").from_cache

    tuned = Tuned(space, db=tmp_path / "t.db", policy="pow2")
    for m, n, k in [(1000, 2000, 504), (77, 304, 64), (1024, 2048, 512)]:  # K and N: multiples of 8 (alignment)
        a = torch.randn(m, k, device="cuda").half()
        b = torch.randn(n, k, device="cuda").half().t()  # column-major B
        d = torch.full((m, n), math.nan, device="cuda").half()
        tuned(a, b, d)
        torch.cuda.synchronize()
        reference = a.double() @ b.double()
        error = ((d.double() - reference).norm() / reference.norm()).item()
        assert error < 5e-3, (m, n, k, error)


def _gpu_count():
    return torch.cuda.device_count() if torch is not None else 0


@pytest.mark.multigpu
@pytest.mark.skipif(_gpu_count() < 2, reason="needs two GPUs")
def test_two_gpu_workers_split_the_work_and_isolate_a_fault(tmp_path):
    good = [gemm((128, 128, 32)), gemm((64, 64, 32)), gemm((128, 256, 32), 3, (2, 4, 1))]
    faulting = gemm((128, 64, 32), cls=FaultingGemm)
    problems = PROBLEMS + [GemmProblem(2048, 2048, 2048)]
    sweep = Sweep([*good, faulting], problems, db=tmp_path / "r.db", name="two")
    sweep.compile()
    summary = sweep.benchmark(config=QUICK, devices=[0, 1], timeout=30, baseline=False)
    rows = sweep.db.query("select kernel, problem, status, worker, device from runs")
    assert len(rows) == len({(r["kernel"], r["problem"]) for r in rows}) == 4 * len(problems)
    assert len({r["worker"] for r in rows}) == 2, "both GPUs must have measured"
    assert all((r["status"] == "failed") == (r["kernel"] == faulting.name) for r in rows), rows
    # The same pairs on one GPU agree with the two-GPU run within noise (same kernels, same model of GPU).
    single = Sweep([*good], problems, db=tmp_path / "r.db", name="one")
    single.benchmark(config=QUICK, devices=[1], baseline=False)
    two = {(k, p): s for k, p, s in sweep.db.results(sweep="two")}
    one = {(k, p): s for k, p, s in sweep.db.results(sweep="one")}
    ratios = sorted(two[pair] / one[pair] for pair in one)
    assert 0.7 < ratios[len(ratios) // 2] < 1.3, ratios
    assert summary.restarts >= 1


def test_graph_replay_and_argument_pool_agree_with_plain_timing(tmp_path):
    """CUDA-graph replay and an argument pool beyond L2 time the same verified kernels; times stay close to the
    plain harness's (graphs remove host cost, so they may only be faster)."""
    ops = [gemm((128, 128, 32)), gemm((64, 64, 32))]
    problems = [GemmProblem(2048, 2048, 2048)]
    results = {}
    for name, config in (("plain", QUICK), ("graph", BenchConfig(repetitions=10, warmup=2, cuda_graph=8)),
                         ("pool", BenchConfig(repetitions=10, warmup=2, arg_pool=8))):
        sweep = Sweep(ops, problems, db=tmp_path / "r.db", name=name)
        sweep.compile()
        summary = sweep.benchmark(config=config, baseline=False)
        assert summary.statuses == {"ok": 2}, (name, summary)
        rows = sweep.db.query("select kernel, seconds, message, rel_error from runs where sweep = ?", [name])
        # no capture fallback (a note on the SM clock may stand beside it)
        assert all("capture failed" not in r["message"] and r["rel_error"] < 5e-3 for r in rows), rows
        results[name] = {r["kernel"]: r["seconds"] for r in rows}
    for op in ops:
        plain = results["plain"][op.name]
        assert 0.5 * plain < results["graph"][op.name] < 1.2 * plain, results
        assert 0.5 * plain < results["pool"][op.name] < 1.5 * plain, results


def test_default_harness_times_small_kernels_on_the_gpu_not_the_host():
    """Without a lead, CUDA events around a 1024^3 GEMM time the host's launch path (torch.matmul measured 26.9 us on
    an H200, a few us of it cuBLAS). The default harness times from the end of its lead: each sample comes within a
    small factor of the kernel's GPU time, bounded from below by a CUDA graph of 20 back-to-back launches (warm L2,
    no host in between), and at most a few us (the GPU's launch of the call) above the kernel timer's span of the
    kernel alone, for the torch baseline and for a pycutlass kernel alike."""
    from pycutlass.tune.bench import DEFAULT_LEAD_US, GemmBench, measure_gemm, measure_torch

    problem = GemmProblem(1024, 1024, 1024)
    default = GemmBench(BenchConfig(repetitions=30, warmup=3))
    assert default.config.lead_us == DEFAULT_LEAD_US and default.config.timer == "launch"
    benches = {"default": default,
               "kernel": GemmBench(BenchConfig(repetitions=30, warmup=3, timer="kernel")),
               "host": GemmBench(BenchConfig(repetitions=30, warmup=3, lead_us=0, timer="events")),
               "graph": GemmBench(BenchConfig(repetitions=10, warmup=3, cuda_graph=20, flush_l2=False, lead_us=0))}

    def check(times):
        assert times["default"] <= 2.0 * times["graph"] + 2e-6, times
        assert times["kernel"] <= times["default"] <= times["kernel"] + 3e-6, times
        assert times["default"] < times["host"], times

    torch_times = {name: measure_torch(bench, problem, "float16").seconds for name, bench in benches.items()}
    check(torch_times)
    op = gemm((128, 128, 32))
    session = cutlass.Session()
    measured = {}
    for name, bench in benches.items():
        result, _ = measure_gemm(bench, op, problem, session)
        assert result.status == "ok", (name, result)
        measured[name] = result.seconds
    check(measured)
    print(f"torch {torch_times}, pycutlass {measured}")  # seconds; shown with pytest -s


def test_autotune_top_k_compiles_only_the_ranked_few_and_runs_the_winner(tmp_path):
    from pycutlass.tune.autotune import autotune

    session = cutlass.Session(cache_path=tmp_path / "kernels.db")  # a cold kernel cache
    space = SearchSpace.preset("sm80-f16")  # 204 configurations
    problem = GemmProblem(1024, 2048, 512)
    start = time.perf_counter()
    result = autotune(space, problem, db=tmp_path / "t.db", session=session, top_k=2)
    assert result.candidates == 2 and len(result.timings) == 2
    assert time.perf_counter() - start < 120  # two Sm80 compiles, not 204
    again = autotune(space, GemmProblem(2048, 1024, 512), db=tmp_path / "t.db", session=session, top_k=2)
    assert 2 <= again.candidates <= 4  # what the first tune compiled is timed too (it is in the cache)
    a = torch.randn(1024, 512, device="cuda").half()
    b = torch.randn(2048, 512, device="cuda").half().t()
    d = torch.full((1024, 2048), math.nan, device="cuda").half()
    operation = result.operation
    arguments = cutlass.GemmArguments(operation, (1024, 2048, 512), a, b, None, d,
                                      output_op=operation.epilogue_type(1.0, 0.0), session=session)
    operation.run(arguments)
    torch.cuda.synchronize()
    reference = a.double() @ b.double()
    assert ((d.double() - reference).norm() / reference.norm()).item() < 5e-3


def test_autotune_times_grouped_sets_and_convolutions_and_keeps_the_winner(tmp_path):
    """autotune on a grouped set (both scheduler modes of one tile) and on a convolution (one kind), each candidate
    verified against float64 before it is timed; the second call answers from the tuning cache."""
    from pycutlass.tune.autotune import autotune
    from pycutlass.tune.problems import Conv2dProblem, grouped_problems

    experts = list(grouped_problems(5, (16, 300), 256, 128, seed=4))[0]
    grouped = autotune(GROUPED_OPS[1:], experts, db=tmp_path / "t.db", top_k=None)
    assert grouped.operation in GROUPED_OPS[1:] and grouped.candidates == 2 and not grouped.from_cache
    assert all(seconds is not None and seconds > 0 for seconds in grouped.timings.values()), grouped.timings
    again = autotune(GROUPED_OPS[1:], experts, db=tmp_path / "t.db", top_k=None)
    assert again.from_cache and again.operation.name == grouped.operation.name
    layer = Conv2dProblem(4, 16, 16, 64, 128, 3, 3, pad=(1, 1))
    conv = autotune(CONV_OPS[1:], layer, db=tmp_path / "t.db", top_k=1)
    assert conv.operation is CONV_OPS[1] and conv.seconds > 0


def test_breakdown_accounts_for_a_real_sweep(tmp_path):
    """Where a real worker's time goes: every phase shows, and the parts add up to the whole."""
    ops = [gemm((128, 128, 32)), gemm((64, 64, 32))]
    sweep = Sweep(ops, PROBLEMS, db=tmp_path / "r.db", name="timed")
    sweep.compile()
    summary = sweep.benchmark(config=QUICK, devices=[0], baseline=False)
    (worker,) = summary.breakdown.workers
    assert worker.tasks == len(ops) * len(PROBLEMS) and worker.kernels == len(ops)
    for phase in ("startup", "load", "inputs", "reference", "verify", "timing"):
        assert worker.phases.get(phase, 0) > 0, (phase, str(summary.breakdown))
    assert worker.requests + worker.parent + worker.idle == pytest.approx(worker.wall, abs=1e-6)
    assert worker.transport >= 0 and worker.startup > 0.1
    assert summary.breakdown.rows_written == summary.done


def test_each_problems_inputs_and_reference_are_made_once_per_worker():
    from pycutlass.tune.bench import GemmBench, measure_gemm

    bench = GemmBench(QUICK)
    problem = GemmProblem(512, 1024, 256)
    first, second = gemm((128, 128, 32)), gemm((64, 64, 32))
    assert measure_gemm(bench, first, problem)[0].status == "ok"
    made = bench.clock.take()
    assert made["inputs"] > 0 and made["reference"] > 0
    assert measure_gemm(bench, second, problem)[0].status == "ok"
    again = bench.clock.take()
    assert "inputs" not in again and "reference" not in again, again  # the second kernel reuses both
    assert again["timing"] > 0 and again["verify"] > 0


@pytest.mark.multigpu
@pytest.mark.skipif(_gpu_count() < 2, reason="needs two GPUs")
def test_every_gpu_draws_the_same_operands():
    from pycutlass.tune.bench import GemmBench

    problem = GemmProblem(256, 384, 128)
    a0, b0 = GemmBench(QUICK, 0).operands(problem, "float16", "float16", True, False)
    a1, b1 = GemmBench(QUICK, 1).operands(problem, "float16", "float16", True, False)
    assert a0.device.index == 0 and a1.device.index == 1
    assert torch.equal(a0.cpu(), a1.cpu()) and torch.equal(b0.cpu(), b1.cpu())
    assert a0.float().std().item() == pytest.approx(1.0, rel=0.1)  # random-normal
