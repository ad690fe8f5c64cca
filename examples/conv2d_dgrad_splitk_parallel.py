"""Data gradient (dgrad) of a convolution with parallel split-K: dx = alpha * conv2d_input(dy, w) + beta * C.

    python examples/conv2d_dgrad_splitk_parallel.py

dgrad is the implicit GEMM M = N*H*W, N = C, K = R*S*K. A deep layer at batch 1 (here 14x14 pixels, 1024 output
channels) has few output tiles and a long K: parallel split-K cuts K into slices that separate thread blocks
multiply, then a second kernel sums them. Two operations:
- the dgrad Conv2dOperation (StrideSupport.Unity: stride 1), with a float32 C so the partial sums stay exact; with
  SplitKMode.Parallel it writes ``split_k_slices`` packed float32 copies of dx (NHWC) to a workspace owned by its
  Conv2dArguments;
- a ReductionOperation that sums the slices, viewed as (N*H*W) x C row-major matrices, and applies the epilogue:
  dx = alpha * sum + beta * C in float16.
"""
import numpy as np

import common
import pycutlass as cutlass
from pycutlass.conv import Conv2dProblemSize, IteratorAlgorithm, Mode, Operator, SplitKMode, StrideSupport

cc = common.compute_capability()
math_inst = cutlass.MathInstruction([16, 8, 16], cutlass.float16, cutlass.float16, cutlass.float32,
                                    cutlass.OpClass.TensorOp, cutlass.MathOperation.multiply_add)
tile_description = cutlass.TileDescription([128, 128, 32], 3, [2, 2, 1], math_inst)
A = cutlass.TensorDescription(cutlass.float16, cutlass.TensorNHWC, 8)  # dy, NPQK
B = cutlass.TensorDescription(cutlass.float16, cutlass.TensorNHWC, 8)  # w, KRSC

# The convolution writes float32 partial sums: its C is float32 (4 floats = one 128-bit access), its epilogue plain.
partials = cutlass.TensorDescription(cutlass.float32, cutlass.TensorNHWC, 4)
plain = cutlass.LinearCombination(cutlass.float32, 4, cutlass.float32, cutlass.float32)
dgrad = cutlass.Conv2dOperation(Operator.dgrad, IteratorAlgorithm.optimized, cc, tile_description, A, B, partials,
                                StrideSupport.Unity, plain, cutlass.IdentitySwizzle1)

# The reduction reads float32 slices and writes float16 dx; each thread handles `count` (8) channels of a row.
C = cutlass.TensorDescription(cutlass.float16, cutlass.RowMajor, 8)
reduction = cutlass.ReductionOperation(
    shape=cutlass.MatrixCoord(4, 32 * 8), C=C, element_accumulator=cutlass.float32,
    element_workspace=cutlass.float32, element_compute=cutlass.float32, count=8, arch=cc)

kernels = cutlass.compiler.add_module([dgrad, reduction])  # one translation unit, one cubin
common.stop_without_gpu(kernels)

cutlass.get_memory_pool(2**26, 2**30)
N, H, W, C_in, K, R, S, pad = 1, 14, 14, 64, 1024, 3, 3, 1
slices = 8
alpha, beta = 1.0, 0.5
problem_size = Conv2dProblemSize(
    cutlass.Tensor4DCoord(N, H, W, C_in), cutlass.Tensor4DCoord(K, R, S, C_in),
    cutlass.Tensor4DCoord(pad, pad, pad, pad), cutlass.MatrixCoord(1, 1), cutlass.MatrixCoord(1, 1),
    Mode.cross_correlation, slices, 1)
P, Q = problem_size.P, problem_size.Q  # 14 x 14

rng = np.random.default_rng(0)
grad_output = rng.standard_normal((N, P, Q, K)).astype(np.float16)  # dy, NPQK
w = (rng.standard_normal((K, R, S, C_in)) / np.sqrt(R * S * K)).astype(np.float16)  # KRSC
tensor_C = rng.standard_normal((N, H, W, C_in)).astype(np.float16)  # NHWC
grad_input = common.nan_array((N, H, W, C_in))  # dx, NHWC

# 1. the convolution: alpha = 1 and beta = 0 are forced; C and D belong to the reduction (pass None here).
dgrad_arguments = cutlass.Conv2dArguments(dgrad, problem_size, grad_output, w, None, None,
                                          split_k_mode=SplitKMode.Parallel, split_k_slices=slices)
dgrad.run(dgrad_arguments)

# 2. the reduction, on the convolution's stream, over the workspace its arguments own. A packed NHWC tensor is an
# (N*H*W) x C row-major matrix; numpy's reshape of a contiguous array is a view, so sync() writes into grad_input.
M, N_gemm = dgrad_arguments.reduction_problem_size  # (N*H*W, C)
reduction_arguments = cutlass.ReductionArguments(
    reduction, [M, N_gemm], slices, dgrad_arguments, grad_input.reshape(M, N_gemm), tensor_C.reshape(M, N_gemm),
    output_op=reduction.epilogue_type(alpha, beta), partition_stride=dgrad_arguments.partition_stride)
reduction.run(reduction_arguments)
reduction_arguments.sync()


def conv2d_input_reference(dy, w, input_shape, pad, stride=1):
    """float64 gradient of a cross-correlation with respect to its NHWC input (torch.nn.grad.conv2d_input)."""
    n, h, wd, c = input_shape
    k, r, s, _ = w.shape
    p, q = dy.shape[1:3]
    dxp = np.zeros((n, h + 2 * pad, wd + 2 * pad, c))
    for i in range(r):
        for j in range(s):  # output pixel (p, q) read input pixel (p * stride + i, q * stride + j) of the padded x
            dxp[:, i:i + stride * (p - 1) + 1:stride, j:j + stride * (q - 1) + 1:stride, :] += dy @ w[:, i, j, :]
    return dxp[:, pad:pad + h, pad:pad + wd, :]


reference = alpha * conv2d_input_reference(grad_output.astype(np.float64), w.astype(np.float64),
                                           (N, H, W, C_in), pad) + beta * tensor_C.astype(np.float64)
common.finish([common.check(f"dgrad, parallel split-K x{slices} + reduction", grad_input, reference)])
