"""Outputs over inputs on the GPU: D updated in place over C is computed correctly (first call and the fast path
for calls seen before), an output beside its input in one buffer (interleaved column blocks) is computed correctly,
and an output over an input is refused, also when the call's signature was seen before (the fast path hands it to
the full check). float64 references; outputs that are not C are poisoned with NaN."""
from __future__ import annotations

import pytest

import pycutlass as cutlass
from pycutlass import ArgumentError
from pycutlass.conv import Conv2dProblemSize, IteratorAlgorithm, Mode as ConvMode, Operator, StrideSupport
from pycutlass.kinds.conv2d.operation import Conv2dOperation

from .conftest import precompile_module, relative_error
from .gemm_cases import make_op
from .test_gemm_sm90 import sm90_op

pytestmark = pytest.mark.gpu
torch = pytest.importorskip("torch")

D = cutlass.DataType
TOLERANCE = 2e-3  # float16 outputs, float32 accumulation


def _conv_op():
    mi = cutlass.MathInstruction([16, 8, 16], D.float16, D.float16, D.float32, cutlass.OpClass.TensorOp)
    tile = cutlass.TileDescription([128, 128, 32], 3, [2, 2, 1], mi)
    nhwc = cutlass.TensorDescription(D.float16, cutlass.TensorNHWC, 8)
    return Conv2dOperation(Operator.fprop, IteratorAlgorithm.optimized, 80, tile, nhwc, nhwc, nhwc,
                           StrideSupport.Strided, cutlass.LinearCombination(D.float16, 8, D.float32, D.float32))


def _grouped_op():
    mi = cutlass.MathInstruction([16, 8, 16], D.float16, D.float16, D.float32, cutlass.OpClass.TensorOp)
    tile = cutlass.TileDescription([64, 128, 32], 4, [2, 2, 1], mi)
    return cutlass.GemmOperationGrouped(
        80, tile, cutlass.TensorDescription(D.float16, cutlass.RowMajor, 8),
        cutlass.TensorDescription(D.float16, cutlass.ColumnMajor, 8),
        cutlass.TensorDescription(D.float16, cutlass.RowMajor, 8),
        cutlass.LinearCombination(D.float16, 8, D.float32, D.float32), precompute_mode=cutlass.SchedulerMode.Device)


GEMMS = {"sm80": make_op("f16"), "sm90": sm90_op(D.float16)}
CONV = _conv_op()
GROUPED = _grouped_op()
OPS = [*GEMMS.values(), CONV, GROUPED]


@pytest.fixture(scope="module", autouse=True)
def _compiled():
    precompile_module([], OPS)
    cutlass.compiler.nvrtc()
    yield
    cutlass.compiler.nvcc()


def _random(*shape, generator):
    return (torch.rand(*shape, generator=generator, dtype=torch.float64) * 2 - 1).to(torch.float16).cuda()


def _gemm_reference(a, b, c, alpha, beta):
    return alpha * (a.double() @ b.double()) + beta * c.double()


@pytest.mark.parametrize("family", list(GEMMS))
def test_gemm_updates_c_in_place_first_call_and_fast_path(family):
    op = GEMMS[family]
    generator = torch.Generator().manual_seed(11)
    m, n, k = 264, 136, 200
    for _ in range(3):  # the first call validates in full; the others take the fast path with new tensors
        a = _random(m, k, generator=generator)
        b = _random(n, k, generator=generator).t()  # column-major B
        c = _random(m, n, generator=generator)
        reference = _gemm_reference(a, b, c, 0.75, -1.25).cpu().numpy()
        arguments = cutlass.GemmArguments(op, [m, n, k], a, b, c, c, output_op=op.epilogue_type(0.75, -1.25))
        op.run(arguments)
        arguments.sync()
        assert relative_error(c.cpu().numpy(), reference) < TOLERANCE


@pytest.mark.parametrize("family", list(GEMMS))
def test_an_output_beside_its_input_in_one_buffer_runs_and_one_over_it_is_refused(family):
    op = GEMMS[family]
    generator = torch.Generator().manual_seed(12)
    m, n, k = 192, 128, 256
    b = _random(n, k, generator=generator).t()
    for _ in range(2):  # full path, then the same signature again: interleaved views still run
        buffer = _random(m, k + n, generator=generator)
        buffer[:, k:] = float("nan")
        a, d = buffer[:, :k], buffer[:, k:]
        reference = (a.double() @ b.double()).cpu().numpy()
        arguments = cutlass.GemmArguments(op, [m, n, k], a, b, None, d, output_op=op.epilogue_type(1.0, 0.0))
        op.run(arguments)
        arguments.sync()
        assert relative_error(d.cpu().numpy(), reference) < TOLERANCE
        assert relative_error(buffer[:, :k].cpu().numpy(), a.cpu().numpy()) == 0  # A untouched
    buffer = _random(m, k + n, generator=generator)
    before = buffer.clone()
    over = buffer[:, k - 64:k - 64 + n]  # the seen signature, 64 columns over A
    with pytest.raises(ArgumentError, match="D shares memory with A"):
        cutlass.GemmArguments(op, [m, n, k], buffer[:, :k], b, None, over, output_op=op.epilogue_type(1.0, 0.0))
    torch.cuda.synchronize()
    assert torch.equal(buffer, before)  # nothing ran


@pytest.mark.parametrize("family", list(GEMMS))
def test_batches_interleaved_row_by_row_are_written_in_place(family):
    """Attention-style output: a (B, M, N) view of (M, B, N) memory. Its batches interleave row by row without
    sharing an element: D is that view, updated in place (C is D) on the full and the fast path, then poisoned with
    NaN beside a packed C."""
    op = GEMMS[family]
    generator = torch.Generator().manual_seed(15)
    batch, m, n, k = 3, 136, 72, 96
    for in_place in (True, True, False):  # in place: full path, then fast path; then D poisoned, C packed
        a = _random(batch, m, k, generator=generator)
        b = _random(batch, n, k, generator=generator).transpose(1, 2)  # column-major B per batch
        heads = _random(m, batch, n, generator=generator)
        d = heads.transpose(0, 1)  # (B, M, N), strides (N, B * N, 1)
        c = d if in_place else _random(batch, m, n, generator=generator)
        reference = _gemm_reference(a, b, c, 1.5, 0.5).cpu().numpy()
        if not in_place:
            heads.fill_(float("nan"))
        arguments = cutlass.GemmArguments(op, [m, n, k], a, b, c, d, output_op=op.epilogue_type(1.5, 0.5),
                                          gemm_mode=cutlass.gemm.Mode.Batched, batch=batch)
        op.run(arguments)
        arguments.sync()
        assert relative_error(d.cpu().numpy(), reference) < TOLERANCE


def test_conv2d_updates_c_in_place():
    generator = torch.Generator().manual_seed(13)
    ps = Conv2dProblemSize((2, 14, 14, 32), (64, 3, 3, 32), (1, 1, 1, 1), (1, 1), (1, 1),
                           ConvMode.cross_correlation, 1, 1)
    for _ in range(2):
        x = _random(2, 14, 14, 32, generator=generator)
        w = _random(64, 3, 3, 32, generator=generator)
        c = _random(2, 14, 14, 64, generator=generator)
        conv = torch.nn.functional.conv2d(x.double().permute(0, 3, 1, 2), w.double().permute(0, 3, 1, 2), padding=1)
        reference = (0.5 * conv.permute(0, 2, 3, 1) + 2.0 * c.double()).cpu().numpy()
        arguments = cutlass.Conv2dArguments(CONV, ps, x, w, c, c, output_op=CONV.epilogue_type(0.5, 2.0))
        CONV.run(arguments)
        arguments.sync()
        assert relative_error(c.cpu().numpy(), reference) < TOLERANCE
    x = _random(2, 14, 14, 32, generator=generator)
    over = torch.empty(2 * 14 * 14 * 64, dtype=torch.float16, device="cuda")
    with pytest.raises(ArgumentError, match=r"D \(output\) shares memory with A \(activation\)"):
        x_view = over[:2 * 14 * 14 * 32].view(2, 14, 14, 32)
        cutlass.Conv2dArguments(CONV, ps, x_view, w, c, over.view(2, 14, 14, 64),
                                output_op=CONV.epilogue_type(1.0, 0.0))


def test_grouped_gemm_in_place_and_a_group_writing_another_groups_input():
    generator = torch.Generator().manual_seed(14)
    problems = [(96, 64, 128), (40, 128, 64), (128, 64, 32)]
    for _ in range(2):  # full path, then the fast path of a seen group
        As = [_random(m, k, generator=generator) for m, n, k in problems]
        Bs = [_random(n, k, generator=generator).t() for m, n, k in problems]
        Cs = [_random(m, n, generator=generator) for m, n, k in problems]
        references = [_gemm_reference(a, b, c, 1.0, 0.5).cpu().numpy() for a, b, c in zip(As, Bs, Cs)]
        arguments = cutlass.GemmGroupedArguments(GROUPED, [cutlass.gemm.GemmCoord(*p) for p in problems], As, Bs,
                                                 Cs, Cs, output_op=GROUPED.epilogue_type(1.0, 0.5))
        GROUPED.run(arguments)
        arguments.sync()
        for c, reference in zip(Cs, references):
            assert relative_error(c.cpu().numpy(), reference) < TOLERANCE
    # group 1's D over group 0's A, with every tensor of the seen signatures
    a0 = _random(96, 128, generator=generator)
    over = a0.view(-1)[:40 * 128].view(40, 128)
    As = [a0, _random(40, 64, generator=generator), _random(128, 32, generator=generator)]
    Ds = [_random(m, n, generator=generator) for m, n, k in problems]
    Ds[1] = over
    with pytest.raises(ArgumentError, match=r"Ds\[1\] .* shares memory with As\[0\]"):
        cutlass.GemmGroupedArguments(GROUPED, [cutlass.gemm.GemmCoord(*p) for p in problems], As, Bs, Ds, Ds,
                                     output_op=GROUPED.epilogue_type(1.0, 0.5))
