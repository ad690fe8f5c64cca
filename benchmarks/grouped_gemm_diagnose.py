"""Where the SM90 grouped kernel's time goes on grouped_gemm.py's 64-problem case (bf16, N = 2048, K = 1024;
the goal there is 1.2x torch._grouped_mm, measured 1.02x). The same compiled kernels run:

  (a) the case: 64 groups, M 16..1024 (33,280 rows, 36,864 once each group is rounded up to 128-row tiles);
  (b) the same groups with M rounded up to 128: the same tiles, no partial ones (what the padding costs);
  (c) 64 equal groups of M 512 (256 full tiles), and (d) of M 520 (the case's rows, 320 tiles, each group's last
      tile nearly empty);
  (e) 8 groups of M 4160: an eighth of the B matrices (34 MB against 268 MB) and of the descriptor switches;
  (f) one group of M 33,280: no switch at all and one B (then torch.matmul on the same operands too).

A persistent CTA's consecutive tiles lie 132 tiles apart, so in (a)-(d) nearly every tile re-targets its TMA
descriptors; (e) and (f) say what that and the B traffic cost. Each output is checked against torch first
(NaN-poisoned); times are medians of do_bench (L2 flushed), torch._grouped_mm on the same tensors.

    python benchmarks/grouped_gemm_diagnose.py [--out benchmarks/results/grouped_gemm_diagnose.json]

``--case mixtral``: the same questions on Mixtral-8x7B's up projection (N = 14336, K = 4096, 16k routed rows), where
both grouped kernels (pycutlass's and torch._grouped_mm) run at 630-670 TFLOP/s on H200, below the 790-810 that
dense GEMMs of a few hundred microseconds reach: (g) the skewed routing of the MoE benchmark's set, (h) 8 equal
groups, (i) one group of all the rows, beside pycutlass's dense SM90 GEMM with the same tile (GemmOperationUniversal)
and torch.matmul on the same operands. If (i) runs at the dense kernels' rate the loss is in grouping; if not, in
the pointer-array kernel or in the length of the run (H200: they run as fast, power-limited).

    python benchmarks/grouped_gemm_diagnose.py [--case 64|mixtral] [--out ...]

H200 results: benchmarks/results/grouped_gemm_diagnose-{mixtral,64}-h200.json (RESULTS.md).
"""
from __future__ import annotations

import argparse
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import pycutlass as cutlass  # noqa: E402
from common import bench_ms, device_name, print_table, write_json  # noqa: E402
from pycutlass.tune.problems import routed_counts  # noqa: E402

D = cutlass.DataType
CASE = [int(m) // 8 * 8 for m in np.linspace(16, 1024, 64)]  # grouped_gemm.py's 64-problem case
MIXTRAL_16K = list(routed_counts(8, 16384))  # the MoE benchmark's draw for Mixtral at 16k tokens
CASES = {"64": (2048, 1024), "mixtral": (14336, 4096)}  # N, K
VARIANTS = {"64": {
    "(a) case: 64 groups, M 16..1024": CASE,
    "(b) 64 groups, M rounded up to 128": [-(-m // 128) * 128 for m in CASE],
    "(c) 64 equal groups, M 512": [512] * 64,
    "(d) 64 equal groups, M 520": [520] * 64,
    "(e) 8 groups, M 4160": [4160] * 8,
    "(f) 1 group, M 33280": [33280],
}, "mixtral": {
    "(g) 8 groups, skewed, 16384 rows": MIXTRAL_16K,
    "(h) 8 equal groups, M 2048": [2048] * 8,
    "(i) 1 group, M 16384": [16384],
}}
# grouped_gemm.py's two fastest SM90 tiles on the case (results/grouped_gemm-wide-h100.json)
CONFIGS = [((128, 256, 64), (1, 2, 1), "TmaWarpSpecializedCooperative"),
           ((128, 256, 64), (2, 1, 1), "TmaWarpSpecializedCooperative")]


def make_op(tile_shape, cluster, schedule, dense=False):
    e = D.bfloat16
    A = cutlass.TensorDescription(e, cutlass.RowMajor, 8)
    B = cutlass.TensorDescription(e, cutlass.ColumnMajor, 8)
    C = cutlass.TensorDescription(e, cutlass.RowMajor, 8)
    math = cutlass.MathInstruction([64, tile_shape[1], 16], e, e, D.float32, cutlass.OpClass.TensorOp)
    tile = cutlass.TileDescription(list(tile_shape), 0, None, math, cluster_shape=list(cluster),
                                   kernel_schedule=cutlass.KernelScheduleType[schedule])
    epilogue = cutlass.LinearCombination(e, 8, D.float32, D.float32)
    if dense:
        return cutlass.GemmOperationUniversal(90, tile, A, B, C, epilogue)
    return cutlass.GemmOperationGrouped(90, tile, A, B, C, epilogue)


def operations(dense: bool = True) -> list:
    """The benchmarked operations, grouped then (``dense``) the dense GEMMs of the same tiles (tests/gpu/precompile.py
    can compile them ahead of time)."""
    return [make_op(*config) for config in CONFIGS] + ([make_op(*config, dense=True) for config in CONFIGS]
                                                        if dense else [])


def label(config) -> str:
    (m, n, _), (cm, cn, _), _ = config
    return f"{m}x{n} c{cm}x{cn}"


def run_variant(name, ms_list, ops, dense_ops, N, K) -> dict:
    import torch

    groups, rows = len(ms_list), sum(ms_list)
    flops = 2.0 * rows * N * K
    gen = torch.Generator(device="cuda").manual_seed(0)
    A = torch.randn(rows, K, device="cuda", generator=gen, dtype=torch.bfloat16)
    B3 = torch.randn(groups, N, K, device="cuda", generator=gen, dtype=torch.bfloat16).transpose(1, 2)
    As, Bs = list(A.split(ms_list)), list(B3.unbind(0))
    offs = torch.tensor(np.cumsum(ms_list), dtype=torch.int32, device="cuda")
    reference = torch._grouped_mm(A, B3, offs=offs).float()
    grouped_mm = bench_ms(lambda: torch._grouped_mm(A, B3, offs=offs))
    row = {"variant": name, "groups": groups, "rows": rows, "_grouped_mm us": grouped_mm * 1e3}
    if groups == 1:
        matmul = bench_ms(lambda: torch.matmul(A, Bs[0]))
        row["torch.matmul us"] = matmul * 1e3
        row["torch.matmul TFLOP/s"] = flops / matmul / 1e9
    out = torch.empty(rows, N, device="cuda", dtype=torch.bfloat16)
    Ds = list(out.split(ms_list))
    problems = [cutlass.GemmCoord(m, N, K) for m in ms_list]

    def check_and_time(key, op, arguments):
        """Poison the output, run once, check against torch, then time: the row's entries under ``key``."""
        out.fill_(float("nan"))
        op.run(arguments)
        arguments.sync()
        error = float((out.float() - reference).norm() / reference.norm())
        if not error < 2e-2:  # NaN fails too
            row[f"{key} us"] = f"wrong (rel err {error:.2e})"
            return None
        ms = bench_ms(lambda: op.run(arguments))
        row[f"{key} us"] = ms * 1e3
        row[f"{key} TFLOP/s"] = flops / ms / 1e9
        return ms

    for op, config in zip(ops, CONFIGS):
        ms = check_and_time(label(config), op, cutlass.GemmGroupedArguments(op, problems, As, Bs, None, Ds))
        if ms is not None:
            row[f"{label(config)} vs _grouped_mm"] = grouped_mm / ms
    for op, config in zip(dense_ops if groups == 1 else [], CONFIGS):
        check_and_time(f"dense {label(config)}", op,
                       cutlass.GemmArguments(op, cutlass.GemmCoord(rows, N, K), A, Bs[0], out, out,
                                             output_op=op.epilogue_type(1.0, 0.0)))
    torch.cuda.empty_cache()
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "results",
                                                      "grouped_gemm_diagnose.json"))
    parser.add_argument("--case", choices=sorted(CASES), default="64")
    args = parser.parse_args()
    if cutlass.compiler.target.detected_compute_capability() != 90:
        print("benchmarks/grouped_gemm_diagnose.py needs an SM90 GPU (tests/gpu/precompile.py can compile its "
              "operations here)")
        return
    N, K = CASES[args.case]
    ops = operations(dense=args.case == "mixtral")
    print(cutlass.compiler.add_module(ops), flush=True)
    grouped, dense = ops[:len(CONFIGS)], ops[len(CONFIGS):]
    rows = []
    for name, ms_list in VARIANTS[args.case].items():
        rows.append(run_variant(name, ms_list, grouped, dense, N, K))
        print(rows[-1], flush=True)
    print_table(f"SM90 grouped kernel, bf16, N={N}, K={K}, on {device_name()}", rows)
    write_json(args.out, {"case": args.case, "N": N, "K": K, "variants": VARIANTS[args.case],
                          "configs": [label(c) for c in CONFIGS], "rows": rows})


if __name__ == "__main__":
    main()
