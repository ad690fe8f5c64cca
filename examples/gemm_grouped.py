"""A grouped GEMM: several independent GEMMs of different sizes in one kernel launch, float16 on tensor cores.

    python examples/gemm_grouped.py                    # the Device scheduler
    python examples/gemm_grouped.py --scheduler Host   # the schedule precomputed once per arguments

D_i = alpha * A_i @ B_i + beta * C_i for every problem i. GemmOperationGrouped runs persistent thread blocks that
walk the output tiles of all the problems; the scheduler mode says who orders them (each warp on the fly, Device,
or a schedule written ahead into a workspace, Host). Every problem has its own M, N, K and its own tensors.
"""
import argparse

import numpy as np

import common
import pycutlass as cutlass
from pycutlass import GemmOperationGrouped, SchedulerMode
from pycutlass import GemmGroupedArguments

parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
parser.add_argument("--scheduler", choices=[m.value for m in SchedulerMode], default="Device")
args = parser.parse_args()

# --- 1. operation description: the same pieces as a GEMM, plus the scheduler mode --------------------------------
math_inst = cutlass.MathInstruction(
    [16, 8, 16], cutlass.float16, cutlass.float16,
    cutlass.float32, cutlass.OpClass.TensorOp, cutlass.MathOperation.multiply_add)
tile_description = cutlass.TileDescription([128, 128, 32], 3, [2, 2, 1], math_inst)
A = cutlass.TensorDescription(cutlass.float16, cutlass.RowMajor, 8)
B = cutlass.TensorDescription(cutlass.float16, cutlass.ColumnMajor, 8)
C = cutlass.TensorDescription(cutlass.float16, cutlass.RowMajor, 8)
epilogue_functor = cutlass.LinearCombination(C.element, C.alignment, math_inst.element_accumulator, cutlass.float32)

operation = GemmOperationGrouped(
    common.compute_capability(), tile_description, A, B, C, epilogue_functor, cutlass.IdentitySwizzle1,
    SchedulerMode(args.scheduler))

# --- 2. compile (or load from the cache) ---------------------------------------------------------------------------
kernels = cutlass.compiler.add_module([operation])
common.stop_without_gpu(kernels)  # compiling needs no GPU; everything below does

# --- 3. run on a group of problems of different sizes ----------------------------------------------------------------
cutlass.get_memory_pool(2**26, 2**30)

# N and K multiples of the alignment (8); M anything. A problem with M, N or K == 0 is allowed too.
problem_sizes = [cutlass.gemm.GemmCoord(777, 512, 128), cutlass.gemm.GemmCoord(96, 64, 256),
                 cutlass.gemm.GemmCoord(1000, 136, 72), cutlass.gemm.GemmCoord(8, 8, 8),
                 cutlass.gemm.GemmCoord(64, 256, 0)]  # K == 0: D = beta * C
alpha, beta = 1.5, 0.5
rng = np.random.default_rng(0)

# numpy arrays, one per problem (each in the operation's layouts); sync() copies every D back.
tensors_A = [rng.standard_normal((m, k)).astype(np.float16) for m, n, k in problem_sizes]
tensors_B = [rng.standard_normal((k, n)).astype(np.float16, order="F") for m, n, k in problem_sizes]  # column-major
tensors_C = [rng.standard_normal((m, n)).astype(np.float16) for m, n, k in problem_sizes]
tensors_D = [common.nan_array((m, n)) for m, n, k in problem_sizes]

arguments = GemmGroupedArguments(
    operation, problem_sizes, tensors_A, tensors_B, tensors_C, tensors_D,
    output_op=operation.epilogue_type(alpha, beta))  # one alpha/beta for the whole group
operation.run(arguments)
arguments.sync()
print(f"{len(problem_sizes)} problems, {arguments.tile_count} output tiles, "
      f"{arguments.threadblock_count} persistent blocks, {args.scheduler} scheduler")

results = []
for i, (a, b, c, d) in enumerate(zip(tensors_A, tensors_B, tensors_C, tensors_D)):
    a, b, c = (t.astype(np.float64) for t in (a, b, c))
    results.append(common.check(f"problem {i} {tuple(problem_sizes[i])}", d, alpha * (a @ b) + beta * c))

common.finish(results)
