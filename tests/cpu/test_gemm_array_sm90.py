"""SM90 GEMM in Array mode without a GPU: ``GemmOperationUniversal(90, ..., array=True)`` builds the pointer-array
kernel (the grouped kind's, run with one size per batch entry), what it rejects, its emission, the arrays its
arguments lay out (lists of matrices, tensors holding the batch, Batched and Gemm), the Array mode of ordinary SM90
operations (tensors run batched; lists are refused with the way out), and one real NVRTC compile."""
from __future__ import annotations

import types

import numpy as np
import pytest

import pycutlass as cutlass
from pycutlass import DescriptionError
from pycutlass import KernelScheduleType as KS
from pycutlass import TileSchedulerType as TS
from pycutlass.gemm import GemmCoord, Mode
from pycutlass.kinds.gemm_array_sm90 import GemmArgumentsArraySm90, GemmOperationArraySm90
from pycutlass.kinds.gemm_sm90 import GemmArgumentsSm90, GemmOperationSm90

from .test_gemm_grouped_sm90 import _FakeTensors, grouped90

D = cutlass.DataType
R, CM = cutlass.RowMajor, cutlass.ColumnMajor


def array90(element=D.float16, layouts=(R, CM, R), out=None, tile=(128, 128, 64), cluster=(1, 1, 1), kernel=KS.Auto,
            functor=None, activation=None, scheduler=TS.Default, acc=D.float32, array=True, **kwargs):
    out = out or element
    math = cutlass.MathInstruction([64, tile[1], 256 // element.bits], element, element, acc,
                                   cutlass.OpClass.TensorOp)
    description = cutlass.TileDescription(list(tile), 0, None, math, cluster_shape=list(cluster),
                                          kernel_schedule=kernel, tile_scheduler=scheduler)
    A = cutlass.TensorDescription(element, layouts[0], 128 // element.bits)
    B = cutlass.TensorDescription(element, layouts[1], 128 // element.bits)
    C = cutlass.TensorDescription(out, layouts[2], 128 // out.bits)
    if functor is None:
        functor = cutlass.LinearCombination(out, C.alignment, acc, D.float32) if activation is None else \
            cutlass.LinearCombinationGeneric(getattr(cutlass, activation)(D.float32), out, C.alignment, acc, D.float32)
    return cutlass.GemmOperationUniversal(90, description, A, B, C, functor, array=array, **kwargs)


def test_array_true_builds_the_pointer_array_kernel():
    op = array90()
    assert type(op) is GemmOperationArraySm90 and isinstance(op, GemmOperationSm90)
    assert isinstance(op, cutlass.GemmOperationUniversal) and op.array and not array90(array=False).array
    assert op.family == "sm90" and op.required_backend == "nvrtc" and op.thread_count == 384
    assert op.kernel_schedule is KS.TmaWarpSpecializedCooperative and op.warp_count == (8, 1, 1)
    assert array90(tile=(64, 128, 64)).kernel_schedule is KS.TmaWarpSpecializedPingpong
    assert op.workspace_bytes(132) == grouped90().workspace_bytes(132)
    positional = cutlass.GemmOperationUniversal(90, op.tile_description, op.A, op.B, op.C, op.epilogue_functor,
                                                cutlass.IdentitySwizzle1, False, None, True)
    assert type(positional) is GemmOperationArraySm90 and positional == op
    assert type(cutlass.kinds.GemmOperationSm90(90, op.tile_description, op.A, op.B, op.C, op.epilogue_functor,
                                                array=True)) is GemmOperationArraySm90


def test_array_true_changes_nothing_for_the_sm80_family():
    """CUTLASS 2.x kernels run Mode.Array as they are: array=True builds the same operation."""
    math = cutlass.MathInstruction([16, 8, 16], D.float16, D.float16, D.float32, cutlass.OpClass.TensorOp)
    tile = cutlass.TileDescription([128, 128, 32], 3, [2, 2, 1], math)
    desc = [cutlass.TensorDescription(D.float16, lay, 8) for lay in (R, CM, R)]
    for cc in (80, 90):
        ops = [cutlass.GemmOperationUniversal(cc, tile, *desc, cutlass.LinearCombination(D.float16, 8), array=a)
               for a in (False, True)]
        assert ops[0].family == "sm80" and ops[0] == ops[1] and ops[0].name == ops[1].name
    with pytest.raises(DescriptionError, match="array must be True or False"):
        cutlass.GemmOperationUniversal(80, tile, *desc, cutlass.LinearCombination(D.float16, 8), array=1)


@pytest.mark.parametrize("kwargs, message", [
    (dict(bias="row"), "bias='row' is not built for the pointer-array kernel"),
    (dict(element=D.int8, acc=D.int32, tile=(128, 128, 128)), "build the operation without array=True"),
    (dict(element=D.float8_e4m3, out=D.float16, tile=(128, 128, 128)), "float16 or bfloat16 operands"),
    (dict(scheduler=TS.StreamK), "group scheduler"),
    (dict(kernel=KS.TmaWarpSpecialized, tile=(64, 128, 64)), "TmaWarpSpecializedPingpong"),
    (dict(tile=(64, 128, 64), kernel=KS.TmaWarpSpecializedCooperative), "tile M must be 128 or 256"),
    (dict(cluster=(2, 2, 1)), "cluster_shape"),
    (dict(functor=cutlass.LinearCombination(D.float16, 8, D.float32, D.float32), out=D.int8), "C must be one of"),
    (dict(visitor=True), "no epilogue visitor"),
])
def test_what_the_pointer_array_kernel_does_not_take_is_rejected(kwargs, message):
    with pytest.raises(DescriptionError, match=message):
        array90(**kwargs)
    with pytest.raises(DescriptionError, match="array must be True"):
        array90(array="yes")


def test_emission_is_the_grouped_pointer_array_kernel():
    """The same template and builder as GemmOperationGrouped(90): only the names differ (and the clamp here). The
    grouped unit adds its device-sizes kernel (<name>_sizes, over Sm90GroupedSizesArgs); the Array kind has no
    device-side sizes, so its unit has neither."""
    op, group = array90(layouts=(CM, R, CM), activation="relu"), grouped90(layouts=(CM, R, CM), activation="relu")
    body, grouped_body = (x.emit_body().replace(x.name, "X").split("\n", 1)[1] for x in (op, group))
    sizes_kernel = "\n\n// Device-side group sizes:"
    assert sizes_kernel in grouped_body and "X_sizes(" in grouped_body
    assert sizes_kernel not in body and "_sizes(" not in body and "SizesArgs" not in body
    assert body == grouped_body[:grouped_body.index(sizes_kernel)] + "\n"
    assert "ptr_bias" not in body and "Sm90RowBroadcast" not in body  # bias=None: CUTLASS's own fusions
    clamp = array90(functor=cutlass.LinearCombinationClamp(D.float16, 8, D.float32, D.float32))
    body = clamp.emit_body()
    for needle in ("KernelPtrArrayTmaWarpSpecializedCooperative", "GroupProblemShape", "LinCombEltAct<"
                   "cutlass::epilogue::thread::Clamp", "numeric_limits<ns::ElementC>::lowest()", "record_tma"):
        assert needle in body, needle
    names = [op.name, clamp.name, array90().name, array90(array=False).name, grouped90().name,
             array90(tile=(64, 128, 64)).name, array90(D.bfloat16).name]
    assert len(set(names)) == len(names) and "_clamp" in clamp.name
    unit = cutlass.emit.emitter.translation_unit([op, array90(array=False), group])
    assert unit.count("namespace pycutlass_sm90 {") == 1 and unit.count("struct Sm90GroupedGemmArgs") == 1
    assert unit.count("struct Sm90GroupedSizesArgs") == 1
    alone = cutlass.emit.emitter.translation_unit([op])
    assert "struct Sm90GroupedGemmArgs" in alone and "Sm90GroupedSizesArgs" not in alone


def _fake_device(monkeypatch, cls=GemmArgumentsArraySm90):
    def materialize(self):
        self.device = types.SimpleNamespace(sm_count=133)
        self.tensors = _FakeTensors()
        self._allocate()

    monkeypatch.setattr(cls, "_materialize", materialize)


def _arrays(args, count):
    blob = args.tensors.uploads[args.device_arrays["problem_sizes"]]
    offsets = {f: a - args.device_arrays["problem_sizes"] for f, a in args.device_arrays.items()}
    found = {"problem_sizes": np.frombuffer(blob, np.int32, 3 * count, offsets["problem_sizes"]).reshape(count, 3)}
    for x in "ABCD":
        found[f"ptr_{x}"] = np.frombuffer(blob, np.uint64, count, offsets[f"ptr_{x}"])
        found[f"ld{x.lower()}"] = np.frombuffer(blob, np.int64, count, offsets[f"ld{x.lower()}"])
    return found


def test_array_arguments_lay_out_one_entry_per_matrix(monkeypatch):
    """Lists of matrices: the size repeated, a pointer per matrix, one leading dimension per operand; C aliases D
    without C; the workspace and the ABI struct (the grouped kernel's)."""
    _fake_device(monkeypatch)
    op = array90(layouts=(CM, R, R), cluster=(2, 1, 1))
    m, n, k, batch = 72, 40, 24, 3
    As = [np.zeros((k, m), np.float16).T for _ in range(batch)]
    Bs = [np.zeros((k, n), np.float16) for _ in range(batch)]
    Ds = [np.zeros((m, n), np.float16) for _ in range(batch)]
    args = cutlass.GemmArguments(op, GemmCoord(m, n, k), As, Bs, None, Ds, op.epilogue_type(2.0, 0.0),
                                 gemm_mode=Mode.Array, batch=batch, swizzle=4)
    assert type(args) is GemmArgumentsArraySm90 and args.sm_count == 132  # whole clusters of 2
    assert args.workspace_bytes == op.workspace_bytes(132) and args.workspace
    arrays = _arrays(args, batch)
    np.testing.assert_array_equal(arrays["problem_sizes"], [[m, n, k]] * batch)
    np.testing.assert_array_equal(arrays["lda"], [m] * batch)
    np.testing.assert_array_equal(arrays["ldb"], [n] * batch)
    np.testing.assert_array_equal(arrays["ldd"], [n] * batch)
    np.testing.assert_array_equal(arrays["ptr_C"], arrays["ptr_D"])
    assert len(set(arrays["ptr_A"])) == batch and len(set(arrays["ptr_D"])) == batch
    abi = args.bind()
    assert (abi.problem_count, abi.sm_count, abi.swizzle, abi.raster_order) == (batch, 132, 4, 1)
    assert abi.workspace == args.workspace and abi.workspace_bytes == args.workspace_bytes
    assert abi.alpha == 2.0 and abi.beta == 0.0 and abi.ptr_A == args.device_arrays["ptr_A"]
    assert args.ptr_D == args.device_arrays["ptr_D"]
    # The grouped kind's struct, bias pointer included (null: no bias here, and the builder never reads it).
    assert type(abi) is type(grouped90()).abi_struct_type and abi.ptr_bias == 0
    assert not hasattr(op, "sizes_symbol")  # no device-sizes kernel in its unit


def test_tensors_holding_the_batch_and_the_other_modes(monkeypatch):
    """A tensor holding the batch gives base + i * batch stride (PyCUTLASS's Array form); Batched the same; Gemm one
    entry."""
    _fake_device(monkeypatch)
    op = array90()
    m, n, k, batch = 64, 32, 16, 4
    A = np.zeros((batch, m, k), np.float16)
    B = np.zeros((batch, n, k), np.float16).transpose(0, 2, 1)  # ColumnMajor
    C = np.zeros((batch, m, n), np.float16)
    for mode in (Mode.Array, Mode.Batched):
        args = cutlass.GemmArguments(op, GemmCoord(m, n, k), A, B, C, C.copy(), op.epilogue_type(1.0, 1.0),
                                     gemm_mode=mode, batch=batch, raster_order="along_n", sm_count=8)
        arrays = _arrays(args, batch)
        assert args.entries == batch and args.sm_count == 8 and args.bind().raster_order == 2
        np.testing.assert_array_equal(np.diff(arrays["ptr_A"].astype(np.int64)), [m * k * 2] * (batch - 1))
        np.testing.assert_array_equal(np.diff(arrays["ptr_C"].astype(np.int64)), [m * n * 2] * (batch - 1))
        np.testing.assert_array_equal(np.diff(arrays["ptr_B"].astype(np.int64)), [n * k * 2] * (batch - 1))
        assert arrays["ldb"][0] == k and arrays["lda"][0] == k and arrays["ldd"][0] == n
    single = cutlass.GemmArguments(op, GemmCoord(m, n, k), A[0], B[0], None, C[0].copy())
    assert single.entries == 1 and single.bind().problem_count == 1
    empty = cutlass.GemmArguments(op, GemmCoord(0, n, k), A[:, :0], B, None, np.zeros((batch, 0, n), np.float16),
                                  gemm_mode=Mode.Array, batch=batch)
    assert empty.device_arrays == {} and empty.workspace == 0  # nothing launches


def test_array_arguments_rules_that_need_no_gpu(monkeypatch):
    _fake_device(monkeypatch)
    op = array90(cluster=(2, 1, 1))
    A = [np.zeros((64, 64), np.float16) for _ in range(2)]
    B = [a.T for a in A]
    size = GemmCoord(64, 64, 64)
    with pytest.raises(cutlass.ArgumentError, match="needs 2 matrices"):
        cutlass.GemmArguments(op, size, A[:1], B, None, A, gemm_mode=Mode.Array, batch=2)
    with pytest.raises(cutlass.ArgumentError, match="stream-K"):
        cutlass.GemmArguments(op, size, A, B, None, A, gemm_mode=Mode.Array, batch=2, decomposition="split_k")
    with pytest.raises(cutlass.ArgumentError, match="stream-K"):
        cutlass.GemmArguments(op, size, A[0], B[0], None, A[0], split_k_slices=2)
    with pytest.raises(cutlass.ArgumentError, match="multiple of the operation's cluster"):
        cutlass.GemmArguments(op, size, A, B, None, A, gemm_mode=Mode.Array, batch=2, sm_count=7)
    with pytest.raises(cutlass.ArgumentError, match="built without a bias"):
        cutlass.GemmArguments(op, size, A, B, None, A, gemm_mode=Mode.Array, batch=2, bias=np.zeros(64, np.float16))
    with pytest.raises(cutlass.ArgumentError, match="K must be at least 1"):
        cutlass.GemmArguments(op, GemmCoord(64, 64, 0), [a[:, :0] for a in A], [b[:0] for b in B], None, A,
                              gemm_mode=Mode.Array, batch=2)
    with pytest.raises(cutlass.ArgumentError, match="GemmSplitKParallel"):
        cutlass.GemmArguments(op, size, A[0], B[0], None, A[0], gemm_mode=Mode.GemmSplitKParallel)


def test_ordinary_sm90_operations_run_tensors_in_array_mode_batched(monkeypatch):
    """Without array=True, Mode.Array with tensors holding the batch is the L mode (as PyCUTLASS's pointer arrays
    were base + i * batch stride); lists of matrices are refused with the way out."""
    _fake_device(monkeypatch, GemmArgumentsSm90)
    op = array90(array=False)
    A = np.zeros((3, 64, 64), np.float16)
    args = cutlass.GemmArguments(op, GemmCoord(64, 64, 64), A, A.transpose(0, 2, 1), A, A.copy(),
                                 gemm_mode=Mode.Array, batch=3)
    assert type(args) is GemmArgumentsSm90 and args.gemm_mode is Mode.Batched and args.batch == 3
    assert args.bind().l == 3 and args.bind().batch_stride_A == 64 * 64
    with pytest.raises(cutlass.ArgumentError, match=r"array=True"):
        cutlass.GemmArguments(op, GemmCoord(64, 64, 64), list(A), A.transpose(0, 2, 1), A, A.copy(),
                              gemm_mode=Mode.Array, batch=3)


@pytest.mark.slow
def test_nvrtc_compiles_an_array_operation_with_its_builder(tmp_path):
    """A real compile (about a minute on two cores): bf16 ping-pong, a 2x1 cluster, column-major C and the clamp."""
    session = cutlass.Session(backend="nvcc", target=90, cache_path=tmp_path / "c.db", progress=False)
    compiler = cutlass.compiler.manager.Compiler.of(session)
    op = array90(D.bfloat16, (CM, R, CM), tile=(64, 128, 64), cluster=(2, 1, 1), kernel=KS.TmaWarpSpecializedPingpong,
                 functor=cutlass.LinearCombinationClamp(D.bfloat16, 8, D.float32, D.float32))
    report = compiler.add_module([op])
    kernel = report[0]
    assert kernel.backend == "nvrtc" and kernel.target == "sm_90a" and "nvrtc" in report.substituted
    assert op.kernel_symbol.encode() in kernel.binary and op.builder_symbol.encode() in kernel.binary
    assert len(kernel.binary) > 100_000  # a real kernel, not an empty stub
    assert (op.name + "_sizes").encode() not in kernel.binary  # the grouped kind's device-sizes kernel: not here
