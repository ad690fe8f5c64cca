"""CPU tests of the description layer: MathInstruction, TileDescription, TensorDescription, epilogue functors and
GemmOperationUniversal validation, immutability, hashing and naming. No compiler, no GPU.

Every rejection is checked for its type (``pycutlass.DescriptionError``) *and* for a message that names the problem
(and, where there is a short list, the valid choices), because the message is what the user acts on.
"""
from __future__ import annotations

import dataclasses
import re

import pytest

import pycutlass as cutlass
from pycutlass import DescriptionError
from pycutlass.description.math_instruction import VALID_MATH_INSTRUCTIONS
from pycutlass.emit import names

T, S = cutlass.OpClass.TensorOp, cutlass.OpClass.Simt
MO = cutlass.MathOperation


# --- helpers --------------------------------------------------------------------------------------------------------
def f16_math(acc=cutlass.float32):
    return cutlass.MathInstruction([16, 8, 16], cutlass.float16, cutlass.float16, acc, T, MO.multiply_add)


def f16_tile(shape=(128, 128, 32), stages=3, warps=(2, 2, 1), math=None):
    return cutlass.TileDescription(list(shape), stages, None if warps is None else list(warps), math or f16_math())


def td(element, layout, alignment):
    return cutlass.TensorDescription(element, layout, alignment)


def f16_gemm(arch=80, tile=None, A=None, B=None, C=None, epilogue=None, swizzle=cutlass.IdentitySwizzle1):
    A = A or td(cutlass.float16, cutlass.RowMajor, 8)
    B = B or td(cutlass.float16, cutlass.ColumnMajor, 8)
    C = C or td(cutlass.float16, cutlass.RowMajor, 8)
    epilogue = epilogue or cutlass.LinearCombination(C.element, C.alignment, cutlass.float32, cutlass.float32)
    return cutlass.GemmOperationUniversal(arch, tile or f16_tile(), A, B, C, epilogue, swizzle)


def int8_parts(layout_a=cutlass.RowMajor, layout_b=cutlass.ColumnMajor, layout_c=cutlass.RowMajor,
               alignment_a=16, alignment_b=16, alignment_c=8):
    math = cutlass.MathInstruction([16, 8, 32], cutlass.int8, cutlass.int8, cutlass.int32, T, MO.multiply_add_saturate)
    tile = cutlass.TileDescription([128, 128, 64], 3, [2, 2, 1], math)
    A = td(cutlass.int8, layout_a, alignment_a)
    B = td(cutlass.int8, layout_b, alignment_b)
    C = td(cutlass.int8, layout_c, alignment_c)
    epilogue = cutlass.LinearCombinationClamp(cutlass.int8, alignment_c, cutlass.int32, cutlass.float32)
    return tile, A, B, C, epilogue


# --- MathInstruction: the seed's table ------------------------------------------------------------------------------
# (opclass, instruction shape, element a/b, accumulator, math operation): every row of the users' table.
SEED_TABLE = [
    (T, [8, 8, 4], cutlass.float64, cutlass.float64, MO.multiply_add),
    (T, [16, 8, 8], cutlass.tfloat32, cutlass.float32, MO.multiply_add),
    (T, [16, 8, 8], cutlass.float32, cutlass.float32, MO.multiply_add),
    (T, [16, 8, 8], cutlass.float32, cutlass.float32, MO.multiply_add_fast_f32),
    (T, [16, 8, 8], cutlass.float32, cutlass.float32, MO.multiply_add_fast_f16),
    (T, [16, 8, 8], cutlass.float32, cutlass.float32, MO.multiply_add_fast_bf16),
    (T, [16, 8, 8], cutlass.float16, cutlass.float32, MO.multiply_add),
    (T, [16, 8, 8], cutlass.bfloat16, cutlass.float32, MO.multiply_add),
    (T, [16, 8, 16], cutlass.float16, cutlass.float16, MO.multiply_add),
    (T, [16, 8, 16], cutlass.float16, cutlass.float32, MO.multiply_add),
    (T, [16, 8, 16], cutlass.bfloat16, cutlass.float32, MO.multiply_add),
    (T, [16, 8, 32], cutlass.int8, cutlass.int32, MO.multiply_add_saturate),
    (S, [1, 1, 1], cutlass.float64, cutlass.float64, MO.multiply_add),
    (S, [1, 1, 1], cutlass.float32, cutlass.float32, MO.multiply_add),
]


def _row_id(row):
    opclass, shape, element, acc, op = row
    return f"{opclass.name}-{'x'.join(map(str, shape))}-{element.label}-{acc.label}-{op.name}"


def _gemm_for_row(math: cutlass.MathInstruction) -> cutlass.GemmOperationUniversal:
    """A plausible GEMM around each instruction, to show the row is usable end to end (construct + emit)."""
    element, acc = math.element_a, math.element_accumulator
    storage = cutlass.float32 if element is cutlass.tfloat32 else element
    if math.opcode_class is S:
        tile = cutlass.TileDescription([128, 128, 8], 4, [2, 2, 1], math)
        alignment = alignment_c = 1
    elif element is cutlass.float64:
        tile = cutlass.TileDescription([64, 64, 16], 3, [2, 2, 1], math)
        alignment = alignment_c = 1
    elif element is cutlass.int8:
        tile = cutlass.TileDescription([128, 128, 64], 3, [2, 2, 1], math)
        alignment, alignment_c = 16, 8
    else:
        tile = cutlass.TileDescription([128, 128, 32], 3, [2, 2, 1], math)
        alignment = 128 // storage.bits
        alignment_c = alignment
    out = cutlass.int8 if element is cutlass.int8 else storage
    layout_b = cutlass.ColumnMajor if element is cutlass.int8 else cutlass.RowMajor
    A, B, C = td(storage, cutlass.RowMajor, alignment), td(storage, layout_b, alignment), td(out, cutlass.RowMajor,
                                                                                             alignment_c)
    epilogue = cutlass.LinearCombination(out, alignment_c, acc, acc if acc.is_float else cutlass.float32)
    return cutlass.GemmOperationUniversal(80, tile, A, B, C, epilogue)


@pytest.mark.parametrize("row", SEED_TABLE, ids=_row_id)
def test_seed_table_rows_are_accepted(row):
    opclass, shape, element, acc, op = row
    math = cutlass.MathInstruction(shape, element, element, acc, opclass, op)
    assert math.instruction_shape == tuple(shape) and isinstance(math.instruction_shape, tuple)
    assert math.opclass is opclass and math.math_operation is op
    gemm = _gemm_for_row(math)
    body = gemm.emit_body()
    assert names.MATH_OPERATION[op] in body
    assert f"cutlass::gemm::GemmShape<{', '.join(map(str, shape))}>" in body
    assert names.OPCLASS[opclass] in body


def test_seed_table_float32_tensorop_multiply_add_is_accepted():
    math = cutlass.MathInstruction([16, 8, 8], cutlass.float32, cutlass.float32, cutlass.float32, T, MO.multiply_add)
    assert "cutlass::arch::OpMultiplyAdd>" in _gemm_for_row(math).emit_body()


def test_every_table_entry_is_covered_by_the_seed_rows():
    """The library's table holds nothing the users' table does not describe (and every row above is in it), but for
    int8 multiply_add, which PyCUTLASS 2.11's scripts use (built saturating: MathInstruction.cutlass_math_operation)."""
    covered = {(opclass, tuple(shape), element, acc, op) for opclass, shape, element, acc, op in SEED_TABLE}
    covered.add((T, (16, 8, 32), cutlass.int8, cutlass.int32, MO.multiply_add))
    for (opclass, shape, element, acc), ops in VALID_MATH_INSTRUCTIONS.items():
        if element.is_fp8:
            continue  # SM90 family only (the seed table predates it)
        for op in ops:
            assert (opclass, shape, element, acc, op) in covered


@pytest.mark.parametrize("shape, element, acc, opclass, op", [
    ([16, 8, 32], cutlass.float16, cutlass.float32, T, MO.multiply_add),        # int8's shape for f16
    ([16, 8, 16], cutlass.float16, cutlass.float32, T, MO.multiply_add_saturate),
    ([16, 8, 16], cutlass.bfloat16, cutlass.bfloat16, T, MO.multiply_add),      # bf16 accumulators
    ([16, 8, 8], cutlass.float16, cutlass.float16, T, MO.multiply_add),
    ([8, 8, 4], cutlass.float32, cutlass.float32, T, MO.multiply_add),          # f64's shape for f32
    ([1, 1, 1], cutlass.float16, cutlass.float16, S, MO.multiply_add),          # no f16 SIMT row
    ([8, 8, 4], cutlass.float64, cutlass.float64, S, MO.multiply_add),          # SIMT is 1x1x1
    ([1, 1, 1], cutlass.float32, cutlass.float32, T, MO.multiply_add),
    ([16, 8, 16], cutlass.float16, cutlass.float32, T, MO.multiply_add_fast_f32),
])
def test_invalid_math_instructions_list_valid_choices(shape, element, acc, opclass, op):
    with pytest.raises(DescriptionError) as info:
        cutlass.MathInstruction(shape, element, element, acc, opclass, op)
    message = str(info.value)
    assert "is not supported" in message and "Valid combinations" in message
    assert f"{list(shape)}" in message and op.name in message  # names what was asked for
    for row in ("TensorOp [16, 8, 16] float16->float32: multiply_add",
                "TensorOp [16, 8, 32] int8->int32: multiply_add_saturate",
                "TensorOp [8, 8, 4] float64->float64: multiply_add",
                "Simt [1, 1, 1] float32->float32: multiply_add"):
        assert row in message


def test_math_instruction_type_and_operand_checks():
    with pytest.raises(DescriptionError, match="element_a .*float16.* and element_b .*bfloat16.* same type"):
        cutlass.MathInstruction([16, 8, 16], cutlass.float16, cutlass.bfloat16, cutlass.float32, T)
    with pytest.raises(DescriptionError, match="element_a must be a DataType"):
        cutlass.MathInstruction([16, 8, 16], "float16", cutlass.float16, cutlass.float32, T)
    with pytest.raises(DescriptionError, match="opcode_class must be a OpClass"):
        cutlass.MathInstruction([16, 8, 16], cutlass.float16, cutlass.float16, cutlass.float32, "TensorOp")
    with pytest.raises(DescriptionError, match="math_operation must be a MathOperation"):
        cutlass.MathInstruction([16, 8, 16], cutlass.float16, cutlass.float16, cutlass.float32, T, "multiply_add")
    # The default math operation is multiply_add, as in the users' snippets.
    assert cutlass.MathInstruction([16, 8, 16], cutlass.float16, cutlass.float16, cutlass.float32,
                                   T).math_operation is MO.multiply_add


# --- TileDescription -------------------------------------------------------------------------------------------------
def test_tile_accepts_and_derives():
    tile = f16_tile((128, 256, 64), 3, (2, 4, 1))
    assert tile.threadblock_shape == (128, 256, 64) and tile.warp_count == (2, 4, 1)
    assert tile.warp_shape == (64, 64, 64) and tile.threads == 256
    assert tile.shared_memory_bytes() == 3 * (128 * 64 + 64 * 256) * 2
    assert tile.procedural_name() == "128x256x64_2x4x1_s3"


def test_tile_warp_count_must_divide_the_threadblock():
    with pytest.raises(DescriptionError, match=r"threadblock M extent 128 is not divisible by the warp count 3"):
        f16_tile((128, 128, 32), 3, (3, 2, 1))
    with pytest.raises(DescriptionError, match=r"threadblock N extent 96 is not divisible by the warp count 5"):
        f16_tile((128, 96, 32), 3, (1, 5, 1))


def test_tile_warp_tile_must_be_a_multiple_of_the_instruction():
    # 64 / 8 warps = 8 rows per warp, but the instruction is 16 rows.
    with pytest.raises(DescriptionError) as info:
        f16_gemm(tile=f16_tile((64, 64, 32), 3, (8, 1, 1)))  # (8, 1, 1) may mean SM90: checked by the operation
    message = str(info.value)
    assert "warp tile [8, 64, 32]" in message and "instruction shape [16, 8, 16]" in message and "along M" in message
    with pytest.raises(DescriptionError, match="along N"):
        f16_tile((128, 16, 32), 3, (1, 4, 1))  # 4 columns per warp < 8
    with pytest.raises(DescriptionError, match=r"threadblock K \(16\) must hold at least two instruction K-steps"):
        f16_tile((128, 128, 16), 3, (2, 2, 1))


def test_tile_other_warp_rules():
    with pytest.raises(DescriptionError, match="warp_count along K must be 1"):
        f16_tile((128, 128, 64), 3, (2, 2, 2))
    with pytest.raises(DescriptionError, match="2048 threads per block; at most 1024"):
        f16_tile((256, 256, 32), 3, (8, 8, 1))
    simt = cutlass.MathInstruction([1, 1, 1], cutlass.float32, cutlass.float32, cutlass.float32, S)
    with pytest.raises(DescriptionError, match="SIMT warp tile"):
        cutlass.TileDescription([4, 4, 8], 2, [1, 1, 1], simt)  # 16 outputs for 32 lanes
    with pytest.raises(DescriptionError, match="threadblock_shape must be 3 positive integers"):
        f16_tile((128, 128), 3, (2, 2, 1))
    with pytest.raises(DescriptionError, match="warp_count must be 3 positive integers"):
        f16_tile((128, 128, 32), 3, (2, 0, 1))
    with pytest.raises(DescriptionError, match="threadblock_shape must be 3 integers"):
        cutlass.TileDescription(128, 3, [2, 2, 1], f16_math())
    with pytest.raises(DescriptionError, match="math_instruction must be a MathInstruction"):
        cutlass.TileDescription([128, 128, 32], 3, [2, 2, 1], "f16")


@pytest.mark.parametrize("stages", [1, 11, 2.5, "3", None, -1])
def test_tile_stages_out_of_range(stages):
    with pytest.raises(DescriptionError, match=r"stages must be an integer in 2\.\.10"):
        f16_tile(stages=stages)


def test_automatic_stages_are_for_the_sm90_family_only():
    tile = f16_tile(stages=0)  # CUTLASS 3.x's automatic stage count
    assert tile.sm90_only
    with pytest.raises(DescriptionError, match="SM90-only values"):
        f16_gemm(arch=80, tile=tile)


def test_tile_too_much_shared_memory_for_sm80():
    big = f16_tile((256, 256, 64), 6, (4, 4, 1))  # 6 * (256*64 + 64*256) * 2 B = 384 KiB
    assert big.shared_memory_bytes() == 384 * 1024
    with pytest.raises(DescriptionError) as info:
        big.check_shared_memory(80)
    message = str(info.value)
    assert "[256, 256, 64]" in message and "6 stages" in message and "384 KiB" in message
    assert "sm_80 allows 163 KiB" in message and "fewer stages" in message
    with pytest.raises(DescriptionError, match="384 KiB of shared memory; sm_80 allows 163 KiB"):
        f16_gemm(tile=big)
    # 192 KiB: too much for sm_80 (163 KiB), fine for sm_90 (227 KiB).
    medium = f16_tile((256, 128, 64), 4, (2, 2, 1))
    with pytest.raises(DescriptionError, match="sm_80 allows 163 KiB"):
        f16_gemm(arch=80, tile=medium)
    medium.check_shared_memory(90)  # the Sm80 family on Hopper (GemmOperationUniversal(90) is the SM90 family)
    with pytest.raises(DescriptionError, match=r"compute capability 71 is not a supported target; choose one of \[80, 86"):
        f16_tile().check_shared_memory(71)


# --- TensorDescription -----------------------------------------------------------------------------------------------
@pytest.mark.parametrize("element, allowed", [
    (cutlass.float16, [1, 2, 4, 8, 16]), (cutlass.bfloat16, [1, 2, 4, 8, 16]), (cutlass.float32, [1, 2, 4, 8]),
    (cutlass.int8, [1, 2, 4, 8, 16]), (cutlass.int32, [1, 2, 4, 8]),
])
def test_tensor_alignment_rules(element, allowed):
    for alignment in allowed:
        # up to 256 bits: a tensor-op GEMM's C may use them; the operations keep A and B (and other C) to 128
        assert td(element, cutlass.RowMajor, alignment).access_bits == alignment * element.bits <= 256
    for bad in {0, 3, 2 * allowed[-1], -1} - set(allowed):
        with pytest.raises(DescriptionError) as info:
            td(element, cutlass.RowMajor, bad)
        message = str(info.value)
        assert f"alignment {bad}" in message and element.label in message and str(allowed) in message


def test_tensor_f16_alignment_16_rejected():
    with pytest.raises(DescriptionError, match=r"alignment 32 is not valid for float16.*\[1, 2, 4, 8, 16\]"):
        td(cutlass.float16, cutlass.ColumnMajor, 32)
    # 16 x float16 = 256 bits: a description, but no main loop loads A or B that wide
    with pytest.raises(DescriptionError, match="B alignment 16 x 16 bits exceeds the 128-bit loads"):
        f16_gemm(B=td(cutlass.float16, cutlass.ColumnMajor, 16))


def test_tensor_f64_alignment_2_rejected():
    with pytest.raises(DescriptionError, match="alignment"):
        A = td(cutlass.float64, cutlass.RowMajor, 2)
        B = td(cutlass.float64, cutlass.ColumnMajor, 2)
        C = td(cutlass.float64, cutlass.RowMajor, 1)
        math = cutlass.MathInstruction([8, 8, 4], cutlass.float64, cutlass.float64, cutlass.float64, T)
        tile = cutlass.TileDescription([64, 64, 16], 3, [2, 2, 1], math)
        epilogue = cutlass.LinearCombination(cutlass.float64, 1, cutlass.float64, cutlass.float64)
        cutlass.GemmOperationUniversal(80, tile, A, B, C, epilogue)


def test_tensor_type_and_layout_checks():
    assert td(cutlass.float64, cutlass.RowMajor, 1).alignment == 1
    assert cutlass.TensorDescription(cutlass.float16, cutlass.RowMajor).alignment == 1  # default
    with pytest.raises(DescriptionError, match=r"alignment '8' is not valid"):
        td(cutlass.float16, cutlass.RowMajor, "8")
    with pytest.raises(DescriptionError, match="element must be a DataType"):
        td("float16", cutlass.RowMajor, 8)
    with pytest.raises(DescriptionError, match=r"layout must be a layout \(e.g. pycutlass.RowMajor\)"):
        td(cutlass.float16, "RowMajor", 8)
    for layout in (cutlass.RowMajorInterleaved32, cutlass.ColumnMajorInterleaved32):
        with pytest.raises(DescriptionError, match=f"interleaved layout {layout.value} is only supported for int8"):
            td(cutlass.float16, layout, 8)
        assert td(cutlass.int8, layout, 16).layout is layout


# --- epilogue functors -----------------------------------------------------------------------------------------------
def test_epilogue_functor_checks():
    for functor in (cutlass.LinearCombination, cutlass.LinearCombinationClamp):
        ok = functor(cutlass.float16, 8, cutlass.float32, cutlass.float32)
        assert ok.alignment == 8 and ok.activation is None and ok.kind == functor.__name__
        with pytest.raises(DescriptionError, match=rf"{functor.__name__}.alignment 32 must be a power of two <= 16 "
                                                   rf"for float16"):
            functor(cutlass.float16, 32, cutlass.float32, cutlass.float32)
        with pytest.raises(DescriptionError, match="power of two <= 8 for float32"):
            functor(cutlass.float32, 3, cutlass.float32, cutlass.float32)
        with pytest.raises(DescriptionError, match="power of two"):
            functor(cutlass.float32, 0, cutlass.float32, cutlass.float32)
        with pytest.raises(DescriptionError, match="an integer epilogue computes in int32, for LinearCombination"):
            functor(cutlass.float16, 8, cutlass.int32, cutlass.int32)  # int32 compute: int8/int32 outputs only
        with pytest.raises(DescriptionError, match="an integer epilogue computes in int32"):
            functor(cutlass.int32, 4, cutlass.float32, cutlass.int32)  # and int32 accumulators
        with pytest.raises(DescriptionError, match="element_output must be a DataType"):
            functor("float16", 8, cutlass.float32, cutlass.float32)
        with pytest.raises(DescriptionError, match="element_accumulator must be a DataType"):
            functor(cutlass.float16, 8, None, cutlass.float32)


def test_fast_linear_combination_clamp():
    fast = cutlass.FastLinearCombinationClamp(cutlass.int8, 16)
    assert fast.element_accumulator is cutlass.int32 and fast.element_epilogue is cutlass.float32
    with pytest.raises(DescriptionError, match="FastLinearCombinationClamp writes int8 output, got float16"):
        cutlass.FastLinearCombinationClamp(cutlass.float16, 8)
    with pytest.raises(DescriptionError, match="power of two <= 32 for int8"):
        cutlass.FastLinearCombinationClamp(cutlass.int8, 64)
    # PyCUTLASS's 4-argument form: the accumulator and compute types are fixed, so only int32/float32 (or None) pass.
    assert cutlass.FastLinearCombinationClamp(cutlass.int8, 16, cutlass.int32, cutlass.float32) == fast
    assert cutlass.FastLinearCombinationClamp(cutlass.int8, 16, cutlass.int32) == fast
    with pytest.raises(DescriptionError, match="always has element_epilogue float32"):
        cutlass.FastLinearCombinationClamp(cutlass.int8, 16, cutlass.int32, cutlass.float64)


def test_linear_combination_generic_and_activations():
    for name in ("identity", "relu", "leaky_relu", "tanh", "sigmoid", "silu", "hardswish", "gelu", "gelu_taylor"):
        activation = getattr(cutlass, name)(cutlass.float32)
        generic = cutlass.LinearCombinationGeneric(activation, cutlass.float16, 8, cutlass.float32, cutlass.float32)
        assert generic.kind == "LinearCombinationGeneric" and generic.activation is activation
        assert generic.num_activation_args == (1 if name == "leaky_relu" else 0)
        assert generic.describe() == f"LinearCombinationGeneric<{name}>"
    with pytest.raises(DescriptionError, match=r"needs an activation such as relu\(pycutlass.float32\)"):
        cutlass.LinearCombinationGeneric("relu", cutlass.float16, 8)
    with pytest.raises(DescriptionError, match="activation relu computes in a floating-point type"):
        cutlass.relu(cutlass.int32)
    with pytest.raises(DescriptionError, match="alignment 32 must be a power of two <= 16"):
        cutlass.LinearCombinationGeneric(cutlass.relu(cutlass.float32), cutlass.float16, 32)
    leaky = cutlass.LinearCombinationGeneric(cutlass.leaky_relu(cutlass.float32), cutlass.float16, 8)
    assert leaky.make_arguments(2.0, 0.5, 0.1) == cutlass.epilogue.EpilogueArguments(2.0, 0.5, (0.1,))
    with pytest.raises(cutlass.ArgumentError, match=r"1 activation argument\(s\) \['leaky_alpha'\]; got 0"):
        leaky.make_arguments(1.0, 0.0)
    with pytest.raises(cutlass.ArgumentError, match="epilogue arguments must be numbers"):
        leaky.make_arguments("one", 0.0, 0.1)


# --- GemmOperationUniversal ------------------------------------------------------------------------------------------
def test_gemm_accepts_the_seed_example():
    op = f16_gemm()
    assert op.compute_capability == 80 and op.swizzling_functor is cutlass.IdentitySwizzle1
    assert not op.transposed and op.element_accumulator is cutlass.float32
    assert re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", op.name)
    assert op.name.startswith("pycutlass_gemm_sm80_tensorop_f16f16f32_tnt_128x128x32_2x2x1_s3_a888_")
    assert op.kernel_symbol == op.name and op.builder_symbol == op.name + "_build"
    assert op.epilogue_type(2.0, 0.5) == cutlass.epilogue.EpilogueArguments(2.0, 0.5, ())


def test_gemm_element_mismatch_with_instruction():
    with pytest.raises(DescriptionError) as info:
        f16_gemm(A=td(cutlass.bfloat16, cutlass.RowMajor, 8))
    message = str(info.value)
    assert "A.element is bfloat16" in message and "multiplies float16" in message and "['float16']" in message
    with pytest.raises(DescriptionError, match="B.element is float32 but the math instruction multiplies float16"):
        f16_gemm(B=td(cutlass.float32, cutlass.ColumnMajor, 4))


def test_gemm_epilogue_must_match_c():
    with pytest.raises(DescriptionError, match="the epilogue writes float32 but C is float16; they must match"):
        f16_gemm(epilogue=cutlass.LinearCombination(cutlass.float32, 4, cutlass.float32, cutlass.float32))
    with pytest.raises(DescriptionError, match="epilogue alignment 4 must equal C's alignment 8"):
        f16_gemm(epilogue=cutlass.LinearCombination(cutlass.float16, 4, cutlass.float32, cutlass.float32))
    with pytest.raises(DescriptionError, match="epilogue reads float16 accumulators but the math instruction "
                                               "accumulates in float32"):
        f16_gemm(epilogue=cutlass.LinearCombination(cutlass.float16, 8, cutlass.float16, cutlass.float32))
    with pytest.raises(DescriptionError, match="epilogue_functor must be an epilogue functor"):
        f16_gemm(epilogue="LinearCombination")
    with pytest.raises(DescriptionError, match="A must be a TensorDescription"):
        cutlass.GemmOperationUniversal(80, f16_tile(), "A", td(cutlass.float16, cutlass.RowMajor, 8),
                                       td(cutlass.float16, cutlass.RowMajor, 8),
                                       cutlass.LinearCombination(cutlass.float16, 8, cutlass.float32, cutlass.float32))


def test_gemm_int8_tensorop_needs_row_a_column_b():
    tile, A, B, C, epilogue = int8_parts()
    assert cutlass.GemmOperationUniversal(80, tile, A, B, C, epilogue).name
    for layout_a, layout_b in ((cutlass.ColumnMajor, cutlass.ColumnMajor), (cutlass.RowMajor, cutlass.RowMajor),
                               (cutlass.ColumnMajor, cutlass.RowMajor)):
        tile, A, B, C, epilogue = int8_parts(layout_a, layout_b)
        with pytest.raises(DescriptionError) as info:
            cutlass.GemmOperationUniversal(80, tile, A, B, C, epilogue)
        message = str(info.value)
        assert "A must be RowMajor and B ColumnMajor" in message
        assert f"got A {layout_a.value}, B {layout_b.value}" in message
    # int32 output is fine too.
    tile, A, B, _, _ = int8_parts()
    assert cutlass.GemmOperationUniversal(80, tile, A, B, td(cutlass.int32, cutlass.RowMajor, 4),
                                          cutlass.LinearCombination(cutlass.int32, 4, cutlass.int32, cutlass.float32))


def test_gemm_interleaved_combinations():
    n32, t32 = cutlass.ColumnMajorInterleaved32, cutlass.RowMajorInterleaved32
    tile, A, B, C, epilogue = int8_parts(n32, t32, n32)
    op = cutlass.GemmOperationUniversal(80, tile, A, B, C, epilogue)
    assert "_n32t32n32_" in op.name and not op.transposed
    for layouts in ((n32, t32, cutlass.RowMajor), (n32, n32, n32), (t32, n32, n32), (n32, t32, t32),
                    (cutlass.RowMajor, t32, n32)):
        tile, A, B, C, epilogue = int8_parts(*layouts)
        with pytest.raises(DescriptionError) as info:
            cutlass.GemmOperationUniversal(80, tile, A, B, C, epilogue)
        message = str(info.value)
        assert "interleaved int8 GEMM takes A ColumnMajorInterleaved32, B RowMajorInterleaved32 and C " \
               "ColumnMajorInterleaved32" in message
        assert str([layout.value for layout in layouts]) in message
    tile, A, B, C, epilogue = int8_parts(n32, t32, n32, alignment_b=8)
    with pytest.raises(DescriptionError, match="interleaved int8 GEMM needs B alignment 16, got 8"):
        cutlass.GemmOperationUniversal(80, tile, A, B, C, epilogue)
    with pytest.raises(DescriptionError, match="interleaved layout ColumnMajorInterleaved32 is only supported for int8"):
        td(cutlass.int32, n32, 4)  # an int32 interleaved output cannot even be described
    with pytest.raises(DescriptionError, match="need matrix layouts"):
        tile, A, B, C, epilogue = int8_parts(cutlass.TensorNHWC)
        cutlass.GemmOperationUniversal(80, tile, A, B, C, epilogue)


@pytest.mark.parametrize("arch", [70, 75, 61, 87, 100, "80", None])
def test_gemm_unsupported_compute_capability(arch):
    with pytest.raises(DescriptionError) as info:
        f16_gemm(arch=arch)
    message = str(info.value)
    assert f"compute capability {arch!r} is not supported" in message and "[80, 86, 89, 90]" in message


@pytest.mark.parametrize("arch", [80, 86, 89, 90])
def test_gemm_supported_compute_capabilities(arch):
    op = f16_gemm(arch=arch)
    assert op.compute_capability == arch and f"_sm{arch}_" in op.name
    assert "cutlass::arch::Sm80" in op.emit_body()  # the Sm80 template family on every supported target


def test_gemm_compute_capability_90_is_the_cutlass_3_family():
    """90 builds the SM90 (CUTLASS 3.x) kernel, unless the tile states an Sm80 warp arrangement (PyCUTLASS 2.11
    scripts pass the device's 90 with those): then it is the Sm80 family, as those scripts expect."""
    assert f16_gemm(arch=90).family == "sm80"
    assert f16_gemm(arch=90, tile=f16_tile(warps=(8, 1, 1), shape=(128, 128, 64))).family == "sm90"
    op = f16_gemm(arch=90, tile=f16_tile(warps=None, stages=0, shape=(128, 128, 64)))
    assert type(op).__name__ == "GemmOperationSm90" and op.family == "sm90"
    assert "CollectiveBuilder" in op.emit_body() and "cutlass::arch::Sm90" in op.emit_body()


def test_gemm_multistage_needs_32_bit_accesses():
    with pytest.raises(DescriptionError) as info:
        f16_gemm(A=td(cutlass.float16, cutlass.RowMajor, 1))
    message = str(info.value)
    assert "A alignment 1 x 16 bits is below the 32-bit minimum of multistage (3-stage) kernels" in message
    assert "stages=2" in message
    with pytest.raises(DescriptionError, match="B alignment 1 x 16 bits"):
        f16_gemm(B=td(cutlass.float16, cutlass.ColumnMajor, 1))
    # Two stages (no cp.async) accept 16-bit accesses; alignment 2 (32 bits) is fine multistage.
    assert f16_gemm(tile=f16_tile(stages=2), A=td(cutlass.float16, cutlass.RowMajor, 1)).tile_description.stages == 2
    assert f16_gemm(A=td(cutlass.float16, cutlass.RowMajor, 2)).A.alignment == 2


def test_gemm_swizzles():
    # The guide's list: IdentitySwizzle1|2|4|8 and BatchedIdentitySwizzle (for batched and array GEMMs).
    for swizzle in (cutlass.IdentitySwizzle1, cutlass.IdentitySwizzle2, cutlass.IdentitySwizzle4,
                    cutlass.IdentitySwizzle8, cutlass.BatchedIdentitySwizzle):
        op = f16_gemm(swizzle=swizzle)
        assert op.swizzling_functor is swizzle and names.gemm_swizzle(swizzle) in op.emit_body()
    assert "GemmIdentityThreadblockSwizzle<8>" in f16_gemm(swizzle=cutlass.IdentitySwizzle8).emit_body()
    assert "GemmBatchedIdentityThreadblockSwizzle" in f16_gemm(swizzle=cutlass.BatchedIdentitySwizzle).emit_body()
    # Conv-only swizzles are not GEMM swizzles.
    for swizzle in (cutlass.HorizontalSwizzle, cutlass.StridedDgradIdentitySwizzle1):
        with pytest.raises(DescriptionError) as info:
            f16_gemm(swizzle=swizzle)
        message = str(info.value)
        assert "swizzling_functor must be one of" in message and f"got pycutlass.{swizzle.name}" in message
        assert "IdentitySwizzle8" in message and "BatchedIdentitySwizzle" in message


def test_gemm_visitor_needs_a_tree():
    A, B, C = (td(cutlass.float16, cutlass.RowMajor, 8),) * 3
    epilogue = cutlass.LinearCombination(cutlass.float16, 8, cutlass.float32, cutlass.float32)
    with pytest.raises(DescriptionError, match="must be an EpilogueVisitTree"):
        cutlass.GemmOperationUniversal(80, f16_tile(), A, B, C, epilogue, cutlass.IdentitySwizzle1, True)


# --- immutability, hashing, naming -----------------------------------------------------------------------------------
def _descriptions():
    math = f16_math()
    return {
        "math": (math, "element_a", cutlass.bfloat16),
        "tile": (f16_tile(math=math), "stages", 4),
        "tensor": (td(cutlass.float16, cutlass.RowMajor, 8), "alignment", 4),
        "linear_combination": (cutlass.LinearCombination(cutlass.float16, 8, cutlass.float32, cutlass.float32),
                               "alignment", 4),
        "clamp": (cutlass.LinearCombinationClamp(cutlass.float16, 8, cutlass.float32, cutlass.float32),
                  "element_output", cutlass.float32),
        "fast_clamp": (cutlass.FastLinearCombinationClamp(cutlass.int8, 16), "alignment", 8),
        "generic": (cutlass.LinearCombinationGeneric(cutlass.gelu(cutlass.float32), cutlass.float16, 8),
                    "activation", None),
        "activation": (cutlass.relu(cutlass.float32), "element", cutlass.float16),
        "coord": (cutlass.GemmCoord(1, 2, 3), "m_", 5),
        "swizzle": (cutlass.IdentitySwizzle2, "log_tile", 3),
    }


@pytest.mark.parametrize("kind", sorted(_descriptions()))
def test_descriptions_are_frozen(kind):
    description, field, value = _descriptions()[kind]
    before = getattr(description, field)
    with pytest.raises(dataclasses.FrozenInstanceError):
        setattr(description, field, value)
    assert getattr(description, field) == before


@pytest.mark.parametrize("kind", sorted(_descriptions()))
def test_descriptions_are_hashable_and_equal_by_value(kind):
    first, second = _descriptions()[kind][0], _descriptions()[kind][0]
    assert first == second and hash(first) == hash(second)
    assert len({first, second}) == 1 and {first: 1}[second] == 1


def test_list_arguments_are_normalized_to_tuples():
    """The users' API passes lists; stored as tuples they hash, and equal lists make equal descriptions."""
    a = cutlass.TileDescription([128, 128, 32], 3, [2, 2, 1], f16_math())
    b = cutlass.TileDescription((128, 128, 32), 3, (2, 2, 1), f16_math())
    assert a.threadblock_shape == (128, 128, 32) and a.warp_count == (2, 2, 1)
    assert a == b and hash(a) == hash(b)


def test_equal_descriptions_make_equal_operations():
    first, second = f16_gemm(), f16_gemm()  # every description object built afresh
    assert first is not second and first == second and hash(first) == hash(second)
    assert first.name == second.name and first.emit() == second.emit()
    assert len({first, second}) == 1
    assert first != "not an operation"


def _variants():
    """Operations differing from the base in exactly one respect."""
    base = dict(arch=80)
    c16 = td(cutlass.float16, cutlass.RowMajor, 8)
    return {
        "base": f16_gemm(**base),
        "arch90": f16_gemm(arch=90, tile=f16_tile(warps=None, stages=0, shape=(128, 128, 64))),
        "arch86": f16_gemm(arch=86),
        "tile_shape": f16_gemm(tile=f16_tile((128, 256, 32), warps=(2, 4, 1))),
        "stages": f16_gemm(tile=f16_tile(stages=4)),
        "warps": f16_gemm(tile=f16_tile(warps=(4, 2, 1))),
        "acc_f16": f16_gemm(tile=f16_tile(math=f16_math(cutlass.float16)),
                            epilogue=cutlass.LinearCombination(cutlass.float16, 8, cutlass.float16, cutlass.float16)),
        "layout_a": f16_gemm(A=td(cutlass.float16, cutlass.ColumnMajor, 8)),
        "layout_b": f16_gemm(B=td(cutlass.float16, cutlass.RowMajor, 8)),
        "layout_c": f16_gemm(C=td(cutlass.float16, cutlass.ColumnMajor, 8)),
        "alignment_a": f16_gemm(A=td(cutlass.float16, cutlass.RowMajor, 4)),
        "alignment_b": f16_gemm(B=td(cutlass.float16, cutlass.ColumnMajor, 2)),
        "alignment_c": f16_gemm(C=td(cutlass.float16, cutlass.RowMajor, 4)),
        "epilogue_compute": f16_gemm(epilogue=cutlass.LinearCombination(cutlass.float16, 8, cutlass.float32,
                                                                        cutlass.float16)),
        "clamp": f16_gemm(epilogue=cutlass.LinearCombinationClamp(cutlass.float16, 8, cutlass.float32,
                                                                  cutlass.float32)),
        "relu": f16_gemm(epilogue=cutlass.LinearCombinationGeneric(cutlass.relu(cutlass.float32), cutlass.float16, 8)),
        "gelu": f16_gemm(epilogue=cutlass.LinearCombinationGeneric(cutlass.gelu(cutlass.float32), cutlass.float16, 8)),
        "swizzle2": f16_gemm(swizzle=cutlass.IdentitySwizzle2),
        "swizzle_batched": f16_gemm(swizzle=cutlass.BatchedIdentitySwizzle),
        "output_f32": f16_gemm(C=td(cutlass.float32, cutlass.RowMajor, 4)),
        "c_is_base": f16_gemm(C=c16),
    }


def test_different_descriptions_make_different_names():
    variants = _variants()
    assert variants.pop("c_is_base") == variants["base"]
    by_name = {}
    for label, op in variants.items():
        assert re.fullmatch(r"pycutlass_gemm_sm\d+_[A-Za-z0-9_]+_[0-9a-f]{10}", op.name), op.name
        assert op.name not in by_name, f"{label} and {by_name.get(op.name)} share the name {op.name}"
        by_name[op.name] = label
    ops = list(variants.values())
    assert len(set(ops)) == len(ops)  # all unequal
    assert len({op.emit() for op in ops}) == len(ops)  # and each emits different code


def test_unequal_operations_never_share_a_name():
    """Regression: the activation's compute type once dropped out of the name (equal names, unequal ops)."""
    relu32 = f16_gemm(epilogue=cutlass.LinearCombinationGeneric(cutlass.relu(cutlass.float32), cutlass.float16, 8))
    relu16 = f16_gemm(epilogue=cutlass.LinearCombinationGeneric(cutlass.relu(cutlass.float16), cutlass.float16, 8))
    assert relu32 != relu16
    assert relu32.name != relu16.name


@pytest.mark.parametrize("shape,warps", [((64, 32, 32), (2, 4, 1)), ((64, 96, 32), (2, 2, 1))])
def test_tensor_op_warp_tiles_must_be_16_32_or_64_wide(shape, warps):
    """8-wide warp tiles do not compile; 128-wide ones are described, and the operations take them for float32
    outputs only (they give wrong results in CUTLASS's mixed epilogue: test_validation_relaxed.py)."""
    with pytest.raises(DescriptionError, match=r"must be 16, 32 or 64 wide in N for tensor-op epilogues \(128 for "
                                               r"float32 outputs\)"):
        f16_tile(shape, 3, warps)
    assert f16_tile((128, 256, 32), 3, (2, 2, 1)).warp_shape[1] == 128
