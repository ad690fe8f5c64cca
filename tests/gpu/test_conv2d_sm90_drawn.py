"""SM90 convolutions drawn at random from what the descriptions accept (seeded, so every run draws the same ones):
fprop, dgrad and wgrad over operand types, tiles, clusters, activations, the fused bias, float32 wgrad outputs; each
on problems drawn from what the arguments accept (odd channel counts, filters, asymmetric padding, strides,
dilations), and float32 wgrads also split K in parallel by images or rows. Every result against float64, outputs
poisoned with NaN. An accepted description or problem that does not compile or computes wrongly fails."""
from __future__ import annotations

import random

import numpy as np
import pytest

import pycutlass as cutlass
from pycutlass import ArgumentError
from pycutlass import conv as pconv

from .conftest import draw_accepted, precompile_module, relative_error
from .gemm_cases import epilogue_reference
from .test_conv2d_sm90 import REDUCTIONS, TOLERANCE, TORCH, _gradients, _padded_fprop

try:
    import torch
except ImportError:  # CPU machines collect (and skip) this module; DRAWN stays importable for precompiling
    torch = None
pytestmark = [pytest.mark.gpu, pytest.mark.skipif(torch is None, reason="needs torch")]

D = cutlass.DataType
NHWC = cutlass.LayoutType.TensorNHWC
KINDS = (pconv.Operator.fprop, pconv.Operator.dgrad, pconv.Operator.wgrad)
ACTIVATIONS = (None, "relu", "leaky_relu", "gelu", "silu", "sigmoid", "tanh", "hardswish")
CLUSTERS = ((1, 1, 1), (2, 1, 1), (1, 2, 1))
CHANNELS = (8, 16, 24, 40, 64, 72, 136)


def _drawn_op(rng: random.Random, staged: bool = False):
    kind = rng.choice(KINDS)
    element = rng.choice((D.float16, D.bfloat16))
    tile = (rng.choice((64, 128)), rng.choice((64, 128, 256)), 64)
    math = cutlass.MathInstruction([64, tile[1], 16], element, element, D.float32, cutlass.OpClass.TensorOp)
    # staged: an explicit stage count (two CTAs per SM where it fits), else CUTLASS's automatic one
    stages = rng.randint(2, 8) if staged else 0
    tile_d = cutlass.TileDescription(list(tile), stages, None, math, cluster_shape=list(rng.choice(CLUSTERS)))
    operand = cutlass.TensorDescription(element, NHWC, 8)
    out = rng.choice((element, D.float32)) if kind is pconv.Operator.wgrad else element
    output = cutlass.TensorDescription(out, NHWC, 128 // out.bits)
    activation = None if kind is pconv.Operator.wgrad else rng.choice(ACTIVATIONS)
    if activation is None:
        functor = cutlass.LinearCombination(out, output.alignment, D.float32, D.float32)
    else:
        functor = cutlass.LinearCombinationGeneric(getattr(cutlass, activation)(D.float32), out, output.alignment,
                                                   D.float32, D.float32)
    bias = kind is not pconv.Operator.wgrad and rng.random() < 0.3
    support = pconv.StrideSupport.Unity if kind is pconv.Operator.dgrad else pconv.StrideSupport.Strided
    return cutlass.Conv2dOperation(kind, pconv.IteratorAlgorithm.optimized, 90, tile_d, operand, operand, output,
                                   support, functor, cutlass.IdentitySwizzle1, bias=bias)


DRAWN = {**draw_accepted(random.Random(90_2), _drawn_op, 12),
         **draw_accepted(random.Random(90_3), lambda rng: _drawn_op(rng, staged=True), 6)}


@pytest.fixture(scope="module", autouse=True)
def compiled(memory_pool):
    precompile_module(list(REDUCTIONS.values()), DRAWN.values())
    yield


def _draw_problem(rng: random.Random, op):
    """A problem the operation accepts: (shape tuple as test_conv2d_sm90 spells it, Conv2dProblemSize)."""
    dgrad = op.conv_kind is pconv.Operator.dgrad
    for _ in range(200):
        n, h, w = rng.randint(1, 5), rng.randint(3, 26), rng.randint(3, 26)
        c, k = rng.choice(CHANNELS), rng.choice(CHANNELS)
        r, s = rng.randint(1, 5), rng.randint(1, 5)
        pad = tuple(rng.randint(0, 2) for _ in range(4))
        stride = (1, 1) if dgrad else (rng.randint(1, 3), rng.randint(1, 3))
        dilation = (rng.randint(1, 2), rng.randint(1, 2))
        try:
            ps = pconv.Conv2dProblemSize((n, h, w, c), (k, r, s, c), pad, stride, dilation,
                                         pconv.Mode.cross_correlation, 1, 1)
            op.check_problem_size(ps)
        except ArgumentError:
            continue
        return (n, h, w, c, k, r, s, pad, stride, dilation), ps
    raise AssertionError(f"no problem drawn for {op.name}")


def test_the_draw_found_every_kind():
    assert len(DRAWN) == 18
    assert sum(op.tile_description.stages > 0 for op in DRAWN.values()) == 6
    assert {op.conv_kind for op in DRAWN.values()} == set(KINDS)


def _activation_args(op):
    return (0.2,) if op.epilogue_functor.num_activation_args else ()


@pytest.mark.parametrize("name", list(DRAWN))
def test_drawn_convolutions_against_float64(name):
    op = DRAWN[name]
    rng = random.Random(name)
    element = op.A.element
    dtype = getattr(torch, TORCH[element])
    out_dtype = torch.float32 if op.C.element is D.float32 else dtype
    tolerance = 1e-4 if op.C.element is D.float32 else TOLERANCE[element]
    for _ in range(2):
        shape, ps = _draw_problem(rng, op)
        n, h, w, c, k, r, s, pad, stride, dilation = shape
        gen = torch.Generator(device="cuda").manual_seed(rng.randrange(2**31))
        x = torch.randn(n, h, w, c, device="cuda", generator=gen).to(dtype)
        wt = torch.randn(k, r, s, c, device="cuda", generator=gen).to(dtype)
        dy = torch.randn(n, ps.P, ps.Q, k, device="cuda", generator=gen).to(dtype)
        kind = op.conv_kind
        if kind is pconv.Operator.fprop:
            inputs, raw = (x, wt), _padded_fprop(x.double(), wt.double(), pad, stride, dilation).permute(0, 2, 3, 1)
        elif kind is pconv.Operator.dgrad:
            inputs, raw = (dy, wt), _gradients(x, wt, dy, pad, stride, dilation)[0]
        else:
            inputs, raw = (dy, x), _gradients(x, wt, dy, pad, stride, dilation)[1]
        out_shape, channels = tuple(raw.shape), raw.shape[-1]
        alpha, args = rng.choice((1.0, 0.75, -1.5)), _activation_args(op)
        if op.bias:
            bias = torch.randn(channels, device="cuda", generator=gen).to(out_dtype)
            c_tensor, beta, c_added = bias, 1.0, np.broadcast_to(bias.double().cpu().numpy(), out_shape)
        else:
            beta = rng.choice((0.0, 0.5))
            c_tensor = torch.randn(out_shape, device="cuda", generator=gen).to(out_dtype) if beta else None
            c_added = None if c_tensor is None else c_tensor.double().cpu().numpy()
        out = torch.full(out_shape, float("nan"), device="cuda", dtype=out_dtype)
        arguments = cutlass.Conv2dArguments(op, ps, *inputs, c_tensor, out,
                                            output_op=op.epilogue_type(alpha, beta, *args))
        op.run(arguments)
        arguments.sync()
        reference = epilogue_reference(op, raw.cpu().numpy(), c_added, alpha, beta, args)
        error = relative_error(out.float().cpu().numpy(), reference)
        assert error < tolerance, (name, shape, alpha, beta, error)
        if kind is pconv.Operator.wgrad and op.C.element is D.float32:
            _check_split(op, ps, shape, inputs, raw, rng)


def _check_split(op, ps, shape, inputs, raw, rng):
    """The same wgrad split in parallel (a drawn count of image or row runs), reduced into the operands' type."""
    element = op.A.element
    allowed = list(range(1, ps.N + 1)) + [ps.N * f for f in range(2, ps.P + 1)]
    slices = rng.choice(allowed)
    try:
        arguments = cutlass.Conv2dArguments(op, ps, *inputs, None, None, split_k_mode=pconv.SplitKMode.Parallel,
                                            split_k_slices=slices)
    except ArgumentError as error:
        assert "read only padding" in str(error), error  # a run of rows inside the padding: refused, with the reason
        return
    reduction = REDUCTIONS[element]
    m, n = arguments.reduction_problem_size
    dw = torch.full(tuple(raw.shape), float("nan"), device="cuda", dtype=getattr(torch, TORCH[element]))
    cc = torch.randn(tuple(raw.shape), device="cuda").to(dw.dtype)
    reduce = cutlass.ReductionArguments(reduction, [m, n], slices, arguments, dw.view(m, n), cc.view(m, n),
                                        reduction.epilogue_type(1.25, -0.5), partition_stride=arguments.partition_stride)
    op.run(arguments)
    reduction.run(reduce)
    reduce.sync()
    reference = 1.25 * raw.cpu().numpy() - 0.5 * cc.double().cpu().numpy()
    error = relative_error(dw.float().cpu().numpy(), reference)
    assert error < TOLERANCE[element], (op.name, shape, slices, error)
