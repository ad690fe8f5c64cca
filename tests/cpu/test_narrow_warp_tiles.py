"""Warp tiles the Sm80-family tensor-op kernels compute wrongly, found by tools/fuzz_run.py on an H100:
every configuration below ran against a float64 reference in its own process, and so did its transposed twin (a
ColumnMajor C swapped for a RowMajor one with A and B exchanged): both failed or both passed, so the kernel is at
fault, not the transposition. The rejected ones must stay rejected, the accepted ones accepted."""
from __future__ import annotations

import pytest

import pycutlass as cutlass
from pycutlass import DescriptionError
from pycutlass.conv import IteratorAlgorithm, Operator, StrideSupport

D = cutlass.DataType
R, C = cutlass.RowMajor, cutlass.ColumnMajor
INST = {D.float16: [16, 8, 16], D.bfloat16: [16, 8, 16], D.float32: [16, 8, 8], D.tfloat32: [16, 8, 8]}


def gemm(element=D.float16, shape=(64, 64, 32), warps=(2, 2, 1), layouts=(R, R, R), aligns=(8, 8, 8), out=None,
         stages=3, inst=None, math_op=cutlass.MathOperation.multiply_add):
    out = out or (element if element.bits == 16 else D.float32)
    math = cutlass.MathInstruction(inst or INST[element], element, element, D.float32, cutlass.OpClass.TensorOp,
                                   math_op)
    tile = cutlass.TileDescription(list(shape), stages, list(warps), math)
    memory = D.float32 if element is D.tfloat32 else element
    A = cutlass.TensorDescription(memory, layouts[0], aligns[0])
    B = cutlass.TensorDescription(memory, layouts[1], aligns[1])
    Cd = cutlass.TensorDescription(out, layouts[2], aligns[2])
    return cutlass.GemmOperationUniversal(80, tile, A, B, Cd, cutlass.LinearCombination(out, aligns[2], D.float32))


# (what the H100 run showed) -> the description
WRONG_OR_CRASHED = {
    # 16-bit, the kernel's B contiguous along N, warp N 16: "Invalid __shared__ read of size 16 bytes"
    "f16 B RowMajor warp 64x16 (illegal address)": dict(warps=(1, 4, 1), aligns=(8, 8, 4)),
    "f16 B RowMajor warp 64x16, A ColumnMajor": dict(warps=(1, 4, 1), layouts=(C, R, R), aligns=(8, 8, 4)),
    "bf16 B RowMajor warp 64x16": dict(element=D.bfloat16, warps=(1, 4, 1), aligns=(8, 8, 4)),
    "f16 B RowMajor warp 64x16 in a 128x64 tile": dict(shape=(128, 64, 32), warps=(2, 4, 1), aligns=(8, 8, 4)),
    "f16 B RowMajor warp 64x16, f32 C": dict(warps=(1, 4, 1), aligns=(8, 8, 4), out=D.float32),
    # ... and through a ColumnMajor C: the kernel's B is A^T, contiguous along N where A is ColumnMajor
    "f16 A, B, C ColumnMajor, warp 64x16 (the first fuzzing crash)": dict(
        warps=(1, 4, 1), layouts=(C, C, C), aligns=(2, 2, 4), stages=4),
    # 16-bit, the kernel's A contiguous along M, warp M 16: wrong results
    "f16 A ColumnMajor warp 16x64": dict(warps=(4, 1, 1), layouts=(C, R, R)),
    "f16 A and B ColumnMajor warp 16x64": dict(warps=(4, 1, 1), layouts=(C, C, R)),
    "f16 16x8x8, B RowMajor, C ColumnMajor, warp 16x32": dict(
        shape=(32, 32, 64), warps=(2, 1, 1), layouts=(C, R, C), aligns=(1, 1, 1), stages=2, inst=[16, 8, 8]),
    # two of C's vector accesses per warp-tile row: wrong for some problem sizes
    "bf16 C x 8 on a 16-wide warp tile": dict(element=D.bfloat16, shape=(64, 16, 64), warps=(1, 1, 1),
                                              layouts=(R, C, C), aligns=(4, 4, 8), stages=7, inst=[16, 8, 8]),
    "f32 fast-bf16 C x 8 on a 16-wide warp tile": dict(
        element=D.float32, shape=(128, 16, 32), warps=(2, 1, 1), layouts=(R, R, C), aligns=(2, 2, 8), stages=4,
        math_op=cutlass.MathOperation.multiply_add_fast_bf16),
    "f16 C x 16 on a 32-wide warp tile": dict(shape=(256, 32, 32), warps=(2, 1, 1), layouts=(C, R, R),
                                              aligns=(2, 4, 16), stages=4, inst=[16, 8, 8]),
    # f32 operands multiplied in f16 / bf16, warp M 16: every size wrong (fuzz_run --seed 21, then 16 bisecting variants)
    "f32 fast-f16 warp 16x64 (seed 21)": dict(
        element=D.float32, shape=(32, 128, 16), warps=(2, 2, 1), layouts=(R, C, R), aligns=(1, 2, 4), stages=7,
        out=D.bfloat16, math_op=cutlass.MathOperation.multiply_add_fast_f16),
    "f32 fast-f16 warp 16x64, A ColumnMajor, tile K 32": dict(
        element=D.float32, shape=(32, 128, 32), warps=(2, 2, 1), layouts=(C, C, R), aligns=(1, 2, 4), stages=7,
        out=D.bfloat16, math_op=cutlass.MathOperation.multiply_add_fast_f16),
    "f32 fast-f16 warp 16x64, f32 C": dict(
        element=D.float32, shape=(32, 128, 16), warps=(2, 2, 1), layouts=(R, C, R), aligns=(1, 2, 4), stages=7,
        math_op=cutlass.MathOperation.multiply_add_fast_f16),
    "f32 fast-f16 warp 16x32": dict(
        element=D.float32, shape=(32, 64, 16), warps=(2, 2, 1), layouts=(R, C, R), aligns=(1, 2, 4), stages=7,
        out=D.bfloat16, math_op=cutlass.MathOperation.multiply_add_fast_f16),
    "f32 fast-f16 warp 16x64, B RowMajor": dict(
        element=D.float32, shape=(32, 128, 16), warps=(2, 2, 1), layouts=(R, R, R), aligns=(1, 2, 4), stages=7,
        out=D.bfloat16, math_op=cutlass.MathOperation.multiply_add_fast_f16),
    "f32 fast-bf16 warp 16x32": dict(
        element=D.float32, shape=(32, 64, 32), warps=(2, 2, 1), layouts=(R, C, R), aligns=(1, 2, 4), stages=7,
        out=D.bfloat16, math_op=cutlass.MathOperation.multiply_add_fast_bf16),
    # f32 operands in the two-stage main loop (half_t in shared memory, CUTLASS's OpMultiplyAddFastF16 core): the
    # 16-bit congruous rule; A and C ColumnMajor make the kernel's B (A transposed) contiguous along N, 16 per warp
    # (fuzz seed 53: every size wrong, output not finite)
    "f32 fast-f16 two-stage, congruous B 16 wide per warp (seed 53)": dict(
        element=D.float32, shape=(128, 64, 32), warps=(1, 4, 1), layouts=(C, R, C), aligns=(1, 4, 4), stages=2,
        out=D.float16, math_op=cutlass.MathOperation.multiply_add_fast_f16),
}

PASSED = {
    # seed 53, passed: a warp 16 wide in N with 6 stages (f32 stays in shared memory), and the two-stage core with
    # a congruous operand 32 wide per warp
    "f32 fast-f16 warp 128x16, 6 stages, all ColumnMajor": dict(
        element=D.float32, shape=(128, 64, 16), warps=(1, 4, 1), layouts=(C, C, C), aligns=(1, 1, 2), stages=6,
        math_op=cutlass.MathOperation.multiply_add_fast_f16),
    "f32 fast-f16 two-stage, warp 64x32, all ColumnMajor": dict(
        element=D.float32, shape=(64, 128, 16), warps=(1, 4, 1), layouts=(C, C, C), aligns=(4, 4, 4), stages=2,
        out=D.bfloat16, math_op=cutlass.MathOperation.multiply_add_fast_f16),
    "f32 fast-f16 warp 32x64": dict(element=D.float32, shape=(32, 128, 16), warps=(1, 2, 1), layouts=(R, C, R),
                                    aligns=(1, 2, 4), stages=7, out=D.bfloat16,
                                    math_op=cutlass.MathOperation.multiply_add_fast_f16),
    "f32 fast-f16 warp 64x16, C ColumnMajor": dict(element=D.float32, shape=(64, 32, 16), warps=(1, 2, 1),
                                                   layouts=(R, C, C), aligns=(1, 2, 4), stages=7, out=D.bfloat16,
                                                   math_op=cutlass.MathOperation.multiply_add_fast_f16),
    "f32 3xTF32 warp 16x64": dict(element=D.float32, shape=(32, 128, 16), warps=(2, 2, 1), layouts=(R, C, R),
                                  aligns=(1, 2, 4), stages=7, out=D.bfloat16,
                                  math_op=cutlass.MathOperation.multiply_add_fast_f32),
    "tf32 warp 16x64": dict(element=D.float32, shape=(32, 128, 16), warps=(2, 2, 1), layouts=(R, C, R),
                            aligns=(1, 2, 4), stages=7, out=D.bfloat16),
    "f16 B RowMajor warp 64x32": dict(shape=(64, 128, 32), warps=(1, 4, 1)),
    "f16 B ColumnMajor warp 64x16 (crosswise)": dict(warps=(1, 4, 1), layouts=(R, C, R), aligns=(8, 8, 4)),
    "tf32 B RowMajor warp 64x16": dict(element=D.tfloat32, warps=(1, 4, 1), aligns=(4, 4, 4)),
    "f16 A RowMajor, C ColumnMajor, warp 64x16": dict(warps=(1, 4, 1), layouts=(R, C, C), aligns=(2, 2, 4),
                                                     stages=4),
    "f16 warps 4x1x1, A RowMajor, C ColumnMajor": dict(warps=(4, 1, 1), layouts=(C, C, C), aligns=(2, 2, 4),
                                                       stages=4),
    "f16 16x8x8 warp 64x16, f32 C x 2": dict(shape=(128, 16, 64), warps=(2, 1, 1), layouts=(R, R, C),
                                             aligns=(2, 2, 2), out=D.float32, stages=5, inst=[16, 8, 8]),
    "f16 32x32 warps on 2x2, C x 1": dict(shape=(32, 32, 32), warps=(2, 2, 1), layouts=(R, C, C), aligns=(8, 8, 1),
                                         inst=[16, 8, 8]),
}


@pytest.mark.parametrize("name", sorted(WRONG_OR_CRASHED))
def test_rejected(name):
    with pytest.raises(DescriptionError, match="warp tile"):
        gemm(**WRONG_OR_CRASHED[name])


@pytest.mark.parametrize("name", sorted(PASSED))
def test_accepted(name):
    gemm(**PASSED[name])


def test_grouped_gemm_and_conv_follow_the_same_rules():
    math = cutlass.MathInstruction([16, 8, 16], D.float16, D.float16, D.float32, cutlass.OpClass.TensorOp)
    f16 = [cutlass.TensorDescription(D.float16, layout, 8) for layout in (R, R)]
    out = cutlass.TensorDescription(D.float16, R, 4)
    epilogue = cutlass.LinearCombination(D.float16, 4, D.float32)
    narrow = cutlass.TileDescription([64, 64, 32], 3, [1, 4, 1], math)
    with pytest.raises(DescriptionError, match="contiguous along N"):
        cutlass.GemmOperationGrouped(80, narrow, *f16, out, epilogue)
    nhwc = cutlass.TensorDescription(D.float16, cutlass.TensorNHWC, 8)
    conv_out = cutlass.TensorDescription(D.float16, cutlass.TensorNHWC, 4)

    def conv(kind, warps):
        support = StrideSupport.Unity if kind is Operator.dgrad else StrideSupport.Strided
        return cutlass.Conv2dOperation(kind, IteratorAlgorithm.optimized, 80,
                                       cutlass.TileDescription([64, 64, 32], 3, list(warps), math), nhwc, nhwc,
                                       conv_out, support, epilogue)
    for kind in (Operator.dgrad, Operator.wgrad):  # their B (filter / activation) is contiguous along N
        with pytest.raises(DescriptionError, match="contiguous along N"):
            conv(kind, (1, 4, 1))
    with pytest.raises(DescriptionError, match="contiguous along M"):  # wgrad's A (the output gradient)
        conv(Operator.wgrad, (4, 1, 1))
    conv(Operator.fprop, (1, 4, 1))  # fprop reads both along K (crosswise)
    conv(Operator.dgrad, (4, 1, 1))


def test_simt_tile_n_must_be_a_multiple_of_32():
    """The SIMT epilogue's one-row thread map writes N / 32 groups of 32 columns (integer division): N = 48 would
    leave 16 columns unwritten (read from output_tile_thread_map.h; N below 32 does not compile at all)."""
    math = cutlass.MathInstruction([1, 1, 1], D.float32, D.float32, D.float32, cutlass.OpClass.Simt)
    f32 = cutlass.TensorDescription(D.float32, R, 1)
    epilogue = cutlass.LinearCombination(D.float32, 1, D.float32)
    with pytest.raises(DescriptionError, match="unwritten"):
        cutlass.GemmOperationUniversal(80, cutlass.TileDescription([32, 48, 8], 2, [1, 1, 1], math), f32,
                                       cutlass.TensorDescription(D.float32, C, 1), f32, epilogue)
    cutlass.GemmOperationUniversal(80, cutlass.TileDescription([96, 96, 8], 2, [1, 3, 1], math), f32, f32, f32,
                                   epilogue)


def test_simt_thread_map_rows_must_divide_the_tile():
    """Seed 23 on an H100: SIMT f64, 64x32x8 on 4x4 warps, A and B RowMajor: an illegal address. B's 32 x 8 tile
    (N-contiguous) over 512 threads: 16 rows of 32 at a time for 8 rows, so CUTLASS's stripmined map rounds up to a
    pass that writes 8 rows past the tile. The same warps on a 64x32x16 tile (16 rows, ColumnMajor C) passed."""
    math = cutlass.MathInstruction([1, 1, 1], D.float64, D.float64, D.float64, cutlass.OpClass.Simt)
    f64 = {layout: cutlass.TensorDescription(D.float64, layout, 1) for layout in (R, C)}
    epilogue = cutlass.LinearCombination(D.float64, 1, D.float64)
    with pytest.raises(DescriptionError, match="writes rows past the tile"):
        cutlass.GemmOperationUniversal(80, cutlass.TileDescription([64, 32, 8], 4, [4, 4, 1], math), f64[R], f64[R],
                                       f64[R], epilogue)
    cutlass.GemmOperationUniversal(80, cutlass.TileDescription([64, 32, 16], 7, [4, 4, 1], math), f64[R], f64[C],
                                   f64[C], epilogue)


def test_striped_thread_map_must_place_every_warp():
    """Seed 29 on an H100: f64 tensor-op wgrad (analytic), 128x256x8 on 4x4 warps: relative error 0.65 on one of
    three sizes. Its A tile (128 x 8, M-contiguous, 64-bit accesses striped 16 x 2) has 8 x 4 warp iterations, and
    PitchLinearWarpStripedThreadMap arranges 8 / (16 / 4) = 2 x 4 warps: the other 8 of its 16 warps start past the
    tile. 128x64x16 on 4x2 warps (8 warps, all placed) passed."""
    math = cutlass.MathInstruction([8, 8, 4], D.float64, D.float64, D.float64, cutlass.OpClass.TensorOp)
    nhwc = cutlass.TensorDescription(D.float64, cutlass.TensorNHWC, 1)
    epilogue = cutlass.LinearCombination(D.float64, 1, D.float64, D.float64)

    def wgrad(shape, warps, stages):
        return cutlass.Conv2dOperation(Operator.wgrad, IteratorAlgorithm.analytic, 80,
                                       cutlass.TileDescription(list(shape), stages, list(warps), math), nhwc, nhwc,
                                       nhwc, StrideSupport.Strided, epilogue)
    with pytest.raises(DescriptionError, match="the other 8 start past it"):
        wgrad((128, 256, 8), (4, 4, 1), 6)
    wgrad((128, 64, 16), (4, 2, 1), 6)
