"""On the GPU: configurations at the edge of validation that it accepts, run against float64 references.

(a) warp tiles 16 wide in N: float64 32x32x16 with 2x2x1 warps (CUTLASS's own DGEMM tile) in every layout, and the
    other epilogue paths (f16 -> f32 x 4, f16 accumulators, tf32, int8 -> int32, the mixed f16 <= f32 x 8 epilogue);
(c) 256-bit C stores: f16 -> f32 and s8 -> s32 GEMMs with C alignment 8 (row- and column-major C, serial split-K);
(d) wgrad with C = 1 (activation alignment 1) and filter-gradient alignment 4, R*S a multiple of 4.
Odd problem sizes throughout; outputs NaN-poisoned (run_gemm / run_conv). CPU side: tests/cpu/test_validation_relaxed.py.
"""
from __future__ import annotations

import pytest

import pycutlass as cutlass
from pycutlass.conv import IteratorAlgorithm, Operator, StrideSupport
from pycutlass.gemm import Mode
from pycutlass.kinds.conv2d.operation import Conv2dOperation

from .conftest import precompile_module
from .gemm_cases import CM, CONFIGS, D, R, make_op
from .test_gemm import assert_close, run_gemm
from .test_conv2d import problem, run_conv

pytestmark = pytest.mark.gpu

LAYOUTS = [(a, b, c) for a in (R, CM) for b in (R, CM) for c in (R, CM)]


def _lid(layouts):
    return "".join("t" if x is R else "n" for x in layouts)


# (a) warp N = 16
F64_N16 = {f"f64_32x32x16_{_lid(lay)}": make_op("f64", lay, tile=[32, 32, 16], warps=[2, 2, 1], stages=5)
           for lay in LAYOUTS}
F64_N16["f64_64x32x16_tnt"] = make_op("f64", (R, CM, R), tile=[64, 32, 16], warps=[2, 2, 1])
N16_OTHER = {
    "f16_f32out4": make_op("f16", out=D.float32, out_align=4, tile=[64, 32, 32], warps=[2, 2, 1]),
    "f16acc16_f16out4": make_op("f16acc16", out_align=4, tile=[64, 32, 32], warps=[2, 2, 1]),
    "tf32": make_op("tf32", tile=[64, 32, 32], warps=[2, 2, 1]),
    "s8_s32out4": make_op("s8", out=D.int32, out_align=4, tile=[64, 32, 64], warps=[2, 2, 1]),
}
# (c) C alignment 8 = 256-bit stores
WIDE_C = {
    "f16_f32out8_tnt": make_op("f16", out=D.float32, out_align=8),
    "f16_f32out8_tnn": make_op("f16", (R, CM, CM), out=D.float32, out_align=8),
    "f16_f32out8_64x64_ntt": make_op("f16", (CM, R, R), out=D.float32, out_align=8, tile=[64, 64, 32]),
    "s8_s32out8": make_op("s8", out=D.int32, out_align=8),
}


# (d) wgrad, C = 1
def _wgrad(cfg, align_a, stages, tile):
    c = CONFIGS[cfg]
    math = cutlass.MathInstruction(c["inst"], c["el"], c["el"], c["acc"], c["cls"], c["math"])
    td = cutlass.TileDescription(tile, stages, [2, 2, 1], math)
    storage = c.get("storage", c["el"])
    A = cutlass.TensorDescription(storage, cutlass.TensorNHWC, align_a)
    B = cutlass.TensorDescription(storage, cutlass.TensorNHWC, 1)  # the activation, read along C = 1
    C = cutlass.TensorDescription(storage, cutlass.TensorNHWC, 4)  # the filter gradient, along R*S*C
    ep = cutlass.LinearCombination(storage, 4, c["acc"], D.float32)
    return Conv2dOperation(Operator.wgrad, IteratorAlgorithm.optimized, 80, td, A, B, C, StrideSupport.Strided, ep,
                           cutlass.IdentitySwizzle1)


WGRAD_C1 = {
    "f16_s2": _wgrad("f16", 8, 2, [64, 64, 32]),  # B f16 x 1 = 16 bits: the 2-stage main loop
    "tf32_s3": _wgrad("tf32", 4, 3, [64, 64, 16]),
}
WGRAD_C1["f16_analytic"] = Conv2dOperation(
    Operator.wgrad, IteratorAlgorithm.analytic, 80, WGRAD_C1["f16_s2"].tile_description, WGRAD_C1["f16_s2"].A,
    WGRAD_C1["f16_s2"].B, WGRAD_C1["f16_s2"].C, StrideSupport.Strided, WGRAD_C1["f16_s2"].epilogue_functor,
    cutlass.IdentitySwizzle1)

NVRTC_OPS = [F64_N16["f64_32x32x16_tnt"], WIDE_C["f16_f32out8_tnt"], WGRAD_C1["f16_s2"]]
NVCC_OPS = list(F64_N16.values()) + list(N16_OTHER.values()) + list(WIDE_C.values()) + list(WGRAD_C1.values())


@pytest.fixture(scope="module", autouse=True)
def compiled(memory_pool):
    precompile_module(NVCC_OPS, NVRTC_OPS)
    yield


SIZES = [(67, 45, 23), (129, 37, 80), (200, 96, 51)]  # partial tiles in M, N and K


def _tol(op):
    return {D.float64: 1e-12, D.float16: 3e-3, D.float32: 5e-3}.get(op.C.element, 0)


@pytest.mark.parametrize("name", list(F64_N16))
@pytest.mark.parametrize("m,n,k", SIZES)
def test_f64_warp_tile_16_wide(name, m, n, k):
    op = F64_N16[name]
    got, ref = run_gemm(op, m, n, k)
    assert_close(op, got, ref, _tol(op))


@pytest.mark.parametrize("name", list(N16_OTHER))
def test_warp_tile_16_wide_other_epilogues(name):
    op = N16_OTHER[name]
    a = max(op.A.alignment, op.C.alignment)
    for m, n, k in ((13 * a, 5 * a, 9 * a), (131, 10 * a, 7 * a)):
        got, ref = run_gemm(op, m, n, k, alpha=1.0 if op.C.element is D.int32 else 1.25,
                            beta=1.0 if op.C.element is D.int32 else -0.5)
        assert_close(op, got, ref, _tol(op))


@pytest.mark.parametrize("name", list(WIDE_C))
@pytest.mark.parametrize("m,n,k", [(136, 72, 48), (264, 200, 80), (72, 520, 112)])
def test_c_alignment_8_256_bit_stores(name, m, n, k):
    op = WIDE_C[name]
    integer = op.C.element is D.int32
    if integer:
        k = 16 * (-(-k // 16))
    got, ref = run_gemm(op, m, n, k, alpha=1.0 if integer else 1.25, beta=1.0 if integer else -0.5)
    assert_close(op, got, ref, _tol(op))


def test_c_alignment_8_serial_split_k():
    op = WIDE_C["f16_f32out8_tnt"]
    got, ref = run_gemm(op, 136, 200, 512, mode=Mode.Gemm, split_k=3)
    assert_close(op, got, ref, _tol(op))


@pytest.mark.parametrize("name", list(WGRAD_C1))
@pytest.mark.parametrize("n,h,w,k,r,s,pad,stride", [
    (2, 17, 19, 24, 2, 2, (1, 1), (1, 1)), (3, 15, 13, 40, 4, 4, (2, 1), (2, 2)),
    (1, 23, 21, 16, 2, 6, (0, 3), (1, 2)), (2, 12, 14, 72, 4, 3, (1, 1), (1, 1)),
])
def test_wgrad_c1_output_alignment_4(name, n, h, w, k, r, s, pad, stride):
    op = WGRAD_C1[name]
    k -= k % op.A.alignment
    run_conv(op, problem(n, h, w, 1, k, r, s, pad, stride))  # asserts inside
