"""GEMM with bias and activation fused into the epilogue: D = activation(A @ B + bias), float16.

    python examples/gemm_bias_activation.py                     # gelu
    python examples/gemm_bias_activation.py --activation leaky_relu --leaky-slope 0.2

LinearCombinationGeneric computes D = activation(alpha * accumulator + beta * C). A 1-D bias of length N passed
as C, with beta = 1, is broadcast over the rows: its leading dimension is 0, so every row reads the same N values.
"""
import argparse

import numpy as np

import common
import pycutlass as cutlass
from pycutlass.epilogue.activations import reference as activation_reference  # float64 formulas

ACTIVATIONS = {"relu": cutlass.relu, "leaky_relu": cutlass.leaky_relu, "tanh": cutlass.tanh,
               "sigmoid": cutlass.sigmoid, "silu": cutlass.silu, "hardswish": cutlass.hardswish, "gelu": cutlass.gelu,
               "gelu_taylor": cutlass.gelu_taylor}

parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
parser.add_argument("--activation", choices=ACTIVATIONS, default="gelu")
parser.add_argument("--leaky-slope", type=float, default=0.1, help="negative slope of leaky_relu")
args = parser.parse_args()

math_inst = cutlass.MathInstruction([16, 8, 16], cutlass.float16, cutlass.float16, cutlass.float32,
                                    cutlass.OpClass.TensorOp, cutlass.MathOperation.multiply_add)
tile_description = cutlass.TileDescription([128, 128, 32], 3, [2, 2, 1], math_inst)
A = cutlass.TensorDescription(cutlass.float16, cutlass.RowMajor, 8)
B = cutlass.TensorDescription(cutlass.float16, cutlass.ColumnMajor, 8)
C = cutlass.TensorDescription(cutlass.float16, cutlass.RowMajor, 8)

activation = ACTIVATIONS[args.activation](cutlass.float32)  # the activation, computed in float32
epilogue_functor = cutlass.LinearCombinationGeneric(
    activation, C.element, C.alignment, math_inst.element_accumulator, cutlass.float32)
operation = cutlass.GemmOperationUniversal(
    common.compute_capability(), tile_description, A, B, C, epilogue_functor)

kernels = cutlass.compiler.add_module([operation])
common.stop_without_gpu(kernels)

cutlass.get_memory_pool(2**26, 2**30)
M, N, K = 777, 512, 256
rng = np.random.default_rng(0)
tensor_A = rng.standard_normal((M, K)).astype(np.float16)
tensor_B = rng.standard_normal((K, N)).astype(np.float16, order="F")
bias = rng.standard_normal(N).astype(np.float16)  # one value per output column
tensor_D = common.nan_array((M, N))

activation_args = [args.leaky_slope] if activation.num_arguments else []  # only leaky_relu takes one
arguments = cutlass.GemmArguments(
    operation, cutlass.gemm.GemmCoord(M, N, K), tensor_A, tensor_B, bias, tensor_D,
    output_op=operation.epilogue_type(1.0, 1.0, *activation_args))  # alpha, beta, the activation's arguments
operation.run(arguments)
arguments.sync()

x = tensor_A.astype(np.float64) @ tensor_B.astype(np.float64) + bias.astype(np.float64)  # bias over rows
reference = activation_reference(args.activation, x, *activation_args)
common.finish([common.check(f"A @ B + bias, then {args.activation}", tensor_D, reference)])
