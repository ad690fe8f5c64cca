"""Parallel split-K: cut K into slices that separate thread blocks multiply, then sum the slices in a second kernel.

    python examples/gemm_splitk_parallel.py

Worth it when M x N is small and K is long (too few output tiles to fill the GPU). Two operations:
- the GEMM, with a float32 C (its partial products stay exact): in Mode.GemmSplitKParallel it writes
  ``split_k_slices`` packed M x N float32 slices to a workspace owned by its GemmArguments;
- a ReductionOperation that sums the slices and applies the epilogue: D = alpha * sum + beta * C, in float16.
"""
import numpy as np

import common
import pycutlass as cutlass

cc = common.compute_capability()
math_inst = cutlass.MathInstruction([16, 8, 16], cutlass.float16, cutlass.float16, cutlass.float32,
                                    cutlass.OpClass.TensorOp, cutlass.MathOperation.multiply_add)
tile_description = cutlass.TileDescription([128, 128, 32], 3, [2, 2, 1], math_inst)
A = cutlass.TensorDescription(cutlass.float16, cutlass.RowMajor, 8)
B = cutlass.TensorDescription(cutlass.float16, cutlass.ColumnMajor, 8)

# The GEMM writes float32 partial sums: its C is float32 (4 floats = one 128-bit access) and its epilogue plain.
partials = cutlass.TensorDescription(cutlass.float32, cutlass.RowMajor, 4)
plain = cutlass.LinearCombination(cutlass.float32, 4, cutlass.float32, cutlass.float32)
gemm = cutlass.GemmOperationUniversal(cc, tile_description, A, B, partials, plain)

# The reduction reads float32 slices and writes float16 D; each of its threads handles `count` (8) elements of a
# row, a block covers `shape` (4 rows x 256 columns). Its epilogue defaults to LinearCombination(C, count, ...).
C = cutlass.TensorDescription(cutlass.float16, cutlass.RowMajor, 8)
reduction = cutlass.ReductionOperation(
    shape=cutlass.MatrixCoord(4, 32 * 8), C=C, element_accumulator=cutlass.float32,
    element_workspace=cutlass.float32, element_compute=cutlass.float32, count=8, arch=cc)

kernels = cutlass.compiler.add_module([gemm, reduction])  # one translation unit, one cubin
common.stop_without_gpu(kernels)

cutlass.get_memory_pool(2**26, 2**30)
M, N, K, slices = 256, 512, 8192, 4
alpha, beta = 2.0, 0.5
rng = np.random.default_rng(0)
tensor_A = rng.standard_normal((M, K)).astype(np.float16)
tensor_B = rng.standard_normal((K, N)).astype(np.float16, order="F")
tensor_C = rng.standard_normal((M, N)).astype(np.float16)
tensor_D = common.nan_array((M, N))

# 1. the GEMM: alpha = 1 and beta = 0 are forced; C and D only give shapes here (the reduction uses them).
gemm_arguments = cutlass.GemmArguments(
    gemm, cutlass.gemm.GemmCoord(M, N, K), tensor_A, tensor_B, tensor_C, tensor_D,
    gemm_mode=cutlass.gemm.Mode.GemmSplitKParallel, split_k_slices=slices)
gemm.run(gemm_arguments)

# 2. the reduction, on the GEMM's stream, over the workspace those arguments own (gemm_arguments.ptr_D).
reduction_arguments = cutlass.ReductionArguments(
    reduction, [M, N], slices, gemm_arguments, tensor_D, tensor_C,
    output_op=reduction.epilogue_type(alpha, beta))
reduction.run(reduction_arguments)
reduction_arguments.sync()  # the reduction's arguments hold D: sync them (not the GEMM's) to get D back

a, b, c = (t.astype(np.float64) for t in (tensor_A, tensor_B, tensor_C))
common.finish([common.check(f"split-K x{slices} + reduction", tensor_D, alpha * (a @ b) + beta * c)])
