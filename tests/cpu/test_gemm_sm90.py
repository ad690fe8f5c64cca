"""SM90 (CUTLASS 3.x) GEMM without a GPU: descriptions and CUTLASS's rules as rejections, emission, the argument
checks that need no device, and a real NVRTC compile of one operation (its cubin holds the kernel and builder)."""
from __future__ import annotations

import pytest

import pycutlass as cutlass
from pycutlass import DescriptionError
from pycutlass import EpilogueScheduleType as ES
from pycutlass import KernelScheduleType as KS
from pycutlass import TileSchedulerType as TS

D = cutlass.DataType
R, CM = cutlass.RowMajor, cutlass.ColumnMajor


def sm90(element=D.float16, layouts=(R, CM, R), out=None, acc=D.float32, tile=(128, 128, 64), cluster=(1, 1, 1),
         kernel=KS.Auto, epilogue=ES.Auto, scheduler=TS.Default, stages=0, warps=None, inst=None, functor=None,
         bias=None, align=None):
    out = out or element
    k = {16: 16, 8: 32, 32: 8}[element.bits]
    math = cutlass.MathInstruction(inst or [64, tile[1], k], element, element, acc, cutlass.OpClass.TensorOp)
    description = cutlass.TileDescription(list(tile), stages, warps, math, cluster_shape=list(cluster),
                                          kernel_schedule=kernel, epilogue_schedule=epilogue, tile_scheduler=scheduler)
    memory = D.float32 if element is D.tfloat32 else element
    a_align = align or 128 // memory.bits
    A = cutlass.TensorDescription(memory, layouts[0], a_align)
    B = cutlass.TensorDescription(memory, layouts[1], a_align)
    C = cutlass.TensorDescription(out, layouts[2], 128 // out.bits)
    functor = functor or cutlass.LinearCombination(out, C.alignment, acc, D.float32)
    return cutlass.GemmOperationUniversal(90, description, A, B, C, functor, bias=bias)


def test_compute_capability_90_builds_the_sm90_family():
    op = sm90()
    assert type(op).__name__ == "GemmOperationSm90" and isinstance(op, cutlass.GemmOperationUniversal)
    assert op.family == "sm90" and op.required_backend == "nvrtc"
    assert op.kernel_schedule is KS.TmaWarpSpecializedCooperative  # Auto, as CUTLASS picks it for M = 128
    assert op.epilogue_schedule is ES.TmaWarpSpecializedCooperative
    assert op.warp_count == (8, 1, 1)
    assert sm90(tile=(64, 128, 64)).kernel_schedule is KS.TmaWarpSpecialized
    assert sm90(D.float8_e4m3, out=D.bfloat16, tile=(128, 128, 128)).kernel_schedule is \
        KS.TmaWarpSpecializedCooperativeFP8FastAccum


def test_sm80_warp_arrangements_at_90_build_the_sm80_family():
    """PyCUTLASS 2.11 scripts pass the device's compute capability with Sm80 tiles: they keep their 2.x kernel."""
    math = cutlass.MathInstruction([16, 8, 16], D.float16, D.float16, D.float32, cutlass.OpClass.TensorOp)
    tile = cutlass.TileDescription([128, 128, 64], 3, [2, 2, 1], math)
    desc = [cutlass.TensorDescription(D.float16, lay, 8) for lay in (R, CM, R)]
    op = cutlass.GemmOperationUniversal(90, tile, *desc, cutlass.LinearCombination(D.float16, 8))
    assert op.family == "sm80" and "cutlass::arch::Sm80" in op.emit_body()
    with pytest.raises(DescriptionError, match="warp_count is derived"):
        cutlass.kinds.GemmOperationSm90(90, tile, *desc, cutlass.LinearCombination(D.float16, 8))


def test_sm80_instruction_shapes_and_cutlass_warp_counts_are_accepted():
    """The seed's [16, 8, 16] means "the builder chooses"; warp_count may state CUTLASS's own value."""
    a = sm90(inst=[16, 8, 16], warps=[8, 1, 1])
    b = sm90()
    assert a.emit_body().split("\n", 1)[1] == b.emit_body().split("\n", 1)[1] or a.name != b.name
    sm90(tile=(64, 128, 64), kernel=KS.TmaWarpSpecializedPingpong, warps=[4, 1, 1])


@pytest.mark.parametrize("kwargs, message", [
    (dict(tile=(64, 128, 64), kernel=KS.TmaWarpSpecializedCooperative), "multiple of 128"),
    (dict(tile=(256, 128, 64), kernel=KS.TmaWarpSpecializedPingpong), "tile M must be 64 or 128"),
    (dict(tile=(96, 128, 64)), "tile M must be 64, 128 or 256"),
    (dict(tile=(128, 120, 64)), "tile N must be one of"),
    (dict(tile=(128, 96, 64)), "tile N must be one of"),
    (dict(tile=(128, 128, 128)), "TMA swizzle atom"),
    (dict(tile=(128, 128, 48)), "TMA swizzle atom"),
    (dict(cluster=(3, 1, 1)), "cluster_shape"),
    (dict(cluster=(4, 4, 1)), "cluster_shape"),
    (dict(cluster=(2, 2, 1)), "cluster_shape"),
    (dict(align=16), "16-byte vectors"),
    (dict(cluster=(1, 1, 2)), "cluster_shape"),
    (dict(scheduler=TS.StreamK, kernel=KS.TmaWarpSpecializedPingpong, tile=(64, 128, 64)), "stream-K"),
    (dict(kernel=KS.TmaWarpSpecializedCooperativeFP8FastAccum), "FP8FastAccum"),
    (dict(epilogue=ES.TmaWarpSpecialized), "TmaWarpSpecializedCooperative"),
    (dict(tile=(64, 128, 64), kernel=KS.TmaWarpSpecializedPingpong, epilogue=ES.TmaWarpSpecializedCooperative),
     "needs the cooperative"),
    (dict(stages=8, tile=(128, 256, 64)), "shared memory"),
    (dict(element=D.int8, acc=D.int32, tile=(128, 128, 128), out=D.int8,
          layouts=(R, CM, cutlass.ColumnMajorInterleaved32)), "RowMajor or ColumnMajor"),
    (dict(align=4), "16-byte vectors"),
    (dict(element=D.tfloat32, out=D.float32, tile=(128, 128, 32), layouts=(CM, CM, R)), "K-major"),
    (dict(element=D.float8_e4m3, tile=(128, 128, 128), layouts=(R, R, R), out=D.float16), "K-major"),
    (dict(element=D.int8, acc=D.int32, out=D.float16, tile=(128, 128, 128)), "not supported with int8"),
    (dict(acc=D.int32), "wgmma"),
    (dict(epilogue=ES.NoSmemWarpSpecialized, bias="row"), "NoSmemWarpSpecialized"),
    (dict(bias="rows"), "bias must be"),
])
def test_cutlass_rules_are_rejected_at_construction(kwargs, message):
    with pytest.raises(DescriptionError, match=message):
        sm90(**kwargs)


def test_unsupported_types_and_epilogues_name_the_way_out():
    f64 = cutlass.MathInstruction([8, 8, 4], D.float64, D.float64, D.float64, cutlass.OpClass.TensorOp)
    tile = cutlass.TileDescription([64, 64, 16], 0, None, f64)
    desc = cutlass.TensorDescription(D.float64, R, 1)
    with pytest.raises(DescriptionError, match="compute capability 80"):
        cutlass.GemmOperationUniversal(90, tile, desc, desc, desc, cutlass.LinearCombination(D.float64, 1, D.float64))
    with pytest.raises(DescriptionError, match="float32 has no lowest"):  # CUTLASS 2.x's rule, kept on SM90
        sm90(out=D.float32, functor=cutlass.LinearCombinationClamp(D.float32, 4, D.float32, D.float32))
    with pytest.raises(DescriptionError, match="SM90-only values"):  # an SM90 tile in an Sm80-family kind
        cutlass.GemmOperationGrouped(80, sm90().tile_description, *(sm90().A, sm90().B, sm90().C),
                                     sm90().epilogue_functor)


def test_warpgroup_instruction_table():
    for bad in ([64, 100, 16], [64, 128, 32], [64, 264, 16]):
        with pytest.raises(DescriptionError, match="wgmma"):
            cutlass.MathInstruction(bad, D.float16, D.float16, D.float32, cutlass.OpClass.TensorOp)
    assert cutlass.MathInstruction([64, 256, 16], D.bfloat16, D.bfloat16, D.float32,
                                   cutlass.OpClass.TensorOp).is_warpgroup
    mixed = cutlass.MathInstruction([64, 128, 32], D.float8_e4m3, D.float8_e5m2, D.float32, cutlass.OpClass.TensorOp)
    assert mixed.element_b is D.float8_e5m2


def test_names_are_unique_per_code_changing_field():
    variants = [sm90(), sm90(cluster=(2, 1, 1)), sm90(kernel=KS.TmaWarpSpecializedPingpong),
                sm90(scheduler=TS.StreamK), sm90(stages=4), sm90(bias="row"), sm90(bias="column"),
                sm90(epilogue=ES.NoSmemWarpSpecialized), sm90(tile=(128, 256, 64)), sm90(layouts=(CM, R, CM)),
                sm90(functor=cutlass.LinearCombinationGeneric(cutlass.relu(D.float32), D.float16, 8)),
                sm90(functor=cutlass.LinearCombinationGeneric(cutlass.gelu(D.float32), D.float16, 8)),
                sm90(D.bfloat16), sm90(acc=D.float16,
                                       functor=cutlass.LinearCombination(D.float16, 8, D.float16, D.float32))]
    names = [op.name for op in variants]
    assert len(set(names)) == len(names)
    assert sm90() == sm90() and sm90().name == sm90().name


def test_emission_uses_cutlass_builders_and_reports_tma():
    op = sm90(cluster=(2, 1, 1), scheduler=TS.StreamK, bias="row",
              functor=cutlass.LinearCombinationGeneric(cutlass.leaky_relu(D.float32), D.float16, 8))
    source = op.emit()
    for needle in ("cutlass::gemm::collective::CollectiveBuilder", "cutlass::epilogue::collective::CollectiveBuilder",
                   "LinCombPerRowBiasEltAct", "cutlass::epilogue::thread::LeakyReLU", "StreamKScheduler",
                   "__cluster_dims__(2, 1, 1)", "__grid_constant__", "record_tma", "fusion.activation.leaky_alpha",
                   "StageCountAutoCarveout", "struct TmaRecord", "is_const_v"):
        assert needle in source, needle
    assert source.index("is_const_v") < source.index('#include "cutlass'), "the NVRTC shim must precede CUTLASS's headers"
    two = cutlass.emit.emitter.translation_unit([op, sm90()])
    assert two.count("namespace pycutlass_sm90 {") == 1  # helpers once per unit


def test_arguments_rules_that_need_no_gpu():
    import numpy as np

    from pycutlass.gemm import GemmCoord, Mode

    op = sm90()
    A = np.zeros((64, 64), np.float16)
    with pytest.raises(cutlass.ArgumentError, match="array=True"):  # lists need the pointer-array kernel
        cutlass.GemmArguments(op, GemmCoord(64, 64, 64), [A], [A.T], [A], [A], gemm_mode=Mode.Array)
    with pytest.raises(cutlass.ArgumentError, match="stream-K"):
        cutlass.GemmArguments(op, GemmCoord(64, 64, 64), A, A.T, A, A, split_k_slices=2)
    with pytest.raises(cutlass.ArgumentError, match="raster_order"):
        cutlass.GemmArguments(op, GemmCoord(64, 64, 64), A, A.T, A, A, raster_order="diagonal")
    with pytest.raises(cutlass.ArgumentError, match="swizzle"):
        cutlass.GemmArguments(op, GemmCoord(64, 64, 64), A, A.T, A, A, swizzle=3)
    with pytest.raises(cutlass.ArgumentError, match="stream-K operation"):
        cutlass.GemmArguments(op, GemmCoord(64, 64, 64), A, A.T, A, A, decomposition="split_k")
    with pytest.raises(cutlass.ArgumentError, match="bias=True"):
        cutlass.GemmArguments(op, GemmCoord(64, 64, 64), A, A.T, A, A, bias=True)
    with pytest.raises(cutlass.ArgumentError, match="pass it as bias="):
        cutlass.GemmArguments(sm90(bias="row"), GemmCoord(64, 64, 64), A, A.T, A, A)
    streamk = sm90(scheduler=TS.StreamK)
    with pytest.raises(cutlass.ArgumentError, match="decomposition"):
        cutlass.GemmArguments(streamk, GemmCoord(64, 64, 64), A, A.T, A, A, split_k_slices=2,
                              decomposition="data_parallel")
    with pytest.raises(cutlass.ArgumentError, match="cluster"):
        cutlass.GemmArguments(sm90(cluster=(2, 1, 1)), GemmCoord(64, 64, 64), A, A.T, A, A, sm_count=1)
    with pytest.raises(cutlass.ArgumentError, match="multiple of the operation's cluster of 2"):
        # CUTLASS would size the grid as 7 CTAs: CUDA_ERROR_INVALID_CLUSTER_SIZE at launch (found by fuzz seed 111)
        cutlass.GemmArguments(sm90(cluster=(1, 2, 1)), GemmCoord(64, 64, 64), A, A.T, A, A, sm_count=7)


def test_stream_k_builders_report_the_barriers_and_only_they_are_zeroed(monkeypatch):
    """Stream-K's barriers (the workspace's tail, as the scheduler's fixup addresses them) must start at zero on
    every launch; its reduction tiles are written before they are read. The builder reports the barrier bytes and
    run() zeroes those alone, as CUTLASS's own initialize_workspace does."""
    from types import SimpleNamespace

    from pycutlass.kinds.gemm_sm90.arguments import GemmArgumentsSm90
    from pycutlass.runtime import driver

    source = sm90(scheduler=TS.StreamK).emit()
    assert "info->workspace_zero_bytes = (epilogue_bytes != 0" in source
    assert "info->workspace_zero_bytes = (" not in sm90().emit()  # the prelude's 0 stands
    calls = []
    monkeypatch.setattr(driver, "memset_d8", lambda address, value, nbytes, stream: calls.append(
        (address, value, nbytes, stream)))
    arguments = GemmArgumentsSm90.__new__(GemmArgumentsSm90)
    arguments._stream_k, arguments.workspace, arguments.stream = True, 0x900000, 7
    arguments._prepared = SimpleNamespace(workspace_bytes=65536 + 96, workspace_zero_bytes=96)
    arguments.before_launch()
    assert calls == [(0x900000 + 65536, 0, 96, 7)]
    arguments._prepared = SimpleNamespace(workspace_bytes=4096, workspace_zero_bytes=0)  # data-parallel: none
    arguments.before_launch()
    assert len(calls) == 1


def test_target_is_sm_90a_and_the_backend_is_nvrtc(tmp_path):
    session = cutlass.Session(backend="nvcc", target=90, cache_path=tmp_path / "c.db")
    compiler = cutlass.compiler.manager.Compiler.of(session)
    op = sm90()
    assert compiler.target_for(op).name == "sm_90a"
    assert compiler.backend_for(op).name == "nvrtc"
    assert compiler.target_for(cutlass.GemmOperationGrouped(
        90, cutlass.TileDescription([128, 128, 32], 3, [2, 2, 1], cutlass.MathInstruction(
            [16, 8, 16], D.float16, D.float16, D.float32, cutlass.OpClass.TensorOp)),
        *(cutlass.TensorDescription(D.float16, lay, 8) for lay in (R, CM, R)),
        cutlass.LinearCombination(D.float16, 8))).name == "sm_90"  # Sm80-family kinds keep plain sm_90
    with pytest.raises(DescriptionError, match="sm_90a"):
        cutlass.Target(80).check_runs("sm90", op.name)


@pytest.mark.slow
def test_nvrtc_compiles_an_sm90_operation_with_its_builder(tmp_path):
    """A real compile (about a minute on two cores): the cubin carries the kernel and the Params builder, and the
    report says NVRTC stood in for the session's nvcc."""
    session = cutlass.Session(backend="nvcc", target=90, cache_path=tmp_path / "c.db", progress=False)
    compiler = cutlass.compiler.manager.Compiler.of(session)
    op = sm90(tile=(64, 128, 64), kernel=KS.TmaWarpSpecializedPingpong, bias="column",
              functor=cutlass.LinearCombinationGeneric(cutlass.gelu(D.float32), D.float16, 8))
    report = compiler.add_module([op])
    kernel = report[0]
    assert kernel.backend == "nvrtc" and kernel.target == "sm_90a" and "nvrtc" in report.substituted
    assert op.kernel_symbol.encode() in kernel.binary and op.builder_symbol.encode() in kernel.binary
    assert len(kernel.binary) > 100_000  # a real kernel, not an empty stub
    again = compiler.add_module([op])
    assert again.from_memory == 1 and again.compiled == 0


# --- LinearCombinationClamp / FastLinearCombinationClamp ------------------------------------------------------------
def s8_clamp(fast=False, out=D.int8, **kwargs):
    functor = cutlass.FastLinearCombinationClamp(D.int8, 16) if fast else \
        cutlass.LinearCombinationClamp(out, 128 // out.bits, D.int32, D.float32)
    kwargs.setdefault("tile", (64, 128, 128))
    kwargs.setdefault("kernel", KS.TmaWarpSpecialized)
    return sm90(D.int8, out=out, acc=D.int32, functor=functor, **kwargs)


def test_clamp_epilogues_are_lincomb_with_a_clamp_to_the_output_range():
    """Both clamps build LinCombEltAct<Clamp> (or the bias forms) with CUTLASS 2.x's bounds, the output type's
    numeric_limits; f16/bf16 outputs clamp to their finite range, int8/int32 saturate."""
    ops = {"clamp": s8_clamp(), "fast": s8_clamp(fast=True), "s32": s8_clamp(out=D.int32),
           "f16": sm90(functor=cutlass.LinearCombinationClamp(D.float16, 8, D.float32, D.float32)),
           "bf16_bias": sm90(D.bfloat16, functor=cutlass.LinearCombinationClamp(D.bfloat16, 8, D.float32, D.float32),
                             bias="column"),
           "f16_acc16": sm90(acc=D.float16, functor=cutlass.LinearCombinationClamp(D.float16, 8, D.float16,
                                                                                    D.float32))}
    for key, op in ops.items():
        body = op.emit_body()
        assert "cutlass::epilogue::thread::Clamp" in body, key
        assert "fusion.activation.lower_bound = ElementCompute(cutlass::platform::numeric_limits<ElementC>::lowest())" \
            in body and "numeric_limits<ElementC>::max()" in body, key
    assert "LinCombEltAct<cutlass::epilogue::thread::Clamp, ElementC" in ops["clamp"].emit_body()
    assert "LinCombPerColBiasEltAct<\n    cutlass::epilogue::thread::Clamp" in ops["bf16_bias"].emit_body()
    assert ops["clamp"].name.count("_clamp_") == 1 and "_fastclamp_" in ops["fast"].name
    names = [op.name for op in ops.values()] + [sm90(D.int8, out=D.int8, acc=D.int32, tile=(64, 128, 128),
                                                     kernel=KS.TmaWarpSpecialized).name]
    assert len(set(names)) == len(names)  # the clamps never share a kernel name with the linear combination
    assert "lower_bound" not in sm90().emit_body()


@pytest.mark.parametrize("kwargs, message", [
    (dict(epilogue=ES.NoSmemWarpSpecialized, tile=(128, 128, 128), kernel=KS.TmaWarpSpecializedCooperative),
     "clamps"),
    (dict(out=D.float16), "integer output"),  # CUTLASS 2.x's rule for int32 accumulators, kept on SM90
])
def test_clamp_rules_are_rejected_at_construction(kwargs, message):
    with pytest.raises(DescriptionError, match=message):
        s8_clamp(**kwargs)


def test_fast_clamp_is_exact_for_every_k_on_sm90(monkeypatch):
    """CUTLASS 2.x's FastLinearCombinationClamp converts with float tricks exact for K <= 256 (the Sm80 family keeps
    the limit); on SM90 it is LinearCombinationClamp's clamp, so K is not limited."""
    import numpy as np

    from pycutlass.gemm import GemmCoord
    from pycutlass.kinds.gemm_sm90 import GemmArgumentsSm90

    monkeypatch.setattr(GemmArgumentsSm90, "_materialize", lambda self: None)
    A, B, C = np.zeros((64, 512), np.int8), np.zeros((64, 512), np.int8).T, np.zeros((64, 64), np.int8)
    args = cutlass.GemmArguments(s8_clamp(fast=True), GemmCoord(64, 64, 512), A, B, C, C.copy(),
                                 output_op=(0.5, 1.0))
    assert type(args) is GemmArgumentsSm90 and args.problem_size.k() == 512
    math = cutlass.MathInstruction([16, 8, 32], D.int8, D.int8, D.int32, cutlass.OpClass.TensorOp)
    tile = cutlass.TileDescription([128, 128, 64], 3, [2, 2, 1], math)
    sm80 = cutlass.GemmOperationUniversal(80, tile, cutlass.TensorDescription(D.int8, R, 16),
                                          cutlass.TensorDescription(D.int8, CM, 16),
                                          cutlass.TensorDescription(D.int8, R, 16),
                                          cutlass.FastLinearCombinationClamp(D.int8, 16))
    with pytest.raises(cutlass.ArgumentError, match="K <= 256"):
        cutlass.GemmArguments(sm80, GemmCoord(64, 64, 512), A, B, C, C.copy(), output_op=(0.5, 1.0))


@pytest.mark.slow
def test_nvrtc_compiles_an_int8_clamp_operation_with_a_bias(tmp_path):
    """A real compile (about a minute on two cores) of int8 -> int8 LinearCombinationClamp with a per-column bias:
    the Clamp fusion's bounds (cutlass::platform::numeric_limits<int8_t>) compile under NVRTC."""
    session = cutlass.Session(backend="nvrtc", target=90, cache_path=tmp_path / "c.db", progress=False)
    compiler = cutlass.compiler.manager.Compiler.of(session)
    op = s8_clamp(bias="column")
    kernel = compiler.add_module([op])[0]
    assert kernel.target == "sm_90a" and op.builder_symbol.encode() in kernel.binary
    assert len(kernel.binary) > 100_000  # a real kernel, not an empty stub


class _FakeDevice:
    """Stands in for device memory: inputs at one aligned address, the workspace at another."""

    def address(self, info, is_output=False):
        return 0x100000

    def allocate(self, nbytes):
        self.workspace_bytes = nbytes
        return 0x900000


@pytest.mark.parametrize("layouts,stride_a,stride_b", [((R, CM), 128, 128), ((CM, R), 128 * 96, 128 * 80),
                                                       ((R, R), 128, 128 * 80), ((CM, CM), 128 * 96, 128)])
def test_parallel_split_k_binds_the_l_mode_over_k_slices(monkeypatch, layouts, stride_a, stride_b):
    """Slice i of the workspace holds A[:, i*K/s:(i+1)*K/s] @ B[i*K/s:(i+1)*K/s, :]: the L mode with K/s and batch
    strides that step along K in each operand's own layout."""
    import numpy as np

    from pycutlass.gemm import GemmCoord, Mode
    from pycutlass.kinds.gemm_sm90.arguments import GemmArgumentsSm90

    device = _FakeDevice()

    def materialize(self):
        self.tensors = device
        self._allocate()

    monkeypatch.setattr(GemmArgumentsSm90, "_materialize", materialize)
    m, n, k, slices = 96, 80, 512, 4
    op = sm90(layouts=(*layouts, R), out=D.float32)
    A = np.zeros((m, k), np.float16) if layouts[0] is R else np.zeros((k, m), np.float16).T
    B = np.zeros((k, n), np.float16) if layouts[1] is R else np.zeros((n, k), np.float16).T
    C = np.zeros((m, n), np.float16)
    args = cutlass.GemmArguments(op, GemmCoord(m, n, k), A, B, C, C.copy(), gemm_mode=Mode.GemmSplitKParallel,
                                 split_k_slices=slices, sm_count=132)
    bound = args.bind()
    assert (bound.m, bound.n, bound.k, bound.l, bound.splits) == (m, n, k // slices, slices, 1)
    assert (bound.batch_stride_A, bound.batch_stride_B) == (stride_a, stride_b)
    assert bound.ptr_D == args.ptr_D == 0x900000 and bound.batch_stride_D == m * n and bound.ldd == n
    assert device.workspace_bytes == slices * m * n * 4  # f32 partial sums, one M x N slice per K slice
    assert (bound.alpha, bound.beta) == (1.0, 0.0)  # raw sums: the reduction applies alpha and beta


def test_parallel_split_k_rules():
    import numpy as np

    from pycutlass.gemm import GemmCoord, Mode

    A = np.zeros((64, 520), np.float16)
    B = np.zeros((64, 520), np.float16).T
    C = np.zeros((64, 64), np.float32)
    parallel = dict(gemm_mode=Mode.GemmSplitKParallel)
    with pytest.raises(cutlass.ArgumentError, match="K must be a multiple of split_k_slices"):
        cutlass.GemmArguments(sm90(out=D.float32), GemmCoord(64, 64, 520), A, B, C, C, split_k_slices=3, **parallel)
    with pytest.raises(cutlass.ArgumentError, match=r"16-byte aligned for TMA.*multiple of 8"):
        cutlass.GemmArguments(sm90(out=D.float32), GemmCoord(64, 64, 520), A, B, C, C, split_k_slices=10, **parallel)
    with pytest.raises(cutlass.ArgumentError, match="Default tile scheduler"):
        cutlass.GemmArguments(sm90(out=D.float32, scheduler=TS.StreamK), GemmCoord(64, 64, 520), A, B, C, C,
                              split_k_slices=5, **parallel)
    with pytest.raises(cutlass.ArgumentError, match="without bias="):
        cutlass.GemmArguments(sm90(out=D.float32, bias="row"), GemmCoord(64, 64, 520), A, B, C, C,
                              split_k_slices=5, bias=np.zeros(64, np.float32), **parallel)
    with pytest.raises(cutlass.ArgumentError, match="raw partial sums"):  # as for Sm80 operations
        relu = cutlass.LinearCombinationGeneric(cutlass.relu(D.float32), D.float32, 4, D.float32, D.float32)
        cutlass.GemmArguments(sm90(out=D.float32, functor=relu), GemmCoord(64, 64, 520), A, B, C, C,
                              split_k_slices=5, **parallel)


# --- fp8 with block-wise scales ---------------------------------------------------------------------------------------
def _blockwise(tile=(128, 128, 128), kernel=KS.Auto, out=D.bfloat16, functor=None, bias=None, **kwargs):
    op = sm90(D.float8_e4m3, out=out, tile=tile, kernel=kernel, functor=functor, **kwargs)
    return cutlass.GemmOperationUniversal(90, op.tile_description, op.A, op.B, op.C, op.epilogue_functor, bias=bias,
                                          scales="blockwise")


def test_blockwise_scales_rules_names_and_emission():
    op = _blockwise()
    plain = sm90(D.float8_e4m3, out=D.bfloat16, tile=(128, 128, 128))
    assert op.kernel_schedule is KS.TmaWarpSpecializedCooperative and plain.kernel_schedule.is_fp8_fast_accum
    assert op.name != plain.name and "_bw_" in op.name and op.abi_struct_type.__name__ == "Sm90BlockwiseGemmArgs"
    assert plain.abi_struct_type.__name__ == "Sm90GemmArgs"
    source = op.emit()
    assert "KernelTmaWarpSpecializedCooperativeFP8Blockwise" in source and "tile_atom_to_shape_SFA" in source
    assert "Sm90BlockwiseScaleConfig<1, 128, 128" in source and "Sm90BlockwiseScaleConfig" not in plain.emit()
    assert _blockwise(tile=(64, 128, 128)).kernel_schedule is KS.TmaWarpSpecializedPingpong  # Auto on 64 rows
    assert _blockwise(kernel=KS.TmaWarpSpecializedPingpong, tile=(128, 128, 128)).kernel_schedule is \
        KS.TmaWarpSpecializedPingpong
    for kwargs, message in ((dict(kernel=KS.TmaWarpSpecializedCooperativeFP8FastAccum), "without promotion"),
                            (dict(kernel=KS.TmaWarpSpecialized, tile=(64, 128, 128)), "cooperative or ping-pong"),
                            (dict(scheduler=TS.StreamK), "default tile scheduler"),
                            (dict(stages=4), "leave stages=0"),
                            (dict(epilogue=ES.NoSmemWarpSpecialized), "TMA epilogues only"),
                            (dict(out=D.float8_e4m3), "C of float8_e4m3|fp8 outputs"),
                            (dict(bias="row"), "not built with bias=")):
        with pytest.raises(DescriptionError, match=message):
            _blockwise(**kwargs)
    for tile in ((128, 64, 128), (128, 256, 128)):
        with pytest.raises(DescriptionError, match="tile N and K must be 128"):
            _blockwise(tile=tile)
    with pytest.raises(DescriptionError, match="built for fp8 operands"):
        f16 = sm90()
        cutlass.GemmOperationUniversal(90, f16.tile_description, f16.A, f16.B, f16.C, f16.epilogue_functor,
                                       scales="blockwise")
    with pytest.raises(DescriptionError, match="scales must be None or 'blockwise'"):
        cutlass.GemmOperationUniversal(90, op.tile_description, op.A, op.B, op.C, op.epilogue_functor, scales="row")
    sm80 = cutlass.TileDescription([128, 128, 32], 3, [2, 2, 1], cutlass.MathInstruction(
        [16, 8, 16], D.float16, D.float16, D.float32, cutlass.OpClass.TensorOp))
    with pytest.raises(DescriptionError, match="SM90 family"):
        cutlass.GemmOperationUniversal(80, sm80, *(cutlass.TensorDescription(D.float16, layout, 8) for layout in
                                                   (R, CM, R)), cutlass.LinearCombination(D.float16, 8, D.float32,
                                                                                          D.float32),
                                       scales="blockwise")


def test_blockwise_scales_arguments(monkeypatch):
    """scale_a (M, ceil(K/128)) M-contiguous and scale_b (ceil(N/128), ceil(K/128)) row-major, float32; both reach
    the builder's struct; every other form is refused before anything launches."""
    torch = pytest.importorskip("torch")
    from pycutlass.gemm import GemmCoord, Mode
    from pycutlass.kinds.gemm_sm90.arguments import GemmArgumentsSm90

    from .test_gemm_grouped_sm90 import _FakeDeviceTensor

    device = _FakeDevice()

    def materialize(self):
        self._tensor_infos()
        self.tensors = device
        self._allocate()

    monkeypatch.setattr(GemmArgumentsSm90, "_materialize", materialize)
    op = _blockwise()
    m, n, k = 96, 200, 304  # 3 K blocks, 2 N blocks
    A = torch.zeros(m, k, dtype=torch.float8_e4m3fn)
    B = torch.zeros(n, k, dtype=torch.float8_e4m3fn).t()
    C = torch.zeros(m, n, dtype=torch.bfloat16)
    sa, sb = torch.ones(3, m).t(), torch.ones(2, 3)

    def build(scale_a=sa, scale_b=sb, **kwargs):
        return cutlass.GemmArguments(op, GemmCoord(m, n, k), A, B, C, C.clone(), scale_a=scale_a, scale_b=scale_b,
                                     sm_count=132, **kwargs)

    bound = build().bind()
    assert type(bound).__name__ == "Sm90BlockwiseGemmArgs" and bound.ptr_scale_a == bound.ptr_scale_b == 0x100000
    assert bound.scale_a_ld == m
    padded = _FakeDeviceTensor((m, 3), "<f4", strides=(1, m + 4))  # K blocks padded apart, in device memory
    assert build(scale_a=padded).bind().scale_a_ld == m + 4
    for kwargs, message in ((dict(scale_a=torch.ones(m, 3)), "M contiguous"),
                            (dict(scale_a=_FakeDeviceTensor((m, 3), "<f4", strides=(1, m + 2))), "a multiple of 4"),
                            (dict(scale_a=_FakeDeviceTensor((m, 3), "<f4", strides=(1, m - 4))), "ld >= 96"),
                            (dict(scale_a=torch.ones(3, m, dtype=torch.float16).t()), "are float32"),
                            (dict(scale_b=torch.ones(2, 2)), "shape \\(2, 3\\)"),
                            (dict(scale_b=torch.ones(3, 2).t()), "row-major"),
                            (dict(scale_b=None), "pass scale_a= .* and scale_b=")):
        with pytest.raises(cutlass.ArgumentError, match=message):
            build(**kwargs)
    # M not a multiple of 4: scale_a's rows padded to one (DeepGEMM's TMA-aligned scale_a), K blocks >= M4 apart
    odd = dict(A=A[:m - 2], B=B, C=C[:m - 2], D=C[:m - 2].clone(), scale_b=sb, sm_count=132)
    with pytest.raises(cutlass.ArgumentError, match=r"rows padded to 96 .* torch.empty\(3, 96\).t\(\)"):
        cutlass.GemmArguments(op, GemmCoord(m - 2, n, k), scale_a=torch.ones(3, m - 2).t(), **odd)
    with pytest.raises(cutlass.ArgumentError, match=r"rows padded to 96"):
        cutlass.GemmArguments(op, GemmCoord(m - 2, n, k), **odd,
                              scale_a=_FakeDeviceTensor((m - 2, 3), "<f4", strides=(1, m)))
    padded = cutlass.GemmArguments(op, GemmCoord(m - 2, n, k), **odd,
                                   scale_a=_FakeDeviceTensor((m, 3), "<f4", strides=(1, m + 8)))
    assert padded.bind().scale_a_ld == m + 8
    with pytest.raises(cutlass.ArgumentError, match="Mode.Gemm with one batch"):
        cutlass.GemmArguments(op, GemmCoord(m, n, k), torch.zeros(2, m, k, dtype=torch.float8_e4m3fn),
                              torch.zeros(2, n, k, dtype=torch.float8_e4m3fn).transpose(1, 2),
                              torch.zeros(2, m, n, dtype=torch.bfloat16), torch.zeros(2, m, n, dtype=torch.bfloat16),
                              gemm_mode=Mode.Batched, batch=2,
                              scale_a=sa, scale_b=sb, sm_count=132)
    with pytest.raises(cutlass.ArgumentError, match="pdl=True is not tested"):
        build(pdl=True)
    with pytest.raises(cutlass.ArgumentError, match="built without block-wise scales"):
        cutlass.GemmArguments(sm90(D.float8_e4m3, out=D.bfloat16, tile=(128, 128, 128)), GemmCoord(m, n, k), A, B,
                              C, C.clone(), scale_a=sa, scale_b=sb)


@pytest.mark.slow
def test_nvrtc_compiles_a_blockwise_scaled_fp8_operation(tmp_path):
    """A real compile of CUTLASS's blockwise main loop with the builder (which computes the scale layouts)."""
    session = cutlass.Session(backend="nvrtc", target=90, cache_path=tmp_path / "c.db", progress=False)
    compiler = cutlass.compiler.manager.Compiler.of(session)
    op = _blockwise()
    kernel = compiler.add_module([op])[0]
    assert op.kernel_symbol.encode() in kernel.binary and op.builder_symbol.encode() in kernel.binary
    assert len(kernel.binary) > 100_000
