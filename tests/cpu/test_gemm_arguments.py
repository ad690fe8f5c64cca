"""CPU tests of GemmArguments validation: every mistake a user can make with tensors, sizes and modes must raise
``pycutlass.ArgumentError`` naming the argument, *before* anything touches the GPU.

An autouse fixture replaces ``OperationArguments._attach_device`` (the first GPU step of every Arguments
object) with a stub that records the call and raises NoGpuError. So on any machine, GPU or not, a validation error
that surfaces only after allocation began shows up as NoGpuError instead of ArgumentError, and fails the test.
"""
from __future__ import annotations

import numpy as np
import pytest

import pycutlass as cutlass
from pycutlass import ArgumentError, GemmArguments, NoGpuError
from pycutlass.gemm import GemmCoord, Mode
from pycutlass.runtime.arguments import OperationArguments

M, N, K = 64, 32, 128


@pytest.fixture(autouse=True)
def gpu_calls(monkeypatch):
    calls = []

    def attach_device(self, infos):
        calls.append(self)
        raise NoGpuError("test stub: validation finished and the GPU was asked for")

    monkeypatch.setattr(OperationArguments, "_attach_device", attach_device)
    return calls


# --- operations -----------------------------------------------------------------------------------------------------
def td(element, layout, alignment):
    return cutlass.TensorDescription(element, layout, alignment)


def f16_tile(stages=3):
    math = cutlass.MathInstruction([16, 8, 16], cutlass.float16, cutlass.float16, cutlass.float32,
                                   cutlass.OpClass.TensorOp)
    return cutlass.TileDescription([128, 128, 32], stages, [2, 2, 1], math)


def f16_gemm(layout_a=cutlass.RowMajor, layout_b=cutlass.ColumnMajor, layout_c=cutlass.RowMajor, epilogue=None,
             swizzle=cutlass.IdentitySwizzle1):
    epilogue = epilogue or cutlass.LinearCombination(cutlass.float16, 8, cutlass.float32, cutlass.float32)
    return cutlass.GemmOperationUniversal(80, f16_tile(), td(cutlass.float16, layout_a, 8),
                                          td(cutlass.float16, layout_b, 8), td(cutlass.float16, layout_c, 8),
                                          epilogue, swizzle)


@pytest.fixture(scope="module")
def op():
    """A row-major A, column-major B, row-major C/D f16 GEMM with 8-element (128-bit) accesses everywhere."""
    return f16_gemm()


def int8_gemm(epilogue, layouts=(cutlass.RowMajor, cutlass.ColumnMajor, cutlass.RowMajor), alignment_c=16):
    math = cutlass.MathInstruction([16, 8, 32], cutlass.int8, cutlass.int8, cutlass.int32, cutlass.OpClass.TensorOp,
                                   cutlass.MathOperation.multiply_add_saturate)
    tile = cutlass.TileDescription([128, 128, 64], 3, [2, 2, 1], math)
    return cutlass.GemmOperationUniversal(80, tile, td(cutlass.int8, layouts[0], 16), td(cutlass.int8, layouts[1], 16),
                                          td(epilogue.element_output, layouts[2], alignment_c), epilogue)


# --- tensors --------------------------------------------------------------------------------------------------------
def a_(m=M, k=K, dtype=np.float16, batch=None):
    return np.zeros((m, k) if batch is None else (batch, m, k), dtype)


def b_(k=K, n=N, dtype=np.float16, batch=None):
    """Column-major B: a Fortran-ordered (K, N) array, or ``batch`` of them packed 1-D (PyCUTLASS style)."""
    if batch is None:
        return np.zeros((k, n), dtype, order="F")
    return np.zeros(batch * k * n, dtype)


def c_(m=M, n=N, dtype=np.float16, batch=None):
    return np.zeros((m, n) if batch is None else (batch, m, n), dtype)


def args(operation, problem_size=(M, N, K), A=None, B=None, C="default", D=None, **kwargs):
    A = a_() if A is None else A
    B = b_() if B is None else B
    C = c_() if isinstance(C, str) else C
    D = c_() if D is None else D
    return GemmArguments(operation=operation, problem_size=problem_size, A=A, B=B, C=C, D=D, **kwargs)


def rejects(match: str, *call_args, **kwargs) -> ArgumentError:
    with pytest.raises(ArgumentError, match=match) as info:
        args(*call_args, **kwargs)
    return info.value


# --- the control: valid arguments get as far as the GPU -------------------------------------------------------------
@pytest.mark.parametrize("case", ["gemm", "gemm_c_none", "serial_split_k", "parallel_split_k", "batched", "array",
                                  "array_lists", "bias_vector", "fast_clamp_k256", "tuple_problem_size"])
def test_valid_arguments_reach_the_gpu(op, gpu_calls, case):
    """Without these, the rejections below could pass because everything is rejected."""
    kwargs = {}
    if case == "gemm":
        kwargs = dict(problem_size=GemmCoord(M, N, K), output_op=op.epilogue_type(1.0, 0.5))
    elif case == "gemm_c_none":
        kwargs = dict(C=None, output_op=op.epilogue_type(2.0, 0.0))
    elif case == "serial_split_k":
        kwargs = dict(split_k_slices=4)
    elif case == "parallel_split_k":
        kwargs = dict(gemm_mode=Mode.GemmSplitKParallel, split_k_slices=2, C=None)
    elif case == "batched":
        kwargs = dict(A=a_(batch=3), B=b_(batch=3), C=c_(batch=3), D=c_(batch=3), gemm_mode=Mode.Batched, batch=3)
    elif case == "array":
        kwargs = dict(A=a_(batch=2), B=b_(batch=2), C=c_(batch=2), D=c_(batch=2), gemm_mode=Mode.Array, batch=2)
    elif case == "array_lists":
        kwargs = dict(A=[a_(), a_()], B=[b_(), b_()], C=None, D=[c_(), c_()], gemm_mode=Mode.Array, batch=2)
    elif case == "bias_vector":
        kwargs = dict(C=np.zeros(N, np.float16), output_op=op.epilogue_type(1.0, 1.0))
    elif case == "fast_clamp_k256":
        fast = int8_gemm(cutlass.FastLinearCombinationClamp(cutlass.int8, 16))
        with pytest.raises(NoGpuError, match="test stub"):
            GemmArguments(fast, (M, N, 256), np.zeros((M, 256), np.int8), np.zeros((256, N), np.int8, order="F"),
                          None, np.zeros((M, N), np.int8))
        assert len(gpu_calls) == 1
        return
    elif case == "tuple_problem_size":
        kwargs = dict(problem_size=[np.int64(M), N, K])
    with pytest.raises(NoGpuError, match="test stub"):
        args(op, **kwargs)
    assert len(gpu_calls) == 1


# --- dtype, shape, layout ---------------------------------------------------------------------------------------------
def test_wrong_dtype(op, gpu_calls):
    rejects(r"^A: the operation expects float16 elements, got float32$", op, A=a_(dtype=np.float32))
    rejects(r"^B: the operation expects float16 elements, got float64$", op, B=b_(dtype=np.float64))
    rejects(r"^C: the operation expects float16 elements, got int32$", op, C=c_(dtype=np.int32))
    rejects(r"^D: the operation expects float16 elements, got int8$", op, D=c_(dtype=np.int8))
    rejects(r"^A: numpy dtype uint8 is not supported; use float64, float32", op, A=a_(dtype=np.uint8))
    rejects(r"^B: numpy dtype complex64 is not supported", op, B=b_(dtype=np.complex64))
    assert gpu_calls == []


def test_wrong_shape(op, gpu_calls):
    rejects(r"^A: expected shape \(64, 128\), got \(64, 136\)$", op, A=a_(k=K + 8))
    rejects(r"^B: expected shape \(128, 32\), got \(32, 128\)$", op, B=np.zeros((N, K), np.float16, order="F"))
    rejects(r"^C: expected shape \(64, 32\), got \(32, 64\)$", op, C=c_(M, N).T.copy())
    rejects(r"^D: expected shape \(64, 32\), got \(1, 32\)$", op, D=c_(1, N))  # outputs never broadcast
    rejects(r"^D: 1-D operand has 32 elements; expected 2048 \(packed \(64, 32\)\)$", op, D=np.zeros(N, np.float16))
    rejects(r"^A: expected a 1-D, 2-D or 3-D tensor", op, A=np.zeros((1, 1, M, K), np.float16))
    with pytest.raises(ArgumentError, match=r"^A: a tensor is required, got None$"):
        GemmArguments(op, (M, N, K), None, b_(), c_(), c_())
    with pytest.raises(ArgumentError, match=r"^D: a tensor is required, got None$"):
        GemmArguments(op, (M, N, K), a_(), b_(), c_(), None)
    rejects(r"^A: expected a torch tensor, numpy array, cupy array .* got list$", op, A=a_().tolist())
    assert gpu_calls == []


def test_wrong_layout_strides(op, gpu_calls):
    err = rejects(r"^A: a RowMajor operand needs unit stride along its columns", op, A=np.asfortranarray(a_()))
    assert "strides are (1, 64)" in str(err) and "row-contiguous view" in str(err)
    err = rejects(r"^B: a ColumnMajor operand needs unit stride along its rows", op, B=np.ascontiguousarray(b_()))
    assert "strides are (32, 1)" in str(err) and "column-contiguous view" in str(err)
    rejects(r"^D: a RowMajor operand needs unit stride along its columns", op, D=np.asfortranarray(c_()))
    # A column-major operation takes exactly those Fortran-ordered arrays.
    col = f16_gemm(layout_a=cutlass.ColumnMajor, layout_c=cutlass.ColumnMajor)
    with pytest.raises(NoGpuError):
        args(col, A=np.asfortranarray(a_()), C=np.asfortranarray(c_()), D=np.asfortranarray(c_()))
    rejects(r"^A: a ColumnMajor operand needs unit stride along its rows", col, A=a_(),
            C=np.asfortranarray(c_()), D=np.asfortranarray(c_()))
    assert len(gpu_calls) == 1


def test_non_contiguous_host_array(op, gpu_calls):
    strided = np.zeros((M, 2 * K), np.float16)[:, ::2]
    err = rejects(r"^A: host arrays must be dense", op, A=strided)
    assert f"strides {strided.strides}" in str(err)
    rows = np.zeros((2 * M, N), np.float16)[::2]
    rejects(r"^D: host arrays must be dense", op, D=rows)
    assert gpu_calls == []


def test_torch_tensors_without_plain_strided_memory(op, gpu_calls):
    torch = pytest.importorskip("torch")
    # z.conj().imag is a view whose memory holds the negated values (torch's negative bit): reading it raw would
    # flip a sign silently
    negated = torch.zeros(M, K, dtype=torch.complex64).conj().imag.to(torch.float16)
    assert not negated.is_neg()  # .to() resolves it; the lazily negated float16 view comes from _neg_view
    rejects(r"^A: the tensor has torch's negative bit set, .* tensor.resolve_neg\(\)$", op,
            A=torch.zeros(M, K, dtype=torch.float16)._neg_view())
    rejects(r"^A: a torch.sparse_coo torch tensor has no strided storage", op,
            A=torch.zeros(M, K, dtype=torch.float16).to_sparse())
    assert gpu_calls == []


# --- problem size -----------------------------------------------------------------------------------------------------
def test_problem_size_alignment(op, gpu_calls):
    k = K + 4
    err = rejects(r"A is accessed 8 elements at a time along K, so K must be a multiple of 8; got K=132", op,
                  problem_size=(M, N, k), A=a_(k=k), B=b_(k=k))
    assert str(err).startswith(op.name) and "smaller A alignment" in str(err)
    n = N + 4
    rejects(r"B is accessed 8 elements at a time along N, so N must be a multiple of 8; got N=36",
            f16_gemm(layout_b=cutlass.RowMajor), problem_size=(M, n, K), B=np.zeros((K, n), np.float16),
            C=c_(n=n), D=c_(n=n))
    rejects(r"C is accessed 8 elements at a time along N, so N must be a multiple of 8; got N=36", op,
            problem_size=(M, n, K), B=b_(n=n), C=c_(n=n), D=c_(n=n))
    m = M + 2
    col = f16_gemm(layout_a=cutlass.ColumnMajor)
    rejects(r"A is accessed 8 elements at a time along M, so M must be a multiple of 8; got M=66", col,
            problem_size=(m, N, K), A=np.zeros((m, K), np.float16, order="F"), C=c_(m=m), D=c_(m=m))
    # Interleaved-32 operands step 32 elements along K.
    n32, t32 = cutlass.ColumnMajorInterleaved32, cutlass.RowMajorInterleaved32
    interleaved = int8_gemm(cutlass.LinearCombinationClamp(cutlass.int8, 8, cutlass.int32, cutlass.float32),
                            (n32, t32, n32), alignment_c=8)
    with pytest.raises(ArgumentError, match=r"A is accessed 32 elements at a time along K, so K must be a multiple "
                                            r"of 32; got K=48"):
        GemmArguments(interleaved, (M, N, 48), np.zeros(M * 48, np.int8), np.zeros(48 * N, np.int8), None,
                      np.zeros(M * N, np.int8))
    assert gpu_calls == []


@pytest.mark.parametrize("problem_size, match", [
    (5, r"^problem_size must be a pycutlass.gemm.GemmCoord\(M, N, K\), got 5$"),
    (None, r"^problem_size must be a pycutlass.gemm.GemmCoord\(M, N, K\), got None$"),
    ((M, N), r"^problem_size must be a pycutlass.gemm.GemmCoord\(M, N, K\), got \(64, 32\)$"),
    ((M, N, K, 1), r"^problem_size must be a pycutlass.gemm.GemmCoord"),
    ((M, N, 1.5), r"^GemmCoord.k must be an integer, got 1.5$"),
    ((M, "32", K), r"^GemmCoord.n must be an integer, got '32'$"),
    ((True, N, K), r"^GemmCoord.m must be an integer, got True$"),
])
def test_bad_problem_size_type(op, gpu_calls, problem_size, match):
    rejects(match, op, problem_size=problem_size)
    assert gpu_calls == []


@pytest.mark.parametrize("problem_size, match", [
    ((-M, N, K), r"^GemmCoord.m must be >= 0, got -64$"),
    ((M, -N, K), r"^GemmCoord.n must be >= 0, got -32$"),
    ((M, N, -8), r"^GemmCoord.k must be >= 0, got -8$"),
])
def test_negative_sizes(op, gpu_calls, problem_size, match):
    rejects(match, op, problem_size=problem_size)
    with pytest.raises(ArgumentError, match=match):
        GemmCoord(*problem_size)
    assert gpu_calls == []


# --- modes ------------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("gemm_mode", [7, -1, "Gemm", None, 1.5])
def test_invalid_gemm_mode(op, gpu_calls, gemm_mode):
    rejects(r"^gemm_mode must be one of \['Gemm', 'GemmSplitKParallel', 'Batched', 'Array'\], got ", op,
            gemm_mode=gemm_mode)
    assert gpu_calls == []


def test_grouped_mode_is_not_a_gemm_mode(op, gpu_calls):
    rejects(r"^grouped GEMMs use GemmOperationGrouped and GemmGroupedArguments$", op, gemm_mode=Mode.Grouped)
    assert gpu_calls == []



@pytest.mark.parametrize("batch", [65536, 70000])
@pytest.mark.parametrize("mode", [Mode.Batched, Mode.Array])
def test_more_batches_than_the_grid_holds_are_refused(batch, mode, gpu_calls):
    # CUTLASS's batched swizzle keeps batch % 65536 grid layers: 65536 would write nothing, 70000 only 4464 batches
    m = n = k = 8
    batched = dict(A=a_(m, k, batch=batch), B=b_(k, n, batch=batch), C=c_(m, n, batch=batch),
                   D=c_(m, n, batch=batch))
    op = f16_gemm(swizzle=cutlass.BatchedIdentitySwizzle)
    rejects(rf"^batch {batch} exceeds 65535: an Sm80-family GEMM runs each batch in its own layer", op,
            problem_size=(m, n, k), gemm_mode=mode, batch=batch, **batched)
    assert gpu_calls == []

def test_bool_gemm_mode_is_rejected(op, gpu_calls):
    rejects(r"^gemm_mode must be one of", op, gemm_mode=True)


def test_mode_split_k_batch_consistency(op, gpu_calls):
    rejects(r"^batch must be 1 in Gemm mode \(use Mode.Batched or Mode.Array\), got 2$", op, batch=2)
    rejects(r"^batch must be 1 in GemmSplitKParallel mode", op, batch=2, gemm_mode=Mode.GemmSplitKParallel,
            split_k_slices=2)
    batched = dict(A=a_(batch=2), B=b_(batch=2), C=c_(batch=2), D=c_(batch=2), batch=2)
    rejects(r"^split_k_slices must be 1 in Batched mode, got 4$", op, gemm_mode=Mode.Batched, split_k_slices=4,
            **batched)
    rejects(r"^split_k_slices must be 1 in Array mode, got 2$", op, gemm_mode=Mode.Array, split_k_slices=2, **batched)
    for name, value in (("split_k_slices", 0), ("split_k_slices", -2), ("split_k_slices", True),
                        ("split_k_slices", 2.0), ("batch", 0), ("batch", "3")):
        rejects(rf"^{name} must be a positive integer, got {value!r}$".replace("(", r"\(").replace(")", r"\)"),
                op, **{name: value})
    # Batched tensors must carry the batch.
    rejects(r"^A: with batch 2 pass a 3-D tensor of shape \(2, 64, 128\)", op, gemm_mode=Mode.Batched, batch=2,
            B=b_(batch=2), C=c_(batch=2), D=c_(batch=2))
    rejects(r"^A: expected shape \(2, 64, 128\), got \(3, 64, 128\)$", op, gemm_mode=Mode.Batched, batch=2,
            A=a_(batch=3), B=b_(batch=2), C=c_(batch=2), D=c_(batch=2))
    rejects(r"^B: 1-D operand has 12288 elements; expected 8192 \(packed \(2, 128, 32\)\)$", op,
            gemm_mode=Mode.Batched, batch=2, A=a_(batch=2), B=b_(batch=3), C=c_(batch=2), D=c_(batch=2))
    assert gpu_calls == []


def test_beta_without_c(op, gpu_calls):
    err = rejects(r"^C is None but beta is 0.5; pass C or set beta to 0$", op, C=None,
                  output_op=op.epilogue_type(1.0, 0.5))
    assert isinstance(err, ValueError)  # ArgumentError is also a ValueError
    rejects(r"^C is None but beta is 1.0", op, C=None, output_op=[1.0, 1.0])
    assert gpu_calls == []


def test_output_op(op, gpu_calls):
    rejects(r"^output_op must come from operation.epilogue_type\(alpha, beta, ...\), got 'alpha'$", op,
            output_op="alpha")
    rejects(r"LinearCombination takes alpha, beta and 0 activation argument\(s\) \[\]; got 1", op,
            output_op=[1.0, 0.0, 0.5])
    leaky = f16_gemm(epilogue=cutlass.LinearCombinationGeneric(cutlass.leaky_relu(cutlass.float32), cutlass.float16, 8))
    rejects(r"LinearCombinationGeneric<leaky_relu> takes alpha, beta and 1 activation argument\(s\) "
            r"\['leaky_alpha'\]; got 0", leaky, output_op=cutlass.epilogue.EpilogueArguments(1.0, 0.0))
    rejects(r"^epilogue arguments must be numbers", op, output_op=["one", 0.0])
    assert gpu_calls == []


def test_fast_linear_combination_clamp_needs_k_at_most_256(gpu_calls):
    fast = int8_gemm(cutlass.FastLinearCombinationClamp(cutlass.int8, 16))
    k = 512
    with pytest.raises(ArgumentError, match=r"^FastLinearCombinationClamp is exact only for K <= 256, got K=512$"):
        GemmArguments(fast, (M, N, k), np.zeros((M, k), np.int8), np.zeros((k, N), np.int8, order="F"), None,
                      np.zeros((M, N), np.int8))
    assert gpu_calls == []


def test_parallel_split_k_needs_a_plain_linear_combination(gpu_calls):
    for epilogue in (cutlass.LinearCombinationGeneric(cutlass.relu(cutlass.float32), cutlass.float16, 8),
                     cutlass.LinearCombinationClamp(cutlass.float16, 8, cutlass.float32, cutlass.float32)):
        with pytest.raises(ArgumentError, match=r"^GemmSplitKParallel writes raw partial sums: build the GEMM with a "
                                                r"LinearCombination epilogue"):
            args(f16_gemm(epilogue=epilogue), gemm_mode=Mode.GemmSplitKParallel, split_k_slices=2)
    assert gpu_calls == []


def test_split_k_with_integer_outputs(gpu_calls):
    """Serial split-K adds every K slice's partial result to what the slice before stored in D: an int8 D rounds and
    clamps each (measured on an H100: 16,547 of 49,152 entries off, by up to 30), an int32 D rounds alpha * partial
    unless alpha is integral. Parallel split-K stores the partials in D's type."""
    ab = dict(A=np.zeros((M, K), np.int8), B=np.zeros((K, N), np.int8, order="F"), C=None)
    clamp8 = int8_gemm(cutlass.LinearCombinationClamp(cutlass.int8, 16, cutlass.int32, cutlass.float32))
    with pytest.raises(ArgumentError, match=r"^serial split-K \(split_k_slices=2\) stores each K slice's partial "
                                            r"result in D, and a int8 D rounds and clamps"):
        GemmArguments(clamp8, (M, N, K), D=np.zeros((M, N), np.int8), split_k_slices=2, **ab)
    plain8 = int8_gemm(cutlass.LinearCombination(cutlass.int8, 16, cutlass.int32, cutlass.float32))
    with pytest.raises(ArgumentError, match=r"^parallel split-K writes its partial sums in the operation's int8"):
        GemmArguments(plain8, (M, N, K), D=np.zeros((M, N), np.int8), gemm_mode=Mode.GemmSplitKParallel,
                      split_k_slices=2, **ab)
    int32 = int8_gemm(cutlass.LinearCombination(cutlass.int32, 4, cutlass.int32, cutlass.float32), alignment_c=4)
    d32 = np.zeros((M, N), np.int32)
    with pytest.raises(ArgumentError, match=r"rounds alpha \* partial to an integer .* with alpha=0.5"):
        GemmArguments(int32, (M, N, K), D=d32, output_op=int32.epilogue_type(0.5, 0.0), split_k_slices=3, **ab)
    assert gpu_calls == []
    # What comes out exact goes on to the GPU: int32 with an integral alpha, split-K 1, parallel int32 partials.
    for extra in (dict(output_op=int32.epilogue_type(2.0, 0.0), split_k_slices=3),
                  dict(output_op=int32.epilogue_type(0.5, 0.0)),
                  dict(gemm_mode=Mode.GemmSplitKParallel, split_k_slices=2)):
        with pytest.raises(NoGpuError):
            GemmArguments(int32, (M, N, K), D=d32, **extra, **ab)
    with pytest.raises(NoGpuError):
        GemmArguments(clamp8, (M, N, K), D=np.zeros((M, N), np.int8), **ab)
    assert len(gpu_calls) == 4


def test_array_mode_lists(op, gpu_calls):
    array = dict(gemm_mode=Mode.Array, batch=2)
    rejects(r"^A: Array mode with batch 2 needs 2 matrices, got 3$", op, A=[a_()] * 3, B=[b_()] * 2, C=None,
            D=[c_()] * 2, **array)
    rejects(r"^D: Array mode with batch 2 needs 2 matrices, got 1$", op, A=[a_()] * 2, B=[b_()] * 2, C=None,
            D=[c_()], **array)
    rejects(r"^B\[1\]: the operation expects float16 elements, got float32$", op, A=[a_()] * 2,
            B=[b_(), b_(dtype=np.float32)], C=None, D=[c_()] * 2, **array)
    rejects(r"^A\[0\]: expected shape \(64, 128\), got \(64, 64\)$", op, A=[a_(k=64), a_()], B=[b_()] * 2, C=None,
            D=[c_()] * 2, **array)
    # Lists belong to Array mode only.
    rejects(r"^A: expected a torch tensor, numpy array", op, A=[a_()])
    assert gpu_calls == []


def test_wrong_operation_and_stream(op, gpu_calls):
    reduction = cutlass.ReductionOperation(cutlass.MatrixCoord(4, 64), td(cutlass.float16, cutlass.RowMajor, 8),
                                           cutlass.float32, count=8)
    with pytest.raises(ArgumentError, match=r"^GemmArguments needs a GemmOperationUniversal, got ReductionOperation$"):
        args(reduction)
    rejects(r"^stream must be None, an int handle, or a torch/cupy stream; got 'default'$", op, stream="default")
    assert gpu_calls == []


# --- device tensors: their geometry is known without a GPU too --------------------------------------------------------
class FakeDeviceArray:
    """A device tensor as seen through ``__cuda_array_interface__``: nothing here is dereferenced."""

    def __init__(self, shape, strides_elements, typestr="<f2", itemsize=2, address=0x7F0000000000):
        self.__cuda_array_interface__ = {
            "shape": tuple(shape), "typestr": typestr, "data": (address, False), "version": 3,
            "strides": tuple(s * itemsize for s in strides_elements)}


def test_device_tensor_shape_dtype_and_stride_checks_need_no_gpu(op, gpu_calls):
    rejects(r"^A: expected shape \(64, 128\), got \(64, 64\)$", op, A=FakeDeviceArray((M, 64), (64, 1)))
    rejects(r"^A: the operation expects float16 elements, got float32$", op,
            A=FakeDeviceArray((M, K), (K, 1), typestr="<f4", itemsize=4))
    rejects(r"^A: a RowMajor operand needs unit stride along its columns", op, A=FakeDeviceArray((M, K), (1, M)))
    rejects(r"^A: leading stride 100 is smaller than the 128 elements of one row; rows would overlap$", op,
            A=FakeDeviceArray((M, K), (100, 1)))
    rejects(r"^A: element type '<u2' is not supported$", op, A=FakeDeviceArray((M, K), (K, 1), typestr="<u2"))
    with pytest.raises(NoGpuError):  # a padded leading dimension that keeps 128-bit alignment is fine
        args(op, A=FakeDeviceArray((M, K), (K + 8, 1)))
    assert len(gpu_calls) == 1


def test_device_tensor_leading_dimension_alignment_is_checked_before_the_gpu(op, gpu_calls):
    rejects(r"^A: leading dimension 132 is not a multiple of the operation's A alignment 8$", op,
            A=FakeDeviceArray((M, K), (K + 4, 1)))


def test_device_tensor_address_alignment_is_checked_before_the_gpu(op, gpu_calls):
    rejects(r"^A: address 0x7f0000000002 is not aligned to the operation's 16-byte vector accesses", op,
            A=FakeDeviceArray((M, K), (K, 1), address=0x7F0000000002))



def test_a_reversed_batch_view_is_refused_for_tma_and_taken_by_the_sm80_family(op, gpu_calls):
    sm90 = cutlass.GemmOperationUniversal(90, cutlass.TileDescription([128, 128, 64], 0, None, cutlass.MathInstruction(
        [64, 128, 16], cutlass.float16, cutlass.float16, cutlass.float32, cutlass.OpClass.TensorOp)),
        td(cutlass.float16, cutlass.RowMajor, 8), td(cutlass.float16, cutlass.ColumnMajor, 8),
        td(cutlass.float16, cutlass.RowMajor, 8), cutlass.LinearCombination(cutlass.float16, 8))
    reversed_a = FakeDeviceArray((2, M, K), (-M * K, K, 1), address=0x7F0000100000)  # a[::-1] of a (2, M, K) array
    batched = dict(A=reversed_a, B=b_(batch=2), C=c_(batch=2), D=c_(batch=2), gemm_mode=Mode.Batched, batch=2)
    rejects(r"^A: batch stride -8192 is negative; TMA addresses memory with positive strides only", sm90, **batched)
    with pytest.raises(NoGpuError, match="test stub"):  # CUTLASS 2.x steps its pointers by a signed batch stride
        args(op, **batched)

def test_batched_column_major_host_operand_as_3d_view(op, gpu_calls):
    column_major_batch = np.zeros((2, N, K), np.float16).transpose(0, 2, 1)  # each matrix column-major, dense
    with pytest.raises(NoGpuError, match="test stub"):
        args(op, A=a_(batch=2), B=column_major_batch, C=c_(batch=2), D=c_(batch=2), gemm_mode=Mode.Batched, batch=2)


def test_keywords_of_another_kind_are_refused_with_what_the_operation_takes(op):
    """SM90 knobs and scales given to Sm80-family operations: an ArgumentError naming them, not a TypeError."""
    import timeit

    from pycutlass.kinds.families.arguments import accepted_keywords
    from pycutlass.kinds.gemm.arguments import GemmArguments

    a = np.zeros((64, 64), np.float16)
    for keywords in ({"raster_order": "along_m"}, {"scale_a": a, "scale_b": a}, {"pdl": True}, {"typo_stream": 1}):
        with pytest.raises(cutlass.ArgumentError, match="takes no '") as found:
            cutlass.GemmArguments(op, cutlass.gemm.GemmCoord(64, 64, 64), a, a.T, a, a, **keywords)
        assert "'output_op'" in str(found.value) and op.name in str(found.value)
    grouped = cutlass.GemmOperationGrouped(80, op.tile_description, op.A, op.B, op.C, op.epilogue_functor)
    with pytest.raises(cutlass.ArgumentError, match="takes no 'alpha', 'scale_a'"):
        cutlass.GemmGroupedArguments(grouped, [cutlass.gemm.GemmCoord(64, 64, 64)], [a], [a.T], [a], [a],
                                     scale_a=[a], alpha=[1.0])
    assert {"output_op", "stream", "bias", "reordered"} <= accepted_keywords(GemmArguments)
    # (cached per class: the check costs a set difference per call with keywords)
    assert timeit.timeit(lambda: accepted_keywords(GemmArguments), number=1000) < 0.05
