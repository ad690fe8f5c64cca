"""A convolution layer's forward pass with bias and relu fused into the epilogue: y = relu(conv2d(x, w) + bias),
float16 NHWC on tensor cores (CUTLASS's implicit GEMM: M = N*P*Q, N = K, K = R*S*C).

    python examples/conv2d_fprop_bias_relu.py

1. describe a Conv2dOperation (fprop, optimized iterators) with a LinearCombinationGeneric(relu) epilogue;
2. compile it with add_module;
3. run it on numpy NHWC arrays, then on torch NCHW tensors in channels_last memory (when torch is installed),
   with a 1-D bias of K values passed as C and beta = 1 (broadcast over N, P and Q), against a float64 reference.
"""
import numpy as np

import common
import pycutlass as cutlass
from pycutlass.conv import Conv2dProblemSize, IteratorAlgorithm, Mode, Operator, StrideSupport

# --- 1. operation description ----------------------------------------------------------------------------------
math_inst = cutlass.MathInstruction([16, 8, 16], cutlass.float16, cutlass.float16, cutlass.float32,
                                    cutlass.OpClass.TensorOp, cutlass.MathOperation.multiply_add)
tile_description = cutlass.TileDescription([128, 128, 32], 3, [2, 2, 1], math_inst)

# A: the activation (NHWC), B: the filter (KRSC), C/D: the output (NPQK); 8 float16 = one 128-bit access, so
# the channel counts C and K must be multiples of 8.
A = cutlass.TensorDescription(cutlass.float16, cutlass.TensorNHWC, 8)
B = cutlass.TensorDescription(cutlass.float16, cutlass.TensorNHWC, 8)
C = cutlass.TensorDescription(cutlass.float16, cutlass.TensorNHWC, 8)

epilogue_functor = cutlass.LinearCombinationGeneric(
    cutlass.relu(cutlass.float32), C.element, C.alignment, math_inst.element_accumulator, cutlass.float32)

operation = cutlass.Conv2dOperation(
    conv_kind=Operator.fprop, iterator_algorithm=IteratorAlgorithm.optimized, arch=common.compute_capability(),
    tile_description=tile_description, A=A, B=B, C=C, stride_support=StrideSupport.Strided,
    epilogue_functor=epilogue_functor, swizzling_functor=cutlass.IdentitySwizzle1)

# --- 2. compile (or load from the cache) ---------------------------------------------------------------------------
kernels = cutlass.compiler.add_module([operation])
common.stop_without_gpu(kernels)

# --- 3. run ----------------------------------------------------------------------------------------------------
cutlass.get_memory_pool(2**26, 2**30)

N, H, W, C_in, K, R, S = 4, 28, 30, 64, 96, 3, 3
pad, stride = 1, 2
problem_size = Conv2dProblemSize(
    cutlass.Tensor4DCoord(N, H, W, C_in), cutlass.Tensor4DCoord(K, R, S, C_in),
    cutlass.Tensor4DCoord(pad, pad, pad, pad), cutlass.MatrixCoord(stride, stride), cutlass.MatrixCoord(1, 1),
    Mode.cross_correlation, 1, 1)
P, Q = problem_size.P, problem_size.Q  # 14 x 15


def conv2d_reference(x, w, pad, stride):
    """float64 NHWC x KRSC -> NPQK cross-correlation (what torch.nn.functional.conv2d computes)."""
    n, h, wd, c = x.shape
    k, r, s, _ = w.shape
    xp = np.pad(x, ((0, 0), (pad, pad), (pad, pad), (0, 0)))
    p, q = (h + 2 * pad - r) // stride + 1, (wd + 2 * pad - s) // stride + 1
    out = np.zeros((n, p, q, k))
    for i in range(r):
        for j in range(s):
            window = xp[:, i:i + stride * (p - 1) + 1:stride, j:j + stride * (q - 1) + 1:stride, :]  # (n, p, q, c)
            out += window @ w[:, i, j, :].T
    return out


rng = np.random.default_rng(0)
x = rng.standard_normal((N, H, W, C_in)).astype(np.float16)  # NHWC
w = (rng.standard_normal((K, R, S, C_in)) / np.sqrt(R * S * C_in)).astype(np.float16)  # KRSC
bias = rng.standard_normal(K).astype(np.float16)
y = common.nan_array((N, P, Q, K))  # NPQK

# numpy: host arrays are copied to the GPU; sync() copies y back. beta = 1 adds the bias (C) to every pixel.
arguments = cutlass.Conv2dArguments(operation, problem_size, x, w, bias, y, output_op=operation.epilogue_type(1.0, 1.0))
operation.run(arguments)
arguments.sync()

reference = np.maximum(conv2d_reference(x.astype(np.float64), w.astype(np.float64), pad, stride)
                       + bias.astype(np.float64), 0.0)
results = [common.check("numpy NHWC: relu(conv2d(x, w) + bias)", y, reference)]

# torch: NCHW tensors in channels_last memory (their strides are NHWC) are used in place.
try:
    import torch
except ImportError:
    torch = None
    print("torch is not installed: skipping the torch half")

if torch is not None:
    cl = torch.channels_last
    x_t = torch.from_numpy(x).permute(0, 3, 1, 2).cuda().contiguous(memory_format=cl)  # (N, C, H, W)
    w_t = torch.from_numpy(w).permute(0, 3, 1, 2).cuda().contiguous(memory_format=cl)  # (K, C, R, S)
    bias_t = torch.from_numpy(bias).cuda()
    y_t = torch.full((N, K, P, Q), float("nan"), device="cuda", dtype=torch.float16).contiguous(memory_format=cl)
    arguments = cutlass.Conv2dArguments(operation, problem_size, x_t, w_t, bias_t, y_t,
                                        output_op=operation.epilogue_type(1.0, 1.0),
                                        stream=torch.cuda.current_stream())
    operation.run(arguments)
    arguments.sync()
    results.append(common.check("torch channels_last: relu(conv2d(x, w) + bias)", y_t.permute(0, 2, 3, 1),
                                reference))

common.finish(results)
