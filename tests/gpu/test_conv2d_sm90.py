"""The conv2d_sm90 kind on a GPU (fprop, dgrad, wgrad; fused bias + activation): ``Conv2dOperation(..., 90, <SM90
tile>, ...)`` through the public API, against float64 references, D poisoned with NaN before every run. Run with PYCUTLASS_VERIFY_PARAMS=1 (the patched
Params of a seen problem are rebuilt and compared, im2col descriptors included). wgrad also writes float32 and
splits K in parallel by images (then a ReductionOperation)."""
from __future__ import annotations

import numpy as np
import pytest

import pycutlass as cutlass
from pycutlass import conv as pconv

from .conftest import precompile_module, relative_error, scan_cubins

try:
    import torch
except ImportError:  # CPU machines collect (and skip) this module; OPS stay importable for precompiling
    torch = None
pytestmark = [pytest.mark.gpu, pytest.mark.skipif(torch is None, reason="needs torch")]

D = cutlass.DataType
NHWC = cutlass.LayoutType.TensorNHWC
TORCH = {D.float16: "float16", D.bfloat16: "bfloat16"}
TOLERANCE = {D.float16: 2e-3, D.bfloat16: 1.5e-2}


COOP = cutlass.KernelScheduleType.TmaWarpSpecializedCooperative


def sm90_conv(element, tile, cluster, kind=pconv.Operator.fprop, activation=None, bias=False, stages=0,
              schedule=cutlass.KernelScheduleType.Auto):
    math = cutlass.MathInstruction([64, tile[1], 16], element, element, D.float32, cutlass.OpClass.TensorOp)
    tile_d = cutlass.TileDescription(list(tile), stages, None, math, cluster_shape=list(cluster),
                                     kernel_schedule=schedule)
    desc = [cutlass.TensorDescription(element, NHWC, 8) for _ in range(3)]
    if activation is None:
        functor = cutlass.LinearCombination(element, 8, D.float32, D.float32)
    else:
        functor = cutlass.LinearCombinationGeneric(activation(D.float32), element, 8, D.float32, D.float32)
    stride_support = pconv.StrideSupport.Unity if kind is pconv.Operator.dgrad else pconv.StrideSupport.Strided
    return cutlass.Conv2dOperation(kind, pconv.IteratorAlgorithm.optimized, 90, tile_d, *desc, stride_support,
                                   functor, bias=bias)


OPS = {"f16-128x128x64-c11": sm90_conv(D.float16, (128, 128, 64), (1, 1, 1)),
       "bf16-64x128x64-c21": sm90_conv(D.bfloat16, (64, 128, 64), (2, 1, 1)),
       "f16-64x64x64-c12": sm90_conv(D.float16, (64, 64, 64), (1, 2, 1)),
       "bf16-128x256x64-c11": sm90_conv(D.bfloat16, (128, 256, 64), (1, 1, 1)),
       # explicit stage counts that fit half an SM: two CTAs co-reside (__launch_bounds__(256, 2))
       "f16-128x64x64-c11-s4": sm90_conv(D.float16, (128, 64, 64), (1, 1, 1), stages=4),
       "bf16-64x128x64-c21-s3": sm90_conv(D.bfloat16, (64, 128, 64), (2, 1, 1), stages=3),
       "f16-64x64x64-c11-s7": sm90_conv(D.float16, (64, 64, 64), (1, 1, 1), stages=7),
       # pycutlass's persistent cooperative kernel (two consumer warpgroups, CTAs walking the tiles)
       "f16-128x128x64-c11-coop": sm90_conv(D.float16, (128, 128, 64), (1, 1, 1), schedule=COOP),
       "bf16-256x128x64-c12-coop": sm90_conv(D.bfloat16, (256, 128, 64), (1, 2, 1), schedule=COOP),
       "f16-128x64x64-c21-coop-s5": sm90_conv(D.float16, (128, 64, 64), (2, 1, 1), stages=5, schedule=COOP)}
DGRAD = pconv.Operator.dgrad
WGRAD = pconv.Operator.wgrad
DGRAD_OPS = {"f16-128x128x64-c11": sm90_conv(D.float16, (128, 128, 64), (1, 1, 1), DGRAD),
             "bf16-64x128x64-c21": sm90_conv(D.bfloat16, (64, 128, 64), (2, 1, 1), DGRAD),
             "f16-128x128x64-c21-coop": sm90_conv(D.float16, (128, 128, 64), (2, 1, 1), DGRAD, schedule=COOP)}
WGRAD_OPS = {"f16-128x128x64-c11": sm90_conv(D.float16, (128, 128, 64), (1, 1, 1), WGRAD),
             "bf16-64x128x64-c12": sm90_conv(D.bfloat16, (64, 128, 64), (1, 2, 1), WGRAD),
             "f16-128x128x64-c11-coop": sm90_conv(D.float16, (128, 128, 64), (1, 1, 1), WGRAD, schedule=COOP),
             # 192-wide tiles (wgrad only): three 64-channel taps, or one and a half of a 128-channel filter
             "f16-64x192x64-c11": sm90_conv(D.float16, (64, 192, 64), (1, 1, 1), WGRAD),
             "bf16-128x192x64-c11-coop": sm90_conv(D.bfloat16, (128, 192, 64), (1, 1, 1), WGRAD, schedule=COOP),
             "f16-64x192x64-c12": sm90_conv(D.float16, (64, 192, 64), (1, 2, 1), WGRAD),  # multicast across N
             "bf16-64x192x64-c21-s3": sm90_conv(D.bfloat16, (64, 192, 64), (2, 1, 1), WGRAD, stages=3),
             "f16-128x192x64-c21-coop": sm90_conv(D.float16, (128, 192, 64), (2, 1, 1), WGRAD, schedule=COOP)}
FUSED_OPS = {"fprop-f16-bias-relu": sm90_conv(D.float16, (128, 128, 64), (1, 1, 1), activation=cutlass.relu,
                                              bias=True),
             "fprop-bf16-silu": sm90_conv(D.bfloat16, (128, 128, 64), (2, 1, 1), activation=cutlass.silu),
             "dgrad-f16-bias-gelu": sm90_conv(D.float16, (128, 128, 64), (1, 1, 1), DGRAD, activation=cutlass.gelu,
                                              bias=True),
             "fprop-bf16-bias-relu-coop": sm90_conv(D.bfloat16, (256, 128, 64), (1, 1, 1), activation=cutlass.relu,
                                                    bias=True, schedule=COOP)}


def wgrad_f32(element, tile, cluster, stages=0, schedule=cutlass.KernelScheduleType.Auto):
    """An SM90 wgrad writing float32: a float32 filter gradient, or the partials of parallel split-K."""
    math = cutlass.MathInstruction([64, tile[1], 16], element, element, D.float32, cutlass.OpClass.TensorOp)
    tile_d = cutlass.TileDescription(list(tile), stages, None, math, cluster_shape=list(cluster),
                                     kernel_schedule=schedule)
    operand = cutlass.TensorDescription(element, NHWC, 8)
    return cutlass.Conv2dOperation(WGRAD, pconv.IteratorAlgorithm.optimized, 90, tile_d, operand, operand,
                                   cutlass.TensorDescription(D.float32, NHWC, 4), pconv.StrideSupport.Strided,
                                   cutlass.LinearCombination(D.float32, 4, D.float32, D.float32))


WGRAD_F32_OPS = {"f16-64x128x64-c11": wgrad_f32(D.float16, (64, 128, 64), (1, 1, 1)),
                 "bf16-128x128x64-c12": wgrad_f32(D.bfloat16, (128, 128, 64), (1, 2, 1)),
                 "f16-64x128x64-c11-s4": wgrad_f32(D.float16, (64, 128, 64), (1, 1, 1), stages=4),  # two CTAs/SM
                 "bf16-256x128x64-c12-coop": wgrad_f32(D.bfloat16, (256, 128, 64), (1, 2, 1), schedule=COOP),
                 "f16-64x192x64-c11": wgrad_f32(D.float16, (64, 192, 64), (1, 1, 1)),
                 "f16-128x192x64-c11-coop": wgrad_f32(D.float16, (128, 192, 64), (1, 1, 1), schedule=COOP),
                 "bf16-256x192x64-c11-coop": wgrad_f32(D.bfloat16, (256, 192, 64), (1, 1, 1), schedule=COOP)}
# The parallel split-K reductions: float32 partials -> D of the operands' type = alpha * sum + beta * C.
REDUCTIONS = {element: cutlass.ReductionOperation(cutlass.MatrixCoord(4, 32 * 8),
                                                  cutlass.TensorDescription(element, cutlass.RowMajor, 8),
                                                  D.float32, D.float32, D.float32, count=8)
              for element in (D.float16, D.bfloat16)}


def taps_op(element, out, rows=1, stages=0, cluster_z=1):
    """The filter-tap-reuse wgrad (tile N = 9*64: all taps of a 3x3 filter, 64 input channels, in one CTA; a stage of
    64 * ``rows`` output pixels; clusters of ``cluster_z`` CTAs along z add their sums through distributed shared
    memory). Rows of the shapes below take 64-, 32- and 16-pixel segments."""
    math = cutlass.MathInstruction([64, 64, 16], element, element, D.float32, cutlass.OpClass.TensorOp)
    tile_d = cutlass.TileDescription([64, 9 * 64, 64 * rows], stages, None, math, cluster_shape=[1, 1, cluster_z])
    operand = cutlass.TensorDescription(element, NHWC, 8)
    output = cutlass.TensorDescription(out, NHWC, 4 if out is D.float32 else 8)
    return cutlass.Conv2dOperation(WGRAD, pconv.IteratorAlgorithm.optimized, 90, tile_d, operand, operand, output,
                                   pconv.StrideSupport.Strided,
                                   cutlass.LinearCombination(out, output.alignment, D.float32, D.float32))


TAPS_OPS = {"f16-f16": taps_op(D.float16, D.float16), "bf16-bf16-rows2-z2": taps_op(D.bfloat16, D.bfloat16, 2, 0, 2),
            "f16-f32": taps_op(D.float16, D.float32), "bf16-f32-rows2-s2": taps_op(D.bfloat16, D.float32, 2, 2),
            "f16-f32-s3-z4": taps_op(D.float16, D.float32, 1, 3, 4), "f16-f16-z4": taps_op(D.float16, D.float16, 1, 0, 4),
            "bf16-f32-z2": taps_op(D.bfloat16, D.float32, 1, 0, 2)}
ALL_OPS = [*OPS.values(), *DGRAD_OPS.values(), *WGRAD_OPS.values(), *FUSED_OPS.values(),
           *WGRAD_F32_OPS.values(), *TAPS_OPS.values()]  # tests/gpu/precompile.py
NVCC_OPS = list(REDUCTIONS.values())


@pytest.fixture(scope="module", autouse=True)
def _compiled():
    precompile_module(NVCC_OPS, ALL_OPS)


def _problem(n, h, w, c, k, r, s, pad, stride, dilation):
    return pconv.Conv2dProblemSize(cutlass.Tensor4DCoord(n, h, w, c), cutlass.Tensor4DCoord(k, r, s, c),
                                   cutlass.Tensor4DCoord(pad[0], pad[1], pad[2], pad[3]),
                                   cutlass.MatrixCoord(*stride), cutlass.MatrixCoord(*dilation),
                                   pconv.Mode.cross_correlation, 1, 1)


def _reference(x, wt, c, alpha, beta, pad, stride, dilation):
    """float64 fprop in NHWC: pad (top, bottom, left, right) may be asymmetric."""
    xt = torch.nn.functional.pad(x.double().permute(0, 3, 1, 2), (pad[2], pad[3], pad[0], pad[1]))
    out = torch.nn.functional.conv2d(xt, wt.double().permute(0, 3, 1, 2), stride=stride, dilation=dilation)
    out = alpha * out.permute(0, 2, 3, 1)
    return out + beta * c.double() if c is not None else out


SHAPES = [  # n, h, w, c, k, r, s, pad (t, b, l, r), stride, dilation
    (1, 9, 9, 64, 128, 3, 3, (1, 1, 1, 1), (1, 1), (1, 1)),
    (2, 17, 13, 72, 136, 3, 3, (1, 1, 1, 1), (1, 1), (1, 1)),       # C, K not multiples of the tile
    (3, 23, 19, 8, 8, 1, 1, (0, 0, 0, 0), (1, 1), (1, 1)),          # C = K = 8
    (2, 31, 29, 40, 96, 3, 5, (1, 2, 2, 1), (2, 3), (1, 1)),        # asymmetric padding, strides
    (1, 28, 30, 24, 200, 3, 3, (2, 2, 2, 2), (1, 1), (2, 2)),       # dilation
    (4, 14, 14, 136, 64, 5, 5, (2, 2, 2, 2), (2, 2), (1, 2)),       # stride and dilation
    (1, 7, 300, 16, 48, 1, 7, (0, 0, 3, 3), (1, 2), (1, 1)),        # odd W
]


@pytest.mark.parametrize("key", list(OPS))
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s[:7])))
@pytest.mark.parametrize("beta", [0.0, 0.5])
def test_fprop_matches_float64(key, shape, beta):
    op = OPS[key]
    element = op.A.element
    n, h, w, c, k, r, s, pad, stride, dilation = shape
    ps = _problem(*shape)
    p, q = ps.P, ps.Q
    dtype = getattr(torch, TORCH[element])
    gen = torch.Generator(device="cuda").manual_seed(hash((key, shape, beta)) % 2**31)
    x = torch.randn(n, h, w, c, device="cuda", generator=gen).to(dtype)
    wt = torch.randn(k, r, s, c, device="cuda", generator=gen).to(dtype)
    cc = torch.randn(n, p, q, k, device="cuda", generator=gen).to(dtype) if beta else None
    out = torch.full((n, p, q, k), float("nan"), device="cuda", dtype=dtype)
    alpha = 1.25
    arguments = cutlass.Conv2dArguments(op, ps, x, wt, cc, out, output_op=op.epilogue_type(alpha, beta))
    op.run(arguments)
    arguments.sync()
    reference = _reference(x, wt, cc, alpha, beta, pad, stride, dilation)
    assert tuple(reference.shape) == (n, p, q, k)
    error = relative_error(out.float().cpu().numpy(), reference.cpu().numpy())
    assert error < TOLERANCE[element], (key, shape, beta, error)


def _padded_fprop(x, wt, pad, stride, dilation):
    """float64 fprop of NHWC x and KRSC wt, asymmetric pad (top, bottom, left, right); returns NCHW."""
    xt = torch.nn.functional.pad(x.permute(0, 3, 1, 2), (pad[2], pad[3], pad[0], pad[1]))
    return torch.nn.functional.conv2d(xt, wt.permute(0, 3, 1, 2), stride=stride, dilation=dilation)


def _gradients(x, wt, dy, pad, stride, dilation):
    """float64 dgrad (NHWC) and wgrad (KRSC) of the fprop above, for NPQK dy, through autograd: the gradients come
    in the layouts of x and wt themselves (the permutes live inside the fprop)."""
    x64 = x.double().requires_grad_(True)
    w64 = wt.double().requires_grad_(True)
    out = _padded_fprop(x64, w64, pad, stride, dilation)
    dx, dw = torch.autograd.grad(out, (x64, w64), dy.double().permute(0, 3, 1, 2))
    return dx.detach(), dw.detach()


DGRAD_SHAPES = [  # n, h, w, c, k, r, s, pad (t, b, l, r), stride (1 only on SM90), dilation
    (1, 9, 9, 64, 128, 3, 3, (1, 1, 1, 1), (1, 1), (1, 1)),
    (2, 17, 13, 136, 72, 3, 3, (1, 1, 1, 1), (1, 1), (1, 1)),      # C, K not multiples of the tile
    (3, 23, 19, 8, 8, 1, 1, (0, 0, 0, 0), (1, 1), (1, 1)),          # C = K = 8
    (2, 31, 29, 40, 96, 3, 5, (1, 2, 2, 1), (1, 1), (1, 1)),        # asymmetric padding
    (1, 28, 30, 24, 200, 3, 3, (2, 2, 2, 2), (1, 1), (2, 2)),       # dilation
    (4, 14, 14, 64, 64, 5, 5, (0, 0, 0, 0), (1, 1), (1, 1)),        # no padding, 5x5
]
WGRAD_SHAPES = [
    (1, 9, 9, 64, 128, 3, 3, (1, 1, 1, 1), (1, 1), (1, 1)),
    (2, 17, 13, 72, 136, 3, 3, (1, 1, 1, 1), (1, 1), (1, 1)),
    (3, 23, 19, 8, 8, 1, 1, (0, 0, 0, 0), (1, 1), (1, 1)),
    (2, 31, 29, 40, 96, 3, 5, (1, 2, 2, 1), (2, 3), (1, 1)),        # asymmetric padding, strides
    (1, 28, 30, 24, 200, 3, 3, (2, 2, 2, 2), (1, 1), (2, 2)),       # dilation
    (4, 14, 14, 136, 64, 5, 5, (2, 2, 2, 2), (2, 2), (1, 2)),       # stride and dilation
    (8, 56, 56, 64, 64, 1, 1, (0, 0, 0, 0), (1, 1), (1, 1)),        # a long GEMM K (N*P*Q = 25088)
    (2, 12, 10, 128, 64, 3, 3, (1, 1, 1, 1), (1, 1), (1, 1)),       # 192-wide tiles end mid-tap (1152 = 6 x 192)
    (1, 11, 13, 96, 72, 3, 3, (0, 1, 1, 0), (1, 2), (1, 1)),        # 864 = 4.5 x 192
]


def _random(shape, dtype, gen):
    return torch.randn(*shape, device="cuda", generator=gen).to(dtype)


@pytest.mark.parametrize("key", list(DGRAD_OPS))
@pytest.mark.parametrize("shape", DGRAD_SHAPES, ids=lambda s: "x".join(map(str, s[:7])))
@pytest.mark.parametrize("beta", [0.0, 0.5])
def test_dgrad_matches_float64(key, shape, beta):
    op = DGRAD_OPS[key]
    element = op.A.element
    n, h, w, c, k, r, s, pad, stride, dilation = shape
    ps = _problem(*shape)
    dtype = getattr(torch, TORCH[element])
    gen = torch.Generator(device="cuda").manual_seed(hash(("dgrad", key, shape, beta)) % 2**31)
    x = torch.zeros(n, h, w, c, device="cuda", dtype=dtype)  # shape only: dgrad does not read x
    wt = _random((k, r, s, c), dtype, gen)
    dy = _random((n, ps.P, ps.Q, k), dtype, gen)
    cc = _random((n, h, w, c), dtype, gen) if beta else None
    dx = torch.full((n, h, w, c), float("nan"), device="cuda", dtype=dtype)
    alpha = 0.75
    arguments = cutlass.Conv2dArguments(op, ps, dy, wt, cc, dx, output_op=op.epilogue_type(alpha, beta))
    op.run(arguments)
    arguments.sync()
    reference, _ = _gradients(x, wt, dy, pad, stride, dilation)
    reference = alpha * reference + (beta * cc.double() if cc is not None else 0)
    error = relative_error(dx.float().cpu().numpy(), reference.cpu().numpy())
    assert error < TOLERANCE[element], (key, shape, beta, error)


@pytest.mark.parametrize("key", list(WGRAD_OPS))
@pytest.mark.parametrize("shape", WGRAD_SHAPES, ids=lambda s: "x".join(map(str, s[:7])))
@pytest.mark.parametrize("beta", [0.0, 0.5])
def test_wgrad_matches_float64(key, shape, beta):
    op = WGRAD_OPS[key]
    element = op.A.element
    n, h, w, c, k, r, s, pad, stride, dilation = shape
    ps = _problem(*shape)
    dtype = getattr(torch, TORCH[element])
    gen = torch.Generator(device="cuda").manual_seed(hash(("wgrad", key, shape, beta)) % 2**31)
    x = _random((n, h, w, c), dtype, gen)
    wt = torch.zeros(k, r, s, c, device="cuda", dtype=dtype)  # shape only
    dy = _random((n, ps.P, ps.Q, k), dtype, gen)
    cc = _random((k, r, s, c), dtype, gen) if beta else None
    dw = torch.full((k, r, s, c), float("nan"), device="cuda", dtype=dtype)
    alpha = 0.75
    arguments = cutlass.Conv2dArguments(op, ps, dy, x, cc, dw, output_op=op.epilogue_type(alpha, beta))
    op.run(arguments)
    arguments.sync()
    _, reference = _gradients(x, wt, dy, pad, stride, dilation)
    reference = alpha * reference + (beta * cc.double() if cc is not None else 0)
    error = relative_error(dw.float().cpu().numpy(), reference.cpu().numpy())
    assert error < TOLERANCE[element], (key, shape, beta, error)


@pytest.mark.parametrize("key", list(WGRAD_F32_OPS))
@pytest.mark.parametrize("shape", WGRAD_SHAPES[:4], ids=lambda s: "x".join(map(str, s[:7])))
def test_wgrad_writes_a_float32_filter_gradient(key, shape):
    op = WGRAD_F32_OPS[key]
    dtype = getattr(torch, TORCH[op.A.element])
    n, h, w, c, k, r, s, pad, stride, dilation = shape
    ps = _problem(*shape)
    gen = torch.Generator(device="cuda").manual_seed(hash(("wgrad-f32", key, shape)) % 2**31)
    x, dy = _random((n, h, w, c), dtype, gen), _random((n, ps.P, ps.Q, k), dtype, gen)
    cc = torch.randn(k, r, s, c, device="cuda", generator=gen)
    dw = torch.full((k, r, s, c), float("nan"), device="cuda")
    arguments = cutlass.Conv2dArguments(op, ps, dy, x, cc, dw, output_op=op.epilogue_type(0.75, -0.5))
    op.run(arguments)
    arguments.sync()
    _, reference = _gradients(x, torch.zeros(k, r, s, c, device="cuda", dtype=dtype), dy, pad, stride, dilation)
    reference = 0.75 * reference - 0.5 * cc.double()
    assert relative_error(dw.cpu().numpy(), reference.cpu().numpy()) < 1e-4, (key, shape)


SPLIT_SHAPES = [  # shape, slices: runs of whole images (uneven ones included), every image its own, one
    ((2, 17, 13, 72, 136, 3, 3, (1, 1, 1, 1), (1, 1), (1, 1)), 2),
    ((3, 23, 19, 8, 8, 1, 1, (0, 0, 0, 0), (1, 1), (1, 1)), 3),
    ((5, 31, 29, 40, 96, 3, 5, (1, 2, 2, 1), (2, 3), (1, 1)), 3),      # slices of 2, 2 and 1 images
    ((13, 28, 30, 24, 64, 3, 3, (2, 2, 2, 2), (1, 1), (2, 2)), 4),     # dilation, slices of 4, 3, 3, 3
    ((13, 14, 14, 136, 64, 5, 5, (2, 2, 2, 2), (2, 2), (1, 2)), 13),
    ((8, 56, 56, 64, 64, 3, 3, (1, 1, 1, 1), (1, 1), (1, 1)), 8),      # a long GEMM K, few output tiles
    ((4, 9, 9, 64, 128, 3, 3, (1, 1, 1, 1), (1, 1), (1, 1)), 1),
    # more slices than images: every image cut into runs of output rows, each with its own top/bottom padding
    ((2, 17, 13, 72, 136, 3, 3, (1, 1, 1, 1), (1, 1), (1, 1)), 6),
    ((2, 31, 29, 40, 96, 3, 5, (1, 2, 2, 1), (2, 3), (1, 1)), 8),      # asymmetric padding, strides
    ((1, 28, 30, 24, 64, 3, 3, (2, 2, 2, 2), (1, 1), (2, 2)), 5),      # dilation
    ((3, 23, 19, 8, 8, 1, 1, (0, 0, 0, 0), (1, 1), (1, 1)), 69),       # every output row its own slice
    ((4, 56, 56, 64, 64, 3, 3, (1, 1, 1, 1), (1, 1), (1, 1)), 16),
]


@pytest.mark.parametrize("key", list(WGRAD_F32_OPS))
@pytest.mark.parametrize("shape,slices", SPLIT_SHAPES, ids=lambda v: "x".join(map(str, v[:7])) if
                         isinstance(v, tuple) else str(v))
def test_wgrad_parallel_split_k_by_images(key, shape, slices):
    """Float32 partials of runs of whole images or of output rows (one launch), then the reduction:
    D = alpha * sum + beta * C in the operands' type; run twice (the slices' Params stay on the device) and again on
    new tensors."""
    op = WGRAD_F32_OPS[key]
    element = op.A.element
    dtype = getattr(torch, TORCH[element])
    reduction = REDUCTIONS[element]
    n, h, w, c, k, r, s, pad, stride, dilation = shape
    ps = _problem(*shape)
    gen = torch.Generator(device="cuda").manual_seed(hash(("wgrad-split", key, shape, slices)) % 2**31)
    for attempt in range(2):
        x, dy = _random((n, h, w, c), dtype, gen), _random((n, ps.P, ps.Q, k), dtype, gen)
        cc = _random((k, r, s, c), dtype, gen)
        dw = torch.full((k, r, s, c), float("nan"), device="cuda", dtype=dtype)
        arguments = cutlass.Conv2dArguments(op, ps, dy, x, None, None, split_k_mode=pconv.SplitKMode.Parallel,
                                            split_k_slices=slices)
        m, nn = arguments.reduction_problem_size
        assert (m, nn, arguments.split_k_slices) == (k, r * s * c, slices)
        reduce = cutlass.ReductionArguments(reduction, [m, nn], slices, arguments, dw.view(m, nn), cc.view(m, nn),
                                            reduction.epilogue_type(0.75, 0.5),
                                            partition_stride=arguments.partition_stride)
        _, reference = _gradients(x, torch.zeros(k, r, s, c, device="cuda", dtype=dtype), dy, pad, stride, dilation)
        reference = (0.75 * reference + 0.5 * cc.double()).cpu().numpy()
        for _ in range(2 if attempt == 0 else 1):
            dw.fill_(float("nan"))
            op.run(arguments)
            reduction.run(reduce)
            reduce.sync()
            error = relative_error(dw.float().cpu().numpy(), reference)
            assert error < TOLERANCE[element], (key, shape, slices, attempt, error)


def test_wgrad_parallel_split_k_under_a_cuda_graph():
    """The slices kernel and the reduction captured once and replayed on new values of the same tensors."""
    op = WGRAD_F32_OPS["f16-64x128x64-c11"]
    reduction = REDUCTIONS[D.float16]
    shape = (6, 20, 20, 64, 64, 3, 3, (1, 1, 1, 1), (1, 1), (1, 1))
    n, h, w, c, k, r, s, pad, stride, dilation = shape
    ps = _problem(*shape)
    gen = torch.Generator(device="cuda").manual_seed(5)
    x, dy = _random((n, h, w, c), torch.float16, gen), _random((n, ps.P, ps.Q, k), torch.float16, gen)
    dw = torch.full((k, r, s, c), float("nan"), device="cuda", dtype=torch.float16)
    stream = torch.cuda.Stream()
    arguments = cutlass.Conv2dArguments(op, ps, dy, x, None, None, split_k_mode=pconv.SplitKMode.Parallel,
                                        split_k_slices=4, stream=stream.cuda_stream)
    m, nn = arguments.reduction_problem_size
    reduce = cutlass.ReductionArguments(reduction, [m, nn], 4, arguments, dw.view(m, nn), None,
                                        reduction.epilogue_type(1.0, 0.0), partition_stride=arguments.partition_stride,
                                        stream=stream.cuda_stream)
    op.run(arguments)  # launched once outside the capture
    reduction.run(reduce)
    stream.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, stream=stream):
        op.run(arguments)
        reduction.run(reduce)
    for _ in range(2):
        x.copy_(_random((n, h, w, c), torch.float16, gen))
        dy.copy_(_random((n, ps.P, ps.Q, k), torch.float16, gen))
        dw.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        _, reference = _gradients(x, torch.zeros(k, r, s, c, device="cuda", dtype=torch.float16), dy, pad, stride,
                                  dilation)
        assert relative_error(dw.float().cpu().numpy(), reference.cpu().numpy()) < TOLERANCE[D.float16]


FUSED_SHAPES = [
    (2, 17, 13, 72, 136, 3, 3, (1, 1, 1, 1), (1, 1), (1, 1)),
    (1, 28, 30, 24, 200, 3, 3, (2, 2, 2, 2), (1, 1), (2, 2)),
]
_ACTIVATIONS = {"relu": torch.nn.functional.relu if torch else None,
                "silu": torch.nn.functional.silu if torch else None,
                "gelu": torch.nn.functional.gelu if torch else None}  # CUTLASS's GELU is the erf form


@pytest.mark.parametrize("key", list(FUSED_OPS))
@pytest.mark.parametrize("shape", FUSED_SHAPES, ids=lambda s: "x".join(map(str, s[:7])))
def test_fused_bias_and_activation(key, shape):
    """D = act(alpha * conv + bias) with a per-channel bias passed as C (1-D and as a broadcast view), or
    D = act(alpha * conv + beta * C) without bias."""
    op = FUSED_OPS[key]
    element = op.A.element
    dtype = getattr(torch, TORCH[element])
    n, h, w, c, k, r, s, pad, stride, dilation = shape
    ps = _problem(*shape)
    gen = torch.Generator(device="cuda").manual_seed(hash(("fused", key, shape)) % 2**31)
    act = _ACTIVATIONS[op.epilogue_functor.activation.name]
    alpha = 1.25
    dgrad = op.conv_kind is DGRAD
    x = _random((n, h, w, c), dtype, gen)
    wt = _random((k, r, s, c), dtype, gen)
    dy = _random((n, ps.P, ps.Q, k), dtype, gen)
    if dgrad:
        inputs, out_shape, channels = (dy, wt), (n, h, w, c), c
        raw = _gradients(x, wt, dy, pad, stride, dilation)[0]
    else:
        inputs, out_shape, channels = (x, wt), (n, ps.P, ps.Q, k), k
        raw = _padded_fprop(x.double(), wt.double(), pad, stride, dilation).permute(0, 2, 3, 1)
    cases = []
    if op.bias:
        bias = _random((channels,), dtype, gen)
        cases = [(bias, 1.0, bias.double()),
                 (bias.view(1, 1, 1, channels).expand(*out_shape), 1.0, bias.double())]
    else:
        cc = _random(out_shape, dtype, gen)
        cases = [(cc, 0.5, 0.5 * cc.double()), (None, 0.0, 0.0)]
    for c_tensor, beta, added in cases:
        out = torch.full(out_shape, float("nan"), device="cuda", dtype=dtype)
        arguments = cutlass.Conv2dArguments(op, ps, *inputs, c_tensor, out, output_op=op.epilogue_type(alpha, beta))
        op.run(arguments)
        arguments.sync()
        reference = act(alpha * raw + added)
        error = relative_error(out.float().cpu().numpy(), reference.cpu().numpy())
        assert error < TOLERANCE[element], (key, shape, beta, error)


TWO_CTA_OPS = [OPS["f16-128x64x64-c11-s4"], OPS["bf16-64x128x64-c21-s3"], OPS["f16-64x64x64-c11-s7"],
               WGRAD_F32_OPS["f16-64x128x64-c11-s4"]]


@pytest.mark.parametrize("op", TWO_CTA_OPS, ids=lambda op: op.name)
def test_explicit_stages_fit_two_ctas_per_sm(op):
    """The kernels built for two CTAs per SM: at most 128 registers, no local memory, shared memory for two (228
    KiB per SM, 1 KiB reserved per CTA); where the driver reports occupancy (not for every cluster kernel), 2."""
    from pycutlass.tune.bench import kernel_resources

    assert op.ctas_per_sm == 2
    shape = (2, 17, 13, 72, 136, 3, 3, (1, 1, 1, 1), (1, 1), (1, 1))
    n, h, w, c, k, r, s = shape[:7]
    ps = _problem(*shape)
    dtype = getattr(torch, TORCH[op.A.element])
    x = torch.zeros(n, h, w, c, device="cuda", dtype=dtype)
    dy = torch.zeros(n, ps.P, ps.Q, k, device="cuda", dtype=dtype)
    if op.conv_kind is WGRAD:
        arguments = cutlass.Conv2dArguments(op, ps, dy, x, None, torch.zeros(k, r, s, c, device="cuda"))
    else:
        arguments = cutlass.Conv2dArguments(op, ps, x, torch.zeros(k, r, s, c, device="cuda", dtype=dtype), None, dy)
    op.run(arguments)
    arguments.sync()
    facts = kernel_resources(arguments)
    assert facts is not None
    assert facts["registers"] <= 128 and facts["local_bytes"] == 0, facts
    assert 2 * (facts["dynamic_smem"] + facts["static_smem"]) <= 228 * 1024, facts
    if "max_active_blocks" in facts:
        assert facts["max_active_blocks"] >= 2, facts


def test_sm90_dgrad_refuses_strides():
    op = DGRAD_OPS["f16-128x128x64-c11"]
    ps = _problem(1, 9, 9, 64, 128, 3, 3, (1, 1, 1, 1), (2, 2), (1, 1))
    dy = torch.zeros(1, ps.P, ps.Q, 128, device="cuda", dtype=torch.float16)
    wt = torch.zeros(128, 3, 3, 64, device="cuda", dtype=torch.float16)
    dx = torch.zeros(1, 9, 9, 64, device="cuda", dtype=torch.float16)
    with pytest.raises(cutlass.ArgumentError, match="stride"):
        cutlass.Conv2dArguments(op, ps, dy, wt, None, dx)


COOP_WALK_CASES = [  # (op, shape): more output tiles than SMs, so every persistent CTA takes several
    (OPS["f16-128x128x64-c11-coop"], (16, 28, 28, 128, 136, 3, 3, (1, 1, 1, 1), (1, 1), (1, 1))),  # 98 x 2 tiles
    (OPS["bf16-256x128x64-c12-coop"], (16, 56, 56, 64, 256, 3, 3, (1, 1, 1, 1), (1, 1), (1, 1))),  # 196 x 2
    (OPS["f16-128x64x64-c21-coop-s5"], (8, 30, 30, 72, 200, 3, 3, (1, 1, 1, 1), (1, 1), (1, 1))),
    (DGRAD_OPS["f16-128x128x64-c21-coop"], (16, 40, 40, 192, 64, 3, 3, (1, 1, 1, 1), (1, 1), (1, 1))),  # 200 x 2
    (WGRAD_OPS["f16-128x128x64-c11-coop"], (2, 14, 14, 256, 1032, 3, 3, (1, 1, 1, 1), (1, 1), (1, 1))),  # 9 x 18
]


@pytest.mark.parametrize("op, shape", COOP_WALK_CASES, ids=lambda v: v.name if hasattr(v, "name") else
                         "x".join(map(str, v[:7])))
@pytest.mark.parametrize("beta", [0.0, 0.5])
def test_cooperative_ctas_walk_more_tiles_than_sms(op, shape, beta):
    """The persistent grid holds at most one CTA per SM (whole clusters); each CTA computes tile after tile, the
    next one's loads under the last one's epilogue, and C is read tile by tile (beta != 0)."""
    assert op.cooperative and op.kernel_schedule is COOP
    n, h, w, c, k, r, s, pad, stride, dilation = shape
    ps = _problem(*shape)
    element = op.A.element
    dtype = getattr(torch, TORCH[element])
    gen = torch.Generator(device="cuda").manual_seed(hash((op.name, shape, beta)) % 2**31)
    x, wt = _random((n, h, w, c), dtype, gen), _random((k, r, s, c), dtype, gen)
    dy = _random((n, ps.P, ps.Q, k), dtype, gen)
    alpha = 0.5
    if op.conv_kind is WGRAD:
        inputs, out_shape = (dy, x), (k, r, s, c)
        reference = _gradients(x, wt, dy, pad, stride, dilation)[1]
    elif op.conv_kind is DGRAD:
        inputs, out_shape = (dy, wt), (n, h, w, c)
        reference = _gradients(x, wt, dy, pad, stride, dilation)[0]
    else:
        inputs, out_shape = (x, wt), (n, ps.P, ps.Q, k)
        reference = _padded_fprop(x.double(), wt.double(), pad, stride, dilation).permute(0, 2, 3, 1)
    cc = _random(out_shape, dtype, gen) if beta else None
    out = torch.full(out_shape, float("nan"), device="cuda", dtype=dtype)
    arguments = cutlass.Conv2dArguments(op, ps, *inputs, cc, out, output_op=op.epilogue_type(alpha, beta))
    op.run(arguments)
    arguments.sync()
    reference = alpha * reference + (beta * cc.double() if cc is not None else 0)
    error = relative_error(out.float().cpu().numpy(), reference.cpu().numpy())
    assert error < TOLERANCE[element], (op.name, shape, beta, error)
    # the launch is persistent: fewer CTAs than output tiles, at most the device's SMs
    grid = arguments.prepared().grid
    gemm = ps.implicit_gemm_size(op.conv_kind)
    tm, tn, _ = op.tile_description.threadblock_shape
    tiles = -(-gemm.m() // tm) * -(-gemm.n() // tn)
    ctas = grid[0] * grid[1] * grid[2]
    assert ctas <= arguments.device.sm_count < tiles, (grid, tiles)


@pytest.mark.parametrize("kind", ["dgrad", "wgrad"])
def test_backward_seen_problem_reuses_params_on_new_tensors(kind):
    """Second and third Arguments for one shape take the patched-Params path (PYCUTLASS_VERIFY_PARAMS=1 rebuilds)."""
    op = (DGRAD_OPS if kind == "dgrad" else WGRAD_OPS)["f16-128x128x64-c11"]
    shape = (2, 17, 13, 72, 136, 3, 3, (1, 1, 1, 1), (1, 1), (1, 1))
    n, h, w, c, k, r, s, pad, stride, dilation = shape
    ps = _problem(*shape)
    for seed in range(3):
        gen = torch.Generator(device="cuda").manual_seed(seed)
        x = _random((n, h, w, c), torch.float16, gen)
        wt = _random((k, r, s, c), torch.float16, gen)
        dy = _random((n, ps.P, ps.Q, k), torch.float16, gen)
        dx_ref, dw_ref = _gradients(x, wt, dy, pad, stride, dilation)
        if kind == "dgrad":
            out = torch.full((n, h, w, c), float("nan"), device="cuda", dtype=torch.float16)
            arguments = cutlass.Conv2dArguments(op, ps, dy, wt, None, out)
            reference = dx_ref
        else:
            out = torch.full((k, r, s, c), float("nan"), device="cuda", dtype=torch.float16)
            arguments = cutlass.Conv2dArguments(op, ps, dy, x, None, out)
            reference = dw_ref
        op.run(arguments)
        arguments.sync()
        assert relative_error(out.float().cpu().numpy(), reference.cpu().numpy()) < TOLERANCE[D.float16]


def test_a_seen_problem_reuses_params_on_new_tensors():
    """A second Arguments object for the same shape: patched Params (im2col descriptors re-encoded with the new
    addresses through the fast path; PYCUTLASS_VERIFY_PARAMS=1 compares them with a fresh build)."""
    op = OPS["f16-128x128x64-c11"]
    ps = _problem(2, 17, 13, 72, 136, 3, 3, (1, 1, 1, 1), (1, 1), (1, 1))
    for seed in range(3):
        torch.manual_seed(seed)
        x = torch.randn(2, 17, 13, 72, device="cuda").half()
        wt = torch.randn(136, 3, 3, 72, device="cuda").half()
        out = torch.full((2, 17, 13, 136), float("nan"), device="cuda", dtype=torch.float16)
        arguments = cutlass.Conv2dArguments(op, ps, x, wt, None, out)
        op.run(arguments)
        arguments.sync()
        reference = _reference(x, wt, None, 1.0, 0.0, (1, 1, 1, 1), (1, 1), (1, 1))
        assert relative_error(out.float().cpu().numpy(), reference.cpu().numpy()) < TOLERANCE[D.float16]


def test_channels_last_nchw_tensors_are_accepted():
    op = OPS["bf16-64x128x64-c21"]
    ps = _problem(2, 10, 12, 32, 64, 3, 3, (1, 1, 1, 1), (1, 1), (1, 1))
    x = torch.randn(2, 32, 10, 12, device="cuda").bfloat16().to(memory_format=torch.channels_last)
    wt = torch.randn(64, 32, 3, 3, device="cuda").bfloat16().to(memory_format=torch.channels_last)
    out = torch.full((2, 64, 10, 12), float("nan"), device="cuda", dtype=torch.bfloat16).to(
        memory_format=torch.channels_last)
    arguments = cutlass.Conv2dArguments(op, ps, x, wt, None, out)
    op.run(arguments)
    arguments.sync()
    reference = torch.nn.functional.conv2d(x.double(), wt.double(), padding=1)
    assert relative_error(out.float().cpu().numpy(), reference.cpu().numpy()) < TOLERANCE[D.bfloat16]
    assert np.isfinite(out.float().cpu().numpy()).all()


def test_cubins_hold_real_kernels_and_no_traps():
    """The SASS of every SM90 conv operation here: no trap instruction (NVRTC without a native __int128, or an encode
    compiled out), and each kernel holds a warpgroup MMA and a TMA load (not an empty kernel)."""
    scan_cubins(ALL_OPS)


# --- the filter-tap-reuse wgrad (3x3, stride 1) ---------------------------------------------------------------------
TAPS_SHAPES = [  # n, h, w, c, k, r, s, pad (t, b, l, r), stride, dilation
    (1, 9, 9, 64, 64, 3, 3, (1, 1, 1, 1), (1, 1), (1, 1)),
    (2, 17, 13, 128, 64, 3, 3, (1, 1, 1, 1), (1, 1), (1, 1)),       # rows narrower than a 64-pixel segment
    (3, 8, 70, 64, 128, 3, 3, (1, 1, 1, 1), (1, 1), (1, 1)),        # two segments a row, the second mostly empty
    (2, 12, 10, 64, 192, 3, 3, (0, 0, 0, 0), (1, 1), (1, 1)),       # no padding
    (1, 11, 67, 192, 64, 3, 3, (2, 1, 0, 2), (1, 1), (1, 1)),       # asymmetric padding
    (2, 5, 5, 64, 64, 3, 3, (3, 3, 3, 3), (1, 1), (1, 1)),          # output rows that read only padding
    (4, 56, 56, 64, 64, 3, 3, (1, 1, 1, 1), (1, 1), (1, 1)),        # a ResNet-50 conv2_x layer
    (3, 15, 28, 128, 64, 3, 3, (1, 1, 1, 1), (1, 1), (1, 1)),       # 32-pixel segments (a conv3_x row)
    (1, 30, 17, 64, 128, 3, 3, (0, 2, 1, 1), (1, 1), (1, 1)),       # 32-pixel segments, 15 of them padding
]


def _taps_inputs(op, shape, seed):
    n, h, w, c, k, r, s, pad, stride, dilation = shape
    ps = _problem(*shape)
    dtype = getattr(torch, TORCH[op.A.element])
    gen = torch.Generator(device="cuda").manual_seed(seed)
    x, dy = _random((n, h, w, c), dtype, gen), _random((n, ps.P, ps.Q, k), dtype, gen)
    _, reference = _gradients(x, torch.zeros(k, r, s, c, device="cuda", dtype=dtype), dy, pad, stride, dilation)
    return ps, x, dy, reference, gen


@pytest.mark.parametrize("key", list(TAPS_OPS))
@pytest.mark.parametrize("shape", TAPS_SHAPES, ids=lambda s: "x".join(map(str, s[:7])) + f"p{s[7][0]}{s[7][2]}")
@pytest.mark.parametrize("beta", [0.0, 0.5])
def test_filter_taps_wgrad_matches_float64(key, shape, beta):
    """One slice: D = alpha * dW + beta * C written by the kernel itself, in C's type."""
    op = TAPS_OPS[key]
    ps, x, dy, reference, gen = _taps_inputs(op, shape, hash(("taps", key, shape, beta)) % 2**31)
    k, r, s, c = shape[4], shape[5], shape[6], shape[3]
    out_dtype = torch.float32 if op.C.element is D.float32 else getattr(torch, TORCH[op.C.element])
    cc = torch.randn(k, r, s, c, device="cuda", generator=gen).to(out_dtype) if beta else None
    dw = torch.full((k, r, s, c), float("nan"), device="cuda", dtype=out_dtype)
    arguments = cutlass.Conv2dArguments(op, ps, dy, x, cc, dw, output_op=op.epilogue_type(0.75, beta))
    op.run(arguments)
    arguments.sync()
    reference = 0.75 * reference + (beta * cc.double() if cc is not None else 0)
    tolerance = 1e-4 if op.C.element is D.float32 else TOLERANCE[op.C.element]
    error = relative_error(dw.float().cpu().numpy(), reference.cpu().numpy())
    assert error < tolerance, (key, shape, beta, error)


TAPS_F32 = [key for key, op in TAPS_OPS.items() if op.C.element is D.float32]


@pytest.mark.parametrize("key", TAPS_F32)
@pytest.mark.parametrize("shape", TAPS_SHAPES, ids=lambda s: "x".join(map(str, s[:7])) + f"p{s[7][0]}{s[7][2]}")
@pytest.mark.parametrize("slices", [2, 7, 150])
def test_filter_taps_wgrad_parallel_split_k(key, shape, slices):
    """float32 partials of runs of 64-pixel row segments (one launch, a cluster of z layers per slice; slices beyond
    the segments write zeros), then the reduction; twice, the second time on new tensors (the Params of a seen
    problem, patched)."""
    op = TAPS_OPS[key]
    element = op.A.element
    reduction = REDUCTIONS[element]
    k, r, s, c = shape[4], shape[5], shape[6], shape[3]
    dtype = getattr(torch, TORCH[element])
    for attempt in range(2):
        ps, x, dy, reference, gen = _taps_inputs(op, shape, hash(("taps-split", key, shape, slices, attempt)) % 2**31)
        cc = _random((k, r, s, c), dtype, gen)
        dw = torch.full((k, r, s, c), float("nan"), device="cuda", dtype=dtype)
        arguments = cutlass.Conv2dArguments(op, ps, dy, x, None, None, split_k_mode=pconv.SplitKMode.Parallel,
                                            split_k_slices=slices)
        m, nn = arguments.reduction_problem_size
        reduce = cutlass.ReductionArguments(reduction, [m, nn], slices, arguments, dw.view(m, nn), cc.view(m, nn),
                                            reduction.epilogue_type(0.75, 0.5),
                                            partition_stride=arguments.partition_stride)
        op.run(arguments)
        reduction.run(reduce)
        reduce.sync()
        expected = (0.75 * reference + 0.5 * cc.double()).cpu().numpy()
        error = relative_error(dw.float().cpu().numpy(), expected)
        assert error < TOLERANCE[element], (key, shape, slices, attempt, error)
