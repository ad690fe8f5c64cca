"""Compile the GPU suites' operations ahead of time (e.g. on a CPU machine) into a cache file to carry along.

    PYCUTLASS_CACHE_DIR=.gpucache python -m tests.gpu.precompile [--arch 90] [--jobs 2]
"""
from __future__ import annotations

import argparse
import importlib
import importlib.util
import time

import pycutlass as cutlass

SUITES = {"tests.gpu.test_gemm": (("NVCC_OPS", "nvcc"), ("NVRTC_OPS", "nvrtc")),
          "tests.gpu.test_runtime": (("OPS", "nvcc"),),
          "tests.gpu.test_reduction": (("OPS", "nvcc"), ("NVRTC_OPS", "nvrtc")),
          "tests.gpu.test_evt": (("NVRTC_OPS", "nvrtc"),),
          "tests.gpu.test_gemm_sm90": (("OPS", "nvrtc"),),
          "tests.gpu.test_gemm_sm90_blockwise": (("OPS", "nvrtc"),),
          "benchmarks/gemm_sm90.py": (("all_operations", "nvrtc"),),
          "tests.gpu.test_validation_relaxed": (("NVCC_OPS", "nvcc"), ("NVRTC_OPS", "nvrtc")),
          "tests.gpu.test_acceptance_defects": (("OPS", "nvcc"),),
          "tests.gpu.test_f64_activations": (("NVCC_OPS", "nvcc"), ("NVRTC_OPS", "nvrtc")),
          "benchmarks/gemm.py": (("all_operations", "nvcc"),),
          "tests.gpu.test_gemm_grouped": (("GROUPED_OPS", "nvcc"), ("NVRTC_OPS", "nvrtc")),
          "tests.gpu.test_gemm_grouped_sm90": (("OPS", "nvrtc"), ("BIAS_OPS", "nvrtc"), ("CLAMP_OPS", "nvrtc")),
          "tests.gpu.test_gemm_grouped_sm90_fp8": (("OPS", "nvrtc"), ("ROWWISE_OPS", "nvrtc")),
          "tests.gpu.test_gemm_grouped_sm90_blockwise": (("OPS", "nvrtc"),),
          "tests.gpu.test_gemm_array_sm90": (("OPS", "nvrtc"),),
          "tests.gpu.test_sm90_epilogue_tile": (("GEMM_OPS", "nvrtc"), ("GROUPED_OPS", "nvrtc"),
                                                ("ARRAY_OPS", "nvrtc")),
          "benchmarks/grouped_gemm.py": (("operations", "nvcc"), ("sm90_operations", "nvrtc")),
          "benchmarks/grouped_gemm_diagnose.py": (("operations", "nvrtc"),),
          "tests.gpu.test_conv2d": (("NVCC_OPS", "nvcc"), ("NVRTC_OPS", "nvrtc")),
          "tests.gpu.test_conv2d_sm90": (("NVCC_OPS", "nvcc"), ("ALL_OPS", "nvrtc")),
          "tests.gpu.test_conv2d_sm90_drawn": (("DRAWN", "nvrtc"),),
          "tests.gpu.test_fp8_scales_drawn": (("BLOCKWISE", "nvrtc"), ("ROWWISE", "nvrtc")),
          "tests.gpu.test_gemm_sm90_drawn": (("DRAWN", "nvrtc"),),
          "tests.gpu.test_overlap": (("OPS", "nvrtc"),),
          "tests.gpu.test_tune": (("GROUPED_OPS", "nvcc"), ("CONV_OPS", "nvcc")),
          "benchmarks/conv2d.py": (("operations", "nvcc"), ("sm90_operations", "nvrtc"))}


def _load(suite: str):
    if suite.endswith(".py"):  # benchmark scripts are not a package
        import sys
        from pathlib import Path

        path = Path(suite).resolve()
        sys.path.insert(0, str(path.parent))
        spec = importlib.util.spec_from_file_location(path.stem, path)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        return module
    return importlib.import_module(suite)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--arch", type=int, default=90)
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--chunk", type=int, default=12, help="operations per add_module call")
    parser.add_argument("suites", nargs="*", default=list(SUITES))
    args = parser.parse_args()
    cutlass.compiler.set_target_arch(args.arch)
    cutlass.session.current().set_option("progress", False)
    for suite in args.suites:
        module = _load(suite)
        for attribute, backend in SUITES[suite]:
            ops = getattr(module, attribute)
            ops = ops() if callable(ops) else ops
            ops = list(dict.fromkeys(ops.values() if isinstance(ops, dict) else ops))
            cutlass.compiler.nvrtc() if backend == "nvrtc" else cutlass.compiler.nvcc()
            for i in range(0, len(ops), args.chunk):
                chunk = ops[i:i + args.chunk]
                start = time.perf_counter()
                try:
                    cutlass.compiler.add_module(chunk, jobs=args.jobs)
                    status = "ok"
                except cutlass.CompilationError as error:
                    status = f"FAILED: {str(error)[:3000]}"
                report = cutlass.compiler.last_report()
                print(f"{suite}.{attribute}[{i}:{i + len(chunk)}] {backend}: compiled {report.compiled}, "
                      f"cached {report.from_disk}, {time.perf_counter() - start:.1f} s {status}", flush=True)


if __name__ == "__main__":
    main()
