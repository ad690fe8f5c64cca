"""SM90 (CUTLASS 3.x) GEMM against torch in the same process: a grid of configurations per shape and data type, fp8
against torch._scaled_mm, fused bias + GELU against eager addmm + gelu (``fused_tanh``: gelu_taylor against gelu(approximate="tanh"), not run
by default), and the host cost of launching.

    python benchmarks/gemm_sm90.py [--dtypes f16 bf16 fp8 fused fused_tanh host]
                                   [--out benchmarks/results/gemm_sm90.json]

Every kernel's output is checked once against torch (output NaN-poisoned first) before it is timed; a kernel that
disagrees is reported as wrong and never timed. Times: median of triton's do_bench (L2 flushed between repetitions),
random-normal inputs, the same tensors for both sides.

"best/torch" is order-fair: the grid's three fastest and torch are timed in interleaved rounds (``paired``), and
the winner's ratio is the median over fresh rounds. "grid best/torch" is the older number: torch timed once before
the grid, each configuration after it in turn.
"""
from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import numpy as np  # noqa: E402

import pycutlass as cutlass  # noqa: E402
from common import bench_ms, device_name, host_submit_us, host_us, print_table, write_json  # noqa: E402

D = cutlass.DataType
KS, TS = cutlass.KernelScheduleType, cutlass.TileSchedulerType
SHAPES = [(4096, 4096, 4096), (8192, 8192, 8192), (2048, 14336, 4096), (4096, 14336, 4096), (1024, 1024, 1024),
          (16, 4096, 4096), (64, 14336, 4096), (128, 4096, 14336), (1000, 3000, 520)]
COOP, PP, WS = KS.TmaWarpSpecializedCooperative, KS.TmaWarpSpecializedPingpong, KS.TmaWarpSpecialized
# (tile, cluster, kernel schedule, tile scheduler): with DEFAULT, 15 compiled configurations per 16-bit type. The
# 64x32 and 64x64 tiles give decode shapes (M <= 128) 2-4x the CTAs of 64x128, to stream B from more SMs; 128x192
# covers a 3000-wide output in one wave; 64x128 on a 2x1 cluster is what cuBLAS runs for f16 1024^3
# (benchmarks/cublas_kernels.py). They replace configurations that were never within 1% of the best on an H100:
# 128x128 c1x2 coop, 128x128 c1x1 pp, 256x128 c1x1 coop, 64x256 pp.
GRID = [((128, 128, 64), (2, 1, 1), COOP, TS.Default), ((128, 256, 64), (1, 1, 1), COOP, TS.Default),
        ((128, 256, 64), (2, 1, 1), COOP, TS.Default), ((256, 128, 64), (1, 2, 1), COOP, TS.Default),
        ((128, 192, 64), (2, 1, 1), COOP, TS.Default), ((128, 128, 64), (2, 1, 1), PP, TS.Default),
        ((64, 128, 64), (1, 1, 1), PP, TS.Default), ((64, 128, 64), (2, 1, 1), WS, TS.Default),
        ((64, 128, 64), (1, 1, 1), WS, TS.Default), ((64, 256, 64), (1, 2, 1), WS, TS.Default),
        ((64, 64, 64), (1, 1, 1), WS, TS.Default), ((64, 32, 64), (1, 1, 1), WS, TS.Default),
        ((128, 128, 64), (1, 1, 1), COOP, TS.StreamK), ((128, 256, 64), (2, 1, 1), COOP, TS.StreamK)]
DEFAULT = ((128, 128, 64), (1, 1, 1), KS.Auto, TS.Default)
SPLIT_KNOBS = [{"split_k_slices": 2, "decomposition": "split_k"}, {"split_k_slices": 4, "decomposition": "split_k"},
               {"decomposition": "stream_k"}]  # what TileDescription's defaults give
FP8_GRID = [((128, 128, 128), (1, 1, 1), KS.TmaWarpSpecializedCooperativeFP8FastAccum, TS.Default),
            ((128, 128, 128), (2, 1, 1), KS.TmaWarpSpecializedCooperativeFP8FastAccum, TS.Default),
            ((128, 256, 128), (2, 1, 1), KS.TmaWarpSpecializedCooperativeFP8FastAccum, TS.Default),
            ((256, 128, 128), (1, 2, 1), KS.TmaWarpSpecializedCooperativeFP8FastAccum, TS.Default),
            ((64, 128, 128), (1, 1, 1), KS.TmaWarpSpecializedPingpongFP8FastAccum, TS.Default),
            ((128, 128, 128), (2, 1, 1), KS.TmaWarpSpecializedPingpongFP8FastAccum, TS.Default)]
FP8_SHAPES = [(4096, 4096, 4096), (8192, 8192, 8192), (2048, 14336, 4096), (64, 14336, 4096)]


def make_op(element, config, out=None, activation=None, bias=None):
    tile, cluster, kernel, scheduler = config
    out = out or element
    k = 32 if element.is_fp8 else 16
    math = cutlass.MathInstruction([64, tile[1], k], element, element, D.float32, cutlass.OpClass.TensorOp)
    description = cutlass.TileDescription(list(tile), 0, None, math, cluster_shape=list(cluster),
                                          kernel_schedule=kernel, tile_scheduler=scheduler)
    A = cutlass.TensorDescription(element, cutlass.RowMajor, 128 // element.bits)
    B = cutlass.TensorDescription(element, cutlass.ColumnMajor, 128 // element.bits)
    C = cutlass.TensorDescription(out, cutlass.RowMajor, 128 // out.bits)
    if activation:
        functor = cutlass.LinearCombinationGeneric(getattr(cutlass, activation)(D.float32), out, C.alignment,
                                                   D.float32, D.float32)
    else:
        functor = cutlass.LinearCombination(out, C.alignment, D.float32, D.float32)
    return cutlass.GemmOperationUniversal(90, description, A, B, C, functor, bias=bias)


def operations(dtypes=("f16", "bf16", "fp8", "fused", "host")) -> dict:
    ops = {}
    if "f16" in dtypes:
        ops["f16"] = [make_op(D.float16, c) for c in [DEFAULT, *GRID]]
    if "host" in dtypes:
        ops["host"] = [make_op(D.float16, DEFAULT)]
    if "bf16" in dtypes:
        ops["bf16"] = [make_op(D.bfloat16, c) for c in [DEFAULT, *GRID]]
    if "fp8" in dtypes:
        ops["fp8"] = [make_op(D.float8_e4m3, c, out=D.bfloat16) for c in FP8_GRID]
    if "fused" in dtypes:
        ops["fused"] = [make_op(D.float16, c, activation="gelu", bias="column") for c in GRID[:11]]
    if "fused_tanh" in dtypes:  # GELU's tanh form against torch's gelu(approximate="tanh")
        ops["fused_tanh"] = [make_op(D.float16, c, activation="gelu_taylor", bias="column") for c in GRID[:11]]
    return {name: list(dict.fromkeys(found)) for name, found in ops.items()}


def all_operations():
    return [op for ops in operations().values() for op in ops]


def describe(op) -> str:
    t = op.tile_description
    sched = {"TmaWarpSpecializedCooperative": "coop", "TmaWarpSpecializedPingpong": "pp",
             "TmaWarpSpecialized": "ws"}[op.kernel_schedule.base.value]
    return (f"{t.threadblock_shape[0]}x{t.threadblock_shape[1]}x{t.threadblock_shape[2]} "
            f"c{t.cluster_shape[0]}x{t.cluster_shape[1]} {sched}{' sk' if op.tile_scheduler is TS.StreamK else ''}")


def stream_k_op(ops):
    """The 128x128 stream-K configuration of ``ops`` (the grid's smallest stream-K tile)."""
    return next(op for op in ops if op.tile_scheduler is TS.StreamK and
                list(op.tile_description.threadblock_shape[:2]) == [128, 128])


def _tflops(m, n, k, ms):
    return 2 * m * n * k / ms / 1e9


def time_op(op, m, n, k, A, B, reference, tolerance, bias=None, epilogue=(1.0, 0.0), **knobs):
    """(milliseconds, note, launch) of ``op`` on the given operands; milliseconds None when its output disagrees
    with ``reference``."""
    import torch

    out_dtype = reference.dtype
    Dt = torch.full((m, n), float("nan"), device="cuda", dtype=out_dtype)
    try:
        arguments = cutlass.GemmArguments(op, cutlass.gemm.GemmCoord(m, n, k), A, B, None, Dt,
                                          output_op=op.epilogue_type(*epilogue), bias=bias, **knobs)
    except cutlass.ArgumentError as error:
        return None, f"rejected: {error}", None
    op.run(arguments)
    arguments.sync()
    error = ((Dt.double() - reference.double()).norm() / reference.double().norm()).item()
    if not error < tolerance:
        return None, f"wrong (relative error {error:.3g})", None
    return bench_ms(lambda: op.run(arguments)), "", lambda: op.run(arguments)


def paired(torch_fn, candidates, select_rounds=5, confirm_rounds=7):
    """Order-fair ratios torch / candidate: torch and the candidates are timed in interleaved rounds, the order
    rotated each round, so neither side gets the cooler (faster-clocked) GPU or the warmer caches more often.

    The grid above times torch once, first, then each configuration in turn: a GPU that heats up over a shape's
    24 runs favours torch. Here the winner is picked by the median ratio over ``select_rounds``, then its ratio is
    measured again over ``confirm_rounds`` fresh rounds (so picking the best of several noisy medians does not
    inflate the reported one). Returns (winner index, confirmed ratio, per-candidate selection ratios)."""
    def rounds(fns, count):
        ratios = [[] for _ in fns[1:]]
        for r in range(count):
            order = list(range(len(fns)))
            order = order[r % len(order):] + order[:r % len(order)]
            ms = {i: bench_ms(fns[i], warmup_ms=10, rep_ms=60) for i in order}
            for j in range(1, len(fns)):
                ratios[j - 1].append(ms[0] / ms[j])
        return [statistics.median(found) for found in ratios]

    selection = rounds([torch_fn, *(fn for _, fn in candidates)], select_rounds) if len(candidates) > 1 else [0.0]
    winner = max(range(len(candidates)), key=selection.__getitem__)
    return winner, rounds([torch_fn, candidates[winner][1]], confirm_rounds)[0], selection


def smi_state() -> str:
    """SM clock, temperature and power now (the clocks drift as the GPU heats: recorded per shape)."""
    return subprocess.run(["nvidia-smi", "--query-gpu=clocks.sm,temperature.gpu,power.draw", "--format=csv,noheader"],
                          capture_output=True, text=True).stdout.strip()


def gemm_section(name, element, ops, shapes, rows, results):
    import torch

    dtype = {D.float16: torch.float16, D.bfloat16: torch.bfloat16}[element]
    for m, n, k in shapes:
        A = torch.randn(m, k, device="cuda", dtype=dtype)
        Bt = torch.randn(n, k, device="cuda", dtype=dtype)
        B = Bt.t()  # ColumnMajor (K, N)
        torch_ms = bench_ms(lambda: torch.matmul(A, B))
        reference = torch.matmul(A, B)
        tolerance = 1e-2 if element is D.float16 else 2e-2
        timings = []
        for op in ops:
            ms, note, fn = time_op(op, m, n, k, A, B, reference, tolerance)
            timings.append((op, {}, ms, note, fn))
        # Runtime knobs need no recompile; 9 runs per shape keep it at 24 configurations (15 compiled + 9): on the
        # fastest configuration the swizzle 2, 4, 8 and an explicit raster order along M and along N (cuBLAS picks
        # its raster per shape: the "_v_" / "_h_" of its kernel names), on the second swizzle 8, and on the 128x128
        # stream-K one K split 2 or 4 ways or stream-K's own balancing.
        ranked = sorted((t for t in timings[1:] if t[2] is not None), key=lambda t: t[2])[:2]
        runs = [(ranked[0][0], knobs) for knobs in ({"swizzle": 2}, {"swizzle": 4}, {"swizzle": 8},
                                                     {"raster_order": "along_m"}, {"raster_order": "along_n"})]
        runs += [(op, {"swizzle": 8}) for op, _, _, _, _ in ranked[1:]]
        runs += [(stream_k_op(ops), knobs) for knobs in SPLIT_KNOBS]
        for op, knobs in runs:
            ms, note, fn = time_op(op, m, n, k, A, B, reference, tolerance, **knobs)
            timings.append((op, knobs, ms, note, fn))
        summarize(name, f"{m}x{n}x{k}", (m, n, k), torch_ms, timings, rows, results, lambda: torch.matmul(A, B))


def fp8_section(ops, rows, results):
    import torch

    for m, n, k in FP8_SHAPES:
        A = torch.randn(m, k, device="cuda").clamp(-4, 4).to(torch.float8_e4m3fn)
        Bt = torch.randn(n, k, device="cuda").clamp(-4, 4).to(torch.float8_e4m3fn)
        one = torch.ones((), device="cuda")
        torch_ms = bench_ms(lambda: torch._scaled_mm(A, Bt.t(), one, one, out_dtype=torch.bfloat16))
        reference = torch._scaled_mm(A, Bt.t(), one, one, out_dtype=torch.bfloat16)
        timings = [(op, {}, *time_op(op, m, n, k, A, Bt.t(), reference, 2e-2)) for op in ops]
        summarize("fp8 e4m3 -> bf16", f"{m}x{n}x{k}", (m, n, k), torch_ms, timings, rows, results,
                  lambda: torch._scaled_mm(A, Bt.t(), one, one, out_dtype=torch.bfloat16))


def summarize(label, shape, mnk, torch_ms, timings, rows, results, torch_fn):
    """One table row from (op, runtime knobs, ms or None, note, launch) timings: the grid's best against torch, the
    three fastest confirmed against ``torch_fn`` in interleaved rounds (``paired``), and the first (default) one."""
    def config(t):
        return describe(t[0]) + "".join(f" {key}={v}" for key, v in t[1].items())

    good = sorted((t for t in timings if t[2] is not None), key=lambda t: t[2])
    best_ms = good[0][2] if good else None
    row = {"dtype": label, "shape": shape, "torch TFLOP/s": _tflops(*mnk, torch_ms), "best/torch": 0.0,
           "best config": "-", "grid best/torch": torch_ms / best_ms if best_ms else 0.0,
           "default/torch": torch_ms / timings[0][2] if timings[0][2] else 0.0}
    selection = []
    if good:  # the grid's three fastest, against torch in interleaved rounds
        winner, ratio, selection = paired(torch_fn, [(config(t), t[4]) for t in good[:3]])
        row.update({"best/torch": ratio, "best config": config(good[winner]),
                    "best TFLOP/s": _tflops(*mnk, good[winner][2])})
    rows.append(row)
    results.append({**row, "torch_ms": torch_ms, "smi": smi_state(),
                    "paired selection": [{"config": config(t), "ratio": r} for t, r in zip(good[:3], selection)],
                    "configs": [{"config": describe(op), **knobs, "ms": ms, "note": note}
                                for op, knobs, ms, note, _ in timings]})
    print(row, flush=True)


def fused_section(ops, rows, results, approximate="none"):
    """Fused bias + GELU against eager addmm + gelu; ``approximate="tanh"``: the ops' gelu_taylor against torch's
    tanh form."""
    import torch
    import torch.nn.functional as F

    m = n = k = 4096
    A = torch.randn(m, k, device="cuda", dtype=torch.float16)
    Bt = torch.randn(n, k, device="cuda", dtype=torch.float16)
    bias = torch.randn(n, device="cuda", dtype=torch.float16)
    eager = lambda: F.gelu(torch.addmm(bias, A, Bt.t()), approximate=approximate)  # noqa: E731
    torch_ms = bench_ms(eager)
    reference = F.gelu(torch.addmm(bias, A, Bt.t()).float(), approximate=approximate).half()
    timings = [(op, {}, *time_op(op, m, n, k, A, Bt.t(), reference, 1e-2, bias=bias)) for op in ops]
    label = "f16 GEMM+bias+GELU" + (f" ({approximate})" if approximate != "none" else "")
    summarize(label, "4096^3", (m, n, k), torch_ms, timings, rows, results, eager)


def host_section(op, rows, results):
    """run() with reused arguments, a new Arguments object for a seen shape, torch.mm; and, for scale, the bare
    driver calls run() is made of (cuLaunchKernel and cuCtxGetCurrent through cuda.bindings and through ctypes).
    Each is timed two ways: in short batches on an idle GPU (the host's cost, the goal's number) and queued 2000
    deep (the older number, bounded below by the kernel's GPU time, which the row also gives)."""
    import ctypes

    import torch
    from cuda.bindings import driver as cu


    m = n = k = 128
    A = torch.randn(m, k, device="cuda", dtype=torch.float16)
    B = torch.randn(n, k, device="cuda", dtype=torch.float16).t()
    Dt = torch.empty(m, n, device="cuda", dtype=torch.float16)
    size = cutlass.gemm.GemmCoord(m, n, k)
    arguments = cutlass.GemmArguments(op, size, A, B, None, Dt)
    op.run(arguments)
    pdl_arguments = cutlass.GemmArguments(op, size, A, B, None, Dt, pdl=True)  # cuLaunchKernelEx's cost
    op.run(pdl_arguments)
    launch = arguments.prepared()
    stream = arguments.stream
    head = (launch.function, *launch.grid, *launch.block, launch.shared_memory_bytes)
    libcuda = ctypes.CDLL("libcuda.so.1")
    ctypes_launch, ctypes_current = libcuda.cuLaunchKernel, libcuda.cuCtxGetCurrent
    ctypes_launch.restype = ctypes_current.restype = ctypes.c_int
    ctypes_launch.argtypes = [ctypes.c_void_p] + [ctypes.c_uint] * 7 + [ctypes.c_void_p] * 3
    ctypes_current.argtypes = [ctypes.POINTER(ctypes.c_void_p)]
    raw_head = (int(launch.function), *launch.grid, *launch.block, launch.shared_memory_bytes)
    context = ctypes.c_void_p()
    stream_object = cu.CUstream(stream)
    def gpu_us_back_to_back(fn, calls=400):
        """GPU microseconds per kernel when ``fn``'s launches run back to back (events around ``calls`` of them)."""
        fn()
        torch.cuda.synchronize()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(calls):
            fn()
        end.record()
        end.synchronize()
        return start.elapsed_time(end) * 1e3 / calls

    found = {}
    timed = [("run() reused (us)", lambda: op.run(arguments)),
             ("run() reused, pdl=True (us)", lambda: op.run(pdl_arguments)),
             ("bare cuLaunchKernel, cuda.bindings (us)",
              lambda: cu.cuLaunchKernel(*head, stream, launch.param_address, 0)),
             ("bare cuLaunchKernel, cuda.bindings, CUstream object (us)",
              lambda: cu.cuLaunchKernel(*head, stream_object, launch.param_address, 0)),
             ("bare cuLaunchKernel, ctypes (us)",
              lambda: ctypes_launch(*raw_head, stream, launch.param_address, None)),
             ("cuCtxGetCurrent, cuda.bindings (us)", cu.cuCtxGetCurrent),
             ("cuCtxGetCurrent, ctypes (us)", lambda: ctypes_current(ctypes.byref(context))),
             ("new Arguments, seen shape (us)",
              lambda: cutlass.GemmArguments(op, size, A, B, None, Dt)),
             ("torch.mm (us)", lambda: torch.mm(A, B))]
    for r in range(4):  # interleaved rounds, the order rotated each round (the first of a round may pay more);
        # the minimum of each
        for name, fn in timed[r % len(timed):] + timed[:r % len(timed)]:
            # host_us queues 2000 calls: past the GPU queue's depth it times the kernels, not the host.
            # host_submit_us times short batches started on an idle GPU: the calls' cost to the host.
            queued = host_us(fn, repeats=1000 if "Arguments" in name else 2000)
            torch.cuda.synchronize()
            submit = host_submit_us(fn)
            found[name] = min(submit, found.get(name, submit))
            found[name + " queued"] = min(queued, found.get(name + " queued", queued))
        gpu = gpu_us_back_to_back(lambda: op.run(arguments))
        found["GPU us per kernel, back to back"] = min(gpu, found.get("GPU us per kernel, back to back", gpu))
    names = ("run() reused (us)", "run() reused, pdl=True (us)", "new Arguments, seen shape (us)", "torch.mm (us)",
             "bare cuLaunchKernel, cuda.bindings (us)", "bare cuLaunchKernel, cuda.bindings, CUstream object (us)",
             "bare cuLaunchKernel, ctypes (us)", "cuCtxGetCurrent, cuda.bindings (us)", "cuCtxGetCurrent, ctypes (us)")
    row = {**{name: found[name] for name in names},
           **{name + " queued": found[name + " queued"] for name in names[:5]},
           "GPU us per kernel, back to back": found["GPU us per kernel, back to back"]}
    rows.append(row)
    results.append(row)
    print(row, flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--dtypes", nargs="*", default=["f16", "bf16", "fp8", "fused", "host"])
    parser.add_argument("--shapes", type=int, default=len(SHAPES), help="first N shapes only")
    parser.add_argument("--jobs", type=int, default=os.cpu_count() or 2)
    parser.add_argument("--out", default="benchmarks/results/gemm_sm90.json")
    args = parser.parse_args()
    ops = operations(args.dtypes)
    report = cutlass.compiler.add_module([op for found in ops.values() for op in found], jobs=args.jobs)
    print(f"compiled {report}")
    smi = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version,clocks.sm,clocks.max.sm",
                          "--format=csv,noheader"], capture_output=True, text=True).stdout.strip()
    tables, results = {}, {}
    shapes = SHAPES[:args.shapes]
    for name, element in (("f16", D.float16), ("bf16", D.bfloat16)):
        if name in args.dtypes:
            rows = tables.setdefault("gemm", [])
            gemm_section(name, element, ops[name], shapes, rows, results.setdefault(name, []))
    if "fp8" in args.dtypes:
        fp8_section(ops["fp8"], tables.setdefault("fp8", []), results.setdefault("fp8", []))
    if "fused" in args.dtypes:
        fused_section(ops["fused"], tables.setdefault("fused", []), results.setdefault("fused", []))
    if "fused_tanh" in args.dtypes:
        fused_section(ops["fused_tanh"], tables.setdefault("fused", []), results.setdefault("fused_tanh", []), "tanh")
    if "host" in args.dtypes:
        host_section(ops["host"][0], tables.setdefault("host", []), results.setdefault("host", []))
    for title, rows in tables.items():
        print_table(f"{title} on {device_name()} ({smi})", rows)
        for dtype in dict.fromkeys(row.get("dtype") for row in rows if "best/torch" in row):
            mine = [row["best/torch"] for row in rows if row.get("dtype") == dtype and row["best/torch"] > 0]
            if mine:
                geomean = float(np.exp(np.mean(np.log(mine))))
                at_least_one = sum(r >= 1.0 for r in mine)
                print(f"{dtype}: geomean best/torch {geomean:.3f} over {len(mine)} shapes; >= 1.0 on {at_least_one}")
                results.setdefault("summary", {})[dtype] = {"geomean": geomean, "shapes": len(mine),
                                                            "at_least_torch": at_least_one}

    write_json(args.out, {"nvidia_smi": smi, "tables": tables, "results": results})


if __name__ == "__main__":
    main()
