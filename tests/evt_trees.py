"""Epilogue visitor trees shared by the CPU and GPU EVT tests (PyCUTLASS 2.11's examples and one per node type), and
the operations of PyCUTLASS 2.11's four EVT invocations of run_all_example.sh."""
from __future__ import annotations

import pycutlass as cutlass
from pycutlass import EpilogueVisitTree, reduction_op
from pycutlass.gemm import Mode
from pycutlass.epilogue import gelu, gelu_taylor, hardswish, leaky_relu, relu, sigmoid, silu, tanh

MATH = cutlass.MathInstruction([16, 8, 16], cutlass.float16, cutlass.float16, cutlass.float32,
                               cutlass.OpClass.TensorOp, cutlass.MathOperation.multiply_add)
TILE = cutlass.TileDescription([128, 128, 32], 3, [2, 2, 1], MATH)
A = cutlass.TensorDescription(cutlass.float16, cutlass.RowMajor, 8)
B = cutlass.TensorDescription(cutlass.float16, cutlass.ColumnMajor, 8)
C = cutlass.TensorDescription(cutlass.float16, cutlass.RowMajor, 8)
C32 = cutlass.TensorDescription(cutlass.float32, cutlass.RowMajor, 4)


class Linear_(EpilogueVisitTree):  # binary ops, scalars, aux load
    def __call__(self, accum: 'tensor', c: 'tensor', alpha: 'scalar', beta: 'scalar'):
        D = alpha * accum + beta * c
        return D


class Unary_(EpilogueVisitTree):  # PyCUTLASS 2.11's UnaryEpilogue_ and every activation
    def __call__(self, accum: 'tensor', c: 'tensor', alpha: 'scalar', beta: 'scalar'):
        T = leaky_relu.numpy(accum, 0.2)
        Z = alpha * T + beta * c
        U = relu.numpy(Z) + sigmoid.numpy(Z) - tanh.numpy(Z) * silu.numpy(Z) + hardswish.numpy(Z) / 2.0 + gelu.numpy(Z)
        U = U - gelu_taylor.numpy(Z) / 4.0
        return U


class RowBroadcast_(EpilogueVisitTree):  # row broadcast, aux store of an intermediate
    def __call__(self, accum: 'tensor', c: 'tensor', vector: 'row', alpha: 'scalar', beta: 'scalar'):
        T = accum + vector
        scale_T = alpha * T
        Z = relu.numpy(scale_T + beta * c)
        return Z, T


class ColumnBroadcast_(EpilogueVisitTree):  # column broadcast
    def __call__(self, accum: 'tensor', c: 'tensor', vector: 'column', alpha: 'scalar', beta: 'scalar'):
        T = accum + vector
        scale_T = leaky_relu.numpy(alpha * T, 0.2)
        Z = scale_T + beta * c
        return Z, T


class RowReduction_(EpilogueVisitTree):  # "row": sums over N, one value per row
    def __call__(self, accum: 'tensor', c: 'tensor', alpha: 'scalar', beta: 'scalar'):
        D = alpha * accum + tanh.numpy(beta * c)
        reduction = reduction_op(D, "row", "Add", 128)
        return D, reduction


class ColumnReduction_(EpilogueVisitTree):  # "column": sums over M, one value per column
    def __call__(self, accum: 'tensor', c: 'tensor', alpha: 'scalar', beta: 'scalar'):
        D = alpha * accum + beta * c
        reduction = reduction_op(D, "column", "Add", 128)
        return D, reduction


class Independent_(EpilogueVisitTree):  # two outputs that share no node; a constant; negation
    def __call__(self, accum: 'tensor', c: 'tensor', alpha: 'scalar'):
        D = accum * 0.5 - c
        E = -(alpha * c)
        return D, E


TREES = [Linear_, Unary_, RowBroadcast_, ColumnBroadcast_, RowReduction_, ColumnReduction_, Independent_]


def make(tree, C=C):
    functor = tree(cutlass.LinearCombination(C.element, C.alignment, cutlass.float32, cutlass.float32), TILE,
                   MATH.element_accumulator, C.alignment, cutlass.float32, C.element)
    functor.initialize()
    return functor


def operation(tree, C=C):
    return cutlass.GemmOperationUniversal(80, TILE, A, B, C, make(tree, C), cutlass.IdentitySwizzle1, visitor=True)


class ColumnReduction64_(EpilogueVisitTree):  # PyCUTLASS's ColumnReduction_ with its 64-row tile
    def __call__(self, accum: 'tensor', c: 'tensor', alpha: 'scalar', beta: 'scalar'):
        D = alpha * accum + beta * c
        reduction = reduction_op(D, "column", "Add", 64)
        return D, reduction


def example_op(inst, element, math, tile, layout_a, layout_b, align_ab, swizzle, tree):
    """gemm.py's operation: C float32 RowMajor alignment 4, 3 stages, warps 2x2x1, float32 epilogue."""
    F32 = cutlass.float32
    mi = cutlass.MathInstruction(inst, element, element, F32, cutlass.OpClass.TensorOp, math)
    td = cutlass.TileDescription(tile, 3, [2, 2, 1], mi)
    A = cutlass.TensorDescription(element, layout_a, align_ab)
    B = cutlass.TensorDescription(element, layout_b, align_ab)
    C = cutlass.TensorDescription(F32, cutlass.RowMajor, 4)
    functor = tree(cutlass.LinearCombination(F32, 4, F32, F32), td, F32, 4, F32, F32)
    functor.initialize()
    return cutlass.GemmOperationUniversal(80, td, A, B, C, functor, swizzle, visitor=True)


MO, RM, CM = cutlass.MathOperation, cutlass.RowMajor, cutlass.ColumnMajor
# (id, operation, mode, batch): run_all_example.sh's -epv RowReduction / ColumnReduction / RowReduction batched /
# ColumnBroadcast in Array mode, all with -p 512 256 128 -alpha 1.0 -beta 0.5.
EXAMPLES = [
    ("row-reduction", example_op([16, 8, 16], cutlass.float16, MO.multiply_add, [128, 128, 32], CM, RM, 8,
                                 cutlass.IdentitySwizzle4, RowReduction_), Mode.Gemm, 1),
    ("column-reduction-bf16", example_op([16, 8, 16], cutlass.bfloat16, MO.multiply_add, [64, 128, 64], CM, CM, 8,
                                         cutlass.IdentitySwizzle2, ColumnReduction64_), Mode.Gemm, 1),
    ("row-reduction-batched", example_op([16, 8, 8], cutlass.float32, MO.multiply_add_fast_bf16, [128, 128, 32], RM,
                                         CM, 4, cutlass.BatchedIdentitySwizzle, RowReduction_), Mode.Batched, 3),
    ("column-broadcast-array", example_op([16, 8, 8], cutlass.float32, MO.multiply_add_fast_bf16, [128, 128, 32],
                                          RM, CM, 4, cutlass.BatchedIdentitySwizzle, ColumnBroadcast_),
     Mode.Array, 3),
]
