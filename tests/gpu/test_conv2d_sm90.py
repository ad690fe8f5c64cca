"""The conv2d_sm90 kind on a GPU (fprop): ``Conv2dOperation(..., 90, <SM90 tile>, ...)`` through the public API,
against a float64 reference, D poisoned with NaN before every run. Run with PYCUTLASS_VERIFY_PARAMS=1 (the patched
Params of a seen problem are rebuilt and compared, im2col descriptors included). Not yet run on a GPU: see
docs/sm90.md, "SM90 convolution"."""
from __future__ import annotations

import numpy as np
import pytest

import pycutlass as cutlass
from pycutlass import conv as pconv

from .conftest import precompile_module, relative_error

try:
    import torch
except ImportError:  # CPU machines collect (and skip) this module; OPS stay importable for precompiling
    torch = None
pytestmark = [pytest.mark.gpu, pytest.mark.skipif(torch is None, reason="needs torch")]

D = cutlass.DataType
NHWC = cutlass.LayoutType.TensorNHWC
TORCH = {D.float16: "float16", D.bfloat16: "bfloat16"}
TOLERANCE = {D.float16: 2e-3, D.bfloat16: 1.5e-2}


def sm90_conv(element, tile, cluster):
    math = cutlass.MathInstruction([64, tile[1], 16], element, element, D.float32, cutlass.OpClass.TensorOp)
    tile_d = cutlass.TileDescription(list(tile), 0, None, math, cluster_shape=list(cluster))
    desc = [cutlass.TensorDescription(element, NHWC, 8) for _ in range(3)]
    return cutlass.Conv2dOperation(pconv.Operator.fprop, pconv.IteratorAlgorithm.optimized, 90, tile_d, *desc,
                                   pconv.StrideSupport.Strided, cutlass.LinearCombination(element, 8, D.float32,
                                                                                            D.float32))


OPS = {"f16-128x128x64-c11": sm90_conv(D.float16, (128, 128, 64), (1, 1, 1)),
       "bf16-64x128x64-c21": sm90_conv(D.bfloat16, (64, 128, 64), (2, 1, 1)),
       "f16-64x64x64-c12": sm90_conv(D.float16, (64, 64, 64), (1, 2, 1)),
       "bf16-128x256x64-c11": sm90_conv(D.bfloat16, (128, 256, 64), (1, 1, 1))}


@pytest.fixture(scope="module", autouse=True)
def _compiled():
    precompile_module((), OPS.values())


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
