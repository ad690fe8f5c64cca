"""Compile speed on this machine: one f16 TensorOp GEMM 128x128x32 (3 stages) cold through nvcc and NVRTC, four
such operations in one add_module call, and a warm load from the disk cache in a fresh process.

    python benchmarks/compile.py [--repeats 2] [--out benchmarks/results/compile.json]

Targets (2-core machine): nvcc <= 8 s, NVRTC <= 5 s, four operations <= 1.6x one. The deprecated predecessor needs
16.2 s for one such GEMM (cubin plus a separately compiled host library).
"""
from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from common import print_table, write_json  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

CHILD = r"""
import sys, time
t0 = time.perf_counter()
import pycutlass as cutlass
t_import = time.perf_counter() - t0
backend, count = sys.argv[1], int(sys.argv[2])
getattr(cutlass.compiler, backend)()
cutlass.compiler.set_target_arch(90)
D = cutlass.DataType
math = cutlass.MathInstruction([16, 8, 16], D.float16, D.float16, D.float32, cutlass.OpClass.TensorOp,
                               cutlass.MathOperation.multiply_add)
ops = []
for i, swizzle in enumerate([cutlass.IdentitySwizzle1, cutlass.IdentitySwizzle2, cutlass.IdentitySwizzle4,
                             cutlass.IdentitySwizzle8][:count]):
    tile = cutlass.TileDescription([128, 128, 32], 3, [2, 2, 1], math)
    A = cutlass.TensorDescription(D.float16, cutlass.RowMajor, 8)
    B = cutlass.TensorDescription(D.float16, cutlass.ColumnMajor, 8)
    C = cutlass.TensorDescription(D.float16, cutlass.RowMajor, 8)
    ops.append(cutlass.GemmOperationUniversal(80, tile, A, B, C,
                                              cutlass.LinearCombination(D.float16, 8, D.float32, D.float32), swizzle))
t1 = time.perf_counter()
cutlass.compiler.add_module(ops)
t2 = time.perf_counter()
r = cutlass.compiler.last_report()
print("RESULT", r.compiled, r.from_disk, t2 - t1, t_import)
"""


def run_child(backend: str, count: int, cache_dir: str, hide_nvcc: bool) -> tuple[int, int, float, float]:
    env = {**os.environ, "PYCUTLASS_CACHE_DIR": cache_dir}
    if hide_nvcc:  # NVRTC must work with pip packages only
        env["PATH"] = os.pathsep.join(p for p in env["PATH"].split(os.pathsep)
                                      if not os.path.exists(os.path.join(p, "nvcc")))
    out = subprocess.run([sys.executable, "-c", CHILD, backend, str(count)], env=env, cwd=ROOT, capture_output=True,
                         text=True)
    if out.returncode:
        raise RuntimeError(out.stderr[-3000:])
    line = [x for x in out.stdout.splitlines() if x.startswith("RESULT")][-1].split()
    return int(line[1]), int(line[2]), float(line[3]), float(line[4])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--out", help="JSON output (default: benchmarks/results/compile.json, from any directory)",
                        default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "results", "compile.json"))
    args = parser.parse_args()
    rows = []
    for backend in ("nvcc", "nvrtc"):
        cold1, cold4, warm, imports = [], [], [], []
        for _ in range(args.repeats):
            with tempfile.TemporaryDirectory() as cache:
                compiled, _, seconds, _ = run_child(backend, 1, cache, backend == "nvrtc")
                assert compiled == 1
                cold1.append(seconds)
                compiled, from_disk, seconds, imp = run_child(backend, 1, cache, backend == "nvrtc")
                assert compiled == 0 and from_disk == 1
                warm.append(seconds)
                imports.append(imp)
            with tempfile.TemporaryDirectory() as cache:
                compiled, _, seconds, _ = run_child(backend, 4, cache, backend == "nvrtc")
                assert compiled == 4
                cold4.append(seconds)
        one, four = statistics.median(cold1), statistics.median(cold4)
        target = 8.0 if backend == "nvcc" else 5.0
        rows.append({"backend": backend, "cold 1 op s": one, "target s": target, "met": one <= target,
                     "cold 4 ops s": four, "4/1 ratio": four / one, "ratio met (<=1.6)": four / one <= 1.6,
                     "warm load ms (fresh process)": statistics.median(warm) * 1e3,
                     "import pycutlass ms": statistics.median(imports) * 1e3, "runs": args.repeats})
        print(rows[-1], flush=True)
    print_table(f"Compile times on this machine ({os.cpu_count()} cores); predecessor: 16.2 s for one GEMM", rows)
    write_json(args.out, {"compile": rows, "cores": os.cpu_count()})


if __name__ == "__main__":
    main()
