"""What PyCUTLASS 2.11's own unit tests (test/gemm, test/conv of its tree) build: their
descriptions, rejections with reasons, emission, NVRTC compiles. GPU results: tests/gpu/test_pycutlass211_units.py."""
from __future__ import annotations

import pytest

import pycutlass as cutlass
from pycutlass import ArgumentError, DescriptionError, compiler
from tests.pycutlass211_cases import CONVS, GEMMS, GROUPED, conv, gemm

D = cutlass.DataType
R, CM = cutlass.RowMajor, cutlass.ColumnMajor
F16, F32, S8, S32 = D.float16, D.float32, D.int8, D.int32


def test_the_testbed_module_exports_pycutlass_like_pycutlass_did():
    """PyCUTLASS's few- and fixed-channel conv tests import only ``from pycutlass.test import *``."""
    namespace = {}
    exec("from pycutlass.test import *", namespace)
    for name in ("MathInstruction", "TileDescription", "TensorDescription", "Conv2dOperation", "LinearCombination",
                 "cutlass", "test_all_conv2d", "test_all_gemm", "TestbedGrouped"):
        assert name in namespace, name
    assert namespace["MathInstruction"] is cutlass.MathInstruction


# --- direct_store ------------------------------------------------------------------------------------------------
def test_direct_store_is_part_of_the_identity_and_the_emitted_kernel():
    plain = gemm(F16, F32, F32, (CM, R, CM), (8, 8, 4))
    direct = GEMMS["direct_store_f16_f32_nt_n"]
    assert direct.direct_store and not plain.direct_store
    assert direct.name != plain.name and "_ds_" in direct.name
    source = direct.emit_body()
    assert "DefaultEpilogueDirectStore<DefaultKernel::Epilogue>" in source
    assert '#include "cutlass/epilogue/threadblock/default_epilogue_direct_store.h"' in source
    assert "DefaultEpilogueDirectStore" not in plain.emit_body()


@pytest.mark.parametrize("build,match", [
    (lambda: gemm(F16, F32, F32, (CM, R, CM), (8, 8, 1), direct_store=True), "C alignment must be at least 2"),
    (lambda: gemm(F16, F32, F32, (CM, R, CM), (8, 8, 4), direct_store=1), "direct_store must be True or False"),
])
def test_direct_store_rejections(build, match):
    with pytest.raises(DescriptionError, match=match):
        build()


def test_direct_store_needs_tensor_ops_and_the_sm80_family():
    math = cutlass.MathInstruction([1, 1, 1], F32, F32, F32, cutlass.OpClass.Simt)
    tile = cutlass.TileDescription([64, 64, 8], 3, [2, 2, 1], math)
    A, C = cutlass.TensorDescription(F32, R, 1), cutlass.TensorDescription(F32, R, 1)
    with pytest.raises(DescriptionError, match="tensor-op accumulator layout"):
        cutlass.GemmOperationUniversal(80, tile, A, A, C, cutlass.LinearCombination(F32, 1, F32), direct_store=True)
    math = cutlass.MathInstruction([64, 128, 16], F16, F16, F32, cutlass.OpClass.TensorOp)
    tile = cutlass.TileDescription([128, 128, 64], 0, None, math)
    A, B, C = (cutlass.TensorDescription(F16, layout, 8) for layout in (R, CM, R))
    with pytest.raises(DescriptionError, match="direct_store=True is the Sm80 family's"):
        cutlass.GemmOperationUniversal(90, tile, A, B, C, cutlass.LinearCombination(F16, 8, F32), direct_store=True)


# --- int32 epilogues ---------------------------------------------------------------------------------------------
def test_int32_compute_epilogues():
    clamp = cutlass.LinearCombinationClamp(S32, 4, S32, S32)
    assert clamp.element_epilogue is S32
    assert cutlass.LinearCombinationClamp(S8, 16, S32, S32).element_output is S8
    assert cutlass.LinearCombination(S32, 4, S32, S32).element_epilogue is S32
    assert clamp.make_arguments(2, -1).alpha == 2.0
    with pytest.raises(ArgumentError, match="alpha and beta must be integers, got alpha=1.5"):
        clamp.make_arguments(1.5, 0.0)
    with pytest.raises(DescriptionError, match="an integer epilogue computes in int32"):
        cutlass.LinearCombination(S8, 16, S32, S32)  # an int32 -> int8 conversion wraps: Clamp only
    with pytest.raises(DescriptionError, match="an integer epilogue computes in int32"):
        cutlass.LinearCombinationClamp(S32, 4, S32, S8)
    with pytest.raises(DescriptionError, match="activation relu computes in a floating-point type"):
        cutlass.LinearCombinationGeneric(cutlass.relu(S32), S32, 4, S32, S32)
    op = GEMMS["s8_s32_clamp_int32_compute_n"]
    assert "cutlass::epilogue::thread::LinearCombinationClamp<int32_t, 4, int32_t, int32_t" in \
        op.emit_body().replace("\n", " ")


def test_sm90_epilogues_still_compute_in_float32():
    math = cutlass.MathInstruction([64, 128, 32], S8, S8, S32, cutlass.OpClass.TensorOp)
    tile = cutlass.TileDescription([128, 128, 128], 0, None, math)
    A, B = cutlass.TensorDescription(S8, R, 16), cutlass.TensorDescription(S8, CM, 16)
    C = cutlass.TensorDescription(S32, R, 4)
    with pytest.raises(DescriptionError, match="SM90 epilogues compute in float32, got int32"):
        cutlass.GemmOperationUniversal(90, tile, A, B, C, cutlass.LinearCombination(S32, 4, S32, S32))


# --- convolutions ------------------------------------------------------------------------------------------------
def test_simt_convolutions_take_any_a_b_alignment_but_c_one():
    op = CONVS["simt_fprop_optimized_a4"]
    assert (op.A.alignment, op.B.alignment, op.C.alignment) == (4, 4, 1)
    with pytest.raises(DescriptionError, match="SIMT kernels access C one element at a time"):
        conv(cutlass.conv.Operator.fprop, cutlass.conv.IteratorAlgorithm.analytic, F32, F32, F32, (4, 4, 4),
             (128, 128, 8), (4, 2, 1), 4)
    math = cutlass.MathInstruction([1, 1, 1], F32, F32, F32, cutlass.OpClass.Simt)
    tile = cutlass.TileDescription([64, 64, 8], 3, [2, 2, 1], math)
    with pytest.raises(DescriptionError, match="SIMT kernels access A, B and C one element at a time"):
        cutlass.GemmOperationUniversal(80, tile, cutlass.TensorDescription(F32, R, 4), cutlass.TensorDescription(F32, R, 1),
                                       cutlass.TensorDescription(F32, R, 1), cutlass.LinearCombination(F32, 1, F32))


def test_convolutions_store_256_bit_c():
    from pycutlass.test._common import reduction_for

    for name in ("tf32_fprop_optimized_c8", "tf32_dgrad_optimized_c8_strided", "tf32_wgrad_optimized_c8",
                 "f16_fprop_f32out_c8"):
        assert CONVS[name].C.access_bits == 256
        assert reduction_for(CONVS[name]).count == 8  # their parallel split-K reduces 256 bits at a time
    with pytest.raises(DescriptionError, match="alignment 3 must be a power of two"):
        cutlass.ReductionOperation(shape=cutlass.MatrixCoord(4, 96), C=cutlass.TensorDescription(F32, R, 1),
                                   element_accumulator=F32, count=3)


def test_simt_conv_alignment_tightens_the_problem_checks():
    op = CONVS["simt_fprop_analytic_a4"]
    ps = cutlass.conv.Conv2dProblemSize((1, 8, 8, 6), (8, 3, 3, 6), (1, 1, 1, 1), (1, 1), (1, 1),
                                        cutlass.conv.Mode.cross_correlation, 1, 1)
    with pytest.raises(ArgumentError, match="accessed 4 elements at a time along C"):
        op.check_problem_size(ps)


# --- compiles ----------------------------------------------------------------------------------------------------
@pytest.mark.slow
def test_they_compile_with_nvrtc(compiler_state):
    compiler.nvrtc()
    from pycutlass.test._common import reduction_for

    ops = [GEMMS["direct_store_tf32_f32_nn_n"], GEMMS["s8_s32_int32_compute_direct_store"],
           GEMMS["s8_s8_clamp_int32_compute_t"], CONVS["simt_dgrad_analytic_a4_strided_2stage"],
           CONVS["simt_wgrad_optimized_a4"], CONVS["tf32_dgrad_optimized_c8_strided"],
           reduction_for(CONVS["tf32_fprop_optimized_c8"]),  # float32 x 8: a 256-bit reduction
           reduction_for(GEMMS["s8_s32_clamp_int32_compute_t"]),  # int32 compute
           GEMMS["tf32_f32_warp_n128"], CONVS["f16_fprop_f32out_warp_n128"]]
    assert len(compiler.add_module(ops, jobs=2)) == len(ops)


@pytest.mark.slow
def test_direct_store_compiles_alone_with_nvcc(compiler_state):
    """Its CUTLASS header uses MatrixShape and TensorRef without including them: the template includes it after
    the unit's headers (a unit holding only this operation failed to compile before)."""
    compiler.nvcc()
    ops = [GEMMS["direct_store_f16_f32_nt_n"]]
    assert len(compiler.add_module(ops, jobs=1)) == 1


# --- test/unit/test_sm80.py ----------------------------------------------------------------------------------------
def test_gemm_kind_is_pycutlass_library_enum():
    from pycutlass.library import GemmKind

    assert cutlass.GemmKind is GemmKind and {"Universal", "Grouped"} <= set(GemmKind.__members__)


def test_fast_math_instructions_in_pycutlass_spelling_are_the_float32_ones():
    MO = cutlass.MathOperation
    for element, op in ((D.float16, MO.multiply_add_fast_f16), (D.bfloat16, MO.multiply_add_fast_bf16)):
        math = cutlass.MathInstruction([16, 8, 8], element, element, F32, cutlass.OpClass.TensorOp, op)
        assert (math.element_a, math.element_b, math.math_operation) == (F32, F32, op)
        assert math == cutlass.MathInstruction([16, 8, 8], F32, F32, F32, cutlass.OpClass.TensorOp, op)
    # plain multiply_add at [16, 8, 8] stays a float16 instruction
    assert cutlass.MathInstruction([16, 8, 8], F16, F16, F32, cutlass.OpClass.TensorOp).element_a is F16


def test_instruction_shape_none_is_a_typed_error():
    with pytest.raises(DescriptionError, match="instruction_shape must be three integers"):
        cutlass.MathInstruction(None, F16, F16, F32, cutlass.OpClass.TensorOp)
    with pytest.raises(DescriptionError, match="instruction_shape must be three integers"):
        cutlass.MathInstruction([16, 8], F16, F16, F32, cutlass.OpClass.TensorOp)


def test_grouped_gemms_store_256_bit_c_and_take_128_wide_warp_tiles():
    assert GROUPED["f16_f32_c8_device"].C.access_bits == 256
    assert GROUPED["tf32_f32_warp_n128_host"].tile_description.warp_shape[1] == 128
    assert GEMMS["f32_fast_f16_warp_n128"].tile_description.math_instruction.math_operation is \
        cutlass.MathOperation.multiply_add_fast_f16
