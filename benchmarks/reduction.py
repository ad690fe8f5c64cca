"""The split-K reduction alone, on the partial products the wgrad split-K candidates of benchmarks/conv2d.py write.

    python benchmarks/reduction.py [--out benchmarks/results/reduction-h200.json]
    python benchmarks/reduction.py --compile-only --target 90     # any host: compile into the kernel cache

Each case sums P float32 partitions of an M x N filter gradient into float16 (D = alpha * sum + beta * C). Each way
is checked against a float64 sum before it is timed, in one process with the tuning harness's kernel timer:
``auto`` is ``ReductionOperation``'s default, which spreads the partitions over thread groups ("lanes") of a block
while the grid is small; ``lanes L`` asks for L lanes (``partition_lanes=L``; 1 is CUTLASS's ReduceSplitK schedule:
each thread walks every partition); ``torch`` is ``partials.sum(0)`` and the epilogue in torch, for context.
"""
from __future__ import annotations

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import pycutlass as cutlass  # noqa: E402
from pycutlass import DataType as D  # noqa: E402

from common import device_name, print_table, write_json  # noqa: E402

# (label, M, N, partitions): the filter gradients (K x R*S*C) and split counts that won or ran in the H200 wgrad runs.
CASES = [("conv2_x 1x1 64->256, b32", 256, 64, 64), ("conv2_x 1x1 256->64, b32", 64, 256, 64),
         ("conv2_x 3x3 64->64, b32", 64, 576, 32), ("conv2_x 3x3 64->64, b128", 64, 576, 44),
         ("conv3_x 3x3 128->128, b128", 128, 1152, 29), ("conv3_x 1x1 512->128, b32", 128, 512, 16),
         ("conv4_x 1x1 256->1024, b32", 1024, 256, 4), ("conv4_x 3x3 256->256, b128", 256, 2304, 7),
         ("GEMM 4096x4096, split 4", 4096, 4096, 4)]
ALPHA, BETA = 1.0, 0.5
LANES = (1, 2, 4, 8)


def operations() -> dict[str, cutlass.ReductionOperation]:
    def reduction(**kwargs):
        return cutlass.ReductionOperation(cutlass.MatrixCoord(4, 32 * 8), cutlass.TensorDescription(
            D.float16, cutlass.RowMajor, 8), D.float32, D.float32, D.float32, count=8, **kwargs)

    return {"auto": reduction(), **{f"lanes {lanes}": reduction(partition_lanes=lanes) for lanes in LANES}}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "results",
                                                      "reduction.json"))
    parser.add_argument("--compile-only", action="store_true")
    parser.add_argument("--target", type=int, default=None)
    args = parser.parse_args()
    ops = operations()
    if args.compile_only:
        from common import compile_only

        compile_only(list(ops.values()), args.target)
        return
    if cutlass.compiler.target.detected_compute_capability() is None:
        print("no GPU: benchmarks/reduction.py needs a GPU (--compile-only compiles its kernels here)")
        return
    import torch

    from pycutlass.tune.bench import BenchConfig, GemmBench, summarize

    cutlass.get_memory_pool(2**28, 2**34)
    cutlass.compiler.add_module(list(ops.values()))
    bench = GemmBench(BenchConfig())
    rows = []
    for label, m, n, partitions in CASES:
        generator = torch.Generator(device="cuda").manual_seed(m * n + partitions)
        partials = torch.randn(partitions, m, n, device="cuda", generator=generator)
        c = torch.randn(m, n, device="cuda", generator=generator).half()
        reference = ALPHA * partials.double().sum(0) + BETA * c.double()
        timings = {}
        for name, op in ops.items():
            out = torch.full((m, n), float("nan"), device="cuda", dtype=torch.float16)
            arguments = cutlass.ReductionArguments(op, [m, n], partitions, partials.data_ptr(), out, c,
                                                   op.epilogue_type(ALPHA, BETA))
            op.run(arguments)
            arguments.sync()
            error = float((out.double() - reference).norm() / reference.norm())
            if not error < 2e-3:
                raise SystemExit(f"{label}: {name} is wrong (relative error {error:.2e})")
            timings[name] = summarize(bench.time(lambda i, op=op, a=arguments: op.run(a))[0])[0] * 1e6
            timings[name + " block"] = "x".join(map(str, arguments.prepared().block))
        out = torch.empty(m, n, device="cuda", dtype=torch.float16)

        def torch_reduction():  # ALPHA is 1
            torch.add(partials.sum(0), c, alpha=BETA, out=out)

        torch_reduction()
        torch.cuda.synchronize()
        assert float((out.double() - reference).norm() / reference.norm()) < 2e-3, label
        timings["torch"] = summarize(bench.time(lambda i: torch_reduction())[0])[0] * 1e6
        read_bytes = partitions * m * n * 4 + m * n * 2 * 2
        fixed = {name: timings[name] for name in ops if name != "auto"}
        best = min(fixed, key=fixed.get)
        rows.append({"case": label, "M x N": f"{m}x{n}", "partitions": partitions,
                     "auto us": round(timings["auto"], 2), "auto block": timings["auto block"],
                     **{f"{name} us": round(value, 2) for name, value in fixed.items()},
                     "torch us": round(timings["torch"], 2),
                     "lanes 1 / auto": round(timings["lanes 1"] / timings["auto"], 3),
                     "best fixed / auto": round(fixed[best] / timings["auto"], 3), "best fixed": best,
                     "auto GB/s": round(read_bytes / timings["auto"] / 1e3, 1)})
    print(f"\n# Split-K reduction on {device_name()} (torch {torch.__version__}): f32 partials -> f16, kernel time")
    print_table("microseconds per reduction (median); ratios > 1: auto is faster", rows)
    write_json(args.out, {"torch": torch.__version__, "timer": "kernel", "alpha": ALPHA, "beta": BETA, "rows": rows})


if __name__ == "__main__":
    main()
