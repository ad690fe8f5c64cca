"""fp8 grouped GEMM with per-group scales: pycutlass's SM90 grouped kernel (e4m3 operands, f32 accumulation, bf16
output, alpha[g] = scale_a[g] * scale_b[g] read on the device) against torch's grouped GEMMs on the same problems.

    python benchmarks/grouped_gemm_fp8.py [--cases moe 64] [--out benchmarks/results/grouped_gemm_fp8.json]

Cases (A row-major packed tokens, B column-major experts (groups, K, N), D row-major):
  moe: 128 experts, 4096 -> 14336, 8192 tokens routed top-2 by a skewed router (grouped_gemm.py's MoE case);
  64:  64 problems, M 16..1024, N = 2048, K = 1024 (grouped_gemm.py's target case).

Baselines, each checked against a float32 reference before it is timed:
  torch._scaled_grouped_mm: e4m3 with row-wise scales (scale_a per row = the group's scale_a, scale_b per column =
      the group's scale_b; the same product), fast accumulation as pycutlass's FP8FastAccum rows;
  torch._grouped_mm in bf16 on the dequantized operands (what a bf16 MoE layer pays).
pycutlass: a small grid of SM90 tiles (fast accumulation, and one tile with CUTLASS's promoting main loop), arguments
built once, per-group alphas as a float32 device tensor. Times are medians (common.bench_ms).
"""
from __future__ import annotations

import argparse
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import pycutlass as cutlass  # noqa: E402
from common import bench_ms, device_name, print_table, write_json  # noqa: E402
from grouped_gemm import moe_tokens  # noqa: E402

D, KS = cutlass.DataType, cutlass.KernelScheduleType
CASES = {
    "moe": ("MoE: 128 experts (skewed top-2 of 8192 tokens), 4096 -> 14336", moe_tokens(), 14336, 4096),
    "64": ("64 x (M 16..1024), N=2048, K=1024", [int(m) // 8 * 8 for m in np.linspace(16, 1024, 64)], 2048, 1024),
}
# (tile, cluster, kernel schedule)
TILES = [((128, 256, 128), (2, 1, 1), KS.TmaWarpSpecializedCooperativeFP8FastAccum),
         ((128, 128, 128), (1, 1, 1), KS.TmaWarpSpecializedCooperativeFP8FastAccum),
         ((256, 128, 128), (1, 1, 1), KS.TmaWarpSpecializedCooperativeFP8FastAccum),
         ((128, 128, 128), (2, 1, 1), KS.TmaWarpSpecializedPingpongFP8FastAccum),
         ((64, 128, 128), (1, 1, 1), KS.TmaWarpSpecializedPingpongFP8FastAccum),
         ((128, 256, 128), (2, 1, 1), KS.TmaWarpSpecializedCooperative)]
TOL = 2e-2  # bf16 output


def operations() -> list:
    ops = []
    for shape, cluster, schedule in TILES:
        math = cutlass.MathInstruction([64, shape[1], 32], D.float8_e4m3, D.float8_e4m3, D.float32,
                                       cutlass.OpClass.TensorOp)
        tile = cutlass.TileDescription(list(shape), 0, None, math, cluster_shape=list(cluster),
                                       kernel_schedule=schedule)
        ops.append(cutlass.GemmOperationGrouped(
            90, tile, cutlass.TensorDescription(D.float8_e4m3, cutlass.RowMajor, 16),
            cutlass.TensorDescription(D.float8_e4m3, cutlass.ColumnMajor, 16),
            cutlass.TensorDescription(D.bfloat16, cutlass.RowMajor, 8),
            cutlass.LinearCombination(D.bfloat16, 8, D.float32, D.float32)))
    return ops


def _name(op) -> str:
    tile = op.tile_description
    schedule = op.kernel_schedule.value.replace("TmaWarpSpecialized", "").replace("FP8FastAccum", "+fa")
    return f"{'x'.join(map(str, tile.threadblock_shape))}_c{tile.cluster_shape[0]}x{tile.cluster_shape[1]}_{schedule}"


def _relative_error(got, reference) -> float:
    import torch

    if not torch.isfinite(got).all().item():
        return float("inf")
    return ((got.float() - reference).norm() / reference.norm()).item()


def run_case(key: str, ops: list) -> tuple[list[dict], dict]:
    import torch

    title, ms_list, n, k = CASES[key]
    groups, total_m = len(ms_list), sum(ms_list)
    flops = float(sum(2 * m * n * k for m in ms_list))
    gen = torch.Generator(device="cuda").manual_seed(0)
    f8 = torch.float8_e4m3fn
    A = torch.randn(total_m, k, device="cuda", generator=gen, dtype=torch.bfloat16).to(f8)
    B3 = torch.randn(groups, n, k, device="cuda", generator=gen, dtype=torch.bfloat16).to(f8).transpose(1, 2)
    scale_a = torch.rand(groups, device="cuda", generator=gen) * 0.5 + 0.25
    scale_b = torch.rand(groups, device="cuda", generator=gen) * 0.05 + 0.01
    alpha = (scale_a * scale_b).contiguous()  # float32, one per group
    offsets = np.concatenate([[0], np.cumsum(ms_list)])

    # float32 reference, one group at a time (the MoE's B is 30 GB in float32)
    reference = torch.empty(total_m, n, device="cuda", dtype=torch.float32)
    for g in range(groups):
        rows = slice(int(offsets[g]), int(offsets[g + 1]))
        if rows.stop > rows.start:
            torch.matmul(A[rows].float(), B3[g].float(), out=reference[rows])
            reference[rows] *= alpha[g]
    torch.cuda.synchronize()

    summary = {"case": title, "problems": groups, "GFLOP": flops / 1e9}
    offs = torch.tensor(offsets[1:], dtype=torch.int32, device="cuda")
    # torch._scaled_grouped_mm with row-wise scales equal to the per-group ones
    fn = getattr(torch, "_scaled_grouped_mm", None)
    scaled_ms = None
    if fn is None:
        summary["_scaled_grouped_mm"] = "n/a: not in this torch"
    else:
        rows_scale = torch.repeat_interleave(scale_a, torch.tensor(ms_list, device="cuda"))
        cols_scale = scale_b[:, None].expand(groups, n).contiguous()
        try:
            def scaled():
                return fn(A, B3, rows_scale, cols_scale, offs=offs, out_dtype=torch.bfloat16, use_fast_accum=True)

            out = scaled()
            torch.cuda.synchronize()
            error = _relative_error(out, reference)
            summary["_scaled_grouped_mm rel_err"] = error
            if error < TOL:
                scaled_ms = bench_ms(scaled)
                summary["_scaled_grouped_mm us"] = scaled_ms * 1e3
                summary["_scaled_grouped_mm TFLOP/s"] = flops / scaled_ms / 1e9
            else:
                summary["_scaled_grouped_mm"] = f"n/a: wrong result (rel err {error:.2e})"
            del out
        except Exception as error:  # noqa: BLE001 - shapes/GPUs it does not support: report n/a
            summary["_scaled_grouped_mm"] = f"n/a: {type(error).__name__}: {str(error).splitlines()[0][:160]}"
    # torch._grouped_mm in bf16 (dequantized operands; the scales folded into A)
    bf16_ms = None
    grouped_mm = getattr(torch, "_grouped_mm", None)
    if grouped_mm is not None:
        A16 = (A.float() * torch.repeat_interleave(alpha, torch.tensor(ms_list, device="cuda"))[:, None]).bfloat16()
        B16 = B3.to(torch.bfloat16)
        out = grouped_mm(A16, B16, offs=offs)
        torch.cuda.synchronize()
        error = _relative_error(out, reference)
        summary["bf16 _grouped_mm rel_err"] = error
        if error < TOL:
            bf16_ms = bench_ms(lambda: grouped_mm(A16, B16, offs=offs))
            summary["bf16 _grouped_mm us"] = bf16_ms * 1e3
        del out, A16, B16
        torch.cuda.empty_cache()

    rows, best = [], None
    out = torch.empty(total_m, n, device="cuda", dtype=torch.bfloat16)
    As, Bs, Ds = list(A.split(ms_list)), list(B3.unbind(0)), list(out.split(ms_list))
    problems = [cutlass.GemmCoord(m, n, k) for m in ms_list]
    for op in ops:
        out.fill_(float("nan"))
        arguments = cutlass.GemmGroupedArguments(op, problems, As, Bs, None, Ds,
                                                 op.epilogue_type(1.0, 0.0), alpha=alpha)
        op.run(arguments)
        arguments.sync()
        error = _relative_error(out, reference)
        ok = error < TOL
        ms = bench_ms(lambda: op.run(arguments)) if ok else float("nan")
        row = {"case": title, "tile": _name(op), "us": ms * 1e3, "TFLOP/s": flops / ms / 1e9 if ok else 0.0,
               "rel_err": error, "correct": ok}
        if scaled_ms:
            row["vs _scaled_grouped_mm"] = scaled_ms / ms if ok else 0.0
        if bf16_ms:
            row["vs bf16 _grouped_mm"] = bf16_ms / ms if ok else 0.0
        rows.append(row)
        if ok and (best is None or ms < best[1]):
            best = (op, ms)
        del arguments
    if best:
        op, ms = best
        summary.update({"pycutlass tile": _name(op), "pycutlass us": ms * 1e3, "pycutlass TFLOP/s": flops / ms / 1e9})
        if scaled_ms:
            summary["pycutlass vs _scaled_grouped_mm"] = scaled_ms / ms
        if bf16_ms:
            summary["pycutlass vs bf16 _grouped_mm"] = bf16_ms / ms
    print(summary, flush=True)
    del A, B3, reference, out, As, Bs, Ds
    torch.cuda.empty_cache()
    return rows, summary


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cases", nargs="*", default=list(CASES), choices=list(CASES))
    parser.add_argument("--jobs", type=int, default=min(6, os.cpu_count() or 1))
    parser.add_argument("--out", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "results",
                                                      "grouped_gemm_fp8.json"))
    args = parser.parse_args()
    if cutlass.compiler.target.detected_compute_capability() != 90:
        print("benchmarks/grouped_gemm_fp8.py needs an SM90 GPU")
        return
    import torch

    cutlass.get_memory_pool(2**28, 2**34)
    ops = operations()
    start = time.perf_counter()
    cutlass.compiler.add_module(ops, jobs=args.jobs)
    print(f"compile/load: {time.perf_counter() - start:.1f} s ({cutlass.compiler.last_report()})", flush=True)
    rows, summaries = [], []
    for key in args.cases:
        case_rows, summary = run_case(key, ops)
        rows += case_rows
        summaries.append(summary)
    print(f"\n# fp8 grouped GEMM with per-group scales on {device_name()} (torch {torch.__version__})")
    print_table("Every pycutlass tile (bf16 out, us: median of op.run with prepared arguments)", rows)
    print_table("Best tile against torch", summaries)
    write_json(args.out, {"torch": torch.__version__, "tiles": [_name(op) for op in ops], "summary": summaries,
                          "kernels": rows})


if __name__ == "__main__":
    main()
