"""CPU tests of PyCUTLASS 2.11's Arguments semantics: ``bias=``, PyCUTLASS's positional mode, raw
``CUdeviceptr`` operands, packed 1-D grouped operands, interleaved operands reordered inside the Arguments, the
fast path's keys for the new keywords, a TensorNHWC reduction and ``operation.rt_module.emit()``.

Every Arguments object stops at its first device step (``_materialize`` is replaced by a recorder), so these check
what the Arguments bind without a GPU; tests/gpu/test_pycutlass_args_compat.py checks the results.
"""
from __future__ import annotations

import numpy as np
import pytest

import pycutlass as pc
from pycutlass import (ArgumentError, Conv2dArguments, GemmArguments, GemmGroupedArguments, GemmOperationGrouped,
                       ReductionArguments, ReductionOperation)
from pycutlass.conv import (Conv2dProblemSize, IteratorAlgorithm, Operator, SplitKMode, StrideSupport,
                            reorder_interleaved_filter)
from pycutlass.conv import Mode as ConvMode
from pycutlass.gemm import GemmCoord, Mode, reorder_interleaved_b
from pycutlass.kinds.conv2d.arguments import _memo_key as conv_memo_key
from pycutlass.kinds.gemm.arguments import _memo_key as gemm_memo_key
from pycutlass.runtime.arguments import OperationArguments
from pycutlass.runtime.tensors import DevicePointerTensor

F16, F32, S8, S32 = pc.float16, pc.float32, pc.int8, pc.int32
M, N, K = 64, 32, 128


@pytest.fixture(autouse=True)
def no_device(monkeypatch):
    reached = []
    monkeypatch.setattr(OperationArguments, "_materialize", lambda self: reached.append(self))
    return reached


def td(element, layout, alignment):
    return pc.TensorDescription(element, layout, alignment)


def f16_gemm(layout_c=pc.RowMajor):
    math = pc.MathInstruction([16, 8, 16], F16, F16, F32, pc.OpClass.TensorOp)
    tile = pc.TileDescription([128, 128, 32], 3, [2, 2, 1], math)
    return pc.GemmOperationUniversal(80, tile, td(F16, pc.RowMajor, 8), td(F16, pc.ColumnMajor, 8),
                                     td(F16, layout_c, 8), pc.LinearCombination(F16, 8, F32, F32))


def interleaved_gemm():
    math = pc.MathInstruction([16, 8, 32], S8, S8, S32, pc.OpClass.TensorOp, pc.MathOperation.multiply_add_saturate)
    tile = pc.TileDescription([128, 128, 64], 3, [2, 2, 1], math)
    return pc.GemmOperationUniversal(80, tile, td(S8, pc.ColumnMajorInterleaved32, 16),
                                     td(S8, pc.RowMajorInterleaved32, 16), td(S8, pc.ColumnMajorInterleaved32, 8),
                                     pc.LinearCombinationClamp(S8, 8, S32, F32))


def f16_conv(kind=Operator.fprop):
    mi = pc.MathInstruction([16, 8, 16], F16, F16, F32, pc.OpClass.TensorOp)
    tile = pc.TileDescription([128, 128, 32], 3, [2, 2, 1], mi)
    A = td(F16, pc.TensorNHWC, 8)
    return pc.Conv2dOperation(kind, IteratorAlgorithm.optimized, 80, tile, A, A, A, StrideSupport.Strided,
                              pc.LinearCombination(F16, 8, F32, F32))


def interleaved_conv():
    mi = pc.MathInstruction([16, 8, 32], S8, S8, S32, pc.OpClass.TensorOp, pc.MathOperation.multiply_add_saturate)
    tile = pc.TileDescription([128, 128, 64], 3, [2, 2, 1], mi)
    return pc.Conv2dOperation(Operator.fprop, IteratorAlgorithm.optimized, 80, tile, td(S8, pc.TensorNC32HW32, 16),
                              td(S8, pc.TensorC32RSK32, 16), td(S8, pc.TensorNC32HW32, 8), StrideSupport.Strided,
                              pc.LinearCombinationClamp(S8, 8, S32, F32))


def conv_problem(n=2, h=8, w=8, c=32, k=64, r=3, s=3, split_k=1):
    return Conv2dProblemSize((n, h, w, c), (k, r, s, c), (1, 1, 1, 1), (1, 1), (1, 1), ConvMode.cross_correlation,
                             split_k, 1)


def gemm_tensors(m=M, n=N, k=K):
    return (np.ones(m * k, np.float16), np.ones(k * n, np.float16), np.ones(m * n, np.float16),
            np.zeros(m * n, np.float16))


def conv_tensors(ps):
    return (np.ones(ps.tensor_a_size(Operator.fprop), np.float16), np.ones(ps.tensor_b_size(Operator.fprop),
                                                                         np.float16),
            np.ones(ps.tensor_c_size(Operator.fprop), np.float16), np.zeros(ps.tensor_c_size(Operator.fprop),
                                                                            np.float16))


class FakeDeviceArray:
    """Device memory as __cuda_array_interface__ describes it (never touched)."""

    def __init__(self, shape, strides, typestr="<f2", itemsize=2):
        self.__cuda_array_interface__ = {"shape": tuple(shape), "typestr": typestr, "data": (0x10000, False),
                                         "version": 3, "strides": tuple(x * itemsize for x in strides)}


# --- 1. bias ----------------------------------------------------------------------------------------------------------
def test_gemm_bias_keyword_maps_onto_a_zero_stride_c():
    op = f16_gemm()
    A, B, _, D = gemm_tensors()
    for C in (np.ones(N, np.float16), np.ones((1, N), np.float16), np.ones((N, 1), np.float16)):
        args = GemmArguments(op, GemmCoord(M, N, K), A, B, C, D, output_op=op.epilogue_type(1.0, 1.0), bias=True)
        form, info, geometry = args._operands["C"]
        assert args.bias is True and geometry.broadcast and geometry.ld == 0 and geometry.batch_stride == 0


def test_gemm_bias_auto_detected_as_pycutlass_did():
    op = f16_gemm()
    A, B, C, D = gemm_tensors()
    assert GemmArguments(op, GemmCoord(M, N, K), A, B, C, D).bias is False
    args = GemmArguments(op, GemmCoord(M, N, K), A, B, np.ones(N, np.float16), D)
    assert args.bias is True and args._operands["C"][2].ld == 0
    # M == 1: N elements are the whole C (PyCUTLASS: "and M != 1")
    args = GemmArguments(op, GemmCoord(1, N, K), np.ones(K, np.float16), B, np.ones(N, np.float16),
                         np.zeros(N, np.float16))
    assert args.bias is False


def test_gemm_bias_column_major_c_is_one_value_per_row():
    op = f16_gemm(pc.ColumnMajor)
    A, B, _, D = gemm_tensors()
    args = GemmArguments(op, GemmCoord(M, N, K), A, B, np.ones(M, np.float16), D, bias=True)
    assert args.bias and args._operands["C"][2].ld == 0
    with pytest.raises(ArgumentError, match=r"bias=True says C is a bias vector of 64 elements \(one per row"):
        GemmArguments(op, GemmCoord(M, N, K), A, B, np.ones(N, np.float16), D, bias=True)


def test_gemm_bias_contradictions():
    op = f16_gemm()
    A, B, C, D = gemm_tensors()
    with pytest.raises(ArgumentError, match=r"bias=True says C is a bias vector of 32 elements .* holds 2048"):
        GemmArguments(op, GemmCoord(M, N, K), A, B, C, D, bias=True)
    with pytest.raises(ArgumentError, match=r"bias=True says C is a bias vector, but C is None"):
        GemmArguments(op, GemmCoord(M, N, K), A, B, None, D, bias=True)
    with pytest.raises(ArgumentError, match=r"bias must be True or False"):
        GemmArguments(op, GemmCoord(M, N, K), A, B, C, D, bias="yes")
    # a broadcast view (device memory, described by its strides) is a bias too
    view = FakeDeviceArray((M, N), (0, 1))
    assert GemmArguments(op, GemmCoord(M, N, K), A, B, view, D, bias=True).bias


def test_gemm_bias_batched_one_vector_per_batch_or_shared():
    op = f16_gemm()
    batch = 3
    A, B = np.ones(batch * M * K, np.float16), np.ones(batch * K * N, np.float16)
    D = np.zeros(batch * M * N, np.float16)
    per_batch = GemmArguments(op, GemmCoord(M, N, K), A, B, np.ones(batch * N, np.float16), D,
                              gemm_mode=Mode.Batched, batch=batch, bias=True)
    assert per_batch._operands["C"][2].batch_stride == N and per_batch._operands["C"][2].ld == 0
    auto = GemmArguments(op, GemmCoord(M, N, K), A, B, np.ones(batch * N, np.float16), D, gemm_mode=Mode.Batched,
                         batch=batch)
    assert auto.bias and auto._operands["C"][2].batch_stride == N
    shared = GemmArguments(op, GemmCoord(M, N, K), A, B, np.ones(N, np.float16), D, gemm_mode=Mode.Batched,
                           batch=batch, bias=True)
    assert shared._operands["C"][2].batch_stride == 0


def test_gemm_pycutlass_positional_mode():
    op = f16_gemm()
    batch = 2
    A, B = np.ones(batch * M * K, np.float16), np.ones(batch * K * N, np.float16)
    C, D = np.ones(batch * M * N, np.float16), np.zeros(batch * M * N, np.float16)
    args = GemmArguments(op, GemmCoord(M, N, K), A, B, C, D, Mode.Batched, batch=batch,
                         output_op=op.epilogue_type(1.0, 0.5))
    assert args.gemm_mode is Mode.Batched and args.output_op.beta == 0.5
    args = GemmArguments(op, GemmCoord(M, N, K), A, B, C, D, op.epilogue_type(2.0, 0.0), Mode.Batched, 1, batch)
    assert args.gemm_mode is Mode.Batched and args.output_op.alpha == 2.0 and args.batch == batch
    args = GemmArguments(op, GemmCoord(M, N, K), *gemm_tensors(), Mode.GemmSplitKParallel, split_k_slices=2)
    assert args.gemm_mode is Mode.GemmSplitKParallel
    with pytest.raises(ArgumentError, match=r"gemm_mode was passed both by position"):
        GemmArguments(op, GemmCoord(M, N, K), A, B, C, D, Mode.Batched, gemm_mode=Mode.Array, batch=batch)
    with pytest.raises(ArgumentError, match=r"pass the rest by keyword"):
        GemmArguments(op, GemmCoord(M, N, K), A, B, C, D, Mode.Batched, 1)


def test_gemm_split_k_splices_is_pycutlass_misspelling_of_split_k_slices():
    """PyCUTLASS 2.11's README and test/frontend/test_frontend.py pass ``split_k_splices=1`` (its GemmArguments
    ignored unknown keywords)."""
    op = f16_gemm()
    with pytest.warns(UserWarning, match="misspelling of split_k_slices"):
        args = GemmArguments(op, GemmCoord(M, N, K), *gemm_tensors(), gemm_mode=Mode.GemmSplitKParallel,
                             split_k_splices=2)
    assert args.split_k_slices == 2
    with pytest.raises(ArgumentError, match="disagree"):
        GemmArguments(op, GemmCoord(M, N, K), *gemm_tensors(), split_k_slices=1, split_k_splices=2)
    with pytest.raises(TypeError):  # other unknown keywords stay errors
        GemmArguments(op, GemmCoord(M, N, K), *gemm_tensors(), split_k_slice=2)


def test_conv_bias_keyword_and_auto_detection():
    op = f16_conv()
    ps = conv_problem()
    A, B, C, D = conv_tensors(ps)
    assert Conv2dArguments(op, ps, A, B, C, D).bias is False
    for bias in (np.ones(64, np.float16), np.ones((1, 1, 1, 64), np.float16), np.ones((64, 1), np.float16)):
        args = Conv2dArguments(op, ps, A, B, bias, D, output_op=op.epilogue_type(1.0, 1.0), bias=True)
        assert args.bias and args._operands["C"][1] == (0, 0, 0)
    args = Conv2dArguments(op, ps, A, B, np.ones(64, np.float16), D)  # auto: K elements < N*P*Q*K
    assert args.bias and args._operands["C"][1] == (0, 0, 0)
    with pytest.raises(ArgumentError, match=r"bias=True says C is a bias vector of 64 elements"):
        Conv2dArguments(op, ps, A, B, C, D, bias=True)
    with pytest.raises(ArgumentError, match=r"bias=True says C is a bias vector, but C is None"):
        Conv2dArguments(op, ps, A, B, None, D, bias=True)


def test_conv_pycutlass_positional_split_k_mode():
    op = f16_conv()
    ps = conv_problem(split_k=2)
    args = Conv2dArguments(op, ps, *conv_tensors(ps), SplitKMode.Parallel, split_k_slices=2)
    assert args.split_k_mode is SplitKMode.Parallel and args.parallel
    with pytest.raises(ArgumentError, match=r"split_k_mode was passed both by position"):
        Conv2dArguments(op, ps, *conv_tensors(ps), SplitKMode.Parallel, split_k_mode=SplitKMode.Serial)
    args = Conv2dArguments(op, ps, *conv_tensors(ps), None, SplitKMode.Parallel, 2)  # pycutlass's order
    assert args.split_k_mode is SplitKMode.Parallel and args.split_k_slices == 2


def test_reduction_bias_keyword():
    reduction = ReductionOperation(pc.MatrixCoord(4, 64), td(F16, pc.RowMajor, 8), F32, count=8)
    dest = np.zeros(M * N, np.float16)
    args = ReductionArguments(reduction, [M, N], 2, 0x10000, dest, np.ones(N, np.float16),
                              output_op=reduction.epilogue_type(1.0, 1.0), bias=True)
    assert args.bias and args._infos["source"][1].ld == 0
    args = ReductionArguments(reduction, [M, N], 2, 0x10000, dest, np.ones((1, N), np.float16),
                              output_op=reduction.epilogue_type(1.0, 1.0), bias=True)
    assert args.bias
    assert not ReductionArguments(reduction, [M, N], 2, 0x10000, dest, np.ones(M * N, np.float16)).bias
    with pytest.raises(ArgumentError, match=r"bias=True says C is a bias vector of 32 elements"):
        ReductionArguments(reduction, [M, N], 2, 0x10000, dest, np.ones(M * N, np.float16), bias=True)


def test_reduction_reads_the_partials_in_the_type_the_split_k_kernel_wrote():
    """GemmArguments.ptr_D of parallel split-K is the workspace's address and knows that the partials are in the
    operation's output type; a ReductionOperation reading another type (element_workspace defaults to the
    accumulator) would read past them."""
    from pycutlass.runtime.tensors import PartialsAddress

    f32_workspace = ReductionOperation(pc.MatrixCoord(4, 64), td(F16, pc.RowMajor, 8), F32, count=8)
    f16_workspace = ReductionOperation(pc.MatrixCoord(4, 64), td(F16, pc.RowMajor, 8), F32, F16, count=8)
    dest = np.zeros(M * N, np.float16)
    with pytest.raises(ArgumentError, match=r"^workspace: the split-K partial results are float16 .* reads float32 "
                                            r"\(its element_workspace, which defaults to element_accumulator\)"):
        ReductionArguments(f32_workspace, [M, N], 2, PartialsAddress(0x10000, F16), dest)
    assert ReductionArguments(f16_workspace, [M, N], 2, PartialsAddress(0x10000, F16), dest).workspace == 0x10000
    assert ReductionArguments(f32_workspace, [M, N], 2, PartialsAddress(0x10000, F32), dest).workspace == 0x10000
    assert ReductionArguments(f32_workspace, [M, N], 2, 0x10000, dest).workspace == 0x10000  # a bare int: unchecked


def test_reduction_reads_no_further_than_the_split_k_workspace():
    """A workspace of known size (ptr_D of parallel split-K): more partitions, or a larger problem, than the
    producer wrote would read past its end."""
    from pycutlass.runtime.tensors import PartialsAddress

    reduction = ReductionOperation(pc.MatrixCoord(4, 64), td(F16, pc.RowMajor, 8), F32, count=8)
    dest = np.zeros(M * N, np.float16)
    three_slices = PartialsAddress(0x10000, F32, 3 * M * N * 4)
    assert ReductionArguments(reduction, [M, N], 3, three_slices, dest).workspace == 0x10000
    with pytest.raises(ArgumentError, match=rf"^workspace: 4 partitions of {M} x {N} .* read {4 * M * N * 4} bytes, "
                                            rf"but the split-K workspace holds {3 * M * N * 4}"):
        ReductionArguments(reduction, [M, N], 4, three_slices, dest)
    with pytest.raises(ArgumentError, match="partition stride"):
        ReductionArguments(reduction, [M, N], 3, three_slices, dest, partition_stride=2 * M * N)
    with pytest.raises(ArgumentError, match=r"wrote 3 partitions .* partitions=2 would sum only part of them"):
        ReductionArguments(reduction, [M, N], 2, three_slices, dest)


def test_parallel_split_k_zeroes_the_slices_no_thread_block_writes(monkeypatch):
    """The builder's grid has one z layer per K chunk; slices past it are zeroed (once: the kernel never writes
    them), on the arguments' stream, and nothing is zeroed when every slice is written."""
    from types import SimpleNamespace

    from pycutlass.kinds.gemm.arguments import zero_unwritten_partials
    from pycutlass.runtime import driver

    calls = []
    monkeypatch.setattr(driver, "memset_d8", lambda *args: calls.append(args))
    arguments = SimpleNamespace(workspace=0x10000, stream=7)
    zero_unwritten_partials(arguments, SimpleNamespace(grid=(3, 2, 1)), 5, 1000)
    assert calls == [(0x10000 + 1000, 0, 4000, 7)]
    calls.clear()
    zero_unwritten_partials(arguments, SimpleNamespace(grid=(3, 2, 5)), 5, 1000)
    assert calls == []


# --- raw device pointers ----------------------------------------------------------------------------------------------
def test_cudeviceptr_operands_are_packed_and_sized_from_the_problem():
    driver = pytest.importorskip("cuda.bindings.driver")
    op = f16_gemm()
    ptr = [driver.CUdeviceptr(0x100000 * (i + 1)) for i in range(4)]
    args = GemmArguments(op, GemmCoord(M, N, K), *ptr, output_op=op.epilogue_type(1.0, 0.5))
    shapes = {label: (info.kind, info.shape, info.device_address) for label, (_, info, _) in args._operands.items()}
    assert shapes == {"A": ("device", (M * K,), 0x100000), "B": ("device", (K * N,), 0x200000),
                      "C": ("device", (M * N,), 0x300000), "D": ("device", (M * N,), 0x400000)}
    assert isinstance(args._operands["A"][1].source, DevicePointerTensor)
    args = GemmArguments(op, GemmCoord(M, N, K), *ptr, output_op=op.epilogue_type(1.0, 0.5), bias=True)
    assert args._operands["C"][1].shape == (N,) and args.bias
    # conv: sizes from the problem
    cop, ps = f16_conv(), conv_problem()
    args = Conv2dArguments(cop, ps, *ptr, output_op=cop.epilogue_type(1.0, 0.5))
    assert args._operands["B"][0].shape == (ps.tensor_b_size(Operator.fprop),)
    reduction = ReductionOperation(pc.MatrixCoord(4, 64), td(F16, pc.RowMajor, 8), F32, count=8)
    args = ReductionArguments(reduction, [M, N], 2, driver.CUdeviceptr(0x500000), ptr[3], ptr[2],
                              output_op=reduction.epilogue_type(1.0, 1.0), bias=True)
    assert args.workspace == 0x500000 and args._infos["source"][0].shape == (N,)
    # a raw pointer where no extent is known
    gop = grouped_op()
    with pytest.raises(ArgumentError, match=r"a raw CUdeviceptr carries no shape"):
        GemmGroupedArguments(gop, [GemmCoord(M, N, K)], [ptr[0]], [ptr[1]], [ptr[2]], [ptr[3]])


def test_plain_ints_are_not_pointers():
    op = f16_gemm()
    A, B, C, D = gemm_tensors()
    with pytest.raises(ArgumentError, match=r"^A: expected a torch tensor"):
        GemmArguments(op, GemmCoord(M, N, K), 0x100000, B, C, D)


# --- 2. grouped GEMM with packed 1-D tensors ----------------------------------------------------------------------------
def grouped_op(layout_c=pc.RowMajor):
    math = pc.MathInstruction([16, 8, 16], F16, F16, F32, pc.OpClass.TensorOp)
    tile = pc.TileDescription([64, 128, 32], 4, [2, 2, 1], math)
    return GemmOperationGrouped(80, tile, td(F16, pc.RowMajor, 8), td(F16, pc.ColumnMajor, 8), td(F16, layout_c, 8),
                                pc.LinearCombination(F16, 8, F32, F32))


@pytest.mark.parametrize("layout_c", [pc.RowMajor, pc.ColumnMajor])
def test_grouped_packed_1d_tensors_as_pycutlass_testbed(layout_c):
    op = grouped_op(layout_c)
    problems = [GemmCoord(48, 16, 8), GemmCoord(24, 40, 64)]
    As = [np.ones(p.m() * p.k(), np.float16) for p in problems]
    Bs = [np.ones(p.k() * p.n(), np.float16) for p in problems]
    Cs = [np.ones(p.m() * p.n(), np.float16) for p in problems]
    Ds = [np.zeros(p.m() * p.n(), np.float16) for p in problems]
    args = GemmGroupedArguments(op, problems, As, Bs, Cs, Ds, output_op=op.epilogue_type(1.0, 0.5))
    lds = [{label: geometry.ld for label, (_, geometry) in operands.items()} for operands in args._operands]
    expected_c = [p.n() if layout_c is pc.RowMajor else p.m() for p in problems]
    assert lds == [{"A": p.k(), "B": p.k(), "C": ldc, "D": ldc} for p, ldc in zip(problems, expected_c)]
    with pytest.raises(ArgumentError, match=r"As\[1\].*1-D operand has 10 elements"):
        GemmGroupedArguments(op, problems, [As[0], np.ones(10, np.float16)], Bs, Cs, Ds)
    # a packed bias vector per problem
    bias = [np.ones(p.n() if layout_c is pc.RowMajor else p.m(), np.float16) for p in problems]
    args = GemmGroupedArguments(op, problems, As, Bs, bias, Ds, output_op=op.epilogue_type(1.0, 1.0))
    assert all(operands["C"][1].broadcast for operands in args._operands)


# --- 3. interleaved operands reordered inside the Arguments -------------------------------------------------------------
def interleave_rmi32(matrix):
    """Logical (rows, cols) -> RowMajorInterleaved32 memory: offset = (row / 32) * 32 * cols + col * 32 + row % 32."""
    rows, cols = matrix.shape
    return np.ascontiguousarray(matrix.T.reshape(cols, rows // 32, 32).transpose(1, 0, 2)).reshape(-1)


def test_interleaved_gemm_b_is_reordered_in_a_copy():
    op = interleaved_gemm()
    m, n, k = 64, 64, 64
    rng = np.random.default_rng(0)
    b = rng.integers(-3, 4, (k, n)).astype(np.int8)
    B = interleave_rmi32(b)
    original = B.copy()
    A, C, D = np.ones(m * k, np.int8), np.ones(m * n, np.int8), np.zeros(m * n, np.int8)
    args = GemmArguments(op, GemmCoord(m, n, k), A, B, C, D)
    bound = args._operands["B"][1].host_array
    assert np.array_equal(bound, interleave_rmi32(reorder_interleaved_b(b)))
    assert np.array_equal(B, original) and bound is not B and args.reordered is False
    # opt-out: B is already in the kernel's order and bound as given
    kernel_order = interleave_rmi32(reorder_interleaved_b(b))
    args = GemmArguments(op, GemmCoord(m, n, k), A, kernel_order, C, D, reordered=True)
    assert args._operands["B"][1].host_array is kernel_order and args.reordered
    with pytest.raises(ArgumentError, match=r"reordered must be True or False"):
        GemmArguments(op, GemmCoord(m, n, k), A, kernel_order, C, D, reordered=1)


def test_interleaved_conv_filter_is_reordered_in_a_copy():
    op = interleaved_conv()
    ps = conv_problem(c=64, k=64, r=3, s=3)
    rng = np.random.default_rng(1)
    k, r, s, c = tuple(ps.filter_extent())
    filt = rng.integers(-3, 4, (c // 32, r, s, k, 32)).astype(np.int8)
    original = filt.copy()
    A = np.ones(ps.tensor_a_size(Operator.fprop), np.int8)
    C = np.ones(ps.tensor_c_size(Operator.fprop), np.int8)
    D = np.zeros_like(C)
    for B in (filt, filt.reshape(-1)):
        args = Conv2dArguments(op, ps, A, B, C, D)
        bound = args._operands["B"][0].host_array
        assert np.array_equal(bound.reshape(filt.shape), reorder_interleaved_filter(filt))
        assert np.array_equal(filt, original)
    ready = np.ascontiguousarray(reorder_interleaved_filter(filt))
    args = Conv2dArguments(op, ps, A, ready, C, D, reordered=True)
    assert args._operands["B"][0].host_array is ready


# --- 4. the fast path's keys ------------------------------------------------------------------------------------------
class Tensor:
    """Enough of a CUDA torch tensor for the fast path's signature."""

    is_cuda = True

    def __init__(self, shape, strides, dtype="float16"):
        self.shape, self._strides, self.dtype = tuple(shape), tuple(strides), dtype

    def stride(self):
        return self._strides

    def get_device(self):
        return 0

    def is_neg(self):  # torch's negative bit: a lazily negated view
        return getattr(self, "negated", False)


Tensor.__module__ = "torch"


def test_fast_path_keys_include_bias_and_reordered():
    op = f16_gemm()
    a, b, c, d = Tensor((M, K), (K, 1)), Tensor((K, N), (1, K)), Tensor((N,), (1,)), Tensor((M, N), (N, 1))
    keys = [gemm_memo_key(op, GemmCoord(M, N, K), a, b, c, d, None, Mode.Gemm, 1, 1, None, None, None, bias, False)
            for bias in (None, True)]
    assert None not in keys and keys[0] != keys[1]
    assert gemm_memo_key(op, GemmCoord(M, N, K), a, b, c, d, None, Mode.Gemm, 1, 1, None, None, None, "x",
                         False) is None
    iop = interleaved_gemm()
    a8, b8, d8 = (Tensor((64 * 64,), (1,), "int8") for _ in range(3))
    assert gemm_memo_key(iop, GemmCoord(64, 64, 64), a8, b8, None, d8, None, Mode.Gemm, 1, 1, None, None, None,
                         None, False) is None  # reordered inside: bound through a copy, never the fast path
    assert gemm_memo_key(iop, GemmCoord(64, 64, 64), a8, b8, None, d8, None, Mode.Gemm, 1, 1, None, None, None,
                         None, True) is not None
    cop, ps = f16_conv(), conv_problem()
    t = Tensor((10,), (1,))
    keys = [conv_memo_key(cop, ps, t, t, t, t, None, SplitKMode.Serial, 1, None, None, None, bias, False)
            for bias in (None, True)]
    assert None not in keys and keys[0] != keys[1]
    assert conv_memo_key(interleaved_conv(), ps, t, t, t, t, None, SplitKMode.Serial, 1, None, None, None, None,
                         False) is None


# --- 5. a TensorNHWC reduction (PyCUTLASS's conv parallel split-K) ----------------------------------------------------------
def test_reduction_with_tensor_nhwc_c_reduces_npq_by_k():
    C = td(F16, pc.TensorNHWC, 8)
    reduction = ReductionOperation(pc.MatrixCoord(4, 64), C, F32, element_compute=F32,
                                   epilogue_functor=pc.LinearCombination(F16, 8, F32, F32), count=8)
    assert reduction.matrix_layout is pc.RowMajor and reduction.C.layout is pc.TensorNHWC
    ps = conv_problem(split_k=2)
    m, n = 2 * 8 * 8, 64
    for dest in (np.zeros(m * n, np.float16), np.zeros((2, 8, 8, 64), np.float16)):
        args = ReductionArguments(reduction, [m, n], 2, 0x10000, dest, np.ones((2, 8, 8, 64), np.float16),
                                  output_op=reduction.epilogue_type(1.0, 0.5))
        assert args._infos["destination"][1].ld == n and args._infos["source"][1].ld == n and not args.bias
    args = ReductionArguments(reduction, [m, n], 2, 0x10000, np.zeros(m * n, np.float16), np.ones(n, np.float16),
                              output_op=reduction.epilogue_type(1.0, 1.0), bias=True)
    assert args.bias and args._infos["source"][1].ld == 0
    with pytest.raises(ArgumentError, match=r"packed NHWC"):
        ReductionArguments(reduction, [m, n], 2, 0x10000, np.zeros((2, 8, 64, 8), np.float16).transpose(0, 1, 3, 2),
                           None)
    # the conv arguments name the reduction's problem
    cop = f16_conv()
    cargs = Conv2dArguments(cop, ps, *conv_tensors(ps), SplitKMode.Parallel, split_k_slices=2)
    assert cargs.reduction_problem_size == (m, n)
    with pytest.raises(pc.DescriptionError, match=r"RowMajor, ColumnMajor or TensorNHWC"):
        ReductionOperation(pc.MatrixCoord(4, 64), td(F16, pc.TensorNC32HW32, 8), F32, count=8)


# --- 6. rt_module.emit() ------------------------------------------------------------------------------------------------
def test_rt_module_emit_is_the_operations_source():
    reduction = ReductionOperation(pc.MatrixCoord(4, 64), td(F16, pc.RowMajor, 8), F32, count=8)
    for op in (f16_gemm(), grouped_op(), f16_conv(), reduction):
        assert op.rt_module.emit() == op.emit()
        assert op.name in op.rt_module.emit()


def test_interleaved_gemm_b_batched_and_array_reordered_per_matrix():
    op = interleaved_gemm()
    m, n, k, batch = 64, 64, 64, 2
    rng = np.random.default_rng(2)
    bs = [rng.integers(-3, 4, (k, n)).astype(np.int8) for _ in range(batch)]
    expected = [interleave_rmi32(reorder_interleaved_b(b)) for b in bs]
    A, C, D = (np.ones(batch * m * x, np.int8) for x in (k, n, n))
    args = GemmArguments(op, GemmCoord(m, n, k), A, np.concatenate([interleave_rmi32(b) for b in bs]), C, D,
                         gemm_mode=Mode.Batched, batch=batch)
    assert np.array_equal(args._operands["B"][1].host_array, np.concatenate(expected))
    args = GemmArguments(op, GemmCoord(m, n, k), [np.ones(m * k, np.int8)] * batch,
                         [interleave_rmi32(b) for b in bs], [np.ones(m * n, np.int8)] * batch,
                         [np.zeros(m * n, np.int8) for _ in range(batch)], gemm_mode=Mode.Array, batch=batch)
    assert all(np.array_equal(info.host_array, e) for info, e in zip(args._operands["B"][1], expected))


def test_grouped_pycutlass_keywords():
    """PyCUTLASS's grouped testbed: GemmGroupedArguments(operation=, problem_sizes=, A=, B=, C=, D=, output_op=)."""
    op = grouped_op()
    problems = [GemmCoord(48, 16, 8)]
    A, B = [np.ones(48 * 8, np.float16)], [np.ones(8 * 16, np.float16)]
    C, D = [np.ones(48 * 16, np.float16)], [np.zeros(48 * 16, np.float16)]
    args = GemmGroupedArguments(operation=op, problem_sizes=problems, A=A, B=B, C=C, D=D,
                                output_op=op.epilogue_type(1.0, 0.5))
    assert args._operands[0]["D"][0].host_array is D[0]
    with pytest.raises(ArgumentError, match=r"pass As= or PyCUTLASS's A=, not both"):
        GemmGroupedArguments(op, problems, A, B, C, D, A=A)
