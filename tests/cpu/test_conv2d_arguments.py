"""CPU tests of Conv2dArguments validation with numpy inputs: every error is raised before any GPU work."""
from __future__ import annotations

import numpy as np
import pytest

import pycutlass as pc
from pycutlass.conv import Conv2dProblemSize, IteratorAlgorithm, Mode, Operator, SplitKMode, StrideSupport
from pycutlass.errors import ArgumentError, NoGpuError
from pycutlass.kinds.conv2d.operation import Conv2dOperation
from pycutlass.kinds.conv2d.arguments import Conv2dArguments

F16, F32 = pc.float16, pc.float32


def op(kind=Operator.fprop, out=F16, align_c=8, epilogue=None, interleaved=False, fast_clamp=False):
    if interleaved:
        mi = pc.MathInstruction([16, 8, 32], pc.int8, pc.int8, pc.int32, pc.OpClass.TensorOp,
                                pc.MathOperation.multiply_add_saturate)
        tile = pc.TileDescription([128, 128, 64], 3, [2, 2, 1], mi)
        A = pc.TensorDescription(pc.int8, pc.TensorNC32HW32, 16)
        B = pc.TensorDescription(pc.int8, pc.TensorC32RSK32, 16)
        C = pc.TensorDescription(pc.int8, pc.TensorNC32HW32, 8)
        ep = (pc.FastLinearCombinationClamp(pc.int8, 8) if fast_clamp
              else pc.LinearCombinationClamp(pc.int8, 8, pc.int32, F32))
        return Conv2dOperation(Operator.fprop, IteratorAlgorithm.optimized, 80, tile, A, B, C, StrideSupport.Strided,
                               ep)
    mi = pc.MathInstruction([16, 8, 16], F16, F16, F32, pc.OpClass.TensorOp)
    tile = pc.TileDescription([128, 128, 32], 3, [2, 2, 1], mi)
    A = pc.TensorDescription(F16, pc.TensorNHWC, 8)
    C = pc.TensorDescription(out, pc.TensorNHWC, align_c)
    epilogue = epilogue or pc.LinearCombination(out, align_c, F32, F32)
    stride = StrideSupport.Unity if kind is Operator.dgrad else StrideSupport.Strided
    return Conv2dOperation(kind, IteratorAlgorithm.optimized, 80, tile, A, A, C, stride, epilogue)


def problem(n=2, h=9, w=10, c=16, k=24, r=3, s=3, pad=1, stride=(1, 1), split_k=1):
    return Conv2dProblemSize((n, h, w, c), (k, r, s, c), (pad, pad, pad, pad), stride, (1, 1),
                             Mode.cross_correlation, split_k, 1)


def nhwc(extent, dtype=np.float16):
    return np.ones(tuple(extent), dtype)


def fprop_tensors(ps, dtype=np.float16, out=np.float16):
    return (nhwc(ps.activation_extent(), dtype), nhwc(ps.filter_extent(), dtype), nhwc(ps.output_extent(), out),
            np.zeros(tuple(ps.output_extent()), out))


class FakeDeviceArray:
    """A device tensor as __cuda_array_interface__ describes it: shape and strides, no memory (never touched)."""

    def __init__(self, shape, strides=None, typestr="<f2", itemsize=2):
        self.__cuda_array_interface__ = {
            "shape": tuple(shape), "typestr": typestr, "data": (0x10000, False), "version": 3,
            "strides": None if strides is None else tuple(s * itemsize for s in strides)}


def channels_last(n, c, h, w):
    """A torch-style NCHW tensor in channels_last memory: NHWC strides, NCHW shape."""
    return FakeDeviceArray((n, c, h, w), (h * w * c, 1, w * c, c))


@pytest.fixture
def no_device(monkeypatch):
    """Stop at the first device step, recording that validation got there."""
    reached = []
    monkeypatch.setattr(Conv2dArguments, "_materialize", lambda self: reached.append(self))
    return reached


def test_valid_fprop_dgrad_wgrad(no_device):
    ps = problem()
    f = op()
    args = Conv2dArguments(f, ps, *fprop_tensors(ps), output_op=f.epilogue_type(1.0, 0.5))
    assert no_device == [args] and args.output_op.beta == 0.5 and args._operands["C"][1] is None
    assert args.split_k_slices == 1 and args.split_k_mode is SplitKMode.Serial
    # dgrad: A = dy (NPQK), B = filter (KRSC), C/D = dx (NHWC)
    d = op(Operator.dgrad)
    Conv2dArguments(d, ps, nhwc(ps.output_extent()), nhwc(ps.filter_extent()), None,
                    np.zeros(tuple(ps.activation_extent()), np.float16))
    # wgrad: A = dy (NPQK), B = x (NHWC), C/D = dw (KRSC)
    wg = op(Operator.wgrad)
    Conv2dArguments(wg, ps, nhwc(ps.output_extent()), nhwc(ps.activation_extent()), nhwc(ps.filter_extent()),
                    np.zeros(tuple(ps.filter_extent()), np.float16), output_op=wg.epilogue_type(1.0, 1.0))
    assert len(no_device) == 3


def test_accepted_tensor_forms(no_device):
    ps = problem()
    f = op()
    x, w, c, d = fprop_tensors(ps)
    # PyCUTLASS style: packed 1-D tensors.
    Conv2dArguments(f, ps, x.reshape(-1), w.reshape(-1), c.reshape(-1), d.reshape(-1))
    # NCHW-shaped views of NHWC memory (what torch's channels_last tensors look like), as device arrays.
    args = Conv2dArguments(f, ps, channels_last(2, 16, 9, 10), channels_last(24, 16, 3, 3),
                           channels_last(2, 24, 9, 10), channels_last(2, 24, 9, 10))
    assert args._operands["A"][0].shape == (2, 16, 9, 10) and args._operands["C"][1] is None
    # Bias vector as C: 1-D of K, or a zero-stride 4-D view (torch: bias.view(1, K, 1, 1).expand(N, K, P, Q)).
    bias = np.ones(ps.K, np.float16)
    args = Conv2dArguments(f, ps, x, w, bias, d, output_op=f.epilogue_type(1.0, 1.0))
    assert args._operands["C"][1] == (0, 0, 0)
    for expanded in (FakeDeviceArray((2, 24, 9, 10), (0, 1, 0, 0)), FakeDeviceArray((2, 9, 10, 24), (0, 0, 0, 1))):
        args = Conv2dArguments(f, ps, x, w, expanded, d, output_op=f.epilogue_type(1.0, 1.0))
        assert args._operands["C"][1] == (0, 0, 0)
    # Size-1 dimensions may have any stride.
    ps1 = problem(n=1, h=3, w=3, r=3, s=3, pad=0)  # P = Q = 1
    x1, w1, c1, d1 = fprop_tensors(ps1)
    Conv2dArguments(f, ps1, x1, w1, c1, np.zeros((1, 24, 1, 1), np.float16))
    assert len(no_device) == 6


@pytest.mark.parametrize("mutate,message", [
    (lambda t: dict(t, A=t["A"].astype(np.float32)), r"A \(activation\): the operation expects float16 elements"),
    (lambda t: dict(t, D=t["D"].astype(np.float32)), r"D \(output\): the operation expects float16 elements"),
    (lambda t: dict(t, A=np.ones((2, 9, 10, 8), np.float16)), r"A \(activation\): expected shape \(2, 9, 10, 16\)"),
    (lambda t: dict(t, B=np.ones((24, 3, 3, 8), np.float16)), r"B \(filter\): expected shape \(24, 3, 3, 16\)"),
    (lambda t: dict(t, D=np.zeros((2, 9, 9, 24), np.float16)), r"D \(output\): expected shape \(2, 9, 10, 24\)"),
    (lambda t: dict(t, A=np.ones((2, 9, 10, 16, 1), np.float16)), "expected a 4-D tensor"),
    (lambda t: dict(t, A=np.ones(100, np.float16)), r"a 1-D operand must hold 2880 contiguous elements"),
    (lambda t: dict(t, C=np.ones(23, np.float16)), r"or a bias vector of 24"),
    (lambda t: dict(t, A=np.asfortranarray(t["A"])), r"the kernel reads packed NHWC tensors"),
    (lambda t: dict(t, D=FakeDeviceArray((2, 9, 10, 24), (0, 0, 0, 1))),
     r"D \(output\): the kernel reads packed NHWC tensors: expected NHWC strides"),
    (lambda t: dict(t, C=FakeDeviceArray((2, 9, 10, 24), (0, 0, 24, 1))),
     r"C \(output\): the kernel reads packed NHWC tensors or a bias broadcast"),
    (lambda t: dict(t, A=FakeDeviceArray((2, 16, 9, 10))), r"the kernel reads packed NHWC tensors"),  # NCHW
    (lambda t: dict(t, A=FakeDeviceArray((2, 9, 10, 16), (2880, 320, 32, 2))), "expected NHWC strides"),
    (lambda t: dict(t, A=np.ones((2, 16, 9, 10), np.float16)), r"the kernel reads packed NHWC tensors"),  # NCHW
    (lambda t: dict(t, A=np.ones((2, 9, 10, 32), np.float16)[..., ::2]), "host arrays must be"),
    (lambda t: dict(t, A=None), r"A \(activation\): a tensor is required"),
    (lambda t: dict(t, D=[1, 2]), "expected a torch tensor, numpy array"),
])
def test_tensor_rejections(no_device, mutate, message):
    ps = problem()
    x, w, c, d = fprop_tensors(ps)
    t = mutate(dict(A=x, B=w, C=c, D=d))
    with pytest.raises(ArgumentError, match=message):
        Conv2dArguments(op(), ps, t["A"], t["B"], t["C"], t["D"], output_op=op().epilogue_type(1.0, 1.0))
    assert no_device == []


def test_problem_constraints_are_checked_before_the_tensors(no_device):
    ps = problem(c=12)  # C % 8
    x, w, c, d = fprop_tensors(ps)
    with pytest.raises(ArgumentError, match=r"channel alignment: A \(activation\)"):
        Conv2dArguments(op(), ps, x, w, c, d)
    with pytest.raises(ArgumentError, match=r"Unity dgrad needs stride \(1, 1\)"):
        psd = problem(stride=(2, 2))
        Conv2dArguments(op(Operator.dgrad), psd, nhwc(psd.output_extent()), nhwc(psd.filter_extent()), None,
                        np.zeros(tuple(psd.activation_extent()), np.float16))
    with pytest.raises(ArgumentError, match="problem_size must be a pycutlass.conv.Conv2dProblemSize"):
        Conv2dArguments(op(), (1, 2, 3), x, w, c, d)
    with pytest.raises(ArgumentError, match="needs a Conv2dOperation"):
        Conv2dArguments(object(), problem(), x, w, c, d)
    assert no_device == []


def test_modes_and_split_k(no_device):
    ps = problem(c=64)
    f = op()
    x, w, c, d = fprop_tensors(ps)
    with pytest.raises(ArgumentError, match="C is None but beta is 0.5"):
        Conv2dArguments(f, ps, x, w, None, d, output_op=f.epilogue_type(1.0, 0.5))
    with pytest.raises(ArgumentError, match="split_k_mode must be"):
        Conv2dArguments(f, ps, x, w, c, d, split_k_mode=7)
    with pytest.raises(ArgumentError, match="split_k_slices must be a positive integer"):
        Conv2dArguments(f, ps, x, w, c, d, split_k_slices=0)
    with pytest.raises(ArgumentError, match="disagrees with the problem size's split_k_slices=2"):
        Conv2dArguments(f, ps.reset_split_k_slices(2), x, w, c, d, split_k_slices=3)
    serial = Conv2dArguments(f, ps, x, w, c, d, split_k_slices=3)  # the argument sets the problem's slices
    assert serial.problem_size.split_k_slices == serial.split_k_slices == 3 and not serial.parallel
    same = Conv2dArguments(f, ps.reset_split_k_slices(2), x, w, c, d)  # or the problem size carries them
    assert same.split_k_slices == 2
    # Parallel: raw partial sums, alpha/beta belong to the reduction; C and D may be left out.
    parallel = Conv2dArguments(f, ps, x, w, None, None, f.epilogue_type(2.0, 1.0), SplitKMode.Parallel, 4)
    assert parallel.parallel and (parallel.output_op.alpha, parallel.output_op.beta) == (1.0, 0.0)
    assert parallel.reduction_problem_size == (2 * 9 * 10, 24)
    with pytest.raises(ArgumentError, match="SplitKMode.Parallel writes raw partial sums"):
        g = op(epilogue=pc.LinearCombinationGeneric(pc.relu(F32), F16, 8, F32, F32))
        Conv2dArguments(g, ps, x, w, None, None, None, SplitKMode.Parallel, 2)
    # Parallel with one slice still writes raw partials to the workspace (as GemmSplitKParallel and PyCUTLASS do):
    # PyCUTLASS's conv testbed reduces one slice with a ReductionOperation.
    single = Conv2dArguments(f, ps, x, w, c, d, f.epilogue_type(2.0, 1.0), SplitKMode.Parallel, 1)
    assert single.parallel and (single.output_op.alpha, single.output_op.beta) == (1.0, 0.0)


def test_split_k_with_an_int8_output_is_refused(no_device):
    """Serial split-K rounds and clamps every slice's partial result in an int8 D; parallel stores them in int8."""
    ps = problem(c=32, k=64)
    i = op(interleaved=True)
    with pytest.raises(ArgumentError, match=r"^serial split-K \(split_k_slices=2\) stores each K slice's partial"):
        Conv2dArguments(i, ps, None, None, None, None, split_k_slices=2)
    with pytest.raises(ArgumentError, match=r"^parallel split-K writes its partial sums in the operation's int8"):
        Conv2dArguments(i, ps, None, None, None, None, None, SplitKMode.Parallel, 2)


def test_output_op_forms(no_device):
    ps = problem()
    g = op(epilogue=pc.LinearCombinationGeneric(pc.leaky_relu(F32), F16, 8, F32, F32))
    x, w, c, d = fprop_tensors(ps)
    args = Conv2dArguments(g, ps, x, w, c, d, [1.0, 0.0, 0.1])
    assert args.output_op.activation_args == (0.1,)
    with pytest.raises(ArgumentError, match="activation argument"):
        Conv2dArguments(g, ps, x, w, c, d, [1.0, 0.0])


def test_interleaved_operands(no_device):
    ps = problem(c=32, k=64)
    i = op(interleaved=True)
    a = np.ones((2, 1, 9, 10, 32), np.int8)  # NC32HW32: (N, C/32, H, W, 32)
    b = np.ones((1, 3, 3, 64, 32), np.int8)  # C32RSK32: (C/32, R, S, K, 32)
    dd = np.zeros((2, 2, 9, 10, 32), np.int8)
    Conv2dArguments(i, ps, a, b, None, dd)
    Conv2dArguments(i, ps, a.reshape(-1), b.reshape(-1), dd, dd, i.epilogue_type(1.0, 1.0))
    with pytest.raises(ArgumentError, match=r"interleaved TensorC32RSK32 operand must be a contiguous tensor of "
                                            r"18432 elements"):
        Conv2dArguments(i, ps, a, np.ones((1, 3, 3, 64, 16), np.int8), None, dd)
    with pytest.raises(ArgumentError, match=r"interleaved TensorNC32HW32 operand must be a contiguous tensor"):
        Conv2dArguments(i, ps, FakeDeviceArray((2, 1, 9, 10, 32), (2880, 2880, 320, 1, 10), "|i1", 1), b, None, dd)
    with pytest.raises(ArgumentError, match="exact only for an implicit GEMM K <= 256"):
        Conv2dArguments(op(interleaved=True, fast_clamp=True), ps, a, b, None, dd)
    small = problem(c=32, k=64, r=1, s=1, pad=0)
    Conv2dArguments(op(interleaved=True, fast_clamp=True), small, a, np.ones(2048, np.int8), None, dd)


def test_validation_passes_then_needs_a_gpu():
    """Without the monkeypatch, valid arguments get as far as the device (no GPU on CPU machines)."""
    from pycutlass.compiler.target import detected_compute_capability

    if detected_compute_capability() is not None:
        pytest.skip("a GPU is present")
    ps = problem()
    with pytest.raises(NoGpuError):
        Conv2dArguments(op(), ps, *fprop_tensors(ps))


def strided_dgrad_example_op():
    """PyCUTLASS 2.11's example: tf32 dgrad, optimized, StrideSupport.Strided, 128x128x16, 3 stages, alignment 4."""
    mi = pc.MathInstruction([16, 8, 8], pc.tfloat32, pc.tfloat32, F32, pc.OpClass.TensorOp)
    tile = pc.TileDescription([128, 128, 16], 3, [2, 2, 1], mi)
    t = pc.TensorDescription(F32, pc.TensorNHWC, 4)
    return Conv2dOperation(Operator.dgrad, IteratorAlgorithm.optimized, 80, tile, t, t, t, StrideSupport.Strided,
                           pc.LinearCombination(F32, 4, F32, F32), pc.StridedDgradIdentitySwizzle1)


def test_strided_dgrad_serial_split_k(no_device):
    """Serial split-K with stride > 1 (PyCUTLASS 2.11's example: stride (2, 1), 2 slices) is accepted, with one
    semaphore per output tile; parallel split-K stays refused."""
    dgrad = strided_dgrad_example_op()
    ps = Conv2dProblemSize((1, 27, 27, 256), (512, 3, 3, 256), (1, 1, 1, 1), (2, 1), (1, 1),
                           Mode.cross_correlation, 1, 1)
    dy, w = nhwc(ps.output_extent(), np.float32), nhwc(ps.filter_extent(), np.float32)
    dx = np.zeros(tuple(ps.activation_extent()), np.float32)
    args = Conv2dArguments(dgrad, ps, dy, w, None, dx, dgrad.epilogue_type(1.0, 0.0), SplitKMode.Serial, 2)
    assert no_device == [args] and args.split_k_slices == 2 and not args.parallel
    # M tiles: ceil(1 * 14 * 27 / 128) = 3 per start filter position, times 2 x 1 positions; N: 256 / 128.
    assert dgrad.tiled_shape(args.problem_size) == (6, 2, 2)
    assert dgrad.semaphore_count(args.problem_size, SplitKMode.Serial) == 12
    for split, stride in ((3, (3, 3)), (2, (2, 2))):
        odd = Conv2dProblemSize((2, 11, 13, 12), (20, 3, 3, 12), (1, 1, 1, 1), stride, (1, 1),
                                Mode.cross_correlation, split, 1)
        Conv2dArguments(dgrad, odd, nhwc(odd.output_extent(), np.float32), nhwc(odd.filter_extent(), np.float32),
                        None, np.zeros(tuple(odd.activation_extent()), np.float32))
    with pytest.raises(ArgumentError, match="does not implement SplitKMode.Parallel"):
        Conv2dArguments(dgrad, ps, dy, w, None, dx, dgrad.epilogue_type(1.0, 0.0), SplitKMode.Parallel, 2)


@pytest.mark.slow
def test_strided_dgrad_example_compiles_with_nvrtc():
    """Split-K is a run-time value of the same kernel: the example's operation emits and compiles unchanged."""
    pytest.importorskip("cuda.bindings.nvrtc")
    from pycutlass.compiler.backends import NvrtcBackend

    dgrad = strided_dgrad_example_op()
    source = dgrad.emit()
    assert "DefaultConv2dDgrad" in source and "StrideSupport::kStrided" in source
    assert "StridedDgradIdentityThreadblockSwizzle<1>" in source
    cubin = NvrtcBackend().compile(source, 90, "strided_dgrad_example")
    assert cubin[:4] == b"\x7fELF" and dgrad.builder_symbol.encode() in cubin
