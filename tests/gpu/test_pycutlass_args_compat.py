"""PyCUTLASS 2.11 client code on the GPU: ``bias=`` on GEMM / Conv2d / Reduction Arguments (and its
auto-detection), PyCUTLASS's positional mode, raw ``CUdeviceptr`` operands, packed 1-D grouped operands, interleaved
int8 B reordered inside the Arguments (and ``reordered=True``), parallel split-K convolutions reduced by a
TensorNHWC ReductionOperation, and the fast path for seen problems with the new keywords. Random inputs,
NaN-poisoned outputs, float64 references."""
from __future__ import annotations

import numpy as np
import pytest

import pycutlass as cutlass
from pycutlass import (ArgumentError, Conv2dArguments, GemmArguments, GemmGroupedArguments, ReductionArguments,
                       ReductionOperation, SchedulerMode)
from pycutlass.conv import SplitKMode, implicit_gemm_problem_size
from pycutlass.gemm import GemmCoord, Mode, reorder_interleaved_b

from .conftest import precompile_module, relative_error
from .gemm_cases import (CM, CMI32, RI32, D, R, check_integer, deinterleave, epilogue_reference, make_op,
                         random_values, to_float64, to_tensor)
from .test_conv2d import ANALYTIC, FPROP, OPTIMIZED, conv_op, conv_reference, from_lib, problem, to_lib
from .test_gemm_grouped import make_grouped

pytestmark = pytest.mark.gpu

F16, F32 = D.float16, D.float32
TOL = 5e-3

GEMM = make_op("f16")
GEMM_CM = make_op("f16", (R, CM, CM))
GEMM_BATCHED = make_op("f16", swizzle=cutlass.BatchedIdentitySwizzle)
GEMM_F32OUT = make_op("f16", out=F32, out_align=4)  # parallel split-K partials
GEMM_S8_IL = make_op("s8", (CMI32, RI32, CMI32), out=D.int8, out_align=8, epilogue="clamp")
REDUCTION = ReductionOperation(cutlass.MatrixCoord(4, 32 * 8), cutlass.TensorDescription(F16, R, 8), F32, F32, F32,
                               count=8)
REDUCTION_NHWC = ReductionOperation(cutlass.MatrixCoord(4, 32 * 8), cutlass.TensorDescription(F16, cutlass.TensorNHWC, 8),
                                    F32, F32, F32, count=8)
GROUPED = make_grouped("f16", (R, CM, R), SchedulerMode.Device)
GROUPED_CM = make_grouped("f16", (R, CM, CM), SchedulerMode.Host)
CONV = conv_op(FPROP, OPTIMIZED, "f16")
CONV_F32OUT = conv_op(FPROP, ANALYTIC, "f16", out=F32, tile=[128, 64, 32])

OPS = [GEMM, GEMM_CM, GEMM_BATCHED, GEMM_F32OUT, GEMM_S8_IL, REDUCTION, REDUCTION_NHWC, GROUPED, GROUPED_CM, CONV,
       CONV_F32OUT]


@pytest.fixture(scope="module", autouse=True)
def compiled(memory_pool):
    precompile_module(OPS)
    yield


def cuda_f16(values):
    import torch

    return torch.from_numpy(np.ascontiguousarray(values)).to(torch.float16).cuda()


def gemm_operands(op, m, n, k, lib, seed):
    rng = np.random.default_rng(seed)
    a, b = random_values(rng, (m, k), F16), random_values(rng, (k, n), F16)
    A, B = to_tensor(a, F16, op.A.layout, lib), to_tensor(b, F16, op.B.layout, lib)
    return rng, a, b, A, B


def poisoned(shape, layout, lib):
    return to_tensor(np.full(shape, np.nan), F16, layout, lib)


def as_lib_vector(values, lib):
    return cuda_f16(values) if lib == "torch" else np.ascontiguousarray(values).astype(np.float16)


# --- bias -----------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("form", ["keyword", "auto"])
@pytest.mark.parametrize("lib", ["torch", "numpy"])
@pytest.mark.parametrize("layout_c", ["row", "col"])
def test_gemm_bias(layout_c, lib, form):
    """bias=True (or a C of one vector's elements): one value per column of a RowMajor C, per row of a ColumnMajor
    one, broadcast over the other dimension."""
    op = GEMM if layout_c == "row" else GEMM_CM
    m, n, k = 200, 136, 72
    rng, a, b, A, B = gemm_operands(op, m, n, k, lib, 1)
    vector = random_values(rng, (n if layout_c == "row" else m,), F16)
    Dt = poisoned((m, n), op.C.layout, lib)
    alpha, beta = 1.25, 0.75
    extra = dict(bias=True) if form == "keyword" else {}
    args = GemmArguments(op, GemmCoord(m, n, k), A, B, as_lib_vector(vector, lib), Dt,
                         output_op=op.epilogue_type(alpha, beta), **extra)
    assert args.bias is True
    op.run(args)
    args.sync()
    broadcast = vector[None, :] if layout_c == "row" else vector[:, None]
    reference = epilogue_reference(op, a @ b, broadcast, alpha, beta)
    assert relative_error(to_float64(Dt), reference) < TOL


def test_gemm_bias_batched_pycutlass_positional_mode():
    """PyCUTLASS's GemmArguments(op, size, A, B, C, D, gemm_mode, **kwargs) with packed 1-D numpy operands and one
    bias vector per batch (PyCUTLASS's batched_stride_C = N)."""
    op = GEMM_BATCHED
    batch, m, n, k = 3, 72, 64, 40
    rng = np.random.default_rng(2)
    a, b = random_values(rng, (batch, m, k), F16), random_values(rng, (batch, k, n), F16)
    bias = random_values(rng, (batch, n), F16)
    A = a.reshape(-1).astype(np.float16)  # RowMajor A, batches one after the other
    B = np.ascontiguousarray(b.transpose(0, 2, 1)).reshape(-1).astype(np.float16)  # ColumnMajor B
    C = bias.reshape(-1).astype(np.float16)
    Dt = np.full(batch * m * n, np.nan, np.float16)
    args = GemmArguments(op, GemmCoord(m, n, k), A, B, C, Dt, Mode.Batched, output_op=op.epilogue_type(1.0, 1.0),
                         batch=batch, bias=True)
    assert args.gemm_mode is Mode.Batched and args.bias
    op.run(args)
    args.sync()
    reference = a @ b + bias[:, None, :]
    assert relative_error(Dt.astype(np.float64).reshape(batch, m, n), reference) < TOL


@pytest.mark.parametrize("bias", [False, True])
def test_gemm_cudeviceptr_operands(bias):
    """Raw CUdeviceptr operands, packed in the operation's layouts, sized from the problem (as PyCUTLASS took them)."""
    import torch
    from cuda.bindings.driver import CUdeviceptr

    op = GEMM
    m, n, k = 128, 96, 64
    rng = np.random.default_rng(3)
    a, b = random_values(rng, (m, k), F16), random_values(rng, (k, n), F16)
    c = random_values(rng, (n,) if bias else (m, n), F16)
    A, B, C = cuda_f16(a), cuda_f16(b.T), cuda_f16(c)  # B column-major: the packed (N, K) transpose
    Dt = torch.full((m, n), float("nan"), dtype=torch.float16, device="cuda")
    pointers = [CUdeviceptr(t.data_ptr()) for t in (A, B, C, Dt)]
    args = GemmArguments(op, GemmCoord(m, n, k), *pointers, output_op=op.epilogue_type(1.5, -0.5),
                         **(dict(bias=True) if bias else {}))
    assert args.bias is bias
    op.run(args)
    args.sync()
    torch.cuda.synchronize()
    reference = 1.5 * (a @ b) - 0.5 * (c[None, :] if bias else c)
    assert relative_error(to_float64(Dt), reference) < TOL
    with pytest.raises(ArgumentError, match=r"not device memory known to the CUDA driver"):
        GemmArguments(op, GemmCoord(m, n, k), CUdeviceptr(0x1000), *pointers[1:])


def test_gemm_parallel_split_k_bias_reduction():
    """PyCUTLASS's parallel split-K with a bias: ReductionArguments(..., workspace=arguments.ptr_D,
    bias=arguments.bias)."""
    import torch

    op = GEMM_F32OUT
    m, n, k, split_k = 136, 256, 512, 3
    rng, a, b, A, B = gemm_operands(op, m, n, k, "torch", 4)
    bias = random_values(rng, (n,), F16)
    C = cuda_f16(bias)
    Dt = torch.full((m, n), float("nan"), dtype=torch.float16, device="cuda")
    args = GemmArguments(op, GemmCoord(m, n, k), A, B, C, Dt, Mode.GemmSplitKParallel, split_k_slices=split_k)
    assert args.bias
    reduction_args = ReductionArguments(REDUCTION, problem_size=[m, n], partitions=split_k, workspace=args.ptr_D,
                                        destination=Dt, source=C, output_op=REDUCTION.epilogue_type(1.25, 0.5),
                                        bias=args.bias)
    op.run(args)
    REDUCTION.run(reduction_args)
    reduction_args.sync()
    reference = 1.25 * (a @ b) + 0.5 * bias[None, :]
    assert relative_error(to_float64(Dt), reference) < TOL


@pytest.mark.parametrize("form", ["keyword_1d", "keyword_4d", "auto"])
@pytest.mark.parametrize("lib", ["torch_nhwc", "numpy"])
def test_conv_bias(lib, form):
    op = CONV
    ps = problem(2, 9, 10, 32, 64, 3, 3)
    rng = np.random.default_rng(5)
    a = random_values(rng, tuple(ps.activation_extent()), F16)
    b = random_values(rng, tuple(ps.filter_extent()), F16)
    bias = random_values(rng, (ps.K,), F16)
    A, B = to_lib(a, F16, lib), to_lib(b, F16, lib)
    C = as_lib_vector(bias.reshape(1, 1, 1, ps.K) if form == "keyword_4d" else bias,
                      "torch" if lib == "torch_nhwc" else "numpy")
    Dt = to_lib(np.full(tuple(ps.output_extent()), np.nan), F16, lib)
    extra = {} if form == "auto" else dict(bias=True)
    args = Conv2dArguments(op, ps, A, B, C, Dt, output_op=op.epilogue_type(1.0, 1.0), **extra)
    assert args.bias
    op.run(args)
    args.sync()
    reference = conv_reference(FPROP, ps, a, b) + bias
    assert relative_error(from_lib(Dt, lib), reference) < TOL


@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("lib", ["torch_1d", "torch_nhwc"])
def test_conv_parallel_split_k_tensor_nhwc_reduction(lib, bias):
    """PyCUTLASS's conv parallel split-K (examples/40_cutlass_py/conv2d.py): the ReductionOperation's C is the
    convolution's TensorNHWC description; it reduces the implicit GEMM's NPQ x K output."""
    import torch

    op = CONV_F32OUT
    ps = problem(2, 15, 17, 64, 64, 3, 3, split_k=4)
    rng = np.random.default_rng(6)
    a = random_values(rng, tuple(ps.activation_extent()), F16)
    b = random_values(rng, tuple(ps.filter_extent()), F16)
    c = random_values(rng, (ps.K,) if bias else tuple(ps.output_extent()), F16)
    if lib == "torch_1d":  # PyCUTLASS's packed 1-D tensors
        A, B, C = (cuda_f16(x.reshape(-1)) for x in (a, b, c))
        Dt = torch.full((int(np.prod(tuple(ps.output_extent()))),), float("nan"), dtype=torch.float16,
                        device="cuda")
    else:
        A, B = to_lib(a, F16, lib), to_lib(b, F16, lib)
        C = cuda_f16(c) if bias else to_lib(c, F16, lib)
        Dt = to_lib(np.full(tuple(ps.output_extent()), np.nan), F16, lib)
    args = Conv2dArguments(op, ps, A, B, C, Dt, SplitKMode.Parallel, output_op=op.epilogue_type(1.25, 0.5),
                           split_k_slices=ps.split_k_slices)
    assert args.bias is bias
    gemm = implicit_gemm_problem_size(FPROP, args.problem_size)
    reduction_args = ReductionArguments(REDUCTION_NHWC, problem_size=[gemm.m(), gemm.n()],
                                        partitions=ps.split_k_slices, workspace=args.ptr_D, destination=Dt,
                                        source=C, output_op=REDUCTION_NHWC.epilogue_type(1.25, 0.5),
                                        bias=args.bias)
    op.run(args)
    REDUCTION_NHWC.run(reduction_args)
    reduction_args.sync()
    reference = 1.25 * conv_reference(FPROP, ps, a, b) + 0.5 * c
    got = to_float64(Dt).reshape(tuple(ps.output_extent()))
    assert relative_error(got, reference) < 2e-3


# --- grouped GEMM with packed 1-D operands ----------------------------------------------------------------------------
def packed(matrix, layout):
    return np.ascontiguousarray(matrix if layout is R else matrix.T).reshape(-1)


@pytest.mark.parametrize("lib", ["numpy", "torch"])
@pytest.mark.parametrize("variant", ["row_c", "col_c", "row_c_bias"])
def test_grouped_packed_1d_operands(variant, lib):
    """PyCUTLASS's grouped testbed: one packed 1-D tensor per problem and operand, in the operation's layouts."""
    op = GROUPED_CM if variant == "col_c" else GROUPED
    bias = variant.endswith("bias")
    rng = np.random.default_rng(7)
    problems = [GemmCoord(48, 16, 8)] + [GemmCoord(*(8 * int(x) + 24 for x in rng.integers(0, 16, 3)))
                                         for _ in range(4)]
    tensors = {"A": [], "B": [], "C": [], "D": []}
    references = []
    for p in problems:
        m, n, k = p.m(), p.n(), p.k()
        a, b = random_values(rng, (m, k), F16), random_values(rng, (k, n), F16)
        c = random_values(rng, (n,) if bias else (m, n), F16)
        tensors["A"].append(packed(a, op.A.layout))
        tensors["B"].append(packed(b, op.B.layout))
        tensors["C"].append(c if bias else packed(c, op.C.layout))
        tensors["D"].append(np.full(m * n, np.nan))
        references.append(1.5 * (a @ b) - 0.5 * (c[None, :] if bias else c))
    convert = cuda_f16 if lib == "torch" else (lambda x: x.astype(np.float16))
    As, Bs, Cs, Ds = ([convert(x) for x in tensors[label]] for label in "ABCD")
    if lib == "numpy":  # as PyCUTLASS's grouped testbed wrote it
        args = GemmGroupedArguments(operation=op, problem_sizes=problems, A=As, B=Bs, C=Cs, D=Ds,
                                    output_op=op.epilogue_type(1.5, -0.5))
    else:
        args = GemmGroupedArguments(op, problems, As, Bs, Cs, Ds, output_op=op.epilogue_type(1.5, -0.5))
    op.run(args)
    args.sync()
    for p, Dt, reference in zip(problems, Ds, references):
        got = to_float64(Dt).reshape((p.m(), p.n()) if op.C.layout is R else (p.n(), p.m()))
        got = got if op.C.layout is R else got.T
        assert relative_error(got, reference) < TOL, p


# --- interleaved int8 B reordered inside the Arguments ----------------------------------------------------------------
@pytest.mark.parametrize("prereordered", [False, True])
@pytest.mark.parametrize("lib", ["torch", "numpy", "cupy"])
def test_interleaved_gemm_reorders_b(lib, prereordered):
    """B in natural RowMajorInterleaved32 order is put in the kernel's column order in a copy the arguments own (the
    caller's B is unchanged), as PyCUTLASS's reorder_column<32>; reordered=True binds B as given. Runs twice: the
    second call must not take a fast path that binds the caller's (unreordered) B."""
    if lib == "cupy":
        pytest.importorskip("cupy")
    op = GEMM_S8_IL
    m, n, k = 128, 96, 64
    rng = np.random.default_rng(8)
    for run in range(2):
        a, b = random_values(rng, (m, k), D.int8), random_values(rng, (k, n), D.int8)
        c = random_values(rng, (m, n), D.int8)
        A = to_tensor(a, D.int8, CMI32, lib)
        B = to_tensor(reorder_interleaved_b(b) if prereordered else b, D.int8, RI32, lib)
        B_before = to_float64(B).copy()
        C = to_tensor(c, D.int8, CMI32, lib)
        Dt = to_tensor(np.full((m, n), -77.0), D.int8, CMI32, lib)
        args = GemmArguments(op, GemmCoord(m, n, k), A, B, C, Dt, op.epilogue_type(0.5, 0.5),
                             reordered=prereordered)
        op.run(args)
        args.sync()
        got = deinterleave(to_float64(Dt).reshape(-1), CMI32, m, n)
        reference = epilogue_reference(op, a @ b, c, 0.5, 0.5)
        assert check_integer(got, reference, op), f"run {run}: max |diff| {np.abs(got - reference).max()}"
        assert np.array_equal(to_float64(B), B_before)


# --- the fast path for seen problems with the new keywords -----------------------------------------------------------
def test_fast_path_with_bias_keyword():
    """Repeated calls (the second and third take the fast path) with bias=True, then auto-detection, then a full C
    of the same problem: each result is correct."""
    import torch

    op = GEMM
    m, n, k = 128, 128, 64
    rng = np.random.default_rng(9)
    for run, (form, full) in enumerate([("keyword", False), ("keyword", False), ("keyword", False), ("auto", False),
                                        ("auto", True), ("auto", True)]):
        a, b = random_values(rng, (m, k), F16), random_values(rng, (k, n), F16)
        c = random_values(rng, (m, n) if full else (n,), F16)
        A, B = to_tensor(a, F16, R, "torch"), to_tensor(b, F16, CM, "torch")
        C = cuda_f16(c)
        Dt = torch.full((m, n), float("nan"), dtype=torch.float16, device="cuda")
        extra = dict(bias=True) if form == "keyword" else {}
        args = GemmArguments(op, GemmCoord(m, n, k), A, B, C, Dt, op.epilogue_type(1.0, 1.0), **extra)
        assert args.bias is (not full)
        op.run(args)
        args.sync()
        reference = a @ b + (c if full else c[None, :])
        assert relative_error(to_float64(Dt), reference) < TOL, f"run {run}"


def test_rt_module_emit():
    for op in (GEMM, GROUPED, CONV, REDUCTION_NHWC):
        assert op.rt_module.emit() == op.emit()
