"""Grouped GEMM throughput: pycutlass GemmOperationGrouped (the CUTLASS 2.x kernel with Host and Device scheduling,
and the SM90 pointer-array kernel, each over a small grid of tiles) against a Python loop of torch.matmul over the
problems and torch._grouped_mm where it applies.

    python benchmarks/grouped_gemm.py [--quick | --moe] [--dtypes bf16 f16] [--families sm80 sm90]
                                      [--out benchmarks/results/grouped_gemm.json]

Cases (the MoE shape: M varies per problem, N and K are shared; A row-major, B column-major, C/D row-major):
  (a) 16 problems, M = 64, 128, ..., 1024, N = K = 4096;
  (b) 64 problems, M spread evenly over 16..1024 (multiples of 8), N = 2048, K = 1024.
      Target: >= 2x faster than the torch.matmul loop (the loop took 932 us on an H100).
  (moe) bf16 only: 128 experts, hidden 4096 -> 14336 (K = 4096, N = 14336), 8192 tokens routed top-2 with a skewed
      (log-normal) router, 8 experts receiving no token; M per expert is any count (not rounded).

Every pycutlass kernel's output (NaN-poisoned first) is checked once against the loop's result before it is timed.
Times are medians (triton's do_bench, or CUDA events) of op.run(arguments) with the arguments built once, like the
loop re-running on the same tensors; in Host mode the schedule is written once per arguments (the sizes are fixed).
The "new args" column times building GemmGroupedArguments plus run and a synchronize (what a caller whose sizes
change every step pays) for the best tile of each scheduler mode. TFLOP/s = sum of 2*M*N*K over the problems / time.

Device-side sizes (SM90, best tile, every case; the MoE case is the one it is for): the counts live in an int32 device
tensor (no host round trip), A and D are packed, B is the (groups, K, N) tensor. "SM90 device-sizes us" times
op.run (the sizes kernel, then the grouped kernel) with arguments built once; "SM90 graph us" replays a CUDA graph
of that run. The graph is then replayed with the counts shuffled across the groups (written into the same tensor)
and checked against a loop over the new split ("SM90 graph new-counts rel_err").
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import pycutlass as cutlass  # noqa: E402
from common import bench_ms, device_name, print_table, write_json  # noqa: E402
from pycutlass import GemmOperationGrouped, SchedulerMode  # noqa: E402
from pycutlass import GemmGroupedArguments  # noqa: E402

D = cutlass.DataType
MODES = (SchedulerMode.Host, SchedulerMode.Device)
LABELS = ("Host", "Device", "SM90")  # the CUTLASS 2.x kernel's two scheduler modes, then the SM90 kernel

MOE_CASE = "MoE: 128 experts (skewed top-2 of 8192 tokens), 4096 -> 14336"
CASE_DTYPES = {MOE_CASE: ("bf16",)}  # cases run for these dtypes only (default: all)


def moe_tokens(experts: int = 128, tokens: int = 8192, top_k: int = 2, empty: int = 8, seed: int = 0) -> list[int]:
    """Tokens per expert from a skewed router: log-normal expert popularity, ``empty`` experts get nothing."""
    rng = np.random.default_rng(seed)
    weights = rng.lognormal(0.0, 1.0, experts)
    weights[rng.choice(experts, empty, replace=False)] = 0.0
    return [int(c) for c in rng.multinomial(tokens * top_k, weights / weights.sum())]


CASES = {
    "16 x (M 64..1024), N=K=4096": ([int(m) for m in np.linspace(64, 1024, 16)], 4096, 4096),
    "64 x (M 16..1024), N=2048, K=1024": ([int(m) // 8 * 8 for m in np.linspace(16, 1024, 64)], 2048, 1024),
    MOE_CASE: (moe_tokens(), 14336, 4096),
}
TARGET_CASE = "64 x (M 16..1024), N=2048, K=1024"
TARGET_SPEEDUP = 2.0
H100_LOOP_US = 932  # the loop's time on an H100, for reference

# dtype -> (element, relative tolerance against the loop's result)
DTYPES = {"bf16": (D.bfloat16, 2e-2), "f16": (D.float16, 1e-2)}
# (threadblock, stages, warps)
TILES = [([128, 128, 32], 3, [2, 2, 1]), ([128, 128, 32], 4, [2, 2, 1]), ([128, 256, 32], 3, [2, 4, 1]),
         ([64, 128, 32], 4, [2, 2, 1])]
ALIGN = 8
# SM90 pointer-array kernel: (tile, cluster, kernel schedule)
SM90_TILES = [((128, 128, 64), (1, 1, 1), "TmaWarpSpecializedCooperative"),
              ((128, 256, 64), (2, 1, 1), "TmaWarpSpecializedCooperative"),
              ((256, 128, 64), (1, 1, 1), "TmaWarpSpecializedCooperative"),
              ((64, 128, 64), (1, 1, 1), "TmaWarpSpecializedPingpong"),
              ((128, 128, 64), (2, 1, 1), "TmaWarpSpecializedPingpong")]


def grid(dtypes=None) -> dict[tuple[str, SchedulerMode], list]:
    """(dtype, scheduler mode) -> the operations of the tile grid; invalid tiles are skipped with a message."""
    ops = {}
    for name, (element, _) in DTYPES.items():
        if dtypes and name not in dtypes:
            continue
        math = cutlass.MathInstruction([16, 8, 16], element, element, D.float32, cutlass.OpClass.TensorOp,
                                       cutlass.MathOperation.multiply_add)
        A = cutlass.TensorDescription(element, cutlass.RowMajor, ALIGN)
        B = cutlass.TensorDescription(element, cutlass.ColumnMajor, ALIGN)
        C = cutlass.TensorDescription(element, cutlass.RowMajor, ALIGN)
        epilogue = cutlass.LinearCombination(element, ALIGN, D.float32, D.float32)
        for mode in MODES:
            ops[name, mode] = []
            for shape, stages, warps in TILES:
                try:
                    tile = cutlass.TileDescription(shape, stages, warps, math)
                    ops[name, mode].append(GemmOperationGrouped(80, tile, A, B, C, epilogue,
                                                                        cutlass.IdentitySwizzle1, mode))
                except cutlass.DescriptionError as error:
                    print(f"skip {name} {shape} s{stages} {mode.value}: {error}")
    return ops


def sm90_grid(dtypes=None) -> dict[tuple[str, str], list]:
    """(dtype, "SM90") -> the SM90 grouped operations of the tile grid (GemmOperationGrouped(90) with SM90 tiles)."""
    ops = {}
    for name, (element, _) in DTYPES.items():
        if dtypes and name not in dtypes:
            continue
        A = cutlass.TensorDescription(element, cutlass.RowMajor, ALIGN)
        B = cutlass.TensorDescription(element, cutlass.ColumnMajor, ALIGN)
        C = cutlass.TensorDescription(element, cutlass.RowMajor, ALIGN)
        epilogue = cutlass.LinearCombination(element, ALIGN, D.float32, D.float32)
        ops[name, "SM90"] = []
        for shape, cluster, schedule in SM90_TILES:
            math = cutlass.MathInstruction([64, shape[1], 16], element, element, D.float32, cutlass.OpClass.TensorOp)
            tile = cutlass.TileDescription(list(shape), 0, None, math, cluster_shape=list(cluster),
                                           kernel_schedule=cutlass.KernelScheduleType[schedule])
            ops[name, "SM90"].append(GemmOperationGrouped(90, tile, A, B, C, epilogue))
    return ops


def operations() -> list:
    """Every benchmarked CUTLASS 2.x operation (tests/gpu/precompile.py compiles them ahead of time)."""
    return [op for ops in grid().values() for op in ops]


def sm90_operations() -> list:
    """Every benchmarked SM90 operation (NVRTC; tests/gpu/precompile.py compiles them ahead of time)."""
    return [op for ops in sm90_grid().values() for op in ops]


def _tile_name(op) -> str:
    if op.family != "sm90":
        return op.tile_description.procedural_name()
    tile = op.tile_description
    schedule = "coop" if op.kernel_schedule.base.name.endswith("Cooperative") else "pp"
    schedule += "fa" if op.kernel_schedule.is_fp8_fast_accum else ""
    epilogue = f"_e{tile.epilogue_tile[0]}x{tile.epilogue_tile[1]}" if tile.epilogue_tile else ""
    return (f"{'x'.join(map(str, tile.threadblock_shape))}_c{tile.cluster_shape[0]}x{tile.cluster_shape[1]}_{schedule}"
            f"{epilogue}")


def _torch_dtype(element):
    import torch

    return {D.float16: torch.float16, D.bfloat16: torch.bfloat16}[element]


def _grouped_mm_signature() -> str | None:
    """What this torch's _grouped_mm looks like (None when it has none); read lazily, never fatal."""
    try:
        import torch

        fn = getattr(torch, "_grouped_mm", None)
        if fn is None:
            return None
        try:
            schemas = [str(s) for s in torch._C._jit_get_schemas_for_operator("aten::_grouped_mm")]
        except Exception:  # noqa: BLE001 - private API
            schemas = []
        doc = " ".join((fn.__doc__ or "").strip().split())[:300]
        return "; ".join(schemas) or doc or "present"
    except Exception as error:  # noqa: BLE001
        return f"unknown ({type(error).__name__}: {error})"


def _relative_error(got, reference) -> float:
    import torch

    if not torch.isfinite(got).all().item():
        return float("inf")
    reference = reference.float()
    return ((got.float() - reference).norm() / reference.norm()).item()


def _us_with_new_arguments(op, problems, As, Bs, Ds, repeats: int) -> float:
    """Median wall-clock us of GemmGroupedArguments(...) + run + synchronize."""
    import torch

    samples = []
    for _ in range(repeats + 2):
        torch.cuda.synchronize()
        start = time.perf_counter()
        arguments = GemmGroupedArguments(op, problems, As, Bs, None, Ds)
        op.run(arguments)
        torch.cuda.synchronize()
        samples.append((time.perf_counter() - start) * 1e6)
        del arguments
    return statistics.median(samples[2:])


def _sm90_device_sizes(op, ms_list, A, B3, out, reference, tol, loop_ms, grouped_mm_ms, flops, seed=1) -> dict:
    """The device-sizes path of the SM90 kernel: eager run, CUDA-graph replay, and a replay with new counts."""
    import torch

    result = {}
    counts = torch.tensor(ms_list, dtype=torch.int32, device="cuda")
    out.fill_(float("nan"))
    arguments = GemmGroupedArguments(op, counts, A, B3, None, out)  # the current (default) stream, as bench_ms
    op.run(arguments)
    torch.cuda.synchronize()
    error = _relative_error(out, reference)
    result["SM90 device-sizes rel_err"] = error
    if not error < tol:
        result["SM90 device-sizes note"] = f"wrong result (rel err {error:.2e})"
        return result
    ms = bench_ms(lambda: op.run(arguments))
    result["SM90 device-sizes us"] = ms * 1e3
    result["SM90 device-sizes vs loop"] = loop_ms / ms
    assert arguments.size_flags() == 0
    del arguments

    # A CUDA graph of one run, captured on a side stream (the arguments' stream), replayed on the current one.
    stream = torch.cuda.Stream()
    arguments = GemmGroupedArguments(op, counts, A, B3, None, out, stream=stream)
    stream.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, stream=stream):
        op.run(arguments)
    out.fill_(float("nan"))
    graph.replay()
    torch.cuda.synchronize()
    error = _relative_error(out, reference)
    ms = bench_ms(graph.replay) if error < tol else float("nan")
    result["SM90 graph us"] = ms * 1e3
    result["SM90 graph TFLOP/s"] = flops / ms / 1e9
    result["SM90 graph vs loop"] = loop_ms / ms
    if grouped_mm_ms:
        result["SM90 graph vs _grouped_mm"] = grouped_mm_ms / ms

    # New routing: the same counts shuffled over the groups, written into the captured tensor, then one replay.
    new_ms = [int(m) for m in np.random.default_rng(seed).permutation(ms_list)]
    counts.copy_(torch.tensor(new_ms, dtype=torch.int32))
    out.fill_(float("nan"))
    graph.replay()
    expected = torch.empty_like(out)
    for a, b, d in zip(A.split(new_ms), B3.unbind(0), expected.split(new_ms)):
        torch.matmul(a, b, out=d)
    torch.cuda.synchronize()
    result["SM90 graph new-counts rel_err"] = _relative_error(out, expected)
    result["SM90 graph new-counts correct"] = result["SM90 graph new-counts rel_err"] < tol
    flags = arguments.size_flags()
    if flags:
        result["SM90 device-sizes flags"] = flags
    counts.copy_(torch.tensor(ms_list, dtype=torch.int32))
    del graph, arguments, expected
    return result


def run_case(case: str, dtype: str, ops_by_mode: dict, args) -> tuple[list[dict], dict]:
    import torch

    ms_list, n, k = CASES[case]
    element, tol = DTYPES[dtype]
    tdtype = _torch_dtype(element)
    groups = len(ms_list)
    total_m = sum(ms_list)
    problems = [cutlass.GemmCoord(m, n, k) for m in ms_list]
    flops = float(sum(2 * m * n * k for m in ms_list))
    gen = torch.Generator(device="cuda").manual_seed(0)
    # One concatenated row-major A (as _grouped_mm takes it) and a (G, K, N) B of column-major matrices, drawn in
    # the dtype itself (the MoE case's B is 15 GB in bf16).
    A = torch.randn(total_m, k, device="cuda", generator=gen, dtype=tdtype)
    B3 = torch.randn(groups, n, k, device="cuda", generator=gen, dtype=tdtype).transpose(1, 2)
    As = list(A.split(ms_list))
    Bs = list(B3.unbind(0))

    # (i) the Python loop of torch.matmul (into slices of one output, so it allocates nothing)
    loop_out = torch.full((total_m, n), float("nan"), device="cuda", dtype=tdtype)
    loop_Ds = list(loop_out.split(ms_list))

    def loop():
        for a, b, d in zip(As, Bs, loop_Ds):
            torch.matmul(a, b, out=d)

    loop()
    torch.cuda.synchronize()
    reference = loop_out.clone()
    loop_ms = bench_ms(loop)

    # (ii) torch._grouped_mm, where this torch, GPU and dtype support it
    grouped_mm = {"ms": None, "note": "n/a"}
    fn = getattr(torch, "_grouped_mm", None)
    if fn is None:
        grouped_mm["note"] = "n/a: torch has no _grouped_mm"
    else:
        offs = torch.tensor(np.cumsum(ms_list), dtype=torch.int32, device="cuda")
        try:
            out = fn(A, B3, offs=offs)
            torch.cuda.synchronize()
            error = _relative_error(out, reference)
            if error < tol:
                # only bfloat16 runs torch's CUTLASS kernel; other types loop over the groups on the host
                note = "ok" if tdtype is torch.bfloat16 else "ok (torch's host loop over the groups: not a kernel)"
                grouped_mm = {"ms": bench_ms(lambda: fn(A, B3, offs=offs)), "note": note, "rel_err": error}
            else:
                grouped_mm = {"ms": None, "note": f"n/a: wrong result (rel err {error:.2e})", "rel_err": error}
            del out
        except Exception as error:  # noqa: BLE001 - layouts/dtypes/GPUs it does not support: report n/a
            grouped_mm["note"] = f"n/a: {type(error).__name__}: {str(error).splitlines()[0][:160]}"

    rows, best = [], {}
    out = torch.empty((total_m, n), device="cuda", dtype=tdtype)
    Ds = list(out.split(ms_list))
    for label, ops in ops_by_mode.items():
        for op in ops:
            out.fill_(float("nan"))
            arguments = GemmGroupedArguments(op, problems, As, Bs, None, Ds)
            op.run(arguments)
            arguments.sync()
            error = _relative_error(out, reference)
            ok = error < tol
            ms = bench_ms(lambda: op.run(arguments)) if ok else float("nan")
            row = {"case": case, "dtype": dtype, "scheduler": label,
                   "tile": _tile_name(op), "blocks": arguments.threadblock_count,
                   "us": ms * 1e3, "TFLOP/s": flops / ms / 1e9 if ok else 0.0,
                   "vs loop": loop_ms / ms if ok else 0.0, "rel_err": error, "correct": ok}
            rows.append(row)
            if args.verbose:
                print(row, flush=True)
            if ok and (label not in best or ms < best[label][1]):
                best[label] = (op, ms, row)
            del arguments

    summary = {"case": case, "dtype": dtype, "problems": groups, "GFLOP": flops / 1e9,
               "loop us": loop_ms * 1e3, "loop TFLOP/s": flops / loop_ms / 1e9,
               "_grouped_mm us": grouped_mm["ms"] * 1e3 if grouped_mm["ms"] else "n/a",
               "_grouped_mm TFLOP/s": flops / grouped_mm["ms"] / 1e9 if grouped_mm["ms"] else "n/a"}
    for label in LABELS:
        if label in best:
            op, ms, row = best[label]
            summary[f"{label} tile"] = row["tile"]
            summary[f"{label} us"] = ms * 1e3
            summary[f"{label} TFLOP/s"] = flops / ms / 1e9
            summary[f"{label} vs loop"] = loop_ms / ms
            summary[f"{label} new args us"] = _us_with_new_arguments(op, problems, As, Bs, Ds, args.repeats)
            if grouped_mm["ms"]:
                summary[f"{label} vs _grouped_mm"] = grouped_mm["ms"] / ms
        elif label in ops_by_mode:
            summary[f"{label} tile"] = "none correct"
    if "SM90" in best and not args.no_device_sizes:
        op = best["SM90"][0]
        try:
            summary.update(_sm90_device_sizes(op, ms_list, A, B3, out, reference, tol, loop_ms, grouped_mm["ms"],
                                              flops))
        except Exception as error:  # noqa: BLE001 - report, keep the rest of the benchmark
            summary["SM90 device-sizes note"] = f"failed: {type(error).__name__}: {str(error)[:200]}"
    speedups = [loop_ms / ms for _, ms, _ in best.values()]
    summary["best vs loop"] = max(speedups) if speedups else 0.0
    if case == TARGET_CASE:
        summary["target >= 2x"] = "met" if summary["best vs loop"] >= TARGET_SPEEDUP else "NOT met"
    if grouped_mm["note"] != "ok":
        summary["_grouped_mm note"] = grouped_mm["note"]
    elif "rel_err" in grouped_mm:
        summary["_grouped_mm rel_err"] = grouped_mm["rel_err"]
    print(summary, flush=True)
    del A, B3, As, Bs, loop_out, loop_Ds, reference, out, Ds
    torch.cuda.empty_cache()
    return rows, summary


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help=f"only the case '{TARGET_CASE}'")
    parser.add_argument("--moe", action="store_true", help=f"only the case '{MOE_CASE}'")
    parser.add_argument("--dtypes", nargs="*", default=None, choices=list(DTYPES))
    parser.add_argument("--families", nargs="*", default=["sm80", "sm90"], choices=["sm80", "sm90"],
                        help="sm80: the CUTLASS 2.x grouped kernel (Host and Device); sm90: the pointer-array kernel")
    parser.add_argument("--jobs", type=int, default=min(6, os.cpu_count() or 1))
    parser.add_argument("--repeats", type=int, default=20, help="samples of the 'new args' timing")
    parser.add_argument("--out", help="JSON output (default: benchmarks/results/grouped_gemm.json, from any directory)",
                        default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "results", "grouped_gemm.json"))
    parser.add_argument("--verbose", action="store_true")
    parser.add_argument("--no-device-sizes", action="store_true",
                        help="skip the SM90 device-sizes / CUDA-graph rows (on by default for the best SM90 tile)")
    args = parser.parse_args()
    if cutlass.compiler.target.detected_compute_capability() is None:
        print("no GPU: benchmarks/grouped_gemm.py needs the GPU host (tests/gpu/precompile.py can compile its "
              "operations here)")
        return
    import torch

    cutlass.get_memory_pool(2**28, 2**34)
    by_key = {}
    if "sm80" in args.families:
        by_key.update({(name, mode.value): ops for (name, mode), ops in grid(args.dtypes).items()})
    if "sm90" in args.families and cutlass.compiler.target.detected_compute_capability() == 90:
        by_key.update(sm90_grid(args.dtypes))
    start = time.perf_counter()
    cutlass.compiler.add_module([op for ops in by_key.values() for op in ops], jobs=args.jobs)
    print(f"grid compile/load: {time.perf_counter() - start:.1f} s ({cutlass.compiler.last_report()})", flush=True)
    signature = _grouped_mm_signature()
    print(f"torch {torch.__version__}, torch._grouped_mm: {signature}", flush=True)

    rows, summaries = [], []
    cases = [TARGET_CASE] if args.quick else [MOE_CASE] if args.moe else list(CASES)
    for case in cases:
        for dtype in CASE_DTYPES.get(case, DTYPES):
            if args.dtypes and dtype not in args.dtypes:
                continue
            ops_by_mode = {label: ops for (name, label), ops in by_key.items() if name == dtype}
            case_rows, summary = run_case(case, dtype, ops_by_mode, args)
            rows += case_rows
            summaries.append(summary)

    print(f"\n# Grouped GEMM benchmark on {device_name()} (torch {torch.__version__})")
    print_table("Every kernel (us: median of op.run with prepared arguments)", rows)
    print_table(f"Best tile per scheduler vs the torch.matmul loop and torch._grouped_mm "
                f"(target: >= {TARGET_SPEEDUP:g}x the loop on '{TARGET_CASE}'; loop {H100_LOOP_US} us on an H100)",
                summaries)
    write_json(args.out, {"torch": torch.__version__, "grouped_mm_signature": signature,
                          "cases": {name: {"M": ms, "N": n, "K": k} for name, (ms, n, k) in CASES.items()
                                    if name in cases},
                          "sm90_tiles": [list(map(list, t[:2])) + [t[2]] for t in SM90_TILES],
                          "target": {"case": TARGET_CASE, "speedup_vs_loop": TARGET_SPEEDUP,
                                     "h100_loop_us": H100_LOOP_US},
                          "summary": summaries, "kernels": rows})


if __name__ == "__main__":
    main()
