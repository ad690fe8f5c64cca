"""Search a grid of tile configurations for one GEMM shape: compile them all in parallel, then time each one.

    python examples/gemm_tile_grid.py                        # 4096 x 4096 x 4096, float16, the full grid
    python examples/gemm_tile_grid.py --shape 2048 8192 1024
    python examples/gemm_tile_grid.py --quick                # a 4-point grid: compiles in seconds

Invalid combinations (warp tiles that do not divide into instructions, too much shared memory, ...) are
rejected by TileDescription / GemmOperationUniversal (and one check of this example's own) with a
DescriptionError while the grid is built, before anything is compiled. The valid ones compile with
add_module(..., jobs=os.cpu_count()): the cache misses are split over that many translation units compiled in
parallel (and cached: a second run compiles nothing).
On a GPU each tile is checked once against a float64 reference (output poisoned with NaN first), then timed
with CUDA events (warm-up, then the median of repeats) and listed best first.
"""
import argparse
import itertools
import os
import time

import numpy as np
from tabulate import tabulate

import common
import pycutlass as cutlass

parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
parser.add_argument("--shape", type=int, nargs=3, default=[4096, 4096, 4096], metavar=("M", "N", "K"))
parser.add_argument("--quick", action="store_true", help="a 4-point grid (3 valid tiles), for a smoke test")
parser.add_argument("--repeats", type=int, default=10, help="timed repeats per tile (median reported)")
args = parser.parse_args()

if args.quick:
    threadblock_shapes = [(128, 128, 32), (128, 256, 64)]
    stage_counts = [3, 5]
    warp_counts = [(2, 4, 1)]
else:
    threadblock_shapes = [(64, 128, 32), (128, 64, 32), (128, 128, 32), (128, 256, 32), (256, 128, 32),
                          (64, 256, 32), (256, 64, 32), (64, 64, 64), (64, 128, 64), (128, 64, 64),
                          (128, 128, 64), (128, 256, 64), (256, 128, 64)]
    stage_counts = [3, 4, 5]
    warp_counts = [(2, 2, 1), (4, 2, 1), (2, 4, 1)]

# --- the grid: every valid (threadblock shape, stages, warps) ------------------------------------------------------
math_inst = cutlass.MathInstruction([16, 8, 16], cutlass.float16, cutlass.float16, cutlass.float32,
                                    cutlass.OpClass.TensorOp, cutlass.MathOperation.multiply_add)
A = cutlass.TensorDescription(cutlass.float16, cutlass.RowMajor, 8)
B = cutlass.TensorDescription(cutlass.float16, cutlass.ColumnMajor, 8)
C = cutlass.TensorDescription(cutlass.float16, cutlass.RowMajor, 8)
epilogue = cutlass.LinearCombination(C.element, C.alignment, cutlass.float32, cutlass.float32)
cc = common.compute_capability()


def build(shape, stages, warps):
    """One GEMM; raises DescriptionError for a configuration that cannot work."""
    tile = cutlass.TileDescription(shape, stages, warps, math_inst)  # rejects warp tiles not 32/64 wide
    if tile.warp_shape[0] > 64:
        # Valid, but warp tiles taller than 64 spill registers (far slower): not worth timing.
        raise cutlass.DescriptionError(f"warp tile {list(tile.warp_shape)}: taller than 64 rows, skipped")
    return cutlass.GemmOperationUniversal(cc, tile, A, B, C, epilogue)


operations, rejected = [], []
for shape, stages, warps in itertools.product(threadblock_shapes, stage_counts, warp_counts):
    try:
        operations.append(build(shape, stages, warps))
    except cutlass.DescriptionError as error:  # e.g. 128x256x64 with 5 stages needs 240 KiB of shared memory
        rejected.append(f"{list(shape)} s{stages} w{list(warps)}: {str(error).splitlines()[0]}")
print(f"{len(operations)} valid tile configurations, {len(rejected)} rejected, e.g.")
for reason in rejected[::max(1, len(rejected) // 3)][:3]:  # a few, spread over the grid
    print(f"  {reason}")

# --- compile them all, in parallel ----------------------------------------------------------------------------
start = time.perf_counter()
kernels = cutlass.compiler.add_module(operations, jobs=os.cpu_count())
report = cutlass.compiler.last_report()
print(f"add_module: {time.perf_counter() - start:.1f} s with jobs={os.cpu_count()} ({report.compiled} compiled, "
      f"{report.from_disk} from the disk cache, {report.from_memory} already loaded)")
common.stop_without_gpu(kernels)

# --- time each tile on the GPU ----------------------------------------------------------------------------------
from cuda.bindings import driver as cu  # noqa: E402  (CUDA events; torch.cuda.Event would do as well)


def cuda(result):
    """Unpack a cuda.bindings (error, value...) result, raising on error."""
    error, *values = result
    if error != cu.CUresult.CUDA_SUCCESS:
        raise RuntimeError(f"CUDA driver error {error!r}")
    return values[0] if values else None


def median_time_us(operation, arguments, repeats, launches=10):
    """Median over ``repeats`` of the mean time of ``launches`` back-to-back launches, after a warm-up."""
    begin, end = cuda(cu.cuEventCreate(0)), cuda(cu.cuEventCreate(0))
    for _ in range(3):
        operation.run(arguments)
    samples = []
    for _ in range(repeats):
        cuda(cu.cuEventRecord(begin, arguments.stream))
        for _ in range(launches):
            operation.run(arguments)
        cuda(cu.cuEventRecord(end, arguments.stream))
        cuda(cu.cuEventSynchronize(end))
        samples.append(cuda(cu.cuEventElapsedTime(begin, end)) * 1e3 / launches)
    cuda(cu.cuEventDestroy(begin))
    cuda(cu.cuEventDestroy(end))
    return float(np.median(samples))


cutlass.get_memory_pool(2**30, 2**34)
M, N, K = args.shape
rng = np.random.default_rng(0)
tensor_A = rng.standard_normal((M, K)).astype(np.float16)
tensor_B = rng.standard_normal((K, N)).astype(np.float16, order="F")
reference = tensor_A.astype(np.float64) @ tensor_B.astype(np.float64)
print(f"timing {len(operations)} tiles on {M} x {N} x {K} (float16, float32 accumulation)")

rows, results = [], []
for operation in operations:
    tensor_D = common.nan_array((M, N))
    arguments = cutlass.GemmArguments(operation, (M, N, K), tensor_A, tensor_B, None, tensor_D)  # beta = 0, no C
    operation.run(arguments)
    arguments.sync()  # copies D back into tensor_D
    error = common.relative_error(tensor_D, reference)
    results.append(error < common.TOLERANCE)
    us = median_time_us(operation, arguments, args.repeats)
    tile = operation.tile_description
    rows.append(("x".join(map(str, tile.threadblock_shape)), "x".join(map(str, tile.warp_count)), tile.stages,
                 us, 2 * M * N * K / us / 1e6, error, "ok" if results[-1] else "FAIL"))
    del arguments  # frees its device copies

rows.sort(key=lambda row: row[3])
print(tabulate(rows, headers=["tile", "warps", "stages", "time (us)", "TFLOP/s", "rel. error", "check"],
               floatfmt=("", "", "", ".1f", ".1f", ".1e")))
common.finish(results)
