"""What zeroing stream-K's workspace costs: the whole workspace before every launch against only its
barriers (what CUTLASS's initialize_workspace zeroes, and what run() does).

    python benchmarks/stream_k_workspace.py [--out benchmarks/results/stream_k_workspace.json]

f16, the gemm_sm90 grid's 128x128 stream-K configuration, each shape with K split 2 and 4 ways and with stream-K's
own decomposition; every variant is checked against torch before it is timed, then both variants and
``torch.matmul`` are timed in interleaved rounds (order rotated each round; median of triton's do_bench, L2 flushed).
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import pycutlass as cutlass  # noqa: E402
from pycutlass.runtime import driver  # noqa: E402

from common import bench_ms, device_name, print_table, write_json  # noqa: E402
from gemm_sm90 import operations, stream_k_op  # noqa: E402

SHAPES = [(16, 4096, 4096), (64, 14336, 4096), (128, 4096, 14336), (1024, 1024, 1024), (1000, 3000, 520)]
RUNS = [dict(split_k_slices=2, decomposition="split_k"), dict(split_k_slices=4, decomposition="split_k"),
        dict(decomposition="stream_k")]
ROUNDS = 5


def zero_all(arguments) -> None:
    """The old before_launch: the whole workspace."""
    driver.memset_d8(arguments.workspace, 0, arguments.workspace_bytes, arguments.stream)


def main() -> None:
    import torch

    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--out", default="benchmarks/results/stream_k_workspace.json")
    args = parser.parse_args()
    op = stream_k_op(operations(("f16",))["f16"])
    cutlass.compiler.add_module([op])
    rows = []
    for m, n, k in SHAPES:
        A = torch.randn(m, k, device="cuda", dtype=torch.float16)
        B = torch.randn(n, k, device="cuda", dtype=torch.float16).t()  # ColumnMajor (K, N), as the grid's
        reference = A @ B
        for knobs in RUNS:
            D_ = torch.full((m, n), float("nan"), device="cuda", dtype=torch.float16)
            arguments = cutlass.GemmArguments(op, cutlass.gemm.GemmCoord(m, n, k), A, B, None, D_,
                                              output_op=op.epilogue_type(1.0, 0.0), **knobs)
            launch = arguments.prepared()

            def barriers_only():
                op.run(arguments)

            def whole():  # the old run(): zero everything, then the same launch
                zero_all(arguments)
                launch.launch(arguments.stream)

            errors = []
            for fn in (barriers_only, whole):
                D_.fill_(float("nan"))
                fn()
                torch.cuda.synchronize()
                errors.append(((D_.double() - reference.double()).norm() / reference.double().norm()).item())
            ok = all(e < 1e-2 for e in errors)
            fns = [lambda: torch.matmul(A, B), barriers_only, whole]
            ms = [[] for _ in fns]
            for r in range(ROUNDS if ok else 0):
                order = list(range(len(fns)))
                order = order[r % len(order):] + order[:r % len(order)]
                for i in order:
                    ms[i].append(bench_ms(fns[i], warmup_ms=10, rep_ms=60))
            med = [statistics.median(x) * 1000 if x else float("nan") for x in ms]
            rows.append({"shape": f"{m}x{n}x{k}", "run": f"{knobs.get('decomposition')} "
                         f"{knobs.get('split_k_slices', '')}".strip(),
                         "workspace KB": launch.workspace_bytes / 1024,
                         "zeroed KB now": launch.workspace_zero_bytes / 1024,
                         "torch us": med[0], "barriers only us": med[1], "whole workspace us": med[2],
                         "saved us": med[2] - med[1], "correct": ok})
            print(rows[-1], flush=True)
    print_table(f"stream-K workspace zeroing, f16 128x128 stream-K, {device_name()}", rows)
    write_json(args.out, {"device": device_name(), "rows": rows})


if __name__ == "__main__":
    main()
