"""A GEMM end to end, as the users' guide writes it: D = alpha * A @ B + beta * C, float16 on tensor cores.

    python examples/gemm_basic.py

1. describe the operation: MathInstruction -> TileDescription -> TensorDescription -> epilogue ->
   GemmOperationUniversal;
2. compile it with add_module (nvcc by default; the cubin is cached on disk, so the next run skips this);
3. run it on numpy arrays, then on torch tensors (when torch is installed), against a float64 reference.
"""
import numpy as np

import common
import pycutlass as cutlass

# --- 1. operation description ----------------------------------------------------------------------------------
math_inst = cutlass.MathInstruction(
    [16, 8, 16], cutlass.float16, cutlass.float16,
    cutlass.float32, cutlass.OpClass.TensorOp, cutlass.MathOperation.multiply_add)

tile_description = cutlass.TileDescription(
    [128, 128, 32], 3, [2, 2, 1], math_inst)  # threadblock tile M x N x K, pipeline stages, warps along M, N, K

A = cutlass.TensorDescription(cutlass.float16, cutlass.RowMajor, 8)  # element, layout, alignment (elements)
B = cutlass.TensorDescription(cutlass.float16, cutlass.ColumnMajor, 8)
C = cutlass.TensorDescription(cutlass.float16, cutlass.RowMajor, 8)

epilogue_functor = cutlass.LinearCombination(
    C.element, C.alignment, math_inst.element_accumulator, cutlass.float32)

operation = cutlass.GemmOperationUniversal(
    common.compute_capability(), tile_description, A, B, C, epilogue_functor, cutlass.IdentitySwizzle1)

# --- 2. compile (or load from the cache) ---------------------------------------------------------------------------
kernels = cutlass.compiler.add_module([operation])
common.stop_without_gpu(kernels)  # compiling needs no GPU; everything below does

# --- 3. run ----------------------------------------------------------------------------------------------------
cutlass.get_memory_pool(2**26, 2**30)  # an RMM pool for the device copies pycutlass makes

M, N, K = 1000, 520, 264  # N and K multiples of the alignment (8); M anything
alpha, beta = 1.5, 0.5
rng = np.random.default_rng(0)

# numpy: host arrays are copied to the GPU; sync() copies D back.
tensor_A = rng.standard_normal((M, K)).astype(np.float16)
tensor_B = rng.standard_normal((K, N)).astype(np.float16, order="F")  # column-major, like B's layout
tensor_C = rng.standard_normal((M, N)).astype(np.float16)
tensor_D = common.nan_array((M, N))

arguments = cutlass.GemmArguments(
    operation=operation, problem_size=cutlass.gemm.GemmCoord(M, N, K),
    A=tensor_A, B=tensor_B, C=tensor_C, D=tensor_D,
    output_op=operation.epilogue_type(alpha, beta),
    gemm_mode=cutlass.gemm.Mode.Gemm, split_k_slices=1)
operation.run(arguments)
arguments.sync()  # wait for the kernel, then copy D back into tensor_D

a, b, c = (t.astype(np.float64) for t in (tensor_A, tensor_B, tensor_C))
results = [common.check("numpy", tensor_D, alpha * (a @ b) + beta * c)]

# torch: CUDA tensors are used in place (their strides give the leading dimensions); nothing is copied.
try:
    import torch
except ImportError:
    torch = None
    print("torch is not installed: skipping the torch half")

if torch is not None:
    torch.manual_seed(0)
    tensor_A = torch.randn(M, K, device="cuda", dtype=torch.float16)
    tensor_B = torch.randn(N, K, device="cuda", dtype=torch.float16).t()  # a K x N column-major view
    tensor_C = torch.randn(M, N, device="cuda", dtype=torch.float16)
    tensor_D = torch.full((M, N), float("nan"), device="cuda", dtype=torch.float16)

    arguments = cutlass.GemmArguments(
        operation, cutlass.gemm.GemmCoord(M, N, K), tensor_A, tensor_B, tensor_C, tensor_D,
        operation.epilogue_type(alpha, beta), stream=torch.cuda.current_stream())
    operation.run(arguments)
    arguments.sync()  # wait for the stream (D is already on the GPU)

    a, b, c = (t.double().cpu().numpy() for t in (tensor_A, tensor_B, tensor_C))
    results.append(common.check("torch", tensor_D, alpha * (a @ b) + beta * c))

common.finish(results)
