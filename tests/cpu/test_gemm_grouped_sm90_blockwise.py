"""fp8 block-wise scales for the SM90 grouped GEMM without a GPU: the rules (what CUTLASS 4.2's pointer-array blockwise
main loop cannot run is refused when built), emission (its own ABI structs, the main loop that reads the sizes
kernel's per-group scale layouts), the arguments' checks and what they hand the sizes kernel, and a real NVRTC
compile."""
from __future__ import annotations

import numpy as np
import pytest

import pycutlass as cutlass
from pycutlass import DescriptionError
from pycutlass import EpilogueScheduleType as ES
from pycutlass import KernelScheduleType as KS
from pycutlass import TileSchedulerType as TS
from pycutlass.kinds.families.sm90_ptr_array import SCALE_LAYOUT_BYTES
from pycutlass.kinds.gemm_grouped_sm90.abi import (Sm90BlockwiseGroupedGemmArgs, Sm90BlockwiseGroupedSizesArgs,
                                                   Sm90GroupedGemmArgs, Sm90GroupedSizesArgs)
from pycutlass.runtime import tensors as runtime_tensors

from .test_gemm_grouped_sm90 import _FakeDeviceTensor, _fake_device, grouped90

D = cutlass.DataType
R, CM = cutlass.RowMajor, cutlass.ColumnMajor
_E4M3 = "|e1"  # a typestr for fake fp8 device tensors (__cuda_array_interface__ has none)


def blockwise(tile=(128, 128, 128), kernel=KS.Auto, out=D.bfloat16, b=D.float8_e4m3, functor=None, cluster=(1, 1, 1),
              **kwargs):
    math = cutlass.MathInstruction([64, tile[1], 32], D.float8_e4m3, b, D.float32, cutlass.OpClass.TensorOp)
    description = cutlass.TileDescription(list(tile), kwargs.pop("stages", 0), None, math,
                                          cluster_shape=list(cluster), kernel_schedule=kernel,
                                          epilogue_schedule=kwargs.pop("epilogue", ES.Auto),
                                          tile_scheduler=kwargs.pop("scheduler", TS.Default))
    A = cutlass.TensorDescription(D.float8_e4m3, R, 16)
    B = cutlass.TensorDescription(b, CM, 16)
    C = cutlass.TensorDescription(out, kwargs.pop("c_layout", R), 128 // out.bits)
    functor = functor or cutlass.LinearCombination(out, C.alignment, D.float32, D.float32)
    return cutlass.GemmOperationGrouped(90, description, A, B, C, functor, scales=kwargs.pop("scales", "blockwise"),
                                        **kwargs)


def test_blockwise_rules_names_and_schedules():
    op = blockwise()
    assert op.scales == "blockwise" and op.kernel_schedule is KS.TmaWarpSpecializedCooperative  # Auto: no fast acc.
    assert op.name.endswith(op.name.split("_")[-1]) and "_coop_bw_" in op.name
    assert blockwise(tile=(64, 128, 128)).kernel_schedule is KS.TmaWarpSpecializedPingpong
    assert blockwise(kernel=KS.TmaWarpSpecializedPingpong).kernel_schedule is KS.TmaWarpSpecializedPingpong
    assert blockwise(tile=(256, 128, 128), cluster=(2, 1, 1)).warp_count == (8, 1, 1)
    assert blockwise(b=D.float8_e5m2).B.element is D.float8_e5m2
    assert op.abi_struct_type is Sm90BlockwiseGroupedGemmArgs and op.sizes_struct_type is Sm90BlockwiseGroupedSizesArgs
    rowwise = cutlass.GemmOperationGrouped(90, op.tile_description, op.A, op.B, op.C, op.epilogue_functor,
                                           scales="rowwise")
    plain = grouped90(D.float8_e4m3, out=D.bfloat16, tile=(128, 128, 128))
    assert len({op.name, rowwise.name, plain.name}) == 3 and op != rowwise
    assert rowwise.abi_struct_type is Sm90GroupedGemmArgs and plain.sizes_struct_type is Sm90GroupedSizesArgs
    assert "scales=blockwise" in op.describe()


@pytest.mark.parametrize("kwargs, message", [
    (dict(tile=(128, 256, 128)), "tile N and K must be 128"),
    (dict(tile=(128, 64, 128)), "tile N and K must be 128"),
    (dict(kernel=KS.TmaWarpSpecializedCooperativeFP8FastAccum), "accumulates without promotion"),
    (dict(kernel=KS.TmaWarpSpecializedPingpongFP8FastAccum, tile=(64, 128, 128)), "accumulates without promotion"),
    (dict(stages=4), "leave stages=0"),
    (dict(bias="column"), "with a bias is not built"),
    (dict(functor=cutlass.LinearCombinationClamp(D.bfloat16, 8, D.float32, D.float32)), "LinearCombinationClamp"),
    (dict(scheduler=TS.StreamK), "scheduler"),
    (dict(out=D.float8_e4m3), "C must be one of"),
    (dict(kernel=KS.TmaWarpSpecialized), "kernel_schedule must be"),
])
def test_blockwise_refusals(kwargs, message):
    with pytest.raises(DescriptionError, match=message) as error:
        blockwise(**kwargs)
    assert error.value.rule


def test_blockwise_needs_fp8_operands_and_the_sm90_kernel():
    bf16 = grouped90(D.bfloat16, tile=(128, 128, 64))
    with pytest.raises(DescriptionError, match="built for fp8 operands") as error:
        cutlass.GemmOperationGrouped(90, bf16.tile_description, bf16.A, bf16.B, bf16.C, bf16.epilogue_functor,
                                     scales="blockwise")
    assert error.value.rule == "scales.unsupported"
    with pytest.raises(DescriptionError, match="'rowwise' .* or 'blockwise'"):
        blockwise(scales="block")
    sm80 = cutlass.TileDescription([128, 128, 32], 3, [2, 2, 1], cutlass.MathInstruction(
        [16, 8, 16], D.float16, D.float16, D.float32, cutlass.OpClass.TensorOp))
    with pytest.raises(DescriptionError, match="scales= is built for the SM90 grouped kernel"):
        cutlass.GemmOperationGrouped(80, sm80, *(cutlass.TensorDescription(D.float16, layout, 8) for layout in
                                                 (R, CM, R)), cutlass.LinearCombination(D.float16, 8, D.float32,
                                                                                        D.float32), scales="blockwise")


def test_blockwise_emission():
    gelu = cutlass.LinearCombinationGeneric(cutlass.gelu(D.float32), D.bfloat16, 8, D.float32, D.float32)
    op = blockwise(functor=gelu)
    source = op.emit()
    for needle in ("cutlass::gemm::KernelPtrArrayTmaWarpSpecializedCooperativeFP8Blockwise",
                   "Sm90BlockwiseScaleConfig<1, 128, 128, cute::GMMA::Major::MN",
                   "cute::tuple<cutlass::layout::RowMajor *, LayoutSFA *>",
                   "struct GroupScaledMainloop : CollectiveMainloop",
                   "GemmUniversal<ProblemShape, GroupScaledMainloop, CollectiveEpilogue>",
                   f"{op.name}_build(pycutlass_abi::Sm90BlockwiseGroupedGemmArgs a",
                   f"{op.name}_sizes(pycutlass_abi::Sm90BlockwiseGroupedSizesArgs a)",
                   "Config::tile_atom_to_shape_SFA(shape)", "args.mainloop.layout_SFA", "GELU",
                   f"sizeof(LayoutSFA) <= {SCALE_LAYOUT_BYTES}", "cutlass/detail/blockwise_scale_layout.hpp"):
        assert needle in source, needle
    pingpong = blockwise(tile=(64, 128, 128)).emit()
    assert "KernelPtrArrayTmaWarpSpecializedPingpongFP8Blockwise" in pingpong
    for other in (grouped90(D.float8_e4m3, out=D.bfloat16, tile=(128, 128, 128)).emit(),
                  cutlass.GemmOperationGrouped(90, op.tile_description, op.A, op.B, op.C, op.epilogue_functor,
                                               scales="rowwise").emit()):
        assert "GroupScaledMainloop" not in other and "Sm90Blockwise" not in other and "LayoutSFA" not in other


# --- arguments -------------------------------------------------------------------------------------------------------
def _packed(monkeypatch, groups=3, rows=300, n=256, k=320, columns=1, op=None, **kwargs):
    monkeypatch.setitem(runtime_tensors._TYPESTR_TO_TYPE, _E4M3, D.float8_e4m3)
    _fake_device(monkeypatch)
    op = op or blockwise()
    kb, nb = -(-k // 128), -(-n // 128)
    sizes = _FakeDeviceTensor((groups, 3) if columns == 3 else (groups,), "<i4")
    A, D_ = _FakeDeviceTensor((rows, k), _E4M3), _FakeDeviceTensor((rows, n), "<f2")
    B = _FakeDeviceTensor((groups, k, n), _E4M3, strides=(n * k, 1, k))
    given = dict(scale_a=_FakeDeviceTensor((rows, kb), "<f4", strides=(1, rows)),
                 scale_b=_FakeDeviceTensor((groups, nb, kb), "<f4"))
    given.update(kwargs)
    return cutlass.GemmGroupedArguments(op, sizes, A, B, None, D_, op.epilogue_type(1.0, 0.0), **given), given


def test_blockwise_arguments_hand_the_sizes_kernel_the_scales(monkeypatch):
    op = blockwise(out=D.float16)  # (no bfloat16 in __cuda_array_interface__)
    args, given = _packed(monkeypatch, op=op)
    s = args._sizes_struct
    assert type(s) is Sm90BlockwiseGroupedSizesArgs
    assert (s.scale_a_base, s.scale_a_group_bytes, s.scale_a_ld) == (given["scale_a"].address, 0, 300)
    assert (s.scale_b_base, s.scale_b_group_bytes, s.scale_b_ld) == (given["scale_b"].address, 2 * 3 * 4, 3)
    for field in ("ptr_scale_a", "ptr_scale_b", "layout_scale_a", "layout_scale_b"):
        assert getattr(s, field) == args.device_arrays[field] != 0, field
    assert args.device_arrays["layout_scale_b"] - args.device_arrays["layout_scale_a"] >= 3 * SCALE_LAYOUT_BYTES
    abi = args.bind()
    assert type(abi) is Sm90BlockwiseGroupedGemmArgs
    assert (abi.ptr_scale_a, abi.ptr_scale_b, abi.layout_scale_a, abi.layout_scale_b) == \
        (s.ptr_scale_a, s.ptr_scale_b, s.layout_scale_a, s.layout_scale_b)
    # DeepGEMM's TMA-aligned form: K blocks padded apart (ld 304 >= 300 rows).
    args, _ = _packed(monkeypatch, op=op, scale_a=_FakeDeviceTensor((300, 3), "<f4", strides=(1, 304)))
    assert args._sizes_struct.scale_a_ld == 304
    # Per-group K and N (columns 3): K = 0 groups read zero scales from the stand-in, sized for them.
    args, _ = _packed(monkeypatch, op=op, columns=3, n=2048)
    assert args._sizes_struct.stand_in and args._sizes_struct.k_stand_in == 16


def test_blockwise_arguments_masked_layout(monkeypatch):
    op = blockwise(out=D.float16)
    monkeypatch.setitem(runtime_tensors._TYPESTR_TO_TYPE, _E4M3, D.float8_e4m3)
    _fake_device(monkeypatch)
    groups, capacity, n, k = 4, 128, 128, 256
    counts = _FakeDeviceTensor((groups,), "<i4")
    scale_a = _FakeDeviceTensor((groups, capacity, 2), "<f4", strides=(2 * capacity, 1, capacity))
    args = cutlass.GemmGroupedArguments(op, counts, _FakeDeviceTensor((groups, capacity, k), _E4M3),
                                        _FakeDeviceTensor((groups, k, n), _E4M3, strides=(n * k, 1, k)), None,
                                        _FakeDeviceTensor((groups, capacity, n), "<f2"), op.epilogue_type(1.0, 0.0),
                                        scale_a=scale_a, scale_b=_FakeDeviceTensor((groups, 1, 2), "<f4"))
    s = args._sizes_struct
    assert args.masked and (s.scale_a_group_bytes, s.scale_a_ld, s.group_rows) == (2 * capacity * 4, capacity, capacity)
    with pytest.raises(cutlass.ArgumentError, match=r"\(4, 128, 2\) \(groups, capacity, ceil\(K/128\)\)"):
        cutlass.GemmGroupedArguments(op, counts, _FakeDeviceTensor((groups, capacity, k), _E4M3),
                                     _FakeDeviceTensor((groups, k, n), _E4M3, strides=(n * k, 1, k)), None,
                                     _FakeDeviceTensor((groups, capacity, n), "<f2"), op.epilogue_type(1.0, 0.0),
                                     scale_a=_FakeDeviceTensor((groups * capacity, 2), "<f4", strides=(1, 512)),
                                     scale_b=_FakeDeviceTensor((groups, 1, 2), "<f4"))


@pytest.mark.parametrize("kwargs, message", [
    (dict(scale_a=_FakeDeviceTensor((300, 3), "<f4")), "unit stride along M"),  # K-major (row-major) scale_a
    (dict(scale_a=_FakeDeviceTensor((300, 2), "<f4", strides=(1, 300))), r"\(300, 3\) \(rows of the packed A"),
    (dict(scale_a=_FakeDeviceTensor((300, 3), "<f4", strides=(1, 200))), "at least M between K blocks"),
    (dict(scale_a=_FakeDeviceTensor((300, 3), "<f2", strides=(1, 300))), "is float32"),
    (dict(scale_b=_FakeDeviceTensor((3, 3, 2), "<f4", strides=(6, 1, 3))), r"\(3, 2, 3\) .* contiguous K blocks"),
    (dict(scale_b=_FakeDeviceTensor((3, 2, 3), "<f4", strides=(6, 3, 3))), "contiguous K blocks"),
    (dict(scale_b=[_FakeDeviceTensor((2, 3), "<f4")] * 3), "one tensor for all groups.*got a list"),
    (dict(scale_b=None), "pass both scale_a="),
    (dict(scale_a=None, scale_b=None), "pass both scale_a="),
])
def test_blockwise_argument_refusals(monkeypatch, kwargs, message):
    with pytest.raises(cutlass.ArgumentError, match=message):
        _packed(monkeypatch, op=blockwise(out=D.float16), **kwargs)


def test_blockwise_refuses_host_sizes_and_host_scales(monkeypatch):
    op = blockwise(out=D.float16)
    monkeypatch.setitem(runtime_tensors._TYPESTR_TO_TYPE, _E4M3, D.float8_e4m3)
    _fake_device(monkeypatch)
    problems = [(64, 128, 128)]
    with pytest.raises(cutlass.ArgumentError, match="int32 device tensor") as error:
        cutlass.GemmGroupedArguments(op, problems, [_FakeDeviceTensor((64, 128), _E4M3)],
                                     [_FakeDeviceTensor((128, 128), _E4M3, strides=(1, 128))], None,
                                     [_FakeDeviceTensor((64, 128), "<f2")],
                                     scale_a=_FakeDeviceTensor((64, 1), "<f4"),
                                     scale_b=_FakeDeviceTensor((1, 1, 1), "<f4"))
    assert isinstance(error.value, cutlass.ArgumentError)
    with pytest.raises(cutlass.ArgumentError, match="device memory"):
        _packed(monkeypatch, op=op, scale_b=np.ones((3, 2, 3), np.float32))
    with pytest.raises(cutlass.ArgumentError, match="built without row-wise scales"):
        _packed(monkeypatch, op=grouped90(D.float16, out=D.float16))


@pytest.mark.slow
def test_nvrtc_compiles_a_blockwise_scaled_grouped_operation(tmp_path):
    """A real compile of CUTLASS's pointer-array blockwise main loop under pycutlass's per-group scale layouts, with
    the builder and the sizes kernel that computes those layouts."""
    session = cutlass.Session(backend="nvrtc", target=90, cache_path=tmp_path / "c.db", progress=False)
    compiler = cutlass.compiler.manager.Compiler.of(session)
    op = blockwise(tile=(64, 128, 128), cluster=(2, 1, 1))  # ping-pong with multicast: the other unit the suite has
    kernel = compiler.add_module([op])[0]
    for symbol in (op.kernel_symbol, op.builder_symbol, op.sizes_symbol):
        assert symbol.encode() in kernel.binary, symbol
    assert len(kernel.binary) > 100_000
