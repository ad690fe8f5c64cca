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
        if name == "gelu_taylor":  # torch.nn.GELU(approximate="tanh")
            return 0.5 * v * (1.0 + math.tanh(math.sqrt(2.0 / math.pi) * (v + 0.044715 * v ** 3)))
        raise KeyError(name)
    return np.array([one(float(v)) for v in x])


@pytest.mark.parametrize("name", ["identity", "relu", "leaky_relu", "tanh", "sigmoid", "silu", "hardswish", "gelu",
                                  "gelu_taylor"])
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


def test_every_activation_reference_takes_empty_arrays():
    """A grouped GEMM's degenerate problem (M or N = 0) has an empty output; its reference must be empty too."""
    from pycutlass.epilogue.activations import ACTIVATIONS, reference

    for name in ACTIVATIONS:
        args = (0.1,) if name == "leaky_relu" else ()
        got = reference(name, np.zeros((0, 8)), *args)
        assert got.shape == (0, 8) and got.dtype == np.float64, name


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


# --- 4. pycutlass.utils: device_cc ---------------------------------------------------------------------------------
def test_device_cc_uses_the_driver_query(monkeypatch):
    from pycutlass.compiler import target
    from pycutlass.utils.device import device_cc

    asked = []
    monkeypatch.setattr(target, "detected_compute_capability", lambda device=0: asked.append(device) or 90)
    assert device_cc() == 90 and device_cc(1) == 90 and asked == [0, 1]
    monkeypatch.setattr(target, "detected_compute_capability", lambda device=0: None)
    with pytest.raises(cutlass.NoGpuError, match=r"device_cc\(0\): no usable GPU"):
        device_cc()


# --- 4. pycutlass.utils: ReferenceModule -----------------------------------------------------------------------------
RM, CM = cutlass.RowMajor, cutlass.ColumnMajor


def _desc(layout, element=cutlass.float32):
    return cutlass.TensorDescription(element, layout, 1)


def _loops(a, b, c, alpha, beta):
    """D = alpha * A @ B + beta * C with explicit sums (independent of numpy's matmul)."""
    m, k = a.shape
    n = b.shape[1]
    d = np.empty((m, n))
    for i in range(m):
        for j in range(n):
            d[i, j] = alpha * sum(float(a[i, p]) * float(b[p, j]) for p in range(k)) + beta * float(c[i, j])
    return d


def _packed(matrix, layout):
    """A logical matrix as PyCUTLASS's packed 1-D tensor in ``layout``."""
    return np.ascontiguousarray(matrix if layout is RM else matrix.T).ravel()


@pytest.mark.parametrize("la,lb,lc", [(RM, RM, RM), (CM, RM, CM), (RM, CM, RM), (CM, CM, CM)])
def test_reference_module_packed_layouts(la, lb, lc):
    rng = np.random.default_rng(1)
    m, n, k = 5, 7, 3
    a, b, c = rng.standard_normal((m, k)), rng.standard_normal((k, n)), rng.standard_normal((m, n))
    reference = cutlass.ReferenceModule(_desc(la), _desc(lb), _desc(lc))
    got = reference.run(_packed(a, la).astype(np.float16), _packed(b, lb).astype(np.float32), _packed(c, lc),
                        cutlass.GemmCoord(m, n, k), 1.5, -0.25)
    expected = _loops(a.astype(np.float16), b.astype(np.float32), c, 1.5, -0.25)
    assert got.dtype == np.float64 and got.shape == (m * n,)
    np.testing.assert_allclose(got, _packed(expected, lc), rtol=1e-13, atol=1e-13)
    # 2-D logical operands give the logical (M, N) result.
    got2 = reference.run(a, b, c, (m, n, k), 1.5, -0.25)
    np.testing.assert_allclose(got2, _loops(a, b, c, 1.5, -0.25), rtol=1e-13, atol=1e-13)


def test_reference_module_batch_bias_and_exact_integers():
    rng = np.random.default_rng(2)
    batch, m, n, k = 3, 4, 6, 5
    a = rng.integers(-8, 8, (batch, m, k)).astype(np.float16)
    b = rng.integers(-8, 8, (batch, k, n)).astype(np.float16)
    bias = rng.integers(-8, 8, (batch, n)).astype(np.float32)
    reference = cutlass.ReferenceModule(_desc(RM, cutlass.float16), _desc(RM, cutlass.float16), _desc(RM))
    got = reference.run(a.ravel(), b.ravel(), bias.ravel(), cutlass.GemmCoord(m, n, k), 1.0, 1.0, bias=True,
                        batch=batch)
    expected = np.stack([_loops(a[i], b[i], np.broadcast_to(bias[i], (m, n)), 1.0, 1.0) for i in range(batch)])
    np.testing.assert_array_equal(got, expected.ravel())  # small integers: exact
    # A column-major bias is one value per row.
    ref_cm = cutlass.ReferenceModule(_desc(RM), _desc(RM), _desc(CM))
    row_bias = np.arange(m, dtype=np.float64)
    got = ref_cm.run(a[0].astype(np.float64), b[0].astype(np.float64), row_bias, (m, n, k), 2.0, 0.5, bias=True)
    np.testing.assert_allclose(got, _loops(a[0], b[0], np.broadcast_to(row_bias[:, None], (m, n)), 2.0, 0.5))
    # beta = 0 reads no C at all (None allowed).
    np.testing.assert_allclose(reference.run(a[0], b[0], None, (m, n, k)), _loops(a[0], b[0], np.zeros((m, n)), 1, 0))
    with pytest.raises(ArgumentError, match="packed 1-D operand needs"):
        reference.run(a.ravel()[:-1], b[0].ravel(), None, (m, n, k))
    with pytest.raises(ArgumentError, match="interleaved"):
        cutlass.ReferenceModule(_desc(cutlass.ColumnMajorInterleaved32, cutlass.int8), _desc(RM), _desc(RM))


def test_reference_module_grouped():
    rng = np.random.default_rng(3)
    sizes = [cutlass.GemmCoord(3, 4, 5), cutlass.GemmCoord(6, 2, 1), cutlass.GemmCoord(1, 1, 7)]
    reference = cutlass.ReferenceModule(_desc(CM), _desc(RM), _desc(CM))
    As = [rng.standard_normal((p.m(), p.k())) for p in sizes]
    Bs = [rng.standard_normal((p.k(), p.n())) for p in sizes]
    Cs = [rng.standard_normal((p.m(), p.n())) for p in sizes]
    got = reference.run_grouped([_packed(a, CM) for a in As], [_packed(b, RM) for b in Bs],
                                [_packed(c, CM) for c in Cs], sizes, 0.5, 2.0)
    for d, a, b, c in zip(got, As, Bs, Cs):
        np.testing.assert_allclose(d, _packed(_loops(a, b, c, 0.5, 2.0), CM), rtol=1e-13, atol=1e-13)
    with pytest.raises(ArgumentError, match="3 problems but 2 As"):
        reference.run_grouped(As[:2], Bs, Cs, sizes)


# --- 4. pycutlass.utils: Conv2dReferenceModule -----------------------------------------------------------------------
NHWC = cutlass.TensorNHWC
FPROP, DGRAD, WGRAD = cutlass.conv.Operator.fprop, cutlass.conv.Operator.dgrad, cutlass.conv.Operator.wgrad


def _conv_loops(x, w, ps):
    """fprop by its definition, one output element at a time (the convolution mode flips the filter)."""
    y = np.zeros((ps.N, ps.P, ps.Q, ps.K))
    flip = ps.mode is cutlass.conv.Mode.convolution
    for n in range(ps.N):
        for p in range(ps.P):
            for q in range(ps.Q):
                for r in range(ps.R):
                    for s in range(ps.S):
                        h = p * ps.stride_h - ps.pad_h + r * ps.dilation_h
                        v = q * ps.stride_w - ps.pad_w + s * ps.dilation_w
                        if 0 <= h < ps.H and 0 <= v < ps.W:
                            rr, ss = (ps.R - 1 - r, ps.S - 1 - s) if flip else (r, s)
                            y[n, p, q, :] += w[:, rr, ss, :] @ x[n, h, v, :]
    return y


CONV_PROBLEMS = {
    "3x3_pad1": ((2, 6, 7, 3), (4, 3, 3, 3), (1, 1, 1, 1), (1, 1), (1, 1), cutlass.conv.Mode.cross_correlation),
    "stride2_dilation2": ((1, 9, 8, 2), (3, 3, 2, 2), (1, 1, 2, 2), (2, 2), (2, 1),
                          cutlass.conv.Mode.cross_correlation),
    "asymmetric_pad": ((2, 5, 6, 4), (2, 2, 3, 4), (0, 1, 1, 0), (1, 2), (1, 1), cutlass.conv.Mode.cross_correlation),
    "convolution_mode": ((1, 6, 5, 2), (3, 3, 2, 2), (1, 1, 0, 1), (2, 1), (1, 2), cutlass.conv.Mode.convolution),
}


@pytest.mark.parametrize("name", list(CONV_PROBLEMS))
def test_conv2d_reference_fprop_dgrad_wgrad(name):
    input_size, filter_size, padding, stride, dilation, mode = CONV_PROBLEMS[name]
    ps = cutlass.conv.Conv2dProblemSize(cutlass.Tensor4DCoord(*input_size), cutlass.Tensor4DCoord(*filter_size),
                                        cutlass.Tensor4DCoord(*padding), cutlass.MatrixCoord(*stride),
                                        cutlass.MatrixCoord(*dilation), mode, 1, 1)
    rng = np.random.default_rng(4)
    x = rng.standard_normal(tuple(ps.activation_extent()))
    w = rng.standard_normal(tuple(ps.filter_extent()))
    dy = rng.standard_normal(tuple(ps.output_extent()))
    alpha, beta = 1.25, -0.5
    y = _conv_loops(x, w, ps)
    c_out = rng.standard_normal(y.shape)

    fprop = cutlass.Conv2dReferenceModule(_desc(NHWC), _desc(NHWC), _desc(NHWC), FPROP)
    got = fprop.run(x.ravel(), w.ravel(), c_out.ravel(), ps, alpha, beta)
    np.testing.assert_allclose(got, (alpha * y + beta * c_out).ravel(), rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(fprop.run(x, w, None, ps), y, rtol=1e-12, atol=1e-12)  # 4-D in, 4-D out

    # dgrad and wgrad are the adjoints of fprop: <fprop(x, w), dy> = <x, dgrad(dy, w)> = <w, wgrad(dy, x)>.
    dgrad = cutlass.Conv2dReferenceModule(_desc(NHWC), _desc(NHWC), _desc(NHWC), DGRAD)
    wgrad = cutlass.Conv2dReferenceModule(_desc(NHWC), _desc(NHWC), _desc(NHWC), "wgrad")
    dx = dgrad.run(dy, w, None, ps)
    dw = wgrad.run(dy, x, None, ps)
    assert dx.shape == x.shape and dw.shape == w.shape
    inner = np.sum(y * dy)
    assert np.sum(x * dx) == pytest.approx(inner, rel=1e-12) and np.sum(w * dw) == pytest.approx(inner, rel=1e-12)
    # ... element by element: dx[i] = d<fprop(x), dy>/dx[i], i.e. fprop of a unit input, likewise for dw.
    for index in [(0, 0, 0, 0), tuple(e - 1 for e in x.shape), (0, x.shape[1] // 2, 1, x.shape[3] - 1)]:
        unit = np.zeros_like(x)
        unit[index] = 1.0
        assert dx[index] == pytest.approx(np.sum(_conv_loops(unit, w, ps) * dy), rel=1e-12, abs=1e-12)
    for index in [(0, 0, 0, 0), tuple(e - 1 for e in w.shape)]:
        unit = np.zeros_like(w)
        unit[index] = 1.0
        assert dw[index] == pytest.approx(np.sum(_conv_loops(x, unit, ps) * dy), rel=1e-12, abs=1e-12)
    # alpha, beta and C in PyCUTLASS's packed form, C of the kind's output shape.
    c_in = rng.standard_normal(x.shape)
    got = dgrad.run(dy.ravel(), w.ravel(), c_in.ravel(), ps, alpha, beta)
    np.testing.assert_allclose(got, (alpha * dx + beta * c_in).ravel(), rtol=1e-12, atol=1e-12)


def test_conv2d_reference_bias_and_errors():
    ps = cutlass.conv.Conv2dProblemSize((1, 4, 4, 2), (3, 1, 1, 2))
    x = np.arange(32, dtype=np.float16).reshape(1, 4, 4, 2)
    w = np.ones((3, 1, 1, 2), dtype=np.float16)
    bias = np.array([1.0, -2.0, 0.5], dtype=np.float32)
    reference = cutlass.Conv2dReferenceModule(_desc(NHWC), _desc(NHWC), _desc(NHWC), cutlass.conv.Operator.fprop)
    got = reference.run(x, w, bias, ps, 1.0, 1.0, bias=True)
    expected = x.astype(np.float64).sum(axis=3, keepdims=True) + bias.reshape(1, 1, 1, 3)
    np.testing.assert_array_equal(got, expected)
    with pytest.raises(ArgumentError, match="one value per output channel"):
        reference.run(x, w, bias[:2], ps, 1.0, 1.0, bias=True)
    with pytest.raises(ArgumentError, match="expected 32 packed NHWC elements"):
        reference.run(x.ravel()[1:], w, None, ps)
    with pytest.raises(ArgumentError, match="TensorNHWC"):
        cutlass.Conv2dReferenceModule(_desc(cutlass.TensorNC32HW32, cutlass.int8), _desc(NHWC), _desc(NHWC), FPROP)


def test_reference_modules_convert_torch_tensors():
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(5)
    a, b = rng.standard_normal((4, 3)), rng.standard_normal((3, 5))
    reference = cutlass.ReferenceModule(_desc(RM), _desc(RM), _desc(RM))
    got = reference.run(torch.from_numpy(a).half(), torch.from_numpy(b).half(), torch.zeros(4, 5), (4, 5, 3))
    assert isinstance(got, torch.Tensor) and got.dtype == torch.float32
    np.testing.assert_allclose(got.numpy(), a.astype(np.float16).astype(np.float64) @
                               b.astype(np.float16).astype(np.float64), rtol=1e-6)
    ps = cutlass.conv.Conv2dProblemSize((1, 5, 5, 2), (3, 3, 3, 2), (1, 1, 1, 1))
    x, w = rng.standard_normal((1, 5, 5, 2)), rng.standard_normal((3, 3, 3, 2))
    conv = cutlass.Conv2dReferenceModule(_desc(NHWC), _desc(NHWC), _desc(NHWC), FPROP)
    xt = torch.from_numpy(x).permute(0, 3, 1, 2)  # (N, C, H, W), channels_last
    wt = torch.from_numpy(w).permute(0, 3, 1, 2)
    got = conv.run(xt, wt, None, ps)
    assert tuple(got.shape) == (1, 3, 5, 5)
    np.testing.assert_allclose(got.permute(0, 2, 3, 1).numpy(), _conv_loops(x, w, ps), rtol=1e-12, atol=1e-12)


# --- 5. PyCUTLASS's module paths and from pycutlass import * -------------------------------------------------------
def test_pycutlass_module_paths():
    import pycutlass.conv2d_operation as conv2d_operation
    import pycutlass.gemm_operation as gemm_operation
    import pycutlass.library as library
    import pycutlass.memory_manager as memory_manager
    import pycutlass.reduction_operation as reduction_operation
    from pycutlass.utils import reference_model
    from pycutlass.utils.device import device_cc

    assert gemm_operation.GemmOperationUniversal is cutlass.GemmOperationUniversal
    assert gemm_operation.GemmGroupedArguments is cutlass.GemmGroupedArguments
    assert conv2d_operation.Conv2dOperation is cutlass.Conv2dOperation
    assert conv2d_operation.Conv2dArguments is cutlass.Conv2dArguments
    assert reduction_operation.ReductionOperation is cutlass.ReductionOperation
    assert memory_manager.get_allocated_size is cutlass.get_allocated_size
    assert library.TensorDescription is cutlass.TensorDescription and library.ConvKind is cutlass.conv.Operator
    assert reference_model.ReferenceModule is cutlass.ReferenceModule and callable(device_cc)
    assert cutlass.epilogue.LinearCombination is cutlass.LinearCombination
    with pytest.raises(AttributeError, match="GemmRTUniversal was part of PyCUTLASS 2.11.*operation.run"):
        gemm_operation.GemmRTUniversal
    with pytest.raises(AttributeError, match="PoolMemoryManager.*get_memory_pool"):
        memory_manager.PoolMemoryManager
    with pytest.raises(AttributeError, match="DataTypeTag.*pycutlass.emit.names"):
        library.DataTypeTag
    with pytest.raises(AttributeError, match="has no attribute 'nonsense'"):
        library.nonsense
    with pytest.raises(ImportError, match="epilogue visitor tree"):
        import pycutlass.parser  # noqa: F401
    import pycutlass.test as testbeds  # PyCUTLASS's testbeds: GEMM, conv2d and grouped
    from pycutlass.test.gemm_grouped_testbed import TestbedGrouped

    assert testbeds.TestbedGrouped is TestbedGrouped
    with pytest.raises(AttributeError, match="get_name was part of PyCUTLASS 2.11.*operation.name"):
        testbeds.get_name


def test_star_import_gives_what_pycutlass_scripts_use():
    namespace = {}
    exec("from pycutlass import *\nfrom pycutlass.conv2d_operation import *\n"
         "from pycutlass.memory_manager import *", namespace)
    for name in ("TensorDescription", "MathInstruction", "TileDescription", "MathOperation", "GemmOperationUniversal",
                 "GemmOperationGrouped", "GemmArguments", "GemmGroupedArguments", "Conv2dOperation",
                 "Conv2dArguments", "ReductionOperation", "ReductionArguments", "StrideSupport", "SchedulerMode",
                 "ReferenceModule", "Conv2dReferenceModule", "LinearCombination", "FastLinearCombinationClamp",
                 "LinearCombinationGeneric", "relu", "gelu", "get_memory_pool", "get_allocated_size", "compiler",
                 "IdentitySwizzle1", "utils"):
        assert name in namespace, name


def test_star_import_carries_rmm_with_its_old_allocator_names():
    """PyCUTLASS 2.11's frontend test calls ``cp.cuda.set_allocator(rmm.rmm_cupy_allocator)`` with the ``rmm`` its
    star import carried; rmm 23.06 moved that allocator to rmm.allocators.cupy."""
    import subprocess
    import sys

    code = ("import sys, pycutlass\n"
            "assert 'rmm' not in sys.modules  # import pycutlass stays light\n"
            "from pycutlass import *\n"
            "import rmm as real, rmm.allocators.cupy as moved\n"
            "assert rmm.rmm_cupy_allocator is moved.rmm_cupy_allocator\n"
            "assert rmm.mr is real.mr and rmm.reinitialize is real.reinitialize\n"
            "from pycutlass.memory_manager import rmm as rmm2\n"
            "assert rmm2.rmm_cupy_allocator is moved.rmm_cupy_allocator\n"
            "try:\n    rmm.not_in_rmm\nexcept AttributeError:\n    print('ok')\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr


def test_pycutlass_scripts_import_cutlass_and_star_import_it(tmp_path):
    """PyCUTLASS 2.11 scripts do `import pycutlass; from pycutlass import *; import cutlass` and use both names."""
    import subprocess
    import sys
    from pathlib import Path

    code = ("import pycutlass\nfrom pycutlass import *\nimport cutlass\n"
            "assert cutlass is pycutlass\n"
            "assert cutlass.gemm.Mode.GemmSplitKParallel == 1 and cutlass.conv.Operator.fprop\n"
            "assert cutlass.float16 is pycutlass.float16 and cutlass.RowMajor is pycutlass.RowMajor\n"
            "print('ok')\n")
    root = Path(__file__).resolve().parents[2]
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=tmp_path,
                         env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(root)}, timeout=120)
    import importlib.util

    import pycutlass

    if sys.modules.get("cutlass") is not pycutlass and importlib.util.find_spec("cutlass") is not None:
        assert out.returncode != 0  # a real `cutlass` package is installed here: pycutlass never shadows it
    else:
        assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr
