"""GPU regressions for defects found by acceptance runs (float64 references, random configurations), in the style
of test_conv2d.py: NaN-poisoned outputs, float64 torch references, per-dtype tolerances.

1. Strided dgrad: the sampled problems on configurations that are still accepted (multistage with alignment 2,
   2-stage with full 128-bit vectors, SIMT with alignment 1), analytic and optimized; 2-stage with a partial vector
   and parallel split-K are rejected (tests/cpu/test_acceptance_defects.py).
   float64 SIMT dgrad with hardswish and the default element_epilogue: computed in float64 (tolerance 1e-12).
2. wgrad bias: a channel vector as C is read correctly for a 1x1 filter and refused for 3x3 (it would be overrun).
"""
from __future__ import annotations

import numpy as np
import pytest

import pycutlass as cutlass
from pycutlass.conv import IteratorAlgorithm, Operator, StrideSupport
from pycutlass import Conv2dOperation

from .conftest import precompile_module
from .test_conv2d import CONFIGS, conv_op, problem, run_conv, to_lib

pytestmark = pytest.mark.gpu

D = cutlass.DataType
F16, F32, F64 = D.float16, D.float32, D.float64
DGRAD, WGRAD = Operator.dgrad, Operator.wgrad
ANALYTIC, OPTIMIZED = IteratorAlgorithm.analytic, IteratorAlgorithm.optimized
SW1, SW4 = cutlass.StridedDgradIdentitySwizzle1, cutlass.StridedDgradIdentitySwizzle4


def _f64_simt_dgrad_hardswish():
    """As the acceptance run built it: the activation in float64, element_epilogue left to its default."""
    c = CONFIGS["f64_simt"]
    math = cutlass.MathInstruction(c["inst"], F64, F64, F64, c["cls"], c["math"])
    tile = cutlass.TileDescription(c["tile"], c["stages"], c["warps"], math)
    desc = cutlass.TensorDescription(F64, cutlass.TensorNHWC, 1)
    epilogue = cutlass.LinearCombinationGeneric(cutlass.hardswish(F64), F64, 1, F64)
    return Conv2dOperation(DGRAD, ANALYTIC, 80, tile, desc, desc, desc, StrideSupport.Strided, epilogue, SW1)


OPS = {
    "f16_analytic_a2_s3": conv_op(DGRAD, ANALYTIC, "f16", align=2, tile=[64, 64, 32]),
    "f16_analytic_a2_s3_sw4": conv_op(DGRAD, ANALYTIC, "f16", align=2, tile=[128, 64, 32], swizzle=SW4),
    "f16_analytic_a8_s2": conv_op(DGRAD, ANALYTIC, "f16", align=8, stages=2, tile=[128, 64, 32]),
    "f16_optimized_a8_s2": conv_op(DGRAD, OPTIMIZED, "f16", align=8, stages=2, tile=[128, 64, 32]),
    "f16_optimized_a2_s3": conv_op(DGRAD, OPTIMIZED, "f16", align=2, tile=[64, 64, 32]),
    "f32_simt_analytic_hardswish": conv_op(DGRAD, ANALYTIC, "f32_simt", activation="hardswish"),
    "f64_simt_analytic_hardswish": _f64_simt_dgrad_hardswish(),
    "wgrad_f16_bias": conv_op(WGRAD, OPTIMIZED, "f16", tile=[128, 64, 32]),
}


@pytest.fixture(scope="module", autouse=True)
def compiled(memory_pool):
    precompile_module(OPS.values())
    yield


# The acceptance run's problems: (a) pad (2, 2, 3, 3), stride (3, 2), no C; (b) stride (2, 1), hardswish, full C;
# (c) stride (1, 1) (it ran parallel split-K 2, which the strided kernel lacks: serial split-K 2 here).
PROBLEM_A = problem(3, 13, 11, 48, 128, 5, 5, (2, 2, 3, 3), (3, 2))
PROBLEM_B = problem(1, 25, 5, 61, 12, 3, 2, (1, 1), (2, 1))
PROBLEM_C = problem(2, 5, 31, 8, 96, 7, 3, (3, 1), (1, 1), split_k=2)


@pytest.mark.parametrize("name,ps,options", [
    ("f16_analytic_a2_s3", PROBLEM_A, dict(with_c=False)),
    ("f16_analytic_a2_s3_sw4", PROBLEM_A, dict(with_c=False)),
    ("f16_analytic_a8_s2", PROBLEM_A, dict(with_c=False)),
    ("f16_optimized_a8_s2", PROBLEM_A, dict(with_c=False)),
    ("f16_optimized_a2_s3", PROBLEM_A, dict(with_c=False)),
    ("f16_analytic_a2_s3", problem(1, 25, 5, 62, 12, 3, 2, (1, 1), (2, 1)), {}),  # (b) with even C
    ("f32_simt_analytic_hardswish", PROBLEM_B, {}),
    ("f16_analytic_a2_s3", PROBLEM_C, dict(runs=2)),
    ("f16_analytic_a8_s2", PROBLEM_C, dict(runs=2)),
    ("f64_simt_analytic_hardswish", PROBLEM_B, {}),
    ("f64_simt_analytic_hardswish", PROBLEM_A, {}),
], ids=["a-analytic-a2", "a-analytic-a2-sw4", "a-analytic-a8-2stage", "a-optimized-a8-2stage", "a-optimized-a2",
        "b-analytic-a2-evenC", "b-simt-f32-hardswish", "c-analytic-a2-serialsplitk", "c-analytic-a8-2stage-serialsplitk",
        "b-simt-f64-hardswish", "a-simt-f64-hardswish"])
def test_strided_dgrad(name, ps, options):
    run_conv(OPS[name], ps, **options)


def test_f64_hardswish_epilogue_computes_in_float64():
    op = OPS["f64_simt_analytic_hardswish"]
    assert op.epilogue_functor.element_epilogue is F64
    got, ref = run_conv(op, PROBLEM_B, alpha=0.7310585786300049, beta=-0.3)  # alpha not exact in float32
    assert np.abs(got - ref).max() <= 1e-12 * np.abs(ref).max()


def test_wgrad_bias_1x1():
    """A 1x1 wgrad reads C as K x C rows with ld 0: a bias of the C channels is exactly what it reads."""
    run_conv(OPS["wgrad_f16_bias"], problem(2, 10, 12, 32, 64, 1, 1, (0, 0), (2, 2)), alpha=1.0, beta=1.0,
             bias="vector")


@pytest.mark.parametrize("bias", ["vector", "expanded"])
def test_wgrad_bias_3x3_rejected(bias):
    op = OPS["wgrad_f16_bias"]
    ps = problem(2, 10, 12, 32, 64, 3, 3)
    kind = op.conv_kind
    a = to_lib(np.zeros(tuple(ps.tensor_a_extent(kind))), F16, "torch")
    b = to_lib(np.zeros(tuple(ps.tensor_b_extent(kind))), F16, "torch")
    d = to_lib(np.zeros(tuple(ps.tensor_c_extent(kind))), F16, "torch")
    c = to_lib(np.zeros(ps.C), F16, "torch")
    if bias == "expanded":  # torch (K, C, R, S) view of a per-channel bias: zero strides but the channels
        c = c.view(1, ps.C, 1, 1).expand(ps.K, ps.C, ps.R, ps.S)
    with pytest.raises(cutlass.ArgumentError, match="past its end"):
        cutlass.Conv2dArguments(op, ps, a, b, c, d, op.epilogue_type(1.0, 1.0))
