"""Every epilogue functor x output element type x kind that the descriptions accept must compile.

Builds one operation per combination (GEMM, grouped GEMM, conv2d fprop / dgrad / wgrad, split-K reduction) from a
base configuration for each output type, skips what the constructors reject (DescriptionError), and compiles all
accepted operations with NVRTC for sm_90 in two translation units (``add_module(ops, jobs=2)``). A combination that
is accepted but does not compile is a hole in the descriptions' validation: fix the check, not this test.
LinearCombinationGeneric cycles through the activations so that each appears in several kinds.
"""
from __future__ import annotations

import itertools

import pytest

import pycutlass as cutlass
from pycutlass import DescriptionError, compiler
from pycutlass.conv import IteratorAlgorithm, Operator, StrideSupport
from pycutlass import Conv2dOperation

pytestmark = pytest.mark.slow

D = cutlass.DataType
R, CM, NHWC = cutlass.RowMajor, cutlass.ColumnMajor, cutlass.TensorNHWC
MO = cutlass.MathOperation
ARCH = 90

# Per output type: (instruction shape, operand type, accumulator, operand alignment, output alignment, tile, warps).
BASES = {
    D.float64: ([8, 8, 4], D.float64, D.float64, 1, 1, [64, 64, 16], [2, 2, 1]),
    D.float32: ([16, 8, 16], D.float16, D.float32, 8, 4, [128, 128, 32], [2, 2, 1]),
    D.float16: ([16, 8, 16], D.float16, D.float32, 8, 8, [128, 128, 32], [2, 2, 1]),
    D.bfloat16: ([16, 8, 16], D.bfloat16, D.float32, 8, 8, [128, 128, 32], [2, 2, 1]),
    D.int8: ([16, 8, 32], D.int8, D.int32, 16, 8, [128, 128, 64], [2, 2, 1]),
    D.int32: ([16, 8, 32], D.int8, D.int32, 16, 4, [128, 128, 64], [2, 2, 1]),
}
FUNCTORS = ("LinearCombination", "LinearCombinationClamp", "FastLinearCombinationClamp", "LinearCombinationGeneric")
KINDS = ("gemm", "grouped", "fprop", "dgrad", "wgrad", "reduction")
ACTIVATIONS = ("relu", "leaky_relu", "tanh", "sigmoid", "silu", "hardswish", "gelu", "gelu_taylor", "identity")


def _epilogue(functor, out, alignment, acc, activation):
    if functor == "LinearCombination":
        return cutlass.LinearCombination(out, alignment, acc)
    if functor == "LinearCombinationClamp":
        return cutlass.LinearCombinationClamp(out, alignment, acc)
    if functor == "FastLinearCombinationClamp":
        return cutlass.FastLinearCombinationClamp(out, alignment)
    compute = D.float64 if D.float64 in (out, acc) else D.float32
    return cutlass.LinearCombinationGeneric(getattr(cutlass, activation)(compute), out, alignment, acc)


def _operation(kind, out, functor, activation):
    inst, element, acc, align, out_align, tile_shape, warps = BASES[out]
    epilogue = _epilogue(functor, out, out_align, acc, activation)
    if kind == "reduction":
        count = out_align
        return cutlass.ReductionOperation((4, 32 * count), cutlass.TensorDescription(out, R, count), acc,
                                          epilogue_functor=epilogue, count=count, arch=ARCH)
    math_op = MO.multiply_add_saturate if element is D.int8 else MO.multiply_add
    math = cutlass.MathInstruction(inst, element, element, acc, cutlass.OpClass.TensorOp, math_op)
    tile = cutlass.TileDescription(tile_shape, 3, warps, math)
    if kind in ("gemm", "grouped"):
        A = cutlass.TensorDescription(element, R, align)
        B = cutlass.TensorDescription(element, CM, align)
        C = cutlass.TensorDescription(out, R, out_align)
        cls = cutlass.GemmOperationUniversal if kind == "gemm" else cutlass.GemmOperationGrouped
        return cls(ARCH, tile, A, B, C, epilogue)
    A = cutlass.TensorDescription(element, NHWC, align)
    B = cutlass.TensorDescription(element, NHWC, align)
    C = cutlass.TensorDescription(out, NHWC, out_align)
    conv_kind = Operator[kind]
    swizzle = cutlass.StridedDgradIdentitySwizzle1 if conv_kind is Operator.dgrad else cutlass.IdentitySwizzle1
    return Conv2dOperation(conv_kind, IteratorAlgorithm.optimized, ARCH, tile, A, B, C, StrideSupport.Strided,
                           epilogue, swizzle)


def accepted_operations():
    """(label, operation) for every combination the descriptions accept, and the labels of those they reject."""
    accepted, rejected = [], []
    activations = itertools.cycle(ACTIVATIONS)
    for kind, out, functor in itertools.product(KINDS, BASES, FUNCTORS):
        activation = next(activations) if functor == "LinearCombinationGeneric" else None
        label = f"{kind}/{out.label}/{functor}" + (f"<{activation}>" if activation else "")
        try:
            accepted.append((label, _operation(kind, out, functor, activation)))
        except DescriptionError as exc:
            rejected.append((label, str(exc)))
    return accepted, rejected


def test_accepted_combinations_compile(compiler_state):
    accepted, rejected = accepted_operations()
    assert len(accepted) > 40, [label for label, _ in accepted]
    labels = {label for label, _ in accepted}
    for must in ("gemm/float16/LinearCombination", "fprop/int8/LinearCombinationClamp",
                 "reduction/float64/LinearCombination", "wgrad/bfloat16/LinearCombination"):
        assert must in labels, must
    for label, message in rejected:  # rejections come from the documented rules only
        assert message, label
    compiler.nvrtc()
    compiled = compiler.add_module([op for _, op in accepted], jobs=2)
    assert len(compiled) == len(accepted)


if __name__ == "__main__":  # python -m tests.cpu.test_compile_matrix: list what is accepted and rejected
    acc, rej = accepted_operations()
    print(f"{len(acc)} accepted:", *(label for label, _ in acc), sep="\n  ")
    print(f"{len(rej)} rejected:", *(f"{label}: {message[:150]}" for label, message in rej), sep="\n  ")
