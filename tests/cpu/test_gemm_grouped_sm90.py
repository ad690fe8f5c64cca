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


@pytest.mark.parametrize("kwargs, message", [
    (dict(tile=(64, 128, 64), kernel=KS.TmaWarpSpecializedCooperative), "tile M must be 128 or 256"),
    (dict(tile=(256, 128, 64), kernel=KS.TmaWarpSpecializedPingpong), "tile M must be 64"),
    (dict(kernel=KS.TmaWarpSpecialized), "pointer-array kernels"),
    (dict(tile=(128, 192, 64)), "tile N must be 64, 128 or 256"),
    (dict(tile=(128, 128, 32)), "128-byte TMA swizzle atom"),
    (dict(cluster=(2, 2, 1)), "cluster_shape"),
    (dict(scheduler=TS.StreamK), "group scheduler"),
    (dict(epilogue=ES.NoSmemWarpSpecialized), "epilogue schedule"),
    (dict(epilogue=ES.TmaWarpSpecialized), "epilogue schedule"),
    (dict(element=D.float8_e4m3, out=D.bfloat16, tile=(128, 128, 128)), "float16 or bfloat16"),
    (dict(acc=D.float16, functor=cutlass.LinearCombination(D.float16, 8, D.float16, D.float32)), "float32"),
    (dict(out=D.int8), "C must be one of"),
    (dict(functor=cutlass.LinearCombinationClamp(D.float16, 8, D.float32, D.float32)), "not built for the SM90 grouped kernel"),
    (dict(mode=cutlass.SchedulerMode.Host), "SchedulerMode.Device"),
    (dict(swizzle=cutlass.BatchedIdentitySwizzle), "swizzling_functor"),
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
