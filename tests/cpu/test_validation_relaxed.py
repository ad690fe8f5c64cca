"""Configurations at the edge of validation: the ones CUTLASS computes correctly (accepted) and the ones it does not
(rejected).

(a) float64 (and other) tensor-op warp tiles 16 wide in N (CUTLASS's own DGEMM tile 32x32x16 with 2x2x1 warps);
    8 wide (and f64 warp M/N not multiples of 16) still rejected: the 64-bit operand iterators static_assert.
(b) int8 with multiply_add: still rejected; CUTLASS's Sm80 int8 mma exists only as OpMultiplyAddSaturate.
(c) float32 (and int32) C with alignment 8 (256-bit stores) in tensor-op GEMMs; still 128 bits elsewhere.
(d) wgrad's C (filter gradient) alignment applies along R*S*C, so C = 1 with alignment 4 runs when R*S is a
    multiple of 4.
GPU counterparts: tests/gpu/test_validation_relaxed.py.
"""
from __future__ import annotations

import pytest

import pycutlass as cutlass
from pycutlass import ArgumentError, DescriptionError, compiler
from pycutlass.conv import Conv2dProblemSize, IteratorAlgorithm, Operator, StrideSupport

D = cutlass.DataType
R, CM, NHWC = cutlass.RowMajor, cutlass.ColumnMajor, cutlass.TensorNHWC
MO = cutlass.MathOperation
T, S = cutlass.OpClass.TensorOp, cutlass.OpClass.Simt

INSTR = {D.float64: ([8, 8, 4], D.float64), D.float16: ([16, 8, 16], D.float32),
         D.tfloat32: ([16, 8, 8], D.float32), D.int8: ([16, 8, 32], D.int32)}


def gemm(el, out, tb, warps, align_ab, align_c, stages=3, layouts=(R, CM, R), opclass=T, math_operation=None):
    inst, acc = INSTR[el] if opclass is T else ([1, 1, 1], el)
    math = cutlass.MathInstruction(inst, el, el, acc, opclass, math_operation or
                                   (MO.multiply_add_saturate if el is D.int8 else MO.multiply_add))
    tile = cutlass.TileDescription(tb, stages, warps, math)
    storage = D.float32 if el is D.tfloat32 else el
    A = cutlass.TensorDescription(storage, layouts[0], align_ab)
    B = cutlass.TensorDescription(storage, layouts[1], align_ab)
    C = cutlass.TensorDescription(out, layouts[2], align_c)
    return cutlass.GemmOperationUniversal(80, tile, A, B, C, cutlass.LinearCombination(out, align_c, acc))


def wgrad(el=D.float16, align_a=8, align_b=1, align_c=4, stages=2, out=None, algorithm=IteratorAlgorithm.optimized):
    inst, acc = INSTR[el]
    math = cutlass.MathInstruction(inst, el, el, acc, T, MO.multiply_add)
    tile = cutlass.TileDescription([64, 64, 32 if el is D.float16 else 16], stages, [2, 2, 1], math)
    storage = D.float32 if el is D.tfloat32 else el
    out = out or storage
    A = cutlass.TensorDescription(storage, NHWC, align_a)
    B = cutlass.TensorDescription(storage, NHWC, align_b)
    C = cutlass.TensorDescription(out, NHWC, align_c)
    return cutlass.Conv2dOperation(Operator.wgrad, algorithm, 90, tile, A, B, C, StrideSupport.Strided,
                                   cutlass.LinearCombination(out, align_c, acc), cutlass.IdentitySwizzle1)


def conv_problem(n, h, w, c, k, r, s, pad=(0, 0), stride=(1, 1)):
    return Conv2dProblemSize((n, h, w, c), (k, r, s, c), (pad[0], pad[0], pad[1], pad[1]), stride, (1, 1),
                             cutlass.conv.Mode.cross_correlation, 1, 1)


# --- (a) warp tiles 16 wide ------------------------------------------------------------------------------------
F64_N16 = [([32, 32, 16], [2, 2, 1]), ([64, 32, 16], [2, 2, 1]), ([32, 64, 16], [2, 4, 1])]


@pytest.mark.parametrize("tb,warps", F64_N16)
@pytest.mark.parametrize("layouts", [(R, CM, R), (CM, CM, R), (CM, R, CM), (R, R, R)])
def test_f64_warp_tile_16_wide_accepted(tb, warps, layouts):
    op = gemm(D.float64, D.float64, tb, warps, 1, 1, layouts=layouts)
    assert op.tile_description.warp_shape[1] == 16


@pytest.mark.parametrize("el,out,tb,align_ab,align_c", [
    (D.float16, D.float32, [64, 32, 32], 8, 4), (D.float16, D.float16, [64, 32, 32], 8, 4),
    (D.tfloat32, D.float32, [64, 32, 32], 4, 4), (D.int8, D.int32, [64, 32, 64], 16, 4),
    (D.float16, D.float16, [64, 32, 32], 8, 4),  # f16 <= f32 x 4: not the mixed-precision epilogue
])
def test_warp_tile_16_wide_accepted_for_other_types(el, out, tb, align_ab, align_c):
    warps = [2, 2, 1] if tb[1] == 32 else [2, 1, 1]
    assert gemm(el, out, tb, warps, align_ab, align_c).tile_description.warp_shape[1] == 16


@pytest.mark.parametrize("el,out,tb,align_ab,align_c,acc", [
    (D.float16, D.float16, [32, 16, 32], 8, 8, None),  # f16 <= f32 x 8: GPU-measured relative error 0.84
    (D.int8, D.int8, [64, 16, 64], 16, 4, None),
])
def test_warp_tile_16_wide_rejected_for_the_mixed_precision_epilogue(el, out, tb, align_ab, align_c, acc):
    warps = [2, 2, 1] if tb[1] == 32 else [2, 1, 1]
    with pytest.raises(DescriptionError, match="mixed-precision epilogue"):
        gemm(el, out, tb, warps, align_ab, align_c)


def test_f64_warp_tile_8_wide_rejected_with_reason():
    with pytest.raises(DescriptionError, match="must be 16, 32 or 64 wide in N"):
        gemm(D.float64, D.float64, [32, 16, 16], [2, 2, 1], 1, 1)
    # 8 rows tall: the 64-bit operand iterators static_assert "Divisibility." (M and N multiples of 16)
    with pytest.raises(DescriptionError, match=r"float64 tensor-op warp tile \[8, 32, 16\].*multiples of 16.*"
                                               r"Divisibility"):
        gemm(D.float64, D.float64, [16, 32, 16], [2, 1, 1], 1, 1)


def test_warp_tile_128_wide_only_for_float32_output():
    with pytest.raises(DescriptionError, match="is 128 wide in N, which CUTLASS's tensor-op epilogue runs correctly "
                                               "only for a row- or column-major float32 output"):
        gemm(D.float64, D.float64, [64, 128, 16], [2, 1, 1], 1, 1)
    with pytest.raises(DescriptionError, match="not float16 output from float32 accumulators"):
        gemm(D.float16, D.float16, [64, 256, 32], [2, 2, 1], 8, 8)
    assert gemm(D.float16, D.float32, [64, 256, 32], [2, 2, 1], 8, 4).tile_description.warp_shape[1] == 128


# --- (b) int8 multiply_add ---------------------------------------------------------------------------------------
def test_int8_multiply_add_is_built_saturating():
    """PyCUTLASS 2.11 scripts ask for int8 multiply_add; CUTLASS 4.2's Sm80 int8 mma exists only saturating."""
    math = cutlass.MathInstruction([16, 8, 32], D.int8, D.int8, D.int32, T, MO.multiply_add)
    assert math.math_operation is MO.multiply_add and math.cutlass_math_operation is MO.multiply_add_saturate
    op = gemm(D.int8, D.int32, [128, 128, 64], [2, 2, 1], 16, 4, math_operation=MO.multiply_add)
    assert "cutlass::arch::OpMultiplyAddSaturate" in op.emit_body()
    saturate = cutlass.MathInstruction([16, 8, 32], D.int8, D.int8, D.int32, T, MO.multiply_add_saturate)
    assert saturate.cutlass_math_operation is MO.multiply_add_saturate


# --- (c) 256-bit C stores ----------------------------------------------------------------------------------------
@pytest.mark.parametrize("el,out,tb,warps,align_ab", [
    (D.float16, D.float32, [128, 128, 32], [2, 2, 1], 8), (D.float16, D.float32, [64, 64, 32], [2, 2, 1], 8),
    (D.int8, D.int32, [128, 128, 64], [2, 2, 1], 16),
])
@pytest.mark.parametrize("c_layout", [R, CM])
def test_c_alignment_256_bits_accepted_for_tensor_op_gemm(el, out, tb, warps, align_ab, c_layout):
    op = gemm(el, out, tb, warps, align_ab, 8, layouts=(R, CM, c_layout))
    assert op.C.access_bits == 256 and op.epilogue_functor.alignment == 8


def test_c_alignment_256_bits_rejected_elsewhere():
    with pytest.raises(DescriptionError, match="exceeds 128 bits; only the tensor-op epilogues"):
        gemm(D.float32, D.float32, [128, 128, 8], [4, 2, 1], 1, 8, opclass=S)
    math = cutlass.MathInstruction([16, 8, 16], D.float16, D.float16, D.float32, T)
    tile = cutlass.TileDescription([128, 128, 32], 3, [2, 2, 1], math)
    # grouped GEMMs store 256 bits too (PyCUTLASS 2.11's test_sm80.py builds them)
    cutlass.GemmOperationGrouped(90, tile, cutlass.TensorDescription(D.float16, R, 8),
                                 cutlass.TensorDescription(D.float16, CM, 8), cutlass.TensorDescription(D.float32, R, 8),
                                 cutlass.LinearCombination(D.float32, 8, D.float32))
    with pytest.raises(DescriptionError, match="A alignment 16 x 16 bits exceeds the 128-bit loads"):
        gemm(D.float16, D.float32, [128, 128, 32], [2, 2, 1], 16, 8)
    with pytest.raises(DescriptionError, match="alignment 16 is not valid for float32"):
        cutlass.TensorDescription(D.float32, R, 16)


# --- (d) wgrad alignment along R*S*C --------------------------------------------------------------------------
@pytest.mark.parametrize("r,s", [(2, 2), (4, 4), (2, 6), (4, 3)])
def test_wgrad_c1_output_alignment_4_accepted(r, s):
    op = wgrad()
    op.check_problem_size(conv_problem(2, 17, 19, 1, 24, r, s, (1, 1)))
    op_tf32 = wgrad(D.tfloat32, 4, 1, 4, 3)
    op_tf32.check_problem_size(conv_problem(1, 9, 11, 1, 20, r, s))


def test_wgrad_output_alignment_along_rsc_rejected_with_reason():
    with pytest.raises(ArgumentError, match=r"C/D \(filter gradient\) is accessed 4 elements at a time along R\*S\*C, "
                                            r"so R\*S\*C must be divisible by 4; the problem has R\*S\*C=9"):
        wgrad().check_problem_size(conv_problem(2, 17, 19, 1, 24, 3, 3, (1, 1)))
    # B (the activation) is still read along C: C = 1 needs B alignment 1
    with pytest.raises(ArgumentError, match=r"B \(activation\) is accessed 8 elements at a time along C"):
        wgrad(align_b=8, stages=3).check_problem_size(conv_problem(2, 17, 19, 1, 24, 2, 2))


# --- compiles (NVRTC, sm_90) -------------------------------------------------------------------------------------
def newly_accepted_operations():
    return [
        gemm(D.float64, D.float64, [32, 32, 16], [2, 2, 1], 1, 1),
        gemm(D.float64, D.float64, [32, 32, 16], [2, 2, 1], 1, 1, layouts=(CM, R, CM)),
        gemm(D.float16, D.float32, [64, 32, 32], [2, 2, 1], 8, 4),
        gemm(D.int8, D.int32, [64, 32, 64], [2, 2, 1], 16, 4),
        gemm(D.float16, D.float32, [128, 128, 32], [2, 2, 1], 8, 8),
        gemm(D.int8, D.int32, [128, 128, 64], [2, 2, 1], 16, 8, layouts=(R, CM, CM)),
        wgrad(),
        wgrad(D.tfloat32, 4, 1, 4, 3),
    ]


@pytest.mark.slow
def test_newly_accepted_compile_with_nvrtc(compiler_state):
    compiler.nvrtc()
    ops = newly_accepted_operations()
    assert len(compiler.add_module(ops, jobs=2)) == len(ops)
