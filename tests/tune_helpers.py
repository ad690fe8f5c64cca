"""Stand-ins shared by the tuning tests and shipped to their worker processes: a benchmark worker that answers like
the real one without a GPU (faults or hangs on the tiles named in FAKE_WORKER_MARKERS, times the rest from a
formula), and a GEMM that is valid as a description but does not compile."""
from __future__ import annotations

import inspect
import os
import signal
import time
from pathlib import Path

import pycutlass as cutlass
from pycutlass.emit.emitter import render
from pycutlass.kinds.gemm.operation import GemmOperationUniversal

_KIND_FOLDER = Path(inspect.getfile(GemmOperationUniversal)).parent



class NamedOp:
    """Just enough of an operation for the results DB (a name and a description)."""

    family = "sm80"

    def __init__(self, name):
        self.name = name

    def describe(self):
        return f"stand-in {self.name}"


def f16_gemm(tile=(128, 128, 32), stages=3, warps=(2, 2, 1), cls=None):
    """A float16 Sm80-family GEMM (A row-, B column-major, f32 accumulation) with the given tile."""
    f16 = cutlass.float16
    math_inst = cutlass.MathInstruction([16, 8, 16], f16, f16, cutlass.float32, cutlass.OpClass.TensorOp,
                                        cutlass.MathOperation.multiply_add)
    a = cutlass.TensorDescription(f16, cutlass.RowMajor, 8)
    b = cutlass.TensorDescription(f16, cutlass.ColumnMajor, 8)
    return (cls or cutlass.GemmOperationUniversal)(80, cutlass.TileDescription(list(tile), stages, list(warps),
                                                                                 math_inst), a, b, a,
                                                    cutlass.LinearCombination(f16, 8, cutlass.float32,
                                                                              cutlass.float32))


class _SabotagedGemm(GemmOperationUniversal):
    """A valid GEMM whose emitted code is changed on purpose: ``PREFIX`` goes at the kernel's start, ``SUFFIX`` at
    the end of the unit. Module-level classes, so worker processes unpickle them by reference."""

    PREFIX = ""
    SUFFIX = ""

    def _signature(self):
        return (*super()._signature(), type(self).__name__)

    def render(self, template, **context):  # the templates live beside the real kind
        return render(_KIND_FOLDER / template, **context)

    def emit_body(self):
        body = super().emit_body()
        if self.PREFIX:
            assert "  K op;\n" in body
            body = body.replace("  K op;\n", "  K op;\n" + self.PREFIX, 1)
        return body + self.SUFFIX


class BrokenGemm(_SabotagedGemm):
    """Does not compile (a configuration CUTLASS would reject late)."""

    SUFFIX = "\n#error deliberately broken for the compile-memo test\n"


class FaultingGemm(_SabotagedGemm):
    """Compiles, then writes to an illegal address on the GPU."""

    PREFIX = "  if (threadIdx.x == 0) { *reinterpret_cast<volatile int *>(16) = 1; }  // illegal address\n"


class HangingGemm(_SabotagedGemm):
    """Compiles, then never returns."""

    # clock64() is an opaque volatile read: the compiler cannot prove the loop ends, so it cannot drop it
    PREFIX = "  if (threadIdx.x == 0) { while (clock64() >= 0) { __nanosleep(1000); } }  // never returns\n"


def f16_conv(kind, tile=(128, 128, 32)):
    """An Sm80-family f16 NHWC convolution (optimized iterators, f32 accumulation) of ``kind``
    (``pycutlass.conv.Operator``)."""
    from pycutlass.conv import IteratorAlgorithm, StrideSupport

    f16 = cutlass.float16
    math = cutlass.MathInstruction([16, 8, 16], f16, f16, cutlass.float32, cutlass.OpClass.TensorOp,
                                   cutlass.MathOperation.multiply_add)
    nhwc = cutlass.TensorDescription(f16, cutlass.LayoutType.TensorNHWC, 8)
    return cutlass.Conv2dOperation(kind, IteratorAlgorithm.optimized, 80,
                                   cutlass.TileDescription(list(tile), 3, [2, 2, 1], math), nhwc, nhwc, nhwc,
                                   StrideSupport.Strided, cutlass.LinearCombination(f16, 8, cutlass.float32),
                                   cutlass.IdentitySwizzle1)


def broken_gemm():
    return f16_gemm((64, 64, 32), cls=BrokenGemm)


def fake_worker_main(conn, ordinal, session_options, config_json, prepare_session):
    """Answers like the real worker, phases included: FAKE_WORKER_STARTUP seconds of start-up, FAKE_WORKER_DELAY
    seconds of "timing" per pair (plus FAKE_WORKER_LOAD of "load" on a kernel's first pair in this process)."""
    from pycutlass.tune.breakdown import PhaseClock
    from pycutlass.tune.runner import spawn_seconds

    signal.signal(signal.SIGINT, signal.SIG_IGN)
    clock = PhaseClock()
    clock.add("startup", spawn_seconds())
    with clock.phase("startup"):
        time.sleep(float(os.environ.get("FAKE_WORKER_STARTUP", "0")))
    loaded = set()
    while True:
        message = conn.recv()
        if message is None:
            return
        if message[0] == "facts":
            uuid = os.environ.get("FAKE_WORKER_UUID", f"GPU-fake-{ordinal}")
            if os.environ.get("FAKE_WORKER_UUID_PARENT"):  # tells apart the GPUs of different (Dask) workers
                uuid = f"{uuid}-{os.getppid()}"
            models = dict(item.split(":") for item in os.environ.get("FAKE_WORKER_MODELS", "").split(",") if item)
            name = f"fake {models[str(ordinal)]}" if str(ordinal) in models else "fake GPU"
            conn.send({"name": name, "uuid": uuid, "compute_capability": 90, "host": "fake",
                       "phases": clock.take()})
            continue
        if message[0] == "adopt":
            conn.send({"adopted": message[1].name})
            continue
        if message[0] == "baseline":
            if os.environ.get("FAKE_WORKER_LOG"):
                with open(os.environ["FAKE_WORKER_LOG"], "a") as log:
                    log.write(f"baseline {message[1].get('kind', 'gemm')} {' '.join(map(str, message[2:]))}\n")
            conn.send({"measurement": {"status": "ok", "seconds": 1e-4, "repetitions": 50}})
            continue
        _, operation, problem = message
        tile = operation.tile_description.threadblock_shape
        marker = os.environ.get("FAKE_WORKER_MARKERS", "")
        if f"fault:{tile[0]}x{tile[1]}" in marker:
            os._exit(3)  # what a CUDA fault looks like from outside: the process is gone
        if f"hang:{tile[0]}x{tile[1]}" in marker:
            time.sleep(3600)
        if operation.name not in loaded:
            with clock.phase("load"):
                time.sleep(float(os.environ.get("FAKE_WORKER_LOAD", "0")))
            loaded.add(operation.name)
        with clock.phase("timing"):
            time.sleep(float(os.environ.get("FAKE_WORKER_DELAY", "0")))
        # a GEMM problem's m, n and k; grouped and conv problems are timed as one 256^3 GEMM
        m, n, k = (problem["m"], problem["n"], problem["k"]) if problem.get("kind", "gemm") == "gemm" else (256,) * 3
        if os.environ.get("FAKE_WORKER_LOG"):  # every measurement, to count repeats
            with open(os.environ["FAKE_WORKER_LOG"], "a") as log:
                log.write(f"{operation.name} {m}x{n}x{k}\n")
        seconds = 1e-6 * (m * n * k) ** (1 / 3) / tile[0] * 64
        conn.send({"measurement": {"status": "ok", "seconds": seconds, "seconds_min": seconds * 0.98,
                                   "seconds_iqr": seconds * 0.01, "repetitions": 50, "rel_error": 1e-4},
                   "resources": {"registers": tile[0], "threads": 128}, "phases": clock.take()})


def sm90_two_class_results(seed=0):
    """What an SM90 sweep over f16 and bf16 kernels records, without a GPU: 108 configurations per class (tile x
    cluster x kernel schedule x tile scheduler) on 9 GEMM shapes, as ``ResultsDB.results`` rows (``Result``: the
    kernel's operation class attached) over ``GemmProblem`` objects, and each kernel's space parameters. Times come
    from a tile-waste cost model with noise; bf16 kernels run 3% slower than their f16 twins; ~3% of pairs fail."""
    import itertools
    import math
    import random

    from pycutlass.tune.db import Result
    from pycutlass.tune.problems import GemmProblem

    rng = random.Random(seed)
    tiles = [(64, 64, 64), (64, 128, 64), (64, 256, 64), (128, 64, 64), (128, 128, 64), (128, 256, 64),
             (256, 64, 64), (256, 128, 64), (256, 256, 64)]
    clusters = [(1, 1, 1), (2, 1, 1)]
    schedules = ["TmaWarpSpecialized", "TmaWarpSpecializedCooperative", "TmaWarpSpecializedPingpong"]
    schedulers = ["Default", "StreamK"]
    configs = [c for c in itertools.product(tiles, clusters, schedules, schedulers)][:108]
    problems = [GemmProblem(m, n, k) for m, n, k in [(1024, 1024, 1024), (2048, 2048, 2048), (4096, 4096, 4096),
                                                     (16, 4096, 4096), (128, 4096, 4096), (8192, 8192, 8192),
                                                     (4096, 14336, 4096), (4096, 4096, 14336), (64, 1024, 8192)]]
    classes = {"f16": "gemm A=f16/row/8 B=f16/col/8 C=f16/row/8 D=f16/row/8 acc=f32 epilogue=LinearCombination/f32",
               "bf16": "gemm A=bf16/row/8 B=bf16/col/8 C=bf16/row/8 D=bf16/row/8 acc=f32 "
                       "epilogue=LinearCombination/f32"}
    results, params = [], {}
    for dtype, op_class in classes.items():
        slow = 1.03 if dtype == "bf16" else 1.0
        for index, (tile, cluster, schedule, scheduler) in enumerate(configs):
            name = (f"pycutlass_gemm_sm90_{dtype}{dtype}{dtype}f32_tnt_{'x'.join(map(str, tile))}_"
                    f"c{cluster[0]}x{cluster[1]}_s0_{schedule[18:].lower() or 'ws'}_a888_{index:04x}{dtype}cafe")
            params[name] = {"kind": "gemm", "compute_capability": 90, "element_a": {"f16": "float16"}.get(
                dtype, "bfloat16"), "layouts": "rcr", "alignment": [8, 8, 8], "threadblock_shape": list(tile),
                "cluster_shape": list(cluster), "kernel_schedule": schedule, "epilogue_schedule": "Auto",
                "tile_scheduler": scheduler, "stages": 0, "swizzle": "IdentitySwizzle1",
                "instruction_shape": [64, tile[1], 16]}
            for problem in problems:
                if rng.random() < 0.03:
                    continue
                tiles_needed = math.ceil(problem.m / tile[0]) * math.ceil(problem.n / tile[1])
                waves = math.ceil(tiles_needed / (132 / cluster[0]))
                seconds = 1e-6 * (3 + waves * tile[0] * tile[1] * problem.k / 6e5) * slow
                seconds *= 1 + 0.04 * schedules.index(schedule) * (problem.m < 256) + rng.uniform(0, 0.05)
                results.append(Result(name, problem, seconds, op_class))
    return results, params
