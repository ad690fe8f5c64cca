"""SM90 (CUTLASS 3.x) grouped GEMM without a GPU: which family compute capability 90 picks, CUTLASS's rules as
rejections, emission, the workspace formula, argument checks that need no device, and a real NVRTC compile."""
from __future__ import annotations

import pytest

import pycutlass as cutlass
from pycutlass import DescriptionError
from pycutlass import EpilogueScheduleType as ES
from pycutlass import KernelScheduleType as KS
from pycutlass import TileSchedulerType as TS
from pycutlass.kinds.gemm_grouped_sm90 import GemmGroupedArgumentsSm90, GemmOperationGroupedSm90
from pycutlass.kinds.gemm_grouped_sm90.arguments import _stand_in_ld

D = cutlass.DataType
R, CM = cutlass.RowMajor, cutlass.ColumnMajor


def grouped90(element=D.float16, layouts=(R, CM, R), out=None, tile=(128, 128, 64), cluster=(1, 1, 1),
              kernel=KS.Auto, epilogue=ES.Auto, scheduler=TS.Default, stages=0, warps=None, activation=None,
              acc=D.float32, functor=None, mode=cutlass.SchedulerMode.Device, swizzle=cutlass.IdentitySwizzle1):
    out = out or element
    math = cutlass.MathInstruction([64, tile[1], 256 // element.bits], element, element, acc, cutlass.OpClass.TensorOp)
    description = cutlass.TileDescription(list(tile), stages, warps, math, cluster_shape=list(cluster),
                                          kernel_schedule=kernel, epilogue_schedule=epilogue, tile_scheduler=scheduler)
    A = cutlass.TensorDescription(element, layouts[0], 128 // element.bits)
    B = cutlass.TensorDescription(element, layouts[1], 128 // element.bits)
    C = cutlass.TensorDescription(out, layouts[2], 128 // out.bits)
    if functor is None:
        functor = cutlass.LinearCombination(out, C.alignment, acc, D.float32) if activation is None else \
            cutlass.LinearCombinationGeneric(getattr(cutlass, activation)(D.float32), out, C.alignment, acc, D.float32)
    return cutlass.GemmOperationGrouped(90, description, A, B, C, functor, swizzle, mode)


def test_compute_capability_90_with_an_sm90_tile_builds_the_pointer_array_kernel():
    op = grouped90()
    assert type(op) is GemmOperationGroupedSm90 and isinstance(op, cutlass.GemmOperationGrouped)
    assert op.family == "sm90" and op.required_backend == "nvrtc"
    assert op.kernel_schedule is KS.TmaWarpSpecializedCooperative and op.warp_count == (8, 1, 1)
    assert grouped90(tile=(64, 128, 64)).kernel_schedule is KS.TmaWarpSpecializedPingpong
    assert op.thread_count == 384 and op.transposed is False and op.precompute_symbol is None
    # An Sm80 warp arrangement at 90 keeps the CUTLASS 2.x grouped kernel (PyCUTLASS 2.11 scripts).
    math = cutlass.MathInstruction([16, 8, 16], D.float16, D.float16, D.float32, cutlass.OpClass.TensorOp)
    sm80 = cutlass.GemmOperationGrouped(90, cutlass.TileDescription([128, 128, 32], 3, [2, 2, 1], math), op.A, op.B,
                                        op.C, op.epilogue_functor)
    assert type(sm80) is cutlass.GemmOperationGrouped and sm80.family == "sm80"
    # And the arguments class follows the operation.
    assert type(cutlass.GemmGroupedArguments.__new__(cutlass.GemmGroupedArguments, op)) is GemmGroupedArgumentsSm90
    assert type(cutlass.GemmGroupedArguments.__new__(cutlass.GemmGroupedArguments, sm80)) is \
        cutlass.GemmGroupedArguments


def _other_epilogue():
    """An epilogue functor of a kind no SM90 kernel builds (every real one is either built or rejected earlier)."""
    functor = cutlass.LinearCombination(D.float16, 8, D.float32, D.float32)
    object.__setattr__(functor, "kind", "SomeOtherEpilogue")
    return functor


@pytest.mark.parametrize("kwargs, message", [
    (dict(tile=(64, 128, 64), kernel=KS.TmaWarpSpecializedCooperative), "tile M must be 128 or 256"),
    (dict(tile=(256, 128, 64), kernel=KS.TmaWarpSpecializedPingpong), "tile M must be 64"),
    (dict(kernel=KS.TmaWarpSpecialized), "pointer-array kernels"),
    (dict(tile=(128, 160, 64)), "tile N must be one of \\[64, 128, 192, 256\\]"),
    (dict(element=D.float8_e4m3, out=D.bfloat16, tile=(128, 192, 128)), "tile N must be 64, 128 or 256"),
    (dict(tile=(128, 128, 32)), "128-byte TMA swizzle atom"),
    (dict(cluster=(2, 2, 1)), "cluster_shape"),
    (dict(scheduler=TS.StreamK), "group scheduler"),
    (dict(epilogue=ES.NoSmemWarpSpecialized), "epilogue schedule"),
    (dict(epilogue=ES.TmaWarpSpecialized), "epilogue schedule"),
    (dict(element=D.tfloat32, out=D.float32, tile=(128, 128, 32)), "float16 or bfloat16 operands.*float8"),
    (dict(element=D.float8_e4m3, layouts=(CM, CM, R), out=D.bfloat16, tile=(128, 128, 128)), "K-major only"),
    (dict(element=D.float8_e4m3, layouts=(R, R, R), out=D.bfloat16, tile=(128, 128, 128)), "K-major only"),
    (dict(element=D.float8_e4m3, out=D.bfloat16, tile=(128, 128, 64)), "tile K must be 128"),
    (dict(element=D.float8_e4m3, out=D.float8_e4m3, tile=(128, 128, 128)), "C must be one of"),
    (dict(kernel=KS.TmaWarpSpecializedCooperativeFP8FastAccum), "accumulates fp8 products fast"),
    (dict(element=D.float8_e4m3, out=D.bfloat16, tile=(64, 128, 128),
          kernel=KS.TmaWarpSpecializedCooperativeFP8FastAccum), "tile M must be 128 or 256"),
    (dict(acc=D.float16, functor=cutlass.LinearCombination(D.float16, 8, D.float16, D.float32)), "float32"),
    (dict(out=D.int8), "C must be one of"),
    (dict(functor=_other_epilogue()), "not built for the SM90 grouped kernel.*bias=.column."),
    (dict(mode=cutlass.SchedulerMode.Host), "SchedulerMode.Device"),
    (dict(swizzle=cutlass.StridedDgradIdentitySwizzle1), "swizzling_functor"),
    (dict(warps=[4, 1, 1]), "warp_count is derived"),
    (dict(stages=8, tile=(128, 256, 64)), "shared memory"),
])
def test_cutlass_rules_are_rejected_at_construction(kwargs, message):
    with pytest.raises(DescriptionError, match=message):
        grouped90(**kwargs)


def test_names_are_unique_per_code_changing_field():
    variants = [grouped90(), grouped90(cluster=(2, 1, 1)), grouped90(cluster=(1, 2, 1)),
                grouped90(kernel=KS.TmaWarpSpecializedPingpong), grouped90(tile=(64, 128, 64)),
                grouped90(tile=(256, 128, 64)), grouped90(tile=(128, 256, 64)), grouped90(stages=4),
                grouped90(D.bfloat16), grouped90(out=D.float32), grouped90(layouts=(CM, R, CM)),
                grouped90(activation="relu"), grouped90(activation="gelu")]
    names = [op.name for op in variants]
    assert len(set(names)) == len(names)
    assert grouped90() == grouped90() and grouped90().name == grouped90().name
    swizzled = grouped90(swizzle=cutlass.IdentitySwizzle4)
    assert swizzled.name == grouped90().name and swizzled.default_swizzle == 4  # a runtime default, not code


def test_emission_uses_cutlass_pointer_array_builders_and_reports_prototypes():
    op = grouped90(D.bfloat16, (CM, R, CM), tile=(64, 128, 64), kernel=KS.TmaWarpSpecializedPingpong,
                   cluster=(2, 1, 1), activation="leaky_relu")
    source = op.emit()
    for needle in ("cutlass::gemm::GroupProblemShape<Shape<int, int, int>>",
                   "cutlass::gemm::KernelPtrArrayTmaWarpSpecializedPingpong",
                   "cutlass::epilogue::PtrArrayTmaWarpSpecializedPingpong", "cutlass::layout::ColumnMajor *",
                   "LinCombEltAct<cutlass::epilogue::thread::LeakyReLU", "fusion.activation.leaky_alpha",
                   "__cluster_dims__(2, 1, 1)", "__grid_constant__", "record_tma", "struct TmaRecord",
                   "struct Sm90GroupedGemmArgs", "CUTE_ARCH_DEVICE_MODIFIABLE_TMA_SM90_ENABLED",
                   "get_workspace_size(problem, args.mainloop, a.sm_count)", "is_const_v"):
        assert needle in source, needle
    assert "query_device_multiprocessor_count" not in source  # the host-only SM query is replaced by the glue
    assert source.index("is_const_v") < source.index('#include "cutlass'), "the NVRTC shim precedes CUTLASS's headers"
    sm90_gemm = cutlass.GemmOperationUniversal(90, op.tile_description, op.A, op.B, op.C, op.epilogue_functor)
    unit = cutlass.emit.emitter.translation_unit([op, sm90_gemm, grouped90()])
    assert unit.count("namespace pycutlass_sm90 {") == 1  # the TMA-record helpers once per unit


def test_workspace_is_per_sm_tensormap_slots():
    op = grouped90()
    # C and two D (one per consumer warpgroup) in the epilogue, A and B in the main loop: 128 bytes each, per SM.
    assert op.workspace_bytes(132) == 5 * 128 * 132
    assert op.workspace_bytes(1) == 3 * 128 + 2 * 128
    with pytest.raises(DescriptionError, match="sm_count"):
        op.workspace_bytes(0)
    assert op.empty_k_stand_in == 8 and grouped90(out=D.float32).empty_k_stand_in == 8


def test_empty_k_stand_in_leading_dimensions():
    """K = 0 groups read a zeroed M x 8 (A) and 8 x N (B) matrix: ld 8 when K is contiguous, else M/N rounded up."""
    tn = grouped90(layouts=(R, CM, R))
    assert _stand_in_ld(tn, "A", 100, 36) == 8 and _stand_in_ld(tn, "B", 100, 36) == 8
    nt = grouped90(layouts=(CM, R, R))
    assert _stand_in_ld(nt, "A", 100, 36) == 104 and _stand_in_ld(nt, "B", 100, 36) == 40


def test_arguments_rules_that_need_no_gpu():
    import numpy as np

    op = grouped90()
    a = np.zeros((64, 64), np.float16)
    problems = [(64, 64, 64)]
    for kwargs, message in ((dict(raster_order="diagonal"), "raster_order"), (dict(swizzle=3), "swizzle"),
                            (dict(sm_count=0), "sm_count"), (dict(sm_count=True), "sm_count")):
        with pytest.raises(cutlass.ArgumentError, match=message):
            cutlass.GemmGroupedArguments(op, problems, [a], [a.T], [a], [a], **kwargs)
    with pytest.raises(cutlass.ArgumentError, match="cluster"):
        cutlass.GemmGroupedArguments(grouped90(cluster=(2, 1, 1)), problems, [a], [a.T], [a], [a], sm_count=7)
    with pytest.raises(cutlass.ArgumentError, match="C broadcast"):
        cutlass.GemmGroupedArguments(op, problems, [a], [a.T], [np.zeros(64, np.float16)], [a],
                                     op.epilogue_type(1.0, 1.0))
    with pytest.raises(cutlass.ArgumentError, match="multiple of 8"):
        cutlass.GemmGroupedArguments(op, [(64, 60, 64)], [a], [np.zeros((64, 60), np.float16, order="F")],
                                     None, [np.zeros((64, 60), np.float16)])
    with pytest.raises(cutlass.ArgumentError, match="Cs\\[0\\] is None but beta"):
        cutlass.GemmGroupedArguments(op, problems, [a], [a.T], None, [a], op.epilogue_type(1.0, 0.5))


def test_target_is_sm_90a_and_the_backend_is_nvrtc(tmp_path):
    session = cutlass.Session(backend="nvcc", target=90, cache_path=tmp_path / "c.db")
    compiler = cutlass.compiler.manager.Compiler.of(session)
    op = grouped90()
    assert compiler.target_for(op).name == "sm_90a"
    assert compiler.backend_for(op).name == "nvrtc"


@pytest.mark.slow
def test_nvrtc_compiles_an_sm90_grouped_operation_with_its_builder(tmp_path):
    """A real compile (about 50 s on two cores): the cubin carries the kernel and the Params builder."""
    session = cutlass.Session(backend="nvcc", target=90, cache_path=tmp_path / "c.db", progress=False)
    compiler = cutlass.compiler.manager.Compiler.of(session)
    op = grouped90()
    report = compiler.add_module([op])
    kernel = report[0]
    assert kernel.backend == "nvrtc" and kernel.target == "sm_90a" and "nvrtc" in report.substituted
    assert op.kernel_symbol.encode() in kernel.binary and op.builder_symbol.encode() in kernel.binary
    assert len(kernel.binary) > 100_000  # a real kernel, not an empty stub


@pytest.mark.slow
def test_nvrtc_compiles_a_clamping_sm90_grouped_operation(tmp_path):
    """A real compile of the clamp in the grouped unit (ping-pong, bf16; with its device-sizes kernel)."""
    session = cutlass.Session(backend="nvrtc", target=90, cache_path=tmp_path / "c.db", progress=False)
    compiler = cutlass.compiler.manager.Compiler.of(session)
    op = grouped90(D.bfloat16, tile=(64, 128, 64), kernel=KS.TmaWarpSpecializedPingpong,
                   functor=cutlass.LinearCombinationClamp(D.bfloat16, 8, D.float32, D.float32))
    kernel = compiler.add_module([op])[0]
    for symbol in (op.kernel_symbol, op.builder_symbol, op.sizes_symbol):
        assert symbol.encode() in kernel.binary, symbol
    assert len(kernel.binary) > 100_000


class _FakeTensors:
    """Stands in for DeviceTensors: hands out distinct fake addresses and keeps what is uploaded."""

    def __init__(self):
        self.next, self.uploads = 1 << 20, {}

    def _new(self, nbytes):
        address, self.next = self.next, self.next + (nbytes + 511) // 256 * 256
        return address

    def address(self, info, is_output=False):
        return self._new(max(info.numel * info.itemsize, 1))

    def upload(self, data):
        address = self._new(len(data))
        self.uploads[address] = bytes(data)
        return address

    def zeros(self, nbytes):
        return self._new(nbytes)

    allocate = zeros


def test_arguments_lay_out_the_group_arrays(monkeypatch):
    """What the kernel reads, built without a GPU: sizes (K = 0 runs as K = 8 on the stand-in), pointers, leading
    dimensions (C aliases D without C), the workspace, and the ABI struct."""
    import types

    import numpy as np

    def materialize(self):
        self.device = types.SimpleNamespace(sm_count=133)
        self.tensors = _FakeTensors()
        self._allocate()

    monkeypatch.setattr(GemmGroupedArgumentsSm90, "_materialize", materialize)
    op = grouped90(layouts=(CM, R, R), cluster=(2, 1, 1))
    problems = [(64, 32, 16), (0, 32, 16), (40, 24, 0)]
    As = [np.zeros((k, m), np.float16).T for m, n, k in problems]
    Bs = [np.zeros((k, n), np.float16) for m, n, k in problems]
    Ds = [np.zeros((m, n), np.float16) for m, n, k in problems]
    args = cutlass.GemmGroupedArguments(op, problems, As, Bs, None, Ds, op.epilogue_type(2.0, 0.0), swizzle=4)
    assert type(args) is GemmGroupedArgumentsSm90
    assert args.sm_count == 132  # rounded down to whole clusters of 2
    assert args.workspace_bytes == op.workspace_bytes(132) and args.workspace
    blob = args.tensors.uploads[args.device_arrays["problem_sizes"]]
    offsets = {f: a - args.device_arrays["problem_sizes"] for f, a in args.device_arrays.items()}

    def array(field, dtype, count):
        return np.frombuffer(blob, dtype, count, offsets[field])

    np.testing.assert_array_equal(array("problem_sizes", np.int32, 9).reshape(3, 3),
                                  [[64, 32, 16], [0, 32, 16], [40, 24, 8]])
    # Column-major A: ld = M, row-major B: ld = N, for the K = 0 stand-in too (M or N rounded to the alignment).
    np.testing.assert_array_equal(array("lda", np.int64, 3)[[0, 2]], [64, 40])
    np.testing.assert_array_equal(array("ldb", np.int64, 3)[[0, 2]], [32, 24])
    np.testing.assert_array_equal(array("ldd", np.int64, 3), [32, 32, 24])
    np.testing.assert_array_equal(array("ldc", np.int64, 3), array("ldd", np.int64, 3))
    np.testing.assert_array_equal(array("ptr_C", np.uint64, 3), array("ptr_D", np.uint64, 3))  # C aliases D
    a_ptr, b_ptr = array("ptr_A", np.uint64, 3), array("ptr_B", np.uint64, 3)
    assert a_ptr[2] == b_ptr[2] != 0 and a_ptr[0] != a_ptr[2]  # the K = 0 group reads the zeroed stand-in
    abi = args.bind()
    assert (abi.problem_count, abi.sm_count, abi.swizzle, abi.raster_order) == (3, 132, 4, 1)
    assert abi.workspace == args.workspace and abi.workspace_bytes == args.workspace_bytes
    assert abi.alpha == 2.0 and abi.beta == 0.0 and abi.lda == args.device_arrays["lda"]


# --- per-group bias and device-side sizes -------------------------------------------------------------------------
def test_bias_is_column_only_and_sm90_only():
    op = grouped90(activation="gelu")
    biased = cutlass.GemmOperationGrouped(90, op.tile_description, op.A, op.B, op.C, op.epilogue_functor, bias="column")
    assert biased.bias == "column" and biased.name != op.name and biased != op
    for bias, message in (("row", "bias='row'.*not built"), (True, "bias=True"), ("both", "None or 'column'")):
        with pytest.raises(DescriptionError, match=message):
            cutlass.GemmOperationGrouped(90, op.tile_description, op.A, op.B, op.C, op.epilogue_functor, bias=bias)
    math = cutlass.MathInstruction([16, 8, 16], D.float16, D.float16, D.float32, cutlass.OpClass.TensorOp)
    with pytest.raises(DescriptionError, match="SM90 grouped kernel"):
        cutlass.GemmOperationGrouped(90, cutlass.TileDescription([128, 128, 32], 3, [2, 2, 1], math), op.A, op.B,
                                     op.C, op.epilogue_functor, bias="column")


def test_bias_emission_is_a_pointer_array_tree_and_every_unit_has_the_sizes_kernel():
    base = grouped90(activation="leaky_relu")
    op = cutlass.GemmOperationGrouped(90, base.tile_description, base.A, base.B, base.C, base.epilogue_functor,
                                      bias="column")
    source = op.emit()
    for needle in ("evt::Sm90RowBroadcast<0, TileShape, ElementBias *", "Sm90ScalarBroadcastPtrArray",
                   "cutlass::epilogue::thread::LeakyReLU", "scaled.op_2.ptr_row",
                   "tree.op_1.leaky_alpha", f"{op.name}_sizes(pycutlass_abi::Sm90GroupedSizesArgs a)",
                   "struct Sm90GroupedSizesArgs", "atomicOr"):
        assert needle in source, needle
    assert op.launch_plan()["sizes"] == op.sizes_symbol == op.name + "_sizes"
    plain = grouped90().emit()
    assert "Sm90RowBroadcast" not in plain and "_sizes(pycutlass_abi::Sm90GroupedSizesArgs a)" in plain


class _FakeDeviceTensor:
    """A device tensor by __cuda_array_interface__ only (no GPU is touched without _attach_device)."""

    _next = 1 << 32

    def __init__(self, shape, typestr="<f2", strides=None):
        itemsize = int(typestr[2:])
        self.__cuda_array_interface__ = {"shape": tuple(shape), "typestr": typestr, "version": 3,
                                         "strides": None if strides is None else tuple(s * itemsize for s in strides),
                                         "data": (_FakeDeviceTensor._next, False)}
        self.address = _FakeDeviceTensor._next
        count = 1
        for extent in shape:
            count *= extent
        _FakeDeviceTensor._next += (count * itemsize + 4095) // 4096 * 4096 + 4096


def _fake_device(monkeypatch):
    import types

    def attach(self, infos):
        self.device = types.SimpleNamespace(sm_count=132)
        self.tensors = _FakeTensors()
        self.tensors.address = lambda info, is_output=False: info.device_address if info.kind == "device" else \
            _FakeTensors._new(self.tensors, info.numel * info.itemsize)

    monkeypatch.setattr(GemmGroupedArgumentsSm90, "_attach_device", attach)
    monkeypatch.setattr(GemmGroupedArgumentsSm90, "_prepare", lambda self: None)


def test_device_sizes_lay_out_the_sizes_kernel_inputs(monkeypatch):
    """Packed A/D, a (groups, K, N) B and a (groups, N) bias: the host side of the device-sizes path."""
    import numpy as np

    _fake_device(monkeypatch)
    op = grouped90(D.float16, (R, CM, R), activation="silu")  # (no bfloat16 in __cuda_array_interface__)
    op = cutlass.GemmOperationGrouped(90, op.tile_description, op.A, op.B, op.C, op.epilogue_functor, bias="column")
    groups, rows, n, k = 5, 300, 64, 128
    sizes = _FakeDeviceTensor((groups, 3), "<i4")
    A, D_ = _FakeDeviceTensor((rows, k)), _FakeDeviceTensor((rows, n))
    B = _FakeDeviceTensor((groups, k, n), strides=(n * k, 1, k))  # column-major matrices, (G, N, K).transpose(1, 2)
    bias = _FakeDeviceTensor((groups, n))
    args = cutlass.GemmGroupedArguments(op, sizes, A, B, None, D_, op.epilogue_type(1.0, 0.0), bias=bias)
    assert args.device_sizes and args.group_count == groups and args.tile_count is None
    assert args.problem_sizes is sizes and args.workspace_bytes == op.workspace_bytes(132)
    s = args._sizes_struct
    assert (s.group_count, s.columns, s.rows_cap, s.n_cap, s.k_cap) == (groups, 3, rows, n, k)
    assert (s.a_base, s.d_base, s.c_base) == (A.address, D_.address, 0)  # no C: C aliases D on the device
    assert (s.a_row_bytes, s.d_row_bytes, s.lda_value, s.ldb_value) == (2 * k, 2 * n, k, k)
    assert (s.align_n, s.align_k, s.contiguous) == (8, 8, 3) and s.stand_in and s.k_stand_in == 8
    assert s.sizes == sizes.address and s.flags == args._flags
    blob = args.tensors.uploads[args.device_arrays["problem_sizes"]]
    base = args.device_arrays["problem_sizes"]

    def array(field, dtype):
        return np.frombuffer(blob, dtype, groups, args.device_arrays[field] - base)

    np.testing.assert_array_equal(array("b_pointers", np.uint64), B.address + np.arange(groups) * n * k * 2)
    np.testing.assert_array_equal(array("ptr_bias", np.uint64), bias.address + np.arange(groups) * n * 2)
    np.testing.assert_array_equal(array("ldd", np.int64), [n] * groups)
    abi = args.bind()
    assert abi.problem_count == groups and abi.ptr_bias == args.device_arrays["ptr_bias"]
    assert abi.problem_sizes == s.problem_sizes and abi.ptr_A == s.ptr_A and abi.ldb == s.ldb
    # M only: N and K are the bounds, and K is then never 0 (no stand-in).
    counts = _FakeDeviceTensor((groups,), "<i4")
    args = cutlass.GemmGroupedArguments(op, counts, [A], B, None, [D_], op.epilogue_type(1.0, 0.0),
                                        bias=[_FakeDeviceTensor((n,)) for _ in range(groups)])
    assert args._sizes_struct.columns == 1 and args._sizes_struct.stand_in == 0


@pytest.mark.parametrize("layout_b", ["column", "row"])
def test_the_empty_k_stand_in_covers_a_and_b_at_their_bounds(monkeypatch, layout_b):
    """K = 0 groups on device sizes read A (rows x K') and B (K' x N) from one zeroed stand-in: it holds the larger,
    also where N is far above the rows (a masked slab of 20 rows, N 240: B's 240 columns of K' used to read past
    it)."""
    _fake_device(monkeypatch)
    sizes_seen = []
    real_zeros = _FakeTensors.zeros
    monkeypatch.setattr(_FakeTensors, "zeros", lambda self, nbytes: sizes_seen.append(nbytes) or real_zeros(self, nbytes))
    op = grouped90(D.float16, (R, CM if layout_b == "column" else R, R))
    groups, capacity, n, k = 3, 20, 240, 64
    sizes = _FakeDeviceTensor((groups, 3), "<i4")
    A, D_ = _FakeDeviceTensor((groups, capacity, k)), _FakeDeviceTensor((groups, capacity, n))
    B = _FakeDeviceTensor((groups, k, n), strides=(n * k, 1, k) if layout_b == "column" else None)
    args = cutlass.GemmGroupedArguments(op, sizes, A, B, None, D_, op.epilogue_type(1.0, 0.0))
    s = args._sizes_struct
    assert args.masked and s.stand_in and s.k_stand_in == 8
    b_extent = s.k_stand_in * n if layout_b == "column" else s.k_stand_in * s.stand_in_ldb
    assert s.stand_in_ldb == (8 if layout_b == "column" else n)
    assert max(sizes_seen) >= 2 * max(b_extent, s.k_stand_in * capacity)  # bytes of float16


def test_the_sizes_kernel_block_is_as_wide_as_the_groups():
    """One warp for a few groups, the next power of two beyond, at most the template's 1024 threads (then each
    thread takes several groups)."""
    op = grouped90()
    widths = {groups: op.sizes_block(groups) for groups in (0, 1, 8, 32, 33, 128, 129, 1024, 1025, 5000)}
    assert widths == {0: 32, 1: 32, 8: 32, 32: 32, 33: 64, 128: 128, 129: 256, 1024: 1024, 1025: 1024, 5000: 1024}
    assert op.sizes_threads == 1024


def test_device_sizes_rules(monkeypatch):
    import numpy as np

    _fake_device(monkeypatch)
    op = grouped90()
    rows, n, k = 64, 64, 64
    A, D_ = _FakeDeviceTensor((rows, k)), _FakeDeviceTensor((rows, n))
    B = _FakeDeviceTensor((3, k, n), strides=(n * k, 1, k))
    sizes = _FakeDeviceTensor((3, 3), "<i4")
    ok = dict(As=A, Bs=B, Cs=None, Ds=D_)

    def build(sizes=sizes, operation=op, **changes):
        kwargs = {**ok, **changes}
        return cutlass.GemmGroupedArguments(operation, sizes, kwargs["As"], kwargs["Bs"], kwargs["Cs"], kwargs["Ds"],
                                            operation.epilogue_type(1.0, kwargs.get("beta", 0.0)))

    build()
    for bad, message in ((np.zeros((3, 3), np.int32), "device memory"),
                         (_FakeDeviceTensor((3, 3), "<f4"), "int32"),
                         (_FakeDeviceTensor((3, 2), "<i4"), "shape \\(groups, 3\\)"),
                         (_FakeDeviceTensor((3, 3), "<i4", strides=(1, 3)), "contiguous"),
                         (_FakeDeviceTensor((0, 3), "<i4"), "at least one group")):
        with pytest.raises(cutlass.ArgumentError, match=message):
            build(bad)
    with pytest.raises(cutlass.ArgumentError, match="must be RowMajor"):
        build(operation=grouped90(layouts=(CM, CM, R)))
    with pytest.raises(cutlass.ArgumentError, match="one packed tensor"):
        build(As=[A, A])
    with pytest.raises(cutlass.ArgumentError, match="expected shape \\(64"):
        build(Ds=_FakeDeviceTensor((rows + 8, n)))
    with pytest.raises(cutlass.ArgumentError, match="host tensor"):
        build(As=np.zeros((rows, k), np.float16))
    with pytest.raises(cutlass.ArgumentError, match="Cs is None but beta"):
        build(beta=0.5)
    with pytest.raises(cutlass.ArgumentError, match="2 matrices but problem_sizes has 3"):
        build(Bs=[_FakeDeviceTensor((k, n), strides=(1, k))] * 2)
    with pytest.raises(cutlass.ArgumentError, match="multiples of the operation's alignment"):
        build(As=_FakeDeviceTensor((rows, 60)), Bs=_FakeDeviceTensor((3, 60, n), strides=(n * 60, 1, 60)))
    biased = cutlass.GemmOperationGrouped(90, op.tile_description, op.A, op.B, op.C, op.epilogue_functor,
                                          bias="column")
    with pytest.raises(cutlass.ArgumentError, match="pass them as bias="):
        build(operation=biased)
    with pytest.raises(cutlass.ArgumentError, match="built without a bias"):
        cutlass.GemmGroupedArguments(op, sizes, A, B, None, D_, bias=_FakeDeviceTensor((3, n)))
    with pytest.raises(cutlass.ArgumentError, match="C's element type"):
        cutlass.GemmGroupedArguments(biased, sizes, A, B, None, D_, bias=_FakeDeviceTensor((3, n), "<f4"))
    with pytest.raises(cutlass.ArgumentError, match="N >= 64"):
        cutlass.GemmGroupedArguments(biased, sizes, A, B, None, D_, bias=_FakeDeviceTensor((3, n - 8)))


def test_masked_layout_lays_out_one_slab_per_group(monkeypatch):
    """A 3-D A, C and D (groups, capacity, columns): each group's rows start its slab (byte strides per operand,
    padded slabs included) and the capacity bounds every count; packed operands keep group_rows 0."""
    _fake_device(monkeypatch)
    op = grouped90(D.float16, (R, CM, R))
    groups, capacity, n, k = 4, 256, 64, 128
    counts = _FakeDeviceTensor((groups,), "<i4")
    A = _FakeDeviceTensor((groups, capacity, k))
    D_ = _FakeDeviceTensor((groups, capacity, n), strides=((capacity + 8) * n, n, 1))  # padded slabs
    C = _FakeDeviceTensor((groups, capacity, n))
    B = _FakeDeviceTensor((groups, k, n), strides=(n * k, 1, k))
    args = cutlass.GemmGroupedArguments(op, counts, A, B, C, D_, op.epilogue_type(1.0, 0.5))
    s = args._sizes_struct
    assert args.masked and args.device_sizes and args.group_count == groups
    assert (s.group_rows, s.rows_cap, s.n_cap, s.k_cap, s.columns) == (capacity, capacity, n, k, 1)
    assert (s.a_group_bytes, s.c_group_bytes, s.d_group_bytes) == (2 * capacity * k, 2 * capacity * n,
                                                                   2 * (capacity + 8) * n)
    assert (s.a_base, s.c_base, s.d_base) == (A.address, C.address, D_.address)
    assert (s.a_row_bytes, s.d_row_bytes, s.lda_value) == (2 * k, 2 * n, k)
    packed = cutlass.GemmGroupedArguments(op, counts, _FakeDeviceTensor((300, k)), B, None,
                                          _FakeDeviceTensor((300, n)), op.epilogue_type(1.0, 0.0))
    assert not packed.masked and packed._sizes_struct.group_rows == 0 and packed._sizes_struct.d_group_bytes == 0


def test_masked_layout_rules(monkeypatch):
    _fake_device(monkeypatch)
    op = grouped90(D.float16, (R, CM, R))
    groups, capacity, n, k = 3, 128, 64, 64
    counts = _FakeDeviceTensor((groups,), "<i4")
    A, D_ = _FakeDeviceTensor((groups, capacity, k)), _FakeDeviceTensor((groups, capacity, n))
    B = _FakeDeviceTensor((groups, k, n), strides=(n * k, 1, k))

    def build(**changes):
        kwargs = {"As": A, "Ds": D_, "Cs": None, **changes}
        return cutlass.GemmGroupedArguments(op, counts, kwargs["As"], B, kwargs["Cs"], kwargs["Ds"],
                                            op.epilogue_type(1.0, 0.0))

    assert build().masked
    for changes, message in (({"Ds": _FakeDeviceTensor((groups * capacity, n))}, "\\(groups, capacity, columns\\)"),
                             ({"Ds": _FakeDeviceTensor((groups, capacity - 8, n))}, "= \\(3, 128, columns\\)"),
                             ({"As": _FakeDeviceTensor((groups + 1, capacity, k))}, "\\(3, capacity, columns\\)"),
                             ({"Cs": _FakeDeviceTensor((groups, capacity, n + 8))}, "\\(3, 128, 64\\)"),
                             ({"Ds": _FakeDeviceTensor((groups, capacity, n), strides=(n * 64, n, 1))}, "overlap"),
                             ({"Ds": _FakeDeviceTensor((groups, capacity, n), strides=(capacity * n + 4, n, 1))},
                              "16-byte aligned"),
                             ({"As": _FakeDeviceTensor((groups, capacity, k), "<f4")}, "expects float16")):
        with pytest.raises(cutlass.ArgumentError, match=message):
            build(**changes)


def test_host_sizes_take_a_bias_per_group(monkeypatch):
    import numpy as np

    _fake_device(monkeypatch)
    op = grouped90()
    op = cutlass.GemmOperationGrouped(90, op.tile_description, op.A, op.B, op.C, op.epilogue_functor, bias="column")
    problems = [(64, 32, 16), (8, 16, 16)]
    As = [np.zeros((m, k), np.float16) for m, n, k in problems]
    Bs = [np.zeros((k, n), np.float16, order="F") for m, n, k in problems]
    Ds = [np.zeros((m, n), np.float16) for m, n, k in problems]
    args = cutlass.GemmGroupedArguments(op, problems, As, Bs, None, Ds, bias=[np.zeros(32, np.float16),
                                                                              np.zeros(16, np.float16)])
    assert not args.device_sizes and args.bind().ptr_bias == args.device_arrays["ptr_bias"] != 0
    with pytest.raises(cutlass.ArgumentError, match="group 1 has N = 16 but its bias has 8"):
        cutlass.GemmGroupedArguments(op, problems, As, Bs, None, Ds, bias=[np.zeros(32, np.float16),
                                                                           np.zeros(8, np.float16)])
    args = cutlass.GemmGroupedArguments(op, problems, As, Bs, None, Ds, bias=np.zeros((2, 32), np.float16))
    assert args.bind().ptr_bias


@pytest.mark.slow
def test_nvrtc_compiles_a_biased_sm90_grouped_operation(tmp_path):
    """A real compile of the bias tree (and the sizes kernel, in every SM90 grouped unit)."""
    _compile_with_a_bias(tmp_path, grouped90(D.bfloat16, activation="gelu"))


def _compile_with_a_bias(tmp_path, base) -> None:
    """NVRTC-compiles ``base`` with bias="column"; the cubin must hold the kernel, its builder and the sizes kernel."""
    session = cutlass.Session(backend="nvrtc", target=90, cache_path=tmp_path / "c.db", progress=False)
    compiler = cutlass.compiler.manager.Compiler.of(session)
    op = cutlass.GemmOperationGrouped(90, base.tile_description, base.A, base.B, base.C, base.epilogue_functor,
                                      bias="column")
    kernel = compiler.add_module([op])[0]
    for symbol in (op.kernel_symbol, op.builder_symbol, op.sizes_symbol):
        assert symbol.encode() in kernel.binary, symbol
    assert len(kernel.binary) > 100_000


def test_clamp_is_built_without_a_bias_and_rejected_with_one():
    """LinearCombinationClamp runs through CUTLASS's LinCombEltAct<Clamp> (as for array=True); the per-group bias is
    pycutlass's own tree, which is not built with the clamp: rejected at construction, saying why."""
    functor = cutlass.LinearCombinationClamp(D.bfloat16, 8, D.float32, D.float32)
    op = grouped90(D.bfloat16, functor=functor)
    assert "_coop_clamp_" in op.name and op.bias is None
    assert op.name not in (grouped90(D.bfloat16).name, grouped90(D.bfloat16, activation="relu").name)
    source = op.emit()
    for needle in ("LinCombEltAct<cutlass::epilogue::thread::Clamp", "fusion.activation.lower_bound",
                   "numeric_limits<ns::ElementC>::max()", f"{op.name}_sizes(pycutlass_abi::Sm90GroupedSizesArgs a)"):
        assert needle in source, needle
    assert "Sm90RowBroadcast" not in source
    with pytest.raises(DescriptionError, match="LinearCombinationClamp with bias='column' is not built.*own epilogue "
                                               "tree"):
        cutlass.GemmOperationGrouped(90, op.tile_description, op.A, op.B, op.C, functor, bias="column")
    with pytest.raises(DescriptionError, match="LinearCombinationClamp clamps to the output type's range"):
        cutlass.LinearCombinationClamp(D.float32, 4, D.float32, D.float32)  # f32 outputs: no clamp (2.x's rule)


def test_grouped_and_array_emission_is_deterministic():
    """The same operations emit the same names and text (each and as one unit), here and in a fresh interpreter
    with another hash seed."""
    import hashlib
    import os
    import subprocess
    import sys

    text = _units()
    assert text == _units()
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, (root, os.environ.get("PYTHONPATH")))),
           "PYTHONHASHSEED": "12345"}
    code = ("import hashlib; from tests.cpu.test_gemm_grouped_sm90 import _units; "
            "print(hashlib.sha256(_units().encode()).hexdigest())")
    fresh = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, cwd=root,
                           check=True)
    assert fresh.stdout.strip() == hashlib.sha256(text.encode()).hexdigest()


def _units() -> str:
    from .test_gemm_array_sm90 import array90

    base = grouped90(activation="gelu")
    ops = [grouped90(), base, grouped90(D.bfloat16, (CM, R, CM), tile=(64, 128, 64)),
           grouped90(functor=cutlass.LinearCombinationClamp(D.float16, 8, D.float32, D.float32)),
           cutlass.GemmOperationGrouped(90, base.tile_description, base.A, base.B, base.C, base.epilogue_functor,
                                        bias="column"),
           array90(), array90(activation="relu"),
           array90(functor=cutlass.LinearCombinationClamp(D.float16, 8, D.float32, D.float32))]
    return "\n".join([op.name for op in ops] + [op.emit() for op in ops] +
                      [cutlass.emit.emitter.translation_unit(ops)])


# --- fp8 operands and per-group alphas ------------------------------------------------------------------------------
def test_fp8_grouped_schedules_names_and_emission():
    """fp8 (any e4m3/e5m2 pair, TN only): Auto takes the fast-accumulation schedule as CUTLASS's builder does; the
    plain schedules keep the main loop's periodic promotion into float32 (CUTLASS's FP8 pointer-array main loop)."""
    auto = grouped90(D.float8_e4m3, out=D.bfloat16, tile=(128, 128, 128))
    assert auto.kernel_schedule is KS.TmaWarpSpecializedCooperativeFP8FastAccum and auto.warp_count == (8, 1, 1)
    assert grouped90(D.float8_e4m3, out=D.float16, tile=(64, 128, 128)).kernel_schedule is \
        KS.TmaWarpSpecializedPingpongFP8FastAccum
    precise = grouped90(D.float8_e4m3, out=D.bfloat16, tile=(128, 128, 128), kernel=KS.TmaWarpSpecializedCooperative)
    assert precise.kernel_schedule is KS.TmaWarpSpecializedCooperative
    assert "coopfa" in auto.name and "coopfa" not in precise.name and auto.name != precise.name
    assert auto.empty_k_stand_in == 16  # one 16-byte vector of fp8
    source, plain = auto.emit(), precise.emit()
    assert "cutlass::gemm::KernelPtrArrayTmaWarpSpecializedCooperativeFP8FastAccum" in source
    assert "cutlass::epilogue::PtrArrayTmaWarpSpecializedCooperative," in source
    assert "cutlass::gemm::KernelPtrArrayTmaWarpSpecializedCooperative>" in plain
    assert "using ElementA = cutlass::float_e4m3_t;" in source
    # A mixed pair: B's type is in the name.
    math = cutlass.MathInstruction([64, 128, 32], D.float8_e4m3, D.float8_e5m2, D.float32, cutlass.OpClass.TensorOp)
    tile = cutlass.TileDescription([128, 128, 128], 0, None, math)
    mixed = cutlass.GemmOperationGrouped(90, tile, cutlass.TensorDescription(D.float8_e4m3, R, 16),
                                         cutlass.TensorDescription(D.float8_e5m2, CM, 16),
                                         cutlass.TensorDescription(D.float16, R, 8),
                                         cutlass.LinearCombination(D.float16, 8, D.float32, D.float32))
    assert "e4m3e5m2" in mixed.name and "using ElementB = cutlass::float_e5m2_t;" in mixed.emit()
    with pytest.raises(DescriptionError, match="B.element is float8_e4m3 but the math instruction multiplies"):
        cutlass.GemmOperationGrouped(90, tile, mixed.A, mixed.A.__class__(D.float8_e4m3, CM, 16), mixed.C,
                                     mixed.epilogue_functor)


def test_per_group_alpha_is_read_from_a_device_vector(monkeypatch):
    """alpha=: a float32 device vector is referenced, host values are uploaded with the group arrays; the builder
    points CUTLASS's scalar broadcast at it with a stride of one per group."""
    import numpy as np

    _fake_device(monkeypatch)
    op = grouped90()
    problems = [(64, 32, 16), (8, 16, 16), (16, 16, 16)]
    As = [np.zeros((m, k), np.float16) for m, n, k in problems]
    Bs = [np.zeros((k, n), np.float16, order="F") for m, n, k in problems]
    Ds = [np.zeros((m, n), np.float16) for m, n, k in problems]
    assert cutlass.GemmGroupedArguments(op, problems, As, Bs, None, Ds).bind().alpha_ptr == 0
    alpha = _FakeDeviceTensor((3,), "<f4")
    args = cutlass.GemmGroupedArguments(op, problems, As, Bs, None, Ds, alpha=alpha)
    assert args.bind().alpha_ptr == alpha.address
    args = cutlass.GemmGroupedArguments(op, problems, As, Bs, None, Ds, alpha=[0.5, 2.0, -1.0])
    address = args.bind().alpha_ptr
    assert address == args.device_arrays["alpha"] != 0
    blob = args.tensors.uploads[args.device_arrays["problem_sizes"]]
    got = np.frombuffer(blob, np.float32, 3, address - args.device_arrays["problem_sizes"])
    np.testing.assert_array_equal(got, [0.5, 2.0, -1.0])
    args = cutlass.GemmGroupedArguments(op, problems, As, Bs, None, Ds, alpha=np.array([1, 2, 3], np.float32))
    assert args.device_arrays["alpha"]
    for bad, message in ((2.0, "one value per group"), ([1.0, 2.0], "expected 3 finite values"),
                         ([1.0, float("nan"), 2.0], "inf/NaN"), (np.array([1, np.inf, 2], np.float32), "inf/NaN"),
                         (_FakeDeviceTensor((3,), "<f8"), "float32"),
                         (_FakeDeviceTensor((4,), "<f4"), "vector of 3 values"),
                         (_FakeDeviceTensor((3,), "<f4", strides=(2,)), "contiguous")):
        with pytest.raises(cutlass.ArgumentError, match=message):
            cutlass.GemmGroupedArguments(op, problems, As, Bs, None, Ds, alpha=bad)
    source = op.emit()
    assert "fusion.alpha_ptr = reinterpret_cast<ns::ElementCompute const *>(a.alpha_ptr);" in source
    assert "cute::get<2>(fusion.dAlpha) = a.alpha_ptr ? 1 : 0;" in source
    biased = cutlass.GemmOperationGrouped(90, op.tile_description, op.A, op.B, op.C, op.epilogue_functor,
                                          bias="column").emit()
    assert "scaled.op_0.scalar_ptrs[0] = reinterpret_cast<ns::ElementCompute const *>(a.alpha_ptr);" in biased


def test_per_group_alpha_with_device_sizes(monkeypatch):
    _fake_device(monkeypatch)
    op = grouped90()
    groups, rows, n, k = 4, 100, 64, 64
    sizes = _FakeDeviceTensor((groups,), "<i4")
    A, D_ = _FakeDeviceTensor((rows, k)), _FakeDeviceTensor((rows, n))
    B = _FakeDeviceTensor((groups, k, n), strides=(n * k, 1, k))
    alpha = _FakeDeviceTensor((groups,), "<f4")
    args = cutlass.GemmGroupedArguments(op, sizes, A, B, None, D_, op.epilogue_type(1.0, 0.0), alpha=alpha)
    assert args.bind().alpha_ptr == alpha.address
    with pytest.raises(cutlass.ArgumentError, match="vector of 4 values"):
        cutlass.GemmGroupedArguments(op, sizes, A, B, None, D_, alpha=_FakeDeviceTensor((3,), "<f4"))


@pytest.mark.slow
def test_nvrtc_compiles_an_fp8_grouped_operation_with_a_bias(tmp_path):
    """A real compile of CUTLASS's fp8 pointer-array main loop (with promotion) under the per-group bias tree."""
    _compile_with_a_bias(tmp_path, grouped90(D.float8_e4m3, out=D.bfloat16, tile=(128, 128, 128),
                                             kernel=KS.TmaWarpSpecializedCooperative, activation="silu"))


# --- row-wise scales ------------------------------------------------------------------------------------------------
def _rowwise(element=D.float8_e4m3, out=D.bfloat16, tile=(128, 128, 128), functor=None, **kwargs):
    op = grouped90(element, out=out, tile=tile, functor=functor)
    return cutlass.GemmOperationGrouped(90, op.tile_description, op.A, op.B, op.C, op.epilogue_functor,
                                        scales="rowwise", **kwargs)


def test_rowwise_scales_rules_names_and_emission():
    op = _rowwise()
    plain = grouped90(D.float8_e4m3, out=D.bfloat16, tile=(128, 128, 128))
    assert op.scales == "rowwise" and plain.scales is None and op.name != plain.name and "_rowscale" in op.name
    source = op.emit()
    assert "Sm90ColBroadcast<0, TileShape, float *" in source and "Sm90RowBroadcast<0, TileShape, float *" in source
    assert "ptr_scale_a" in source and "Sm90ColBroadcast" not in plain.emit()
    assert _rowwise(D.bfloat16, tile=(128, 128, 64)).scales == "rowwise"  # any operand type
    gelu = cutlass.LinearCombinationGeneric(cutlass.gelu(D.float32), D.bfloat16, 8, D.float32, D.float32)
    assert "GELU" in _rowwise(functor=gelu).emit()
    for kwargs, message in ((dict(bias="column"), "with a bias is not built"),):
        with pytest.raises(cutlass.DescriptionError, match=message):
            _rowwise(**kwargs)
    clamp = cutlass.LinearCombinationClamp(D.bfloat16, 8, D.float32, D.float32)
    with pytest.raises(cutlass.DescriptionError, match="LinearCombinationClamp with scales"):
        _rowwise(functor=clamp)
    with pytest.raises(cutlass.DescriptionError, match="scales must be None, 'rowwise' .* or 'blockwise'"):
        cutlass.GemmOperationGrouped(90, op.tile_description, op.A, op.B, op.C, op.epilogue_functor, scales="row")
    sm80 = cutlass.TileDescription([128, 128, 32], 3, [2, 2, 1], cutlass.MathInstruction(
        [16, 8, 16], D.float16, D.float16, D.float32, cutlass.OpClass.TensorOp))
    with pytest.raises(cutlass.DescriptionError, match="scales= is built for the SM90 grouped kernel"):
        cutlass.GemmOperationGrouped(80, sm80, *(cutlass.TensorDescription(D.float16, layout, 8) for layout in
                                                 (R, CM, R)), cutlass.LinearCombination(D.float16, 8, D.float32,
                                                                                        D.float32), scales="rowwise")


def test_rowwise_scales_arguments_point_every_group_at_its_scales(monkeypatch):
    """Host sizes: packed scale_a (offsets = the rows before each group) and a (groups, N) scale_b; device sizes:
    the sizes kernel gets scale_a's base (and the masked layout its stride between groups)."""
    import numpy as np

    _fake_device(monkeypatch)
    op = _rowwise(D.float16, out=D.float16, tile=(128, 128, 64))
    from pycutlass.gemm import GemmCoord

    shapes = [(40, 64, 32), (0, 64, 32), (24, 64, 32)]
    problems = [GemmCoord(*shape) for shape in shapes]
    As = [_FakeDeviceTensor((m, k)) for m, n, k in shapes]
    Bs = [_FakeDeviceTensor((k, n), strides=(1, k)) for m, n, k in shapes]
    Ds = [_FakeDeviceTensor((m, n)) for m, n, k in shapes]
    scale_a, scale_b = _FakeDeviceTensor((64,), "<f4"), _FakeDeviceTensor((3, 64), "<f4")
    args = cutlass.GemmGroupedArguments(op, problems, As, Bs, None, Ds, op.epilogue_type(1.0, 0.0),
                                        scale_a=scale_a, scale_b=scale_b)
    blob = args.tensors.uploads[args.device_arrays["problem_sizes"]]
    base = args.device_arrays["problem_sizes"]

    def array(field):
        return np.frombuffer(blob, np.uint64, 3, args.device_arrays[field] - base)

    np.testing.assert_array_equal(array("ptr_scale_a"), scale_a.address + np.array([0, 40, 40]) * 4)
    np.testing.assert_array_equal(array("ptr_scale_b"), scale_b.address + np.arange(3) * 64 * 4)
    abi = args.bind()
    assert abi.ptr_scale_a == args.device_arrays["ptr_scale_a"] and abi.ptr_scale_b == args.device_arrays["ptr_scale_b"]
    # one vector per group works too; a short one is refused
    args = cutlass.GemmGroupedArguments(op, problems, As, Bs, None, Ds, op.epilogue_type(1.0, 0.0),
                                        scale_a=[_FakeDeviceTensor((m,), "<f4") for m, _, _ in shapes],
                                        scale_b=[_FakeDeviceTensor((64,), "<f4")] * 3)
    for kwargs, message in ((dict(scale_a=_FakeDeviceTensor((63,), "<f4")), "at least 64 values"),
                            (dict(scale_a=_FakeDeviceTensor((64,), "<f2")), "is float32"),
                            (dict(scale_b=_FakeDeviceTensor((3, 56), "<f4")), "N >= 64"),
                            (dict(scale_b=None), "pass both scale_a= .* and scale_b=")):
        given = {"scale_a": scale_a, "scale_b": scale_b, **kwargs}
        with pytest.raises(cutlass.ArgumentError, match=message):
            cutlass.GemmGroupedArguments(op, problems, As, Bs, None, Ds, op.epilogue_type(1.0, 0.0), **given)
    with pytest.raises(cutlass.ArgumentError, match="built without row-wise scales"):
        plain = grouped90()
        cutlass.GemmGroupedArguments(plain, problems, As, Bs, None, Ds, scale_a=scale_a, scale_b=scale_b)

    groups, rows, capacity, n, k = 3, 96, 64, 64, 32
    counts = _FakeDeviceTensor((groups,), "<i4")
    B3 = _FakeDeviceTensor((groups, k, n), strides=(n * k, 1, k))
    packed = cutlass.GemmGroupedArguments(op, counts, _FakeDeviceTensor((rows, k)), B3, None,
                                          _FakeDeviceTensor((rows, n)), op.epilogue_type(1.0, 0.0),
                                          scale_a=_FakeDeviceTensor((rows,), "<f4"), scale_b=scale_b)
    s = packed._sizes_struct
    assert s.ptr_scale_a == packed.device_arrays["ptr_scale_a"] and s.scale_a_group_bytes == 0 and s.scale_a_base
    masked_scale_a = _FakeDeviceTensor((groups, capacity), "<f4", strides=(capacity + 4, 1))
    masked = cutlass.GemmGroupedArguments(op, counts, _FakeDeviceTensor((groups, capacity, k)), B3, None,
                                          _FakeDeviceTensor((groups, capacity, n)), op.epilogue_type(1.0, 0.0),
                                          scale_a=masked_scale_a, scale_b=scale_b)
    s = masked._sizes_struct
    assert (s.scale_a_base, s.scale_a_group_bytes) == (masked_scale_a.address, (capacity + 4) * 4)
    with pytest.raises(cutlass.ArgumentError, match="\\(3, 64\\): a row of capacity scales per group"):
        cutlass.GemmGroupedArguments(op, counts, _FakeDeviceTensor((groups, capacity, k)), B3, None,
                                     _FakeDeviceTensor((groups, capacity, n)), op.epilogue_type(1.0, 0.0),
                                     scale_a=_FakeDeviceTensor((groups * capacity,), "<f4"), scale_b=scale_b)


@pytest.mark.slow
def test_nvrtc_compiles_an_fp8_rowwise_scaled_grouped_operation(tmp_path):
    """A real compile of the row-wise scale tree (fp8 e4m3, bf16 output, with its device-sizes kernel)."""
    session = cutlass.Session(backend="nvrtc", target=90, cache_path=tmp_path / "c.db", progress=False)
    compiler = cutlass.compiler.manager.Compiler.of(session)
    op = _rowwise()
    kernel = compiler.add_module([op])[0]
    for symbol in (op.kernel_symbol, op.builder_symbol, op.sizes_symbol):
        assert symbol.encode() in kernel.binary, symbol
    assert len(kernel.binary) > 100_000
