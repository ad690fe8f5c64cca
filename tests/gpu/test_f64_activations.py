"""Float64 epilogues compute every activation in float64: each activation on the float64 SIMT strided dgrad the
acceptance run found 3e-8 off with hardswish (N=2 H=5 W=34 C=56, K=1 R=S=5, padding (3, 3, 2, 2), optimized
iterator, strided support; nvcc and NVRTC), on fprop and wgrad of the same problem, and on a float64 tensor-op
GEMM, against float64 numpy references at 1e-12 relative.

Operands are random normals; C is chosen so that a share of alpha * accumulator + beta * C lands on and around
hardswish's kinks (-3 and 3, from 1e-9 to 1e-3 away). Outputs are NaN-poisoned. The activations of one kind share
one precompile (``add_module``), so the module compiles 36 nvcc and 9 NVRTC operations.

The same float64 result 2^-25 high is what torch's CUDA ``F.hardswish`` gives on a float64 tensor (it multiplies by
the float32 1.0f / 6.0f): ``pycutlass.torch.reference.activate`` must not, and a reference built with it must
agree with the kernels to 1e-12.
"""
from __future__ import annotations

import numpy as np
import pytest

import pycutlass as cutlass
from pycutlass.conv import IteratorAlgorithm, Operator, StrideSupport
from pycutlass.epilogue.activations import reference as activation_reference
from pycutlass.gemm import GemmCoord

from .conftest import precompile_module, relative_error
from .gemm_cases import R, epilogue_reference, make_op, poisoned_output, to_float64, to_tensor
from .test_conv2d import CONFIGS, conv_reference, from_lib, poisoned, problem, to_lib

pytestmark = pytest.mark.gpu

F64 = cutlass.float64
ACTIVATIONS = ("identity", "relu", "leaky_relu", "tanh", "sigmoid", "silu", "hardswish", "gelu", "gelu_taylor")
TOLERANCE = 1e-12
ALPHA, BETA = 0.7310585786300049, -0.3  # alpha not exact in float32
LEAKY_SLOPE = 0.1
# The acceptance run's problem.
PROBLEM = problem(2, 5, 34, 56, 1, 5, 5, (3, 3, 2, 2), (1, 1), (1, 1))
GEMM_PROBLEM = (67, 45, 93)


def _activation_args(activation):
    return (LEAKY_SLOPE,) if activation == "leaky_relu" else ()


def conv_f64(kind, activation):
    """float64 SIMT, optimized iterator, strided support: the acceptance run's dgrad (and fprop / wgrad alike).
    element_epilogue left out: a float64 epilogue computes in float64."""
    c = CONFIGS["f64_simt"]
    math = cutlass.MathInstruction(c["inst"], F64, F64, F64, c["cls"], c["math"])
    tile = cutlass.TileDescription(c["tile"], c["stages"], c["warps"], math)
    desc = cutlass.TensorDescription(F64, cutlass.TensorNHWC, 1)
    epilogue = cutlass.LinearCombinationGeneric(getattr(cutlass, activation)(F64), F64, 1, F64)
    swizzle = cutlass.StridedDgradIdentitySwizzle1 if kind is Operator.dgrad else cutlass.IdentitySwizzle1
    return cutlass.Conv2dOperation(kind, IteratorAlgorithm.optimized, 80, tile, desc, desc, desc,
                                   StrideSupport.Strided, epilogue, swizzle)


DGRAD_OPS = {a: conv_f64(Operator.dgrad, a) for a in ACTIVATIONS}
FPROP_OPS = {a: conv_f64(Operator.fprop, a) for a in ACTIVATIONS}
WGRAD_OPS = {a: conv_f64(Operator.wgrad, a) for a in ACTIVATIONS}
GEMM_OPS = {a: make_op("f64", activation=a) for a in ACTIVATIONS}
CONV_OPS = {Operator.dgrad: DGRAD_OPS, Operator.fprop: FPROP_OPS, Operator.wgrad: WGRAD_OPS}
NVCC_OPS = [*DGRAD_OPS.values(), *FPROP_OPS.values(), *WGRAD_OPS.values(), *GEMM_OPS.values()]
NVRTC_OPS = list(DGRAD_OPS.values())


@pytest.fixture(scope="module", autouse=True)
def compiled(memory_pool):
    precompile_module(NVCC_OPS, NVRTC_OPS)
    yield


def with_kinks(accumulator, rng, share=4):
    """C (random normals) where every ``share``-th element instead puts alpha * accumulator + beta * C on or near
    -3 or 3 (hardswish's kinks, also where relu6 saturates)."""
    c = rng.standard_normal(accumulator.shape)
    flat_acc, flat_c = accumulator.reshape(-1), c.reshape(-1)
    offsets = np.array([0.0, 1e-9, -1e-9, 1e-6, -1e-6, 1e-3, -1e-3])
    picked = np.arange(0, flat_c.size, share)
    targets = np.where(rng.integers(0, 2, picked.size) == 0, -3.0, 3.0) + offsets[picked // share % offsets.size]
    flat_c[picked] = (targets - ALPHA * flat_acc[picked]) / BETA
    return flat_c.reshape(accumulator.shape)


def run_conv_f64(op, backend="nvcc", seed=0):
    kind = op.conv_kind
    rng = np.random.default_rng(seed)
    a = rng.standard_normal(tuple(PROBLEM.tensor_a_extent(kind)))
    b = rng.standard_normal(tuple(PROBLEM.tensor_b_extent(kind)))
    accumulator = conv_reference(kind, PROBLEM, a, b)
    c = with_kinks(accumulator, rng)
    args_act = _activation_args(op.epilogue_functor.activation.name)
    Dt = poisoned(tuple(PROBLEM.tensor_c_extent(kind)), F64, "torch")
    args = cutlass.Conv2dArguments(op, PROBLEM, to_lib(a, F64, "torch"), to_lib(b, F64, "torch"),
                                   to_lib(c, F64, "torch"), Dt, op.epilogue_type(ALPHA, BETA, *args_act))
    if backend == "nvrtc":
        cutlass.compiler.nvrtc()
    try:
        assert cutlass.compiler.Compiler.of().lookup(op) is not None, f"{op.name} was not precompiled ({backend})"
        op.run(args)
        args.sync()
    finally:
        cutlass.compiler.nvcc()
    got = from_lib(Dt, "torch")
    return got, epilogue_reference(op, accumulator, c, ALPHA, BETA, args_act), (a, b, c)


@pytest.mark.parametrize("backend", ["nvcc", "nvrtc"])
@pytest.mark.parametrize("activation", ACTIVATIONS)
def test_dgrad(activation, backend):
    op = DGRAD_OPS[activation]
    assert op.epilogue_functor.element_epilogue is F64
    got, reference, _ = run_conv_f64(op, backend)
    assert got.shape == reference.shape
    error = relative_error(got, reference)
    assert error < TOLERANCE, f"{activation} ({backend}): relative error {error:.3e}"


@pytest.mark.parametrize("kind", [Operator.fprop, Operator.wgrad], ids=["fprop", "wgrad"])
@pytest.mark.parametrize("activation", ACTIVATIONS)
def test_fprop_wgrad(activation, kind):
    got, reference, _ = run_conv_f64(CONV_OPS[kind][activation])
    error = relative_error(got, reference)
    assert error < TOLERANCE, f"{activation} {kind.name}: relative error {error:.3e}"


@pytest.mark.parametrize("activation", ACTIVATIONS)
def test_gemm(activation):
    op = GEMM_OPS[activation]
    m, n, k = GEMM_PROBLEM
    rng = np.random.default_rng(1)
    a, b = rng.standard_normal((m, k)), rng.standard_normal((k, n))
    accumulator = a @ b
    c = with_kinks(accumulator, rng)
    args_act = _activation_args(activation)
    Dt = poisoned_output((m, n), F64, op.C.layout, "torch")
    args = cutlass.GemmArguments(op, GemmCoord(m, n, k), to_tensor(a, F64, op.A.layout, "torch"),
                                 to_tensor(b, F64, op.B.layout, "torch"), to_tensor(c, F64, op.C.layout, "torch"),
                                 Dt, op.epilogue_type(ALPHA, BETA, *args_act))
    op.run(args)
    args.sync()
    error = relative_error(to_float64(Dt), epilogue_reference(op, accumulator, c, ALPHA, BETA, args_act))
    assert error < TOLERANCE, f"{activation}: relative error {error:.3e}"


# --- the float64 torch reference on the GPU ---------------------------------------------------------------------------
@pytest.mark.parametrize("activation", ACTIVATIONS)
def test_torch_reference_on_cuda_is_float64(activation):
    """pycutlass.torch.reference.activate on CUDA float64 tensors equals the numpy float64 formulas (torch's own CUDA
    hardswish is 2^-25 high there)."""
    import torch

    from pycutlass.torch import reference

    rng = np.random.default_rng(2)
    x = np.concatenate([rng.uniform(-8.0, 8.0, 4096), [-3.0, 3.0, -3.0 + 1e-9, 3.0 - 1e-9]])
    got = reference.activate(torch.from_numpy(x).cuda(), activation, LEAKY_SLOPE).cpu().numpy()
    expected = activation_reference(activation, x, *_activation_args(activation))
    error = relative_error(got, expected)
    assert error < 1e-15, f"{activation}: relative error {error:.3e}"


def test_dgrad_hardswish_against_a_cuda_torch_reference():
    """The acceptance run's comparison rebuilt with torch on the GPU: the float64 input gradient and pycutlass's torch
    reference of hardswish, both in float64 on CUDA, agree with the kernel to 1e-12 (F.hardswish: 2.98e-8)."""
    import torch

    from pycutlass.torch import reference

    got, _, (a, b, c) = run_conv_f64(DGRAD_OPS["hardswish"])

    def nchw(x):
        return torch.from_numpy(x).cuda().permute(0, 3, 1, 2)

    ps = PROBLEM
    grad = torch.nn.grad.conv2d_input((ps.N, ps.C, ps.H, ps.W), nchw(b), nchw(a), (ps.stride_h, ps.stride_w),
                                      (ps.pad_h, ps.pad_w), (ps.dilation_h, ps.dilation_w))
    expected = reference.activate(ALPHA * grad + BETA * nchw(c), "hardswish").permute(0, 2, 3, 1).cpu().numpy()
    error = relative_error(got, expected)
    assert error < TOLERANCE, f"relative error {error:.3e}"
