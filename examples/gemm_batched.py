"""Many GEMMs of one shape in a single launch: Mode.Batched (3-D tensors) and Mode.Array (lists of matrices).

    python examples/gemm_batched.py

Batched: each operand is one tensor of `batch` matrices a fixed stride apart (the stride is read from the 3-D
tensor). Array: each operand is a list of `batch` separate matrices (pycutlass uploads an array of their
addresses); they only need to share a leading dimension. The operation uses the BatchedIdentitySwizzle, as the
users' guide suggests for both modes; each matrix of the batch gets its own slice of the grid (z).
"""
import numpy as np

import common
import pycutlass as cutlass

math_inst = cutlass.MathInstruction([16, 8, 16], cutlass.float16, cutlass.float16, cutlass.float32,
                                    cutlass.OpClass.TensorOp, cutlass.MathOperation.multiply_add)
tile_description = cutlass.TileDescription([128, 128, 32], 3, [2, 2, 1], math_inst)
A = cutlass.TensorDescription(cutlass.float16, cutlass.RowMajor, 8)
B = cutlass.TensorDescription(cutlass.float16, cutlass.RowMajor, 8)
C = cutlass.TensorDescription(cutlass.float16, cutlass.RowMajor, 8)
epilogue_functor = cutlass.LinearCombination(C.element, C.alignment, cutlass.float32, cutlass.float32)
operation = cutlass.GemmOperationUniversal(common.compute_capability(), tile_description, A, B, C,
                                           epilogue_functor, cutlass.BatchedIdentitySwizzle)

kernels = cutlass.compiler.add_module([operation])
common.stop_without_gpu(kernels)

cutlass.get_memory_pool(2**26, 2**30)
batch, M, N, K = 6, 300, 256, 128
alpha, beta = 1.0, -1.0
rng = np.random.default_rng(0)
f16 = np.float16


def reference(a, b, c):
    return alpha * np.matmul(np.asarray(a, np.float64), np.asarray(b, np.float64)) + beta * np.asarray(c, np.float64)


# Mode.Batched: (batch, rows, cols) tensors.
tensor_A = rng.standard_normal((batch, M, K)).astype(f16)
tensor_B = rng.standard_normal((batch, K, N)).astype(f16)
tensor_C = rng.standard_normal((batch, M, N)).astype(f16)
tensor_D = common.nan_array((batch, M, N))
arguments = cutlass.GemmArguments(
    operation, cutlass.gemm.GemmCoord(M, N, K), tensor_A, tensor_B, tensor_C, tensor_D,
    operation.epilogue_type(alpha, beta), gemm_mode=cutlass.gemm.Mode.Batched, batch=batch)
operation.run(arguments)
arguments.sync()
results = [common.check("Batched (3-D tensors)", tensor_D, reference(tensor_A, tensor_B, tensor_C))]

# Mode.Array: lists of batch (rows, cols) matrices, each its own allocation.
list_A = [rng.standard_normal((M, K)).astype(f16) for _ in range(batch)]
list_B = [rng.standard_normal((K, N)).astype(f16) for _ in range(batch)]
list_C = [rng.standard_normal((M, N)).astype(f16) for _ in range(batch)]
list_D = [common.nan_array((M, N)) for _ in range(batch)]
arguments = cutlass.GemmArguments(
    operation, cutlass.gemm.GemmCoord(M, N, K), list_A, list_B, list_C, list_D,
    operation.epilogue_type(alpha, beta), gemm_mode=cutlass.gemm.Mode.Array, batch=batch)
operation.run(arguments)
arguments.sync()  # copies every D matrix back
results.append(common.check("Array (lists of matrices)", np.stack(list_D), reference(list_A, list_B, list_C)))

common.finish(results)
