"""pycutlass's exact GELU functor (epilogue/gelu_erf.cuh): its float32 arithmetic, step by step on the CPU, against
float64 over the whole range; and how a translation unit gets its definition."""
from __future__ import annotations

import math
import re
from importlib import resources

import numpy as np

import pycutlass as cutlass
from pycutlass.emit.emitter import translation_unit

F32 = np.float32


def _device_steps():
    """The coefficients of the device branch, read from the shipped header."""
    source = resources.files("pycutlass.epilogue").joinpath("gelu_erf.cuh").read_text()
    device = source[source.index("#if defined(__CUDA_ARCH__)"):source.index("#else")]
    first = re.search(r"fmaf\(t, (-?[0-9.]+)f, (-?[0-9.]+)f\)", device).groups()
    rest = re.findall(r"p = fmaf\(t, p, (-?[0-9.]+)f\)", device)
    return [float(v) for v in first], [float(v) for v in rest]


def _fma(a, b, c):
    return (a.astype(np.float64) * b + c).astype(F32)  # one rounding, as fmaf


def gelu_float32(x):
    """The device branch's arithmetic in float32 (ex2.approx modelled as an exact exp2 rounded to float32)."""
    (lead, first), rest = _device_steps()
    x = x.astype(F32)
    z = np.minimum(np.abs(x) * F32(0.70710678118654752), F32(10.0)).astype(F32)
    t = (1.0 / _fma(F32(0.5), z, F32(1.0)).astype(np.float64)).astype(F32)
    p = _fma(t, F32(lead), F32(first))
    for c in rest:
        p = _fma(t, p, F32(c))
    z2 = (z * z).astype(F32)
    z2_low = _fma(z, z, -z2)
    exponent = ((p - z2).astype(F32) * F32(1.4426950408889634)).astype(F32)
    erfc_z = ((t * np.exp2(exponent.astype(np.float64)).astype(F32)).astype(F32) * (F32(1) - z2_low)).astype(F32)
    one_plus_erf = np.where(x >= 0, (F32(2) - erfc_z).astype(F32), erfc_z)
    return (F32(0.5) * x * one_plus_erf).astype(F32)


def test_gelu_erf_is_within_3e_6_of_float64_over_the_whole_range():
    x = np.concatenate([np.linspace(-14.0, 14.0, 280001), [0.0, 1e-30, -1e-30, 5e-8]]).astype(F32)
    got = gelu_float32(x).astype(np.float64)
    ref = np.array([0.5 * v * math.erfc(-v / math.sqrt(2.0)) for v in x.astype(np.float64)])
    assert (np.abs(got - ref) <= 3e-6 * np.abs(ref) + 1e-9).all()
    middle = np.abs(x) <= 4  # where the values are not tiny: within 2e-6 relative
    assert (np.abs(got - ref)[middle] <= 2e-6 * np.abs(ref)[middle] + 1e-30).all()
    # CUTLASS's form, 1 + erff(x / sqrt(2)) in float32, cancels in the negative tail; this one does not
    tail = (x > -9) & (x < -5)
    assert (np.abs(got - ref)[tail] <= 1e-4 * np.abs(ref)[tail]).all()


def test_a_gelu_operation_carries_the_definition_once_and_others_none():
    math_inst = cutlass.MathInstruction([16, 8, 16], cutlass.float16, cutlass.float16, cutlass.float32,
                                        cutlass.OpClass.TensorOp, cutlass.MathOperation.multiply_add)
    tile = cutlass.TileDescription([128, 128, 32], 3, [2, 2, 1], math_inst)
    a = cutlass.TensorDescription(cutlass.float16, cutlass.RowMajor, 8)
    b = cutlass.TensorDescription(cutlass.float16, cutlass.ColumnMajor, 8)
    c = cutlass.TensorDescription(cutlass.float16, cutlass.RowMajor, 8)

    def gemm(epilogue):
        return cutlass.GemmOperationUniversal(80, tile, a, b, c, epilogue, cutlass.IdentitySwizzle1)

    gelu = gemm(cutlass.LinearCombinationGeneric(cutlass.gelu(cutlass.float32), cutlass.float16, 8))
    gelu16 = gemm(cutlass.LinearCombinationGeneric(cutlass.gelu(cutlass.float16), cutlass.float16, 8,
                                                   cutlass.float32, cutlass.float16))
    plain = gemm(cutlass.LinearCombination(cutlass.float16, 8))
    unit = translation_unit([gelu, gelu16, plain])
    assert unit.count("struct GeluErf {") == 1 and "LinearCombinationGeneric<pycutlass_epilogue::GeluErf," in unit
    assert unit.index("struct GeluErf {") > unit.rindex("#include")  # after CUTLASS's headers, before the kernels
    assert "GeluErf" not in translation_unit([plain])
    assert "cutlass::epilogue::thread::GELU<" not in unit
