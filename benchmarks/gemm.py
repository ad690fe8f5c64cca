"""GEMM throughput against torch.matmul (cuBLAS), host overhead of run(), and compile / warm-load times.

    python benchmarks/gemm.py [--quick] [--out benchmarks/results/gemm.json]

For each data type a small grid of tiles runs on each shape; the best tile is compared with cuBLAS.
Every kernel's output is checked once against torch (NaN-poisoned first) before it is timed.
"""
from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import pycutlass as cutlass  # noqa: E402
from common import bench_ms, device_name, host_us, print_table, write_json  # noqa: E402

D = cutlass.DataType
MO = cutlass.MathOperation
SHAPES = [(4096, 4096, 4096), (8192, 8192, 8192), (2048, 14336, 4096), (1024, 1024, 1024)]

# dtype -> (instruction, element, math operation, alignment, tiles [(threadblock, stages, warps)], tolerance)
GRIDS = {
    "f16": ([16, 8, 16], D.float16, MO.multiply_add, 8,
            [([128, 128, 32], 3, [2, 2, 1]), ([128, 128, 32], 4, [2, 2, 1]), ([128, 256, 32], 3, [2, 4, 1]),
             ([256, 128, 32], 3, [4, 2, 1]), ([128, 128, 64], 3, [2, 2, 1]), ([128, 256, 64], 3, [2, 4, 1]),
             ([256, 128, 64], 3, [4, 2, 1]), ([64, 256, 32], 4, [1, 4, 1])], 1e-2),
    "bf16": ([16, 8, 16], D.bfloat16, MO.multiply_add, 8,
             [([128, 128, 32], 4, [2, 2, 1]), ([128, 256, 32], 3, [2, 4, 1]), ([256, 128, 32], 3, [4, 2, 1]),
              ([128, 256, 64], 3, [2, 4, 1]), ([256, 128, 64], 3, [4, 2, 1])], 2e-2),
    "tf32": ([16, 8, 8], D.tfloat32, MO.multiply_add, 4,
             [([128, 128, 32], 3, [2, 2, 1]), ([128, 256, 32], 3, [2, 4, 1]), ([256, 128, 32], 3, [4, 2, 1]),
              ([128, 128, 16], 5, [2, 2, 1])], 1e-2),
    "f32 (3xTF32)": ([16, 8, 8], D.float32, MO.multiply_add_fast_f32, 4,
                     [([128, 128, 32], 3, [2, 2, 1]), ([128, 256, 32], 3, [2, 4, 1]),
                      ([256, 128, 32], 3, [4, 2, 1])], 1e-4),
    "f32 (SIMT)": ([1, 1, 1], D.float32, MO.multiply_add, 1,
                   [([128, 128, 8], 4, [4, 2, 1]), ([128, 256, 8], 3, [4, 4, 1])], 1e-4),
}
SWIZZLES = {"f16": [cutlass.IdentitySwizzle1, cutlass.IdentitySwizzle8]}


def operations(dtypes=None) -> dict[str, list]:
    """The benchmarked operations, also used to precompile them elsewhere (tests/gpu/precompile.py)."""
    ops = {}
    for name, (inst, element, math_op, align, tiles, _) in GRIDS.items():
        if dtypes and name not in dtypes:
            continue
        opclass = cutlass.OpClass.Simt if inst == [1, 1, 1] else cutlass.OpClass.TensorOp
        math = cutlass.MathInstruction(inst, element, element, D.float32, opclass, math_op)
        storage = D.float32 if element is D.tfloat32 else element
        out_align = min(align, 128 // storage.bits)
        A = cutlass.TensorDescription(storage, cutlass.RowMajor, align)
        B = cutlass.TensorDescription(storage, cutlass.ColumnMajor, align)
        C = cutlass.TensorDescription(storage, cutlass.RowMajor, out_align)
        epilogue = cutlass.LinearCombination(storage, out_align, D.float32, D.float32)
        ops[name] = []
        for shape, stages, warps in tiles:
            for swizzle in SWIZZLES.get(name, [cutlass.IdentitySwizzle8]):
                try:
                    tile = cutlass.TileDescription(shape, stages, warps, math)
                    ops[name].append(cutlass.GemmOperationUniversal(80, tile, A, B, C, epilogue, swizzle))
                except cutlass.DescriptionError as error:
                    print(f"skip {name} {shape} s{stages}: {error}")
    return ops


def all_operations():
    return [op for ops in operations().values() for op in ops]


def _torch_dtype(element):
    import torch

    return {D.float16: torch.float16, D.bfloat16: torch.bfloat16, D.float32: torch.float32}[element]


def throughput(args) -> list[dict]:
    import torch

    rows = []
    torch.backends.cuda.matmul.allow_tf32 = False
    for name, ops in operations(args.dtypes).items():
        storage = ops[0].A.element
        tol = GRIDS[name][5]
        for m, n, k in (SHAPES[:1] if args.quick else SHAPES):
            gen = torch.Generator(device="cuda").manual_seed(0)
            a = torch.randn(m, k, device="cuda", generator=gen).to(_torch_dtype(storage))
            b = torch.randn(n, k, device="cuda", generator=gen).to(_torch_dtype(storage)).t()  # column-major B
            d = torch.full((m, n), float("nan"), device="cuda", dtype=a.dtype)
            flops = 2.0 * m * n * k
            if name.startswith("tf32"):
                torch.backends.cuda.matmul.allow_tf32 = True
            reference = torch.matmul(a, b)
            cublas_ms = bench_ms(lambda: torch.matmul(a, b))
            torch.backends.cuda.matmul.allow_tf32 = False
            exact = (a.double() @ b.double())
            best = None
            for op in ops:
                d.fill_(float("nan"))
                arguments = cutlass.GemmArguments(op, (m, n, k), a, b, None, d)
                op.run(arguments)
                arguments.sync()
                error = ((d.double() - exact).norm() / exact.norm()).item()
                ok = error < tol and not torch.isnan(d).any().item()
                ms = bench_ms(lambda: op.run(arguments)) if ok else float("nan")
                row = {"dtype": name, "M": m, "N": n, "K": k, "tile": op.tile_description.procedural_name(),
                       "swizzle": op.swizzling_functor.name, "ms": ms, "TFLOP/s": flops / ms / 1e9 if ok else 0.0,
                       "rel_err": error, "correct": ok}
                if args.verbose:
                    print(row, flush=True)
                if ok and (best is None or ms < best["ms"]):
                    best = row
                del arguments
            cublas_error = ((reference.double() - exact).norm() / exact.norm()).item()
            rows.append({"dtype": name, "shape": f"{m}x{n}x{k}", "best tile": best["tile"] if best else "-",
                         "swizzle": best["swizzle"] if best else "-",
                         "pycutlass TFLOP/s": best["TFLOP/s"] if best else 0.0,
                         "cuBLAS TFLOP/s": flops / cublas_ms / 1e9,
                         "ratio": (best["TFLOP/s"] / (flops / cublas_ms / 1e9)) if best else 0.0,
                         "pycutlass err": best["rel_err"] if best else float("nan"), "cuBLAS err": cublas_error})
            print(rows[-1], flush=True)
    return rows


def host_overhead() -> list[dict]:
    """Host microseconds per call: run() with reused arguments, and new Arguments for a seen problem + run(), for
    GEMM, grouped GEMM and conv. New arguments cycle through several tensor sets, so every call binds other
    addresses (the Params are patched, not rebuilt: the builder-launch count over the loop is reported)."""
    import torch

    def tensors(*shapes, sets=8):
        return [[torch.randn(*shape, device="cuda").half() for shape in shapes] for _ in range(sets)]

    op = operations(["f16"])["f16"][0]
    pool = tensors((128, 128), (128, 128), (128, 128))
    a, b, d = pool[0]
    arguments = cutlass.GemmArguments(op, (128, 128, 128), a, b.t(), None, d)
    op.run(arguments)
    arguments.sync()
    rows = [{"what": "GEMM: op.run(arguments), arguments reused (128^3)", "host us": host_us(lambda: op.run(arguments))}]
    torch.cuda.synchronize()
    rows.append(_new_arguments_row("GEMM: GemmArguments(new tensors, seen shape) + op.run (128^3)", op, pool,
                                   lambda a, b, d: cutlass.GemmArguments(op, (128, 128, 128), a, b.t(), None, d)))

    grouped = cutlass.GemmOperationGrouped(90, op.tile_description, op.A, op.B, op.C, op.epilogue_functor)
    problems = [cutlass.gemm.GemmCoord(64 + 16 * (i % 8), 256, 128) for i in range(16)]
    grouped_pool = []
    for _ in range(4):
        grouped_pool.append([[torch.randn(p.m(), p.k(), device="cuda").half() for p in problems],
                             [torch.randn(p.n(), p.k(), device="cuda").half().t() for p in problems],
                             [torch.empty(p.m(), p.n(), device="cuda").half() for p in problems]])
    rows.append(_new_arguments_row(
        "grouped: GemmGroupedArguments(16 problems, new tensors) + op.run", grouped, grouped_pool,
        lambda As, Bs, Ds: cutlass.GemmGroupedArguments(grouped, problems, As, Bs, None, Ds), repeats=200))

    conv_tile = cutlass.TileDescription([128, 128, 64], 3, [2, 2, 1], op.tile_description.math_instruction)
    nhwc = cutlass.TensorDescription(cutlass.float16, cutlass.TensorNHWC, 8)
    conv = cutlass.Conv2dOperation(cutlass.conv.Operator.fprop, cutlass.IteratorAlgorithm.optimized, 90, conv_tile,
                                   nhwc, nhwc, nhwc, cutlass.StrideSupport.Strided, op.epilogue_functor)
    problem = cutlass.Conv2dProblemSize(cutlass.Tensor4DCoord(8, 14, 14, 64), cutlass.Tensor4DCoord(64, 3, 3, 64),
                                        cutlass.Tensor4DCoord(1, 1, 1, 1), cutlass.MatrixCoord(1, 1),
                                        cutlass.MatrixCoord(1, 1), cutlass.conv.Mode.cross_correlation, 1, 1)
    conv_pool = tensors((8, 14, 14, 64), (64, 3, 3, 64), (8, 14, 14, 64))
    rows.append(_new_arguments_row("conv2d: Conv2dArguments(new tensors, seen problem) + op.run (3x3, 64 ch)",
                                   conv, conv_pool,
                                   lambda x, w, y: cutlass.Conv2dArguments(conv, problem, x, w, None, y)))
    rows.append({"what": "torch.mm 128^3 (for reference)", "host us": host_us(lambda: torch.mm(a, b))})
    torch.cuda.synchronize()
    return rows


def _new_arguments_row(what, op, pool, make, repeats=1000) -> dict:
    import itertools

    import torch

    from pycutlass.runtime.launch import loaded

    cutlass.compiler.add_module([op])
    first = make(*pool[0])  # the first sight of this problem builds Params on the device
    op.run(first)
    torch.cuda.synchronize()
    loaded_op = loaded(op, first.device, first.session)
    sets = itertools.cycle(pool)
    before = loaded_op.builder_launches

    def build_and_run():
        op.run(make(*next(sets)))

    us = host_us(build_and_run, repeats=repeats)
    torch.cuda.synchronize()
    return {"what": what, "host us": us, "builder launches in loop": loaded_op.builder_launches - before}


def compile_and_load() -> list[dict]:
    """Cold compile of one f16 128x128x32 s3 GEMM per backend (fresh cache), then warm load in a fresh process."""
    import tempfile

    rows = []
    code = ("import time,sys; t=time.perf_counter(); import pycutlass as c; sys.path.insert(0,'benchmarks'); "
            "import gemm; op=gemm.operations(['f16'])['f16'][0]; getattr(c.compiler, sys.argv[1])(); "
            "t1=time.perf_counter(); c.compiler.add_module([op]); t2=time.perf_counter(); "
            "a=c.GemmArguments(op, (128, 128, 128), *[__import__('numpy').zeros((128, 128), 'float16')] * 2, None, "
            "__import__('numpy').zeros((128, 128), 'float16')); t3=time.perf_counter(); "
            "r=c.compiler.last_report(); print('RESULT', r.compiled, r.from_disk, t2-t1, t3-t2, t1-t)")
    for backend in ("nvcc", "nvrtc"):
        with tempfile.TemporaryDirectory() as cache:
            env = {**os.environ, "PYCUTLASS_CACHE_DIR": cache}
            for phase in ("cold compile", "warm load (fresh process)"):
                out = subprocess.run([sys.executable, "-c", code, backend], env=env, capture_output=True, text=True,
                                     cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
                if out.returncode:
                    rows.append({"backend": backend, "phase": phase, "error": out.stderr[-500:]})
                    continue
                fields = next((line.split()[1:] for line in reversed(out.stdout.splitlines())
                               if line.startswith("RESULT ")), [])
                if len(fields) != 5:
                    rows.append({"backend": backend, "phase": phase, "error": (out.stdout + out.stderr)[-300:]})
                    continue
                compiled, from_disk, seconds, load, imp = fields
                rows.append({"backend": backend, "phase": phase, "compiled": int(compiled),
                             "from cache": int(from_disk), "add_module ms": float(seconds) * 1e3,
                             "module load ms": float(load) * 1e3, "import ms": float(imp) * 1e3})
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true", help="first shape only")
    parser.add_argument("--dtypes", nargs="*", default=None, choices=list(GRIDS))
    parser.add_argument("--jobs", type=int, default=min(6, os.cpu_count() or 1))
    parser.add_argument("--out", help="JSON output (default: benchmarks/results/gemm.json, from any directory)",
                        default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "results", "gemm.json"))
    parser.add_argument("--sections", nargs="*", default=["throughput", "host_overhead", "compile"],
                        choices=["throughput", "host_overhead", "compile"])
    parser.add_argument("--verbose", action="store_true")
    args = parser.parse_args()
    from pycutlass.compiler.target import detected_compute_capability

    if detected_compute_capability() is None:
        print("no GPU: benchmarks/gemm.py needs the GPU host (see benchmarks/compile.py for compile times here)")
        return
    cutlass.get_memory_pool(2**30, 2**36)
    start = time.perf_counter()
    cutlass.compiler.add_module([op for ops in operations(args.dtypes).values() for op in ops], jobs=args.jobs)
    print(f"grid compile/load: {time.perf_counter() - start:.1f} s ({cutlass.compiler.last_report()})")
    results = {}
    sections = [("throughput", "Best tile vs cuBLAS (torch.matmul)", lambda: throughput(args)),
                ("host_overhead", "Host overhead", host_overhead),
                ("compile", "Compile and warm load (GPU host)", compile_and_load)]
    for key, title, section in sections:
        if key not in args.sections:
            continue
        results[key] = section()
        print(f"\n# GEMM benchmark on {device_name()}")
        print_table(title, results[key])
        write_json(args.out, results)  # after every section, so a late failure loses nothing


if __name__ == "__main__":
    main()
