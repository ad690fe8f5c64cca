"""CUTLASS's SM90 pointer-array GEMM, which two kinds run: grouped GEMM (``GemmOperationGrouped(90, ...)``) and Array
mode (``GemmOperationUniversal(90, ..., array=True)``, one problem size per batch entry). Its rules, names, argument
struct, tensormap workspace and template (``sm90_ptr_array.cu.j2``, which each kind's template includes)."""
from __future__ import annotations

import ctypes
from pathlib import Path

from ...description.tile_description import TileDescription
from ...description.types import DataType, EpilogueScheduleType, KernelScheduleType
from ...emit import names
from ...emit.abi import EPILOGUE_FIELDS, AbiStruct
from ...emit.emitter import render
from ...errors import DescriptionError
from ..base import check_description_types
from .sm90 import (BLOCK_SCALE, check_cluster_shape, check_default_tile_scheduler, check_derived_warp_count,
                   check_epilogue_kind, check_epilogue_schedule, check_epilogue_tile, check_epilogue_types,
                   check_explicit_stages, check_fast_accum, check_k_major, check_operand_element,
                   check_schedule_tile_m, check_tensor_op, check_tile_k, check_tile_n, check_tma_operand,
                   epilogue_suffix, epilogue_tile_suffix, epilogue_tile_text, fusion_activation)

_KS, _ES = KernelScheduleType, EpilogueScheduleType
GROUPED_WHAT = "GemmOperationGrouped(90)"
_OPERANDS = (DataType.float16, DataType.bfloat16)
_FP8 = (DataType.float8_e4m3, DataType.float8_e5m2)
_OUTPUTS = (DataType.float16, DataType.bfloat16, DataType.float32)
_KERNEL_SCHEDULES = {
    _KS.TmaWarpSpecializedCooperative: "cutlass::gemm::KernelPtrArrayTmaWarpSpecializedCooperative",
    _KS.TmaWarpSpecializedPingpong: "cutlass::gemm::KernelPtrArrayTmaWarpSpecializedPingpong",
    # fp8 only: wgmma accumulates in its own (reduced-precision) registers across the whole K loop, without the
    # main loop's periodic promotion into float32 (CUTLASS's "fast accumulation").
    _KS.TmaWarpSpecializedCooperativeFP8FastAccum:
        "cutlass::gemm::KernelPtrArrayTmaWarpSpecializedCooperativeFP8FastAccum",
    _KS.TmaWarpSpecializedPingpongFP8FastAccum: "cutlass::gemm::KernelPtrArrayTmaWarpSpecializedPingpongFP8FastAccum",
}
# scales="blockwise" (grouped operations): CUTLASS's pointer-array main loops that promote the wgmma partial sums into
# float32 every 128 of K and multiply them by the block's scales (fp8 only).
BLOCKWISE_SCHEDULES = {
    _KS.TmaWarpSpecializedCooperative: "cutlass::gemm::KernelPtrArrayTmaWarpSpecializedCooperativeFP8Blockwise",
    _KS.TmaWarpSpecializedPingpong: "cutlass::gemm::KernelPtrArrayTmaWarpSpecializedPingpongFP8Blockwise",
}
# Bytes per group of the per-group scale layout arrays (CUTLASS's LayoutSFA / LayoutSFB, written by the sizes kernel
# on the device; the template static_asserts that each fits).
SCALE_LAYOUT_BYTES = 32
_EPILOGUE_SCHEDULES = {  # by the schedule's base (fast accumulation does not change the epilogue)
    _KS.TmaWarpSpecializedCooperative: "cutlass::epilogue::PtrArrayTmaWarpSpecializedCooperative",
    _KS.TmaWarpSpecializedPingpong: "cutlass::epilogue::PtrArrayTmaWarpSpecializedPingpong",
}
# Both pointer-array epilogues keep one D tensormap per consumer warpgroup (CollectiveEpilogue::NumEpilogueWarpGroups,
# static_assert-ed in the template).
EPILOGUE_WARP_GROUPS = 2
TMA_DESCRIPTOR_BYTES = 128  # sizeof(cute::TmaDescriptor), static_assert-ed
_TENSORMAP_ALIGNMENT = 64  # the kernel's MinTensorMapWorkspaceAlignment
PTR_ARRAY_HEADERS = ("cute/tensor.hpp", "cutlass/gemm/collective/collective_builder.hpp",
                     "cutlass/epilogue/collective/collective_builder.hpp", "cutlass/epilogue/thread/activation.h",
                     "cutlass/gemm/group_array_problem_shape.hpp", "cutlass/gemm/kernel/gemm_universal.hpp",
                     "cutlass/gemm/dispatch_policy.hpp")
GROUPED_EPILOGUES = ("LinearCombination", "LinearCombinationGeneric", "LinearCombinationClamp")


def _round_up(value: int, multiple: int) -> int:
    return -(-value // multiple) * multiple


def tensormap_workspace_bytes(name: str, sm_count: int) -> int:
    """The pointer-array kernel's per-SM tensormap slots: C and one D per epilogue warpgroup, then A and B."""
    if isinstance(sm_count, bool) or not isinstance(sm_count, int) or sm_count <= 0:
        raise DescriptionError(f"{name}: sm_count must be a positive integer, got {sm_count!r}",
                               rule="description.field_type")
    epilogue = _round_up(TMA_DESCRIPTOR_BYTES * sm_count * (EPILOGUE_WARP_GROUPS + 1), _TENSORMAP_ALIGNMENT)
    mainloop = _round_up(TMA_DESCRIPTOR_BYTES * sm_count * 2, _TENSORMAP_ALIGNMENT)
    return epilogue + mainloop


def ptr_array_description(op, kind: str) -> str:
    """The one-line summary of a pointer-array operation (``kind``: grouped or array)."""
    tile = op.tile_description
    return (f"GEMM {kind} sm90 A={op.A.element.label}/{op.A.layout.value}/{op.A.alignment} "
            f"B={op.B.element.label}/{op.B.layout.value}/{op.B.alignment} "
            f"C={op.C.element.label}/{op.C.layout.value}/{op.C.alignment} "
            f"acc={op.element_accumulator.label} tile={list(tile.threadblock_shape)} "
            f"cluster={list(tile.cluster_shape)} stages={tile.stages or 'auto'} "
            f"kernel=PtrArray{op.kernel_schedule.value} "
            f"{epilogue_tile_text(tile)}"
            f"epilogue_op={op.epilogue_functor.describe()}")


def ptr_array_readable_name(op, kind: str) -> str:
    """``<kind>_<types>_<layouts>_<tile>_<cluster>_<stages>_<schedule><epilogue>`` of a pointer-array operation."""
    tile = op.tile_description
    s = names.SHORT
    layouts = "".join(names.LAYOUT_SHORT[d.layout] for d in (op.A, op.B, op.C))
    m, n, k = tile.threadblock_shape
    cm, cn, _ = tile.cluster_shape
    schedule = "coop" if op.kernel_schedule.base is _KS.TmaWarpSpecializedCooperative else "pp"
    schedule += "fa" if op.kernel_schedule.is_fp8_fast_accum else ""
    b = s[op.B.element] if op.B.element is not op.A.element else ""
    return (f"{kind}_{s[op.A.element]}{b}{s[op.C.element]}{s[op.element_accumulator]}_{layouts}_"
            f"{m}x{n}x{k}_c{cm}x{cn}_s{tile.stages}_{schedule}{epilogue_tile_suffix(tile)}"
            f"{epilogue_suffix(op.epilogue_functor)}")


def render_ptr_array_kernel(op, template: Path, bias: str | None = None, sizes_kernel: bool = False,
                            scales: str | None = None) -> str:
    """The pointer-array kernel and its builder (sm90_ptr_array.cu.j2) for ``op``: a grouped operation, or an
    SM90 GEMM built for Mode.Array (kinds/gemm_array_sm90), which runs it with one size per batch entry.

    ``bias``: None or "column" (the per-group bias tree; grouped operations only). ``scales``: None, "rowwise"
    (the row-wise scales tree; grouped operations only, not with a bias) or "blockwise" (CUTLASS's blockwise main
    loop over per-group scale layouts from the sizes kernel; grouped operations only). ``sizes_kernel``: also emit
    ``<name>_sizes``, the device-sizes kernel of grouped operations, whose ABI struct (Sm90GroupedSizesArgs) only
    their units define; the Array kind has no device-side sizes and leaves it out. ``template``: the kind's own
    template (each includes sm90_ptr_array.cu.j2)."""
    tile = op.tile_description
    functor = op.epilogue_functor
    activation, activation_args, clamp = fusion_activation(functor)
    if bias not in (None, "column"):
        raise DescriptionError(f"{op.name}: the pointer-array template builds bias None or 'column', got {bias!r}",
                               rule="bias.unsupported")
    if bias is not None and clamp:  # the operation rejects it; the bias tree sets no clamp bounds
        raise DescriptionError(f"{op.name}: the clamp is not built with the per-group bias tree",
                               rule="bias.unsupported")
    if scales not in (None, "rowwise", "blockwise") or (scales and (bias or clamp)) or \
            (scales == "blockwise" and not sizes_kernel):  # the operation rejects these
        raise DescriptionError(f"{op.name}: the pointer-array template builds scales None, 'rowwise' or 'blockwise' "
                               f"(without a bias or the clamp; block-wise with the sizes kernel), got {scales!r}",
                               rule="scales.unsupported")
    blockwise = scales == "blockwise"
    return render(
        template, name=op.name, summary=op.describe(),
        element_a=names.ELEMENT[op.A.element], layout_a=names.LAYOUT[op.A.layout], alignment_a=op.A.alignment,
        element_b=names.ELEMENT[op.B.element], layout_b=names.LAYOUT[op.B.layout], alignment_b=op.B.alignment,
        element_c=names.ELEMENT[op.C.element], layout_c=names.LAYOUT[op.C.layout], alignment_c=op.C.alignment,
        element_accumulator=names.ELEMENT[op.element_accumulator],
        element_compute=names.ELEMENT[functor.element_epilogue],
        tile_shape=tile.threadblock_shape, cluster_shape=tile.cluster_shape, stages=tile.stages,
        epilogue_tile=tile.epilogue_tile,
        kernel_schedule=(BLOCKWISE_SCHEDULES if blockwise else _KERNEL_SCHEDULES)[op.kernel_schedule],
        epilogue_schedule=_EPILOGUE_SCHEDULES[op.kernel_schedule.base],
        activation=activation, activation_args=activation_args, clamp=clamp, bias=bias, sizes_kernel=sizes_kernel,
        scales=scales, block_scale=BLOCK_SCALE if blockwise else None, scale_layout_bytes=SCALE_LAYOUT_BYTES,
        abi_struct=op.abi_struct_type.__name__, sizes_struct=op.sizes_struct_type.__name__ if sizes_kernel else None,
        epilogue_warp_groups=EPILOGUE_WARP_GROUPS, tma_descriptor_bytes=TMA_DESCRIPTOR_BYTES,
        thread_count=op.thread_count)


def check_ptr_array(tile: TileDescription, A, B, C, functor, what: str = GROUPED_WHAT,
                    epilogues: tuple = GROUPED_EPILOGUES, kernel: str = "the SM90 grouped kernel",
                    other_types: str = "use compute capability 80's grouped kernel (an Sm80 tile) for other types",
                    epilogue_hint: str = "", fp8: bool = False) -> KernelScheduleType:
    """CUTLASS 3.x's rules for the SM90 pointer-array grouped kernel (as far as the GPU suite covers them); returns the
    resolved kernel schedule. Everything is rejected here, before a compile of about a minute. ``fp8``: also take
    float8_e4m3 / float8_e5m2 operands (A RowMajor, B ColumnMajor; the grouped kind's GPU suite covers them)."""
    check_description_types(tile, A, B, C, functor, what)
    math = tile.math_instruction
    check_tensor_op(what, math, kernel)
    operand = math.element_a
    is_fp8 = fp8 and operand in _FP8 and math.element_b in _FP8
    if not is_fp8 and (operand not in _OPERANDS or math.element_b is not operand):
        allowed = "float16 or bfloat16 operands (both the same)" + (", or float8_e4m3 / float8_e5m2 (any pair)"
                                                                    if fp8 else "")
        raise DescriptionError(f"{what}: {kernel} is built for {allowed}, got {operand.label} x "
                               f"{math.element_b.label}; {other_types}", rule="sm90.operand_type")
    if math.element_accumulator is not DataType.float32:
        raise DescriptionError(f"{what}: accumulate in float32, got {math.element_accumulator.label}",
                               rule="sm90.accumulator")
    for label, desc, element in (("A", A, operand), ("B", B, math.element_b)):
        check_operand_element(what, label, desc, element)
        check_tma_operand(what, label, desc)
    if is_fp8:
        check_k_major(what, A, B, "fp8")
    if C.element not in _OUTPUTS:
        raise DescriptionError(f"{what}: C must be one of {[e.label for e in _OUTPUTS]}, got {C.element.label}",
                               rule="sm90.output_type")
    check_tma_operand(what, "C", C)
    check_epilogue_kind(what, functor, epilogues, kernel, f"{' or '.join(epilogues)}{epilogue_hint}")
    check_epilogue_types(what, functor, C, DataType.float32)

    m, n, k = tile.threadblock_shape
    # 192 (16-bit operands): 3000-wide outputs and 14336-wide expert projections in fewer partial tiles than 256,
    # more operand reuse than 128; the GPU suites cover it for both schedules and every cluster shape.
    check_tile_n(what, n, (64, 128, 256) if is_fp8 else (64, 128, 192, 256))
    check_tile_k(what, k, operand)
    check_cluster_shape(what, tile)
    check_default_tile_scheduler(what, tile, "the grouped kernel uses CUTLASS's group scheduler")
    schedule = tile.kernel_schedule
    if schedule is _KS.Auto:  # as CUTLASS's builder (and GemmOperationUniversal(90)): fp8 accumulates fast
        schedule = _KS.TmaWarpSpecializedCooperative if m % 128 == 0 else _KS.TmaWarpSpecializedPingpong
        if is_fp8:
            schedule = schedule.fp8_fast_accum
    if schedule not in _KERNEL_SCHEDULES:
        fast = ", or their FP8FastAccum forms for fp8" if fp8 else ""
        raise DescriptionError(f"{what}: kernel_schedule must be Auto, TmaWarpSpecializedCooperative or "
                               f"TmaWarpSpecializedPingpong (CUTLASS's pointer-array kernels){fast}, got "
                               f"{schedule.value}", rule="sm90.kernel_schedule")
    check_fast_accum(what, schedule, is_fp8, f"{operand.label} x {math.element_b.label}")
    base = schedule.base
    check_schedule_tile_m(what, schedule, m, "the ping-pong schedule")
    expected_epilogue = _ES.TmaWarpSpecializedCooperative if base is _KS.TmaWarpSpecializedCooperative \
        else _ES.TmaWarpSpecialized
    check_epilogue_schedule(what, tile, expected_epilogue,
                            f"with {schedule.value} (CUTLASS's pointer-array TMA epilogue)")
    check_derived_warp_count(what, tile, schedule)
    check_epilogue_tile(what, tile, base is _KS.TmaWarpSpecializedCooperative, expected_epilogue, C.element,
                        operand.bits)
    if tile.stages:
        check_explicit_stages(what, tile, base is _KS.TmaWarpSpecializedCooperative, expected_epilogue,
                              C.element, operand.bits)
    return schedule


class Sm90GroupedGemmArgs(AbiStruct):
    """What Python hands the device-side Params builder. Nothing here depends on the per-group sizes (they stay on
    the device and the kernel reads them), so Params built for one group serve every group of the same count.
    ``raster_order``: 0 heuristic, 1 along M, 2 along N; ``sm_count``: SMs the persistent grid (and the per-SM
    tensormap slots of the workspace) are sized for. ``ptr_bias``: the per-group bias pointers (operations built
    with ``bias="column"``; null otherwise). ``alpha_ptr``: per-group alphas (float32, one per group; null: the scalar
    ``alpha`` for every group). ``ptr_scale_a`` / ``ptr_scale_b``: per-group pointers to the row-wise scales
    (operations built with ``scales="rowwise"``: M float32 values of group g's rows, N of its columns)."""

    _pointers_ = ("problem_sizes", "ptr_A", "ptr_B", "ptr_C", "ptr_D", "lda", "ldb", "ldc", "ldd", "workspace",
                  "ptr_bias", "alpha_ptr", "ptr_scale_a", "ptr_scale_b")
    _fields_ = [("problem_count", ctypes.c_int32), ("sm_count", ctypes.c_int32), ("raster_order", ctypes.c_int32),
                ("swizzle", ctypes.c_int32), ("max_active_clusters", ctypes.c_int32), ("reserved", ctypes.c_int32),
                ("problem_sizes", ctypes.c_uint64),  # device array of Shape<int, int, int> (3 x int32)
                ("ptr_A", ctypes.c_uint64), ("ptr_B", ctypes.c_uint64), ("ptr_C", ctypes.c_uint64),
                ("ptr_D", ctypes.c_uint64),  # device arrays of pointers
                ("lda", ctypes.c_uint64), ("ldb", ctypes.c_uint64), ("ldc", ctypes.c_uint64),
                ("ldd", ctypes.c_uint64),  # device arrays of CUTLASS's internal strides (one int64 each)
                ("workspace", ctypes.c_uint64),  # per-SM tensormap slots
                ("workspace_bytes", ctypes.c_int64),
                ("ptr_bias", ctypes.c_uint64),  # device array of per-group bias pointers
                ("alpha_ptr", ctypes.c_uint64),  # device array of per-group alphas (float32)
                ("ptr_scale_a", ctypes.c_uint64),  # device arrays of per-group row-wise scale pointers (float32)
                ("ptr_scale_b", ctypes.c_uint64)] + EPILOGUE_FIELDS


class Sm90BlockwiseGroupedGemmArgs(AbiStruct):
    """Sm90GroupedGemmArgs for grouped operations built with ``scales="blockwise"``: the same fields (``ptr_scale_a``
    / ``ptr_scale_b``: per-group pointers to the float32 block scales), then the device arrays of per-group CuTe
    layouts of the two scale tensors (``SCALE_LAYOUT_BYTES`` per group, written by the sizes kernel). A struct of its
    own, so that the units of every other grouped operation stay as they are."""

    _pointers_ = Sm90GroupedGemmArgs._pointers_ + ("layout_scale_a", "layout_scale_b")
    _fields_ = Sm90GroupedGemmArgs._fields_ + [("layout_scale_a", ctypes.c_uint64), ("layout_scale_b", ctypes.c_uint64)]
