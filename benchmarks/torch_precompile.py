"""Compile the kernels pycutlass.torch will tune for the models of benchmarks/torch_models.py and
tests/gpu/test_torch.py ahead of time (e.g. on a CPU machine), into the artifact cache PYCUTLASS_CACHE_DIR names.

    PYCUTLASS_CACHE_DIR=build/pc python benchmarks/torch_precompile.py [--arch 90] [--jobs 2]
"""
from __future__ import annotations

import argparse
import time

from pycutlass.compiler.manager import Compiler
from pycutlass.session import current
from pycutlass.torch.kernels import ConvClass, GemmClass, conv_candidates, gemm_candidates


def classes(cc: int):
    gemm = [GemmClass("float16", True, False, 8, "identity", True, False, cc),   # ResNet-50 fc
            GemmClass("bfloat16", True, False, 8, "identity", True, False, cc),  # qkv, projections, fc2
            GemmClass("bfloat16", True, False, 8, "gelu", True, False, cc)]      # fc1 + GELU
    conv = [ConvClass("float16", "fprop", 8, "relu", True, False, cc), ConvClass("float16", "fprop", 8, "identity",
                                                                                 True, False, cc)]
    return gemm, conv


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--arch", type=int, default=90)
    parser.add_argument("--jobs", type=int, default=None)
    parser.add_argument("--only", choices=("gemm", "conv"), default=None)
    args = parser.parse_args()
    gemm, conv = classes(args.arch)
    operations = []
    if args.only in (None, "conv"):
        operations += [op for cls in conv for _, op in conv_candidates(cls)]
    if args.only in (None, "gemm"):
        operations += [op for cls in gemm for _, op in gemm_candidates(cls)]
    start = time.perf_counter()
    report = Compiler.of(current()).add_module(operations, jobs=args.jobs, target=args.arch, errors="report")
    print(f"{len(operations)} operations, {len(report.failures)} failed units, {time.perf_counter() - start:.0f} s",
          flush=True)
    for ops, error in report.failures:
        print("FAILED", [op.name for op in ops], str(error)[:500])


if __name__ == "__main__":
    main()
