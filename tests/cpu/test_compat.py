"""PyCUTLASS 2.11 compatibility: activations' host references, coordinate accessors, the 4-argument
FastLinearCombinationClamp, ``pycutlass.utils`` (device_cc, ReferenceModule, Conv2dReferenceModule) and the
module aliases PyCUTLASS scripts import. Every reference is checked against an independent float64 computation."""
from __future__ import annotations

import math

import numpy as np
import pytest

import pycutlass as cutlass
from pycutlass import ArgumentError, DescriptionError

X = np.linspace(-6.0, 6.0, 97)


# --- 1. activations: relu.numpy(x) -----------------------------------------------------------------------------
def _expected(name, x, *args):
    """Each activation written out element by element from CUTLASS's definitions (activation.h)."""
    def one(v):
        if name == "identity":
            return v
        if name == "relu":
            return v if v > 0 else 0.0
        if name == "leaky_relu":
            return v if v > 0 else v * args[0]
        if name == "tanh":
            return math.tanh(v)
        if name == "sigmoid":
            return 1.0 / (1.0 + math.exp(-v))
        if name == "silu":
            return v / (1.0 + math.exp(-v))
        if name == "hardswish":
            return v * min(max(v + 3.0, 0.0), 6.0) / 6.0
        if name == "gelu":
            return 0.5 * v * (1.0 + math.erf(v / math.sqrt(2.0)))
        raise KeyError(name)
    return np.array([one(float(v)) for v in x])


@pytest.mark.parametrize("name", ["identity", "relu", "leaky_relu", "tanh", "sigmoid", "silu", "hardswish", "gelu"])
def test_activation_numpy(name):
    factory = getattr(cutlass, name)
    args = (0.125,) if name == "leaky_relu" else ()
    expected = _expected(name, X, *args)
    for got in (factory.numpy(X, *args), factory(cutlass.float32).numpy(X, *args),
                factory(cutlass.float64).numpy(X.reshape(1, -1), *args).ravel()):
        assert got.dtype == np.float64
        np.testing.assert_allclose(got, expected, rtol=1e-14, atol=1e-15)


def test_activation_numpy_known_values():
    assert cutlass.gelu.numpy(np.array([1.0]))[0] == pytest.approx(0.8413447460685429, rel=1e-15)
    np.testing.assert_array_equal(cutlass.hardswish.numpy(np.array([-4.0, -3.0, 0.0, 3.0, 4.0])),
                                  [0.0, 0.0, 0.0, 3.0, 4.0])
    np.testing.assert_array_equal(cutlass.hardswish.numpy(np.array([-1.5, 1.5])), [-0.375, 1.125])
    np.testing.assert_array_equal(cutlass.leaky_relu.numpy(np.array([-2.0, 3.0]), 0.5), [-1.0, 3.0])


def test_activation_numpy_arguments():
    with pytest.raises(TypeError, match=r"leaky_relu.numpy takes x and 1 argument\(s\) \['leaky_alpha'\]"):
        cutlass.leaky_relu.numpy(X)
    with pytest.raises(TypeError, match="relu.numpy takes x and 0"):
        cutlass.relu.numpy(X, 0.1)


def test_activation_numpy_reuses_the_module_reference():
    from pycutlass.epilogue.activations import reference

    np.testing.assert_array_equal(cutlass.silu.numpy(X), reference("silu", X))


# --- 2. coordinates --------------------------------------------------------------------------------------------
def test_tensor4d_coord_accessors():
    t = cutlass.Tensor4DCoord(2, 3, 5, 7)
    assert [t.at(i) for i in range(4)] == [2, 3, 5, 7] == [t.n(), t.h(), t.w(), t.c()] == list(t)
    assert t[3] == t.at(-1) == 7 and len(t) == 4
    assert t.size() == t.product() == 210
    with pytest.raises(IndexError):
        t.at(4)
    with pytest.raises(ArgumentError, match="integer index"):
        t.at(1.0)


def test_gemm_and_matrix_coord_accessors():
    g = cutlass.GemmCoord(4, 5, 6)
    assert (g.at(0), g.at(1), g.at(2)) == (g.m(), g.n(), g.k()) == (4, 5, 6)
    assert g.mk() == cutlass.MatrixCoord(4, 6) and g.kn() == cutlass.MatrixCoord(6, 5)
    assert g.mn() == cutlass.MatrixCoord(4, 5) and g.nm() == cutlass.MatrixCoord(5, 4)
    assert g.km() == cutlass.MatrixCoord(6, 4) and g.nk() == cutlass.MatrixCoord(5, 6)
    assert g.product() == 120 and tuple(g) == (4, 5, 6) and len(g) == 3
    assert cutlass.gemm.GemmCoord is cutlass.GemmCoord
    m = cutlass.MatrixCoord(8, 9)
    assert (m.at(0), m.at(1)) == (m.row(), m.column()) == (8, 9) and m[1] == 9 and tuple(m) == (8, 9)
    # Still hashable values, equal by content; the problem sizes read them as before.
    assert hash(g) == hash(cutlass.GemmCoord(4, 5, 6))
    ps = cutlass.conv.Conv2dProblemSize(cutlass.Tensor4DCoord(1, 8, 8, 16), cutlass.Tensor4DCoord(32, 3, 3, 16),
                                        cutlass.Tensor4DCoord(1, 1, 1, 1), cutlass.MatrixCoord(1, 1),
                                        cutlass.MatrixCoord(1, 1))
    assert ps.output_extent().at(3) == 32 and ps.output_extent().size() == ps.output_size()


# --- 3. FastLinearCombinationClamp's 4-argument form ---------------------------------------------------------------
def test_fast_clamp_four_arguments_as_pycutlass():
    two = cutlass.FastLinearCombinationClamp(cutlass.int8, 16)
    four = cutlass.FastLinearCombinationClamp(cutlass.int8, 16, cutlass.int32, cutlass.float32)
    assert four == two and hash(four) == hash(two) and repr(four) == repr(two)
    assert cutlass.FastLinearCombinationClamp(cutlass.int8, 8, None, None).alignment == 8
    # The generic construction of PyCUTLASS's customizable examples: getattr(pycutlass, name)(C, align, acc, epi).
    made = getattr(cutlass, "FastLinearCombinationClamp")(cutlass.int8, 16, cutlass.int32, cutlass.float32)
    assert made.element_accumulator is cutlass.int32 and made.element_epilogue is cutlass.float32
    with pytest.raises(DescriptionError, match="always has element_accumulator int32"):
        cutlass.FastLinearCombinationClamp(cutlass.int8, 16, cutlass.float32, cutlass.float32)
