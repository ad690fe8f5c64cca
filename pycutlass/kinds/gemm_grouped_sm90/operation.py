"""The SM90 (CUTLASS 3.x) grouped GEMM: CUTLASS's pointer-array kernel over ``GroupProblemShape<Shape<int, int, int>>``
(``KernelPtrArrayTmaWarpSpecializedCooperative`` / ``...Pingpong``), TMA loads and stores, warpgroup MMA, clusters.

``GemmOperationGrouped(90, tile, ...)`` builds one when the tile means the SM90 family (as for
``GemmOperationUniversal(90, ...)``: ``warp_count=None``, ``stages=0``, a warpgroup instruction, a cluster or a
schedule); a tile with an Sm80 warp arrangement keeps the CUTLASS 2.x grouped kernel.

How it runs without host C++ (see docs/grouped-gemm.md): the kernel keeps one *prototype* TMA descriptor per operand
in its Params and, per group, rewrites a copy of it in a per-SM slot of the workspace (``tensormap.replace``) with
that group's address, extents and strides. A one-thread builder runs CUTLASS's collective ``to_underlying_arguments``
(the kernel-level glue, which asks the host for the SM count, is written in the template with the count passed in)
and reports the prototypes as TMA records that the runtime encodes. The per-group sizes are read on the device only
(no host copy is given to CUTLASS), so the persistent grid is one wave of ``sm_count`` CTAs and the Params depend on
the group count, not on the sizes: new arguments for another group of the same count reuse them.
"""
from __future__ import annotations

from pathlib import Path

from ...description.tensor_description import TensorDescription
from ...description.tile_description import TileDescription
from ...description.types import (DataType, EpilogueScheduleType, IdentitySwizzle1, KernelScheduleType, LayoutType,
                                  OpClass, SwizzlingFunctor, TileSchedulerType)
from ...emit import names
from ...emit.emitter import render
from ...epilogue.functors import EpilogueFunctor
from ...errors import DescriptionError
from ..families.grouped import GROUPED_SWIZZLES, SchedulerMode
from ..gemm_grouped.operation import GemmOperationGrouped
from ..base import check_description_types
from ..families.sm90 import Sm90Operation, check_tma_operand, derived_warp_count
from ..gemm_sm90 import operation as sm90
from .abi import Sm90GroupedGemmArgs, Sm90GroupedSizesArgs

_KS, _ES, _TS = KernelScheduleType, EpilogueScheduleType, TileSchedulerType
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
_EPILOGUE_SCHEDULES = {  # by the schedule's base (fast accumulation does not change the epilogue)
    _KS.TmaWarpSpecializedCooperative: "cutlass::epilogue::PtrArrayTmaWarpSpecializedCooperative",
    _KS.TmaWarpSpecializedPingpong: "cutlass::epilogue::PtrArrayTmaWarpSpecializedPingpong",
}
# Both pointer-array epilogues keep one D tensormap per consumer warpgroup (CollectiveEpilogue::NumEpilogueWarpGroups,
# static_assert-ed in the template).
EPILOGUE_WARP_GROUPS = 2
TMA_DESCRIPTOR_BYTES = 128  # sizeof(cute::TmaDescriptor), static_assert-ed
_TENSORMAP_ALIGNMENT = 64  # the kernel's MinTensorMapWorkspaceAlignment
_WHAT = "GemmOperationGrouped(90)"
GROUPED_EPILOGUES = ("LinearCombination", "LinearCombinationGeneric", "LinearCombinationClamp")
_GROUPED_EPILOGUE_HINT = " (any activation), with bias='column' for a per-group bias"


def _round_up(value: int, multiple: int) -> int:
    return -(-value // multiple) * multiple


class GemmOperationGroupedSm90(Sm90Operation, GemmOperationGrouped):
    """``GemmOperationGrouped(90, tile_description, A, B, C, epilogue_functor, swizzling_functor=IdentitySwizzle1,
    precompute_mode=SchedulerMode.Device, bias=None)`` with an SM90 tile.

    f16 or bf16 operands (any layouts), or fp8 (float8_e4m3 / float8_e5m2, any pair; A RowMajor and B ColumnMajor,
    tile K 128; ``Auto`` resolves to the FP8FastAccum schedules as CUTLASS's builder does), f32 accumulation,
    f16/bf16/f32 output (C RowMajor or ColumnMajor);
    ``LinearCombination``, ``LinearCombinationGeneric`` with any activation, or ``LinearCombinationClamp`` (f16/bf16
    outputs: clamped to the output type's range). ``bias="column"``: every group adds its own vector of N values (in
    C's element type) to each row, D_g = act(alpha * A_g @ B_g + beta * C_g + bias_g); the vectors come with the
    arguments (``bias=``). The clamp with a bias is not built (rejected). ``precompute_mode`` must be Device:
    CUTLASS's SM90 group scheduler always walks the groups on the device. An ``IdentitySwizzleN`` sets the default
    swizzle of that scheduler (a runtime argument here).

    Per-group scales: the arguments take ``alpha=`` as G float32 values (one per group, e.g. an fp8 MoE's
    scale_a[g] * scale_b[g]) instead of the epilogue's scalar alpha; the kernel reads them on the device per tile.
    Beta stays one scalar.
    """

    kind = "gemm_grouped_sm90"
    abi_struct_type = Sm90GroupedGemmArgs

    def __new__(cls, *args, **kwargs):
        return object.__new__(cls)

    def __init__(self, arch: int, tile_description: TileDescription, A: TensorDescription, B: TensorDescription,
                 C: TensorDescription, epilogue_functor: EpilogueFunctor,
                 swizzling_functor: SwizzlingFunctor = IdentitySwizzle1,
                 precompute_mode: SchedulerMode = SchedulerMode.Device, bias=None):
        if arch != 90 or isinstance(arch, bool):
            raise DescriptionError(f"GemmOperationGroupedSm90 is compute capability 90, got {arch!r}")
        self.compute_capability = 90
        if precompute_mode is not SchedulerMode.Device:
            raise DescriptionError(f"{_WHAT}: CUTLASS's SM90 group scheduler walks the groups on the device; "
                                   f"precompute_mode must be SchedulerMode.Device, got {precompute_mode!r}")
        if swizzling_functor not in GROUPED_SWIZZLES:
            raise DescriptionError(f"{_WHAT}: swizzling_functor must be one of {[s.name for s in GROUPED_SWIZZLES]}, "
                                   f"got {swizzling_functor!r}")
        self._describe(90, tile_description, A, B, C, epilogue_functor, swizzling_functor)
        self.precompute_mode = precompute_mode
        self.kernel_schedule = _check(tile_description, A, B, C, epilogue_functor,
                                      epilogue_hint=_GROUPED_EPILOGUE_HINT, fp8=True)
        self.bias = _check_bias(bias, epilogue_functor)

    # --- identity -------------------------------------------------------------------------------------------
    def abi_structs(self) -> tuple:
        return (*super().abi_structs(), Sm90GroupedSizesArgs)

    def _signature(self) -> tuple:
        tile = self.tile_description
        return ("gemm_grouped_sm90", tile.threadblock_shape, tile.stages, tile.math_instruction, tile.cluster_shape,
                self.kernel_schedule, self.A, self.B, self.C, self.epilogue_functor, self.bias)

    def _readable_name(self) -> str:
        return ptr_array_readable_name(self, "gemm_grouped_sm90") + ("_biasc" if self.bias else "")

    @property
    def transposed(self) -> bool:
        return False  # CUTLASS 3.x writes either layout of D directly

    @property
    def precompute_symbol(self) -> None:
        return None

    @property
    def thread_count(self) -> int:
        """Threads per CTA: one producer warpgroup plus two consumer warpgroups (both schedules)."""
        return 384

    @property
    def warp_count(self) -> tuple[int, int, int]:
        return derived_warp_count(self.tile_description.threadblock_shape, self.kernel_schedule)

    @property
    def default_swizzle(self) -> int:
        """The group scheduler's swizzle when the arguments give none (from an IdentitySwizzleN)."""
        return self.swizzling_functor.log_tile if self.swizzling_functor.kind == "gemm" else 1

    @property
    def empty_k_stand_in(self) -> int:
        """The K a group of K = 0 runs with (one 16-byte vector of zeros): CUTLASS's main loop leaves the
        accumulators unset when a tile has no K iteration, so such groups multiply zeros instead."""
        return 128 // self.A.element.bits

    # --- scheduling (what the runtime needs) ----------------------------------------------------------------
    def grid_for(self, sm_count: int, occupancy: int = 1, problem_sizes=None) -> int:
        raise DescriptionError(f"{self.name}: the SM90 grouped kernel sizes its persistent grid itself (one wave of "
                               f"sm_count CTAs); see GemmGroupedArguments.threadblock_count after a run")

    def workspace_bytes(self, sm_count: int, threadblock_count: int | None = None) -> int:
        """Per-SM tensormap slots: C and one D per epilogue warpgroup, then A and B (CUTLASS's get_workspace_size,
        which the builder reports too; the runtime checks that both agree)."""
        return tensormap_workspace_bytes(self.name, sm_count)

    @property
    def sizes_symbol(self) -> str:
        """The kernel that turns device-side group sizes into the per-group arrays (run before each such launch)."""
        return self.name + "_sizes"

    sizes_threads = 1024  # one block; the template's __launch_bounds__

    def launch_plan(self) -> dict:
        return {"kernel": self.kernel_symbol, "builder": self.builder_symbol, "precompute": None,
                "sizes": self.sizes_symbol, "thread_count": self.thread_count}

    # --- emission -------------------------------------------------------------------------------------------
    def headers(self) -> list[str]:
        return ["cute/tensor.hpp", "cutlass/gemm/collective/collective_builder.hpp",
                "cutlass/epilogue/collective/collective_builder.hpp", "cutlass/epilogue/thread/activation.h",
                "cutlass/gemm/group_array_problem_shape.hpp", "cutlass/gemm/kernel/gemm_universal.hpp",
                "cutlass/gemm/dispatch_policy.hpp"]

    def emit_body(self) -> str:
        return render_ptr_array_kernel(self, bias=self.bias, sizes_kernel=True)

    def describe(self) -> str:
        return ptr_array_description(self, "grouped") + (f" bias={self.bias}" if self.bias else "")


def tensormap_workspace_bytes(name: str, sm_count: int) -> int:
    """The pointer-array kernel's per-SM tensormap slots: C and one D per epilogue warpgroup, then A and B."""
    if isinstance(sm_count, bool) or not isinstance(sm_count, int) or sm_count <= 0:
        raise DescriptionError(f"{name}: sm_count must be a positive integer, got {sm_count!r}")
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
            f"kernel=PtrArray{op.kernel_schedule.value} epilogue_op={op.epilogue_functor.describe()}")


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
            f"{m}x{n}x{k}_c{cm}x{cn}_s{tile.stages}_{schedule}{sm90.epilogue_suffix(op.epilogue_functor)}")


def render_ptr_array_kernel(op, bias: str | None = None, sizes_kernel: bool = False, template: Path | None = None) -> str:
    """The pointer-array kernel and its builder (gemm_grouped_sm90.cu.j2) for ``op``: a grouped operation, or an
    SM90 GEMM built for Mode.Array (kinds/gemm_array_sm90), which runs it with one size per batch entry.

    ``bias``: None or "column" (the per-group bias tree; grouped operations only). ``sizes_kernel``: also emit
    ``<name>_sizes``, the device-sizes kernel of grouped operations, whose ABI struct (Sm90GroupedSizesArgs) only
    their units define; the Array kind has no device-side sizes and leaves it out. ``template``: the kind's own
    template (the Array kind's includes this one)."""
    tile = op.tile_description
    functor = op.epilogue_functor
    activation, activation_args, clamp = sm90.fusion_activation(functor)
    if bias not in (None, "column"):
        raise DescriptionError(f"{op.name}: the pointer-array template builds bias None or 'column', got {bias!r}")
    if bias is not None and clamp:  # the operation rejects it; the bias tree sets no clamp bounds
        raise DescriptionError(f"{op.name}: the clamp is not built with the per-group bias tree")
    return render(
        template or Path(__file__).parent / "gemm_grouped_sm90.cu.j2", name=op.name, summary=op.describe(),
        element_a=names.ELEMENT[op.A.element], layout_a=names.LAYOUT[op.A.layout], alignment_a=op.A.alignment,
        element_b=names.ELEMENT[op.B.element], layout_b=names.LAYOUT[op.B.layout], alignment_b=op.B.alignment,
        element_c=names.ELEMENT[op.C.element], layout_c=names.LAYOUT[op.C.layout], alignment_c=op.C.alignment,
        element_accumulator=names.ELEMENT[op.element_accumulator],
        element_compute=names.ELEMENT[functor.element_epilogue],
        tile_shape=tile.threadblock_shape, cluster_shape=tile.cluster_shape, stages=tile.stages,
        kernel_schedule=_KERNEL_SCHEDULES[op.kernel_schedule],
        epilogue_schedule=_EPILOGUE_SCHEDULES[op.kernel_schedule.base],
        activation=activation, activation_args=activation_args, clamp=clamp, bias=bias, sizes_kernel=sizes_kernel,
        epilogue_warp_groups=EPILOGUE_WARP_GROUPS, tma_descriptor_bytes=TMA_DESCRIPTOR_BYTES,
        thread_count=op.thread_count)


def _check(tile: TileDescription, A, B, C, functor, what: str = _WHAT, epilogues: tuple = GROUPED_EPILOGUES,
           kernel: str = "the SM90 grouped kernel",
           other_types: str = "use compute capability 80's grouped kernel (an Sm80 tile) for other types",
           epilogue_hint: str = "", fp8: bool = False) -> KernelScheduleType:
    """CUTLASS 3.x's rules for the SM90 pointer-array grouped kernel (as far as the GPU suite covers them); returns the
    resolved kernel schedule. Everything is rejected here, before a compile of about a minute. ``fp8``: also take
    float8_e4m3 / float8_e5m2 operands (A RowMajor, B ColumnMajor; the grouped kind's GPU suite covers them)."""
    check_description_types(tile, A, B, C, functor, what)
    math = tile.math_instruction
    if math.opcode_class is not OpClass.TensorOp:
        raise DescriptionError(f"{what}: {kernel} computes on tensor cores (OpClass.TensorOp)")
    operand = math.element_a
    is_fp8 = fp8 and operand in _FP8 and math.element_b in _FP8
    if not is_fp8 and (operand not in _OPERANDS or math.element_b is not operand):
        allowed = "float16 or bfloat16 operands (both the same)" + (", or float8_e4m3 / float8_e5m2 (any pair)"
                                                                    if fp8 else "")
        raise DescriptionError(f"{what}: {kernel} is built for {allowed}, got {operand.label} x "
                               f"{math.element_b.label}; {other_types}")
    if math.element_accumulator is not DataType.float32:
        raise DescriptionError(f"{what}: accumulate in float32, got {math.element_accumulator.label}")
    for label, desc, element in (("A", A, operand), ("B", B, math.element_b)):
        if desc.element is not element:
            raise DescriptionError(f"{what}: {label}.element is {desc.element.label} but the math instruction "
                                   f"multiplies {element.label}")
        check_tma_operand(what, label, desc)
    if is_fp8 and (A.layout, B.layout) != (LayoutType.RowMajor, LayoutType.ColumnMajor):
        raise DescriptionError(f"{what}: wgmma reads fp8 operands K-major only: A must be RowMajor and B ColumnMajor "
                               f"(got A {A.layout.value}, B {B.layout.value})")
    if C.element not in _OUTPUTS:
        raise DescriptionError(f"{what}: C must be one of {[e.label for e in _OUTPUTS]}, got {C.element.label}")
    check_tma_operand(what, "C", C)
    if functor.kind not in epilogues:
        raise DescriptionError(f"{what}: the {functor.kind} epilogue is not built for {kernel}; use "
                               f"{' or '.join(epilogues)}{epilogue_hint}")
    if functor.element_output is not C.element or functor.alignment != C.alignment:
        raise DescriptionError(f"{what}: the epilogue writes {functor.element_output.label} x {functor.alignment} but "
                               f"C is {C.element.label} x {C.alignment}; they must match")
    if functor.element_accumulator is not DataType.float32 or functor.element_epilogue is not DataType.float32:
        raise DescriptionError(f"{what}: the epilogue reads float32 accumulators and computes in float32, got "
                               f"{functor.element_accumulator.label} / {functor.element_epilogue.label}")

    m, n, k = tile.threadblock_shape
    if n not in (64, 128, 256):
        raise DescriptionError(f"{what}: tile N must be 64, 128 or 256, got {n}")
    if k * operand.bits // 8 != 128:
        raise DescriptionError(f"{what}: tile K must be {128 * 8 // operand.bits} {operand.label} elements (the "
                               f"128-byte TMA swizzle atom), got {k}")
    if tuple(tile.cluster_shape) not in ((1, 1, 1), (2, 1, 1), (1, 2, 1)):
        raise DescriptionError(f"{what}: cluster_shape must be [1, 1, 1], [2, 1, 1] or [1, 2, 1], got "
                               f"{list(tile.cluster_shape)}")
    if tile.tile_scheduler is not _TS.Default:
        raise DescriptionError(f"{what}: the grouped kernel uses CUTLASS's group scheduler; tile_scheduler must be "
                               f"Default, got {tile.tile_scheduler.name}")
    schedule = tile.kernel_schedule
    if schedule is _KS.Auto:  # as CUTLASS's builder (and GemmOperationUniversal(90)): fp8 accumulates fast
        schedule = _KS.TmaWarpSpecializedCooperative if m % 128 == 0 else _KS.TmaWarpSpecializedPingpong
        if is_fp8:
            schedule = schedule.fp8_fast_accum
    if schedule not in _KERNEL_SCHEDULES:
        fast = ", or their FP8FastAccum forms for fp8" if fp8 else ""
        raise DescriptionError(f"{what}: kernel_schedule must be Auto, TmaWarpSpecializedCooperative or "
                               f"TmaWarpSpecializedPingpong (CUTLASS's pointer-array kernels){fast}, got "
                               f"{schedule.value}")
    if schedule.is_fp8_fast_accum and not is_fp8:
        raise DescriptionError(f"{what}: {schedule.value} accumulates fp8 products fast; the operands are "
                               f"{operand.label} x {math.element_b.label}")
    base = schedule.base
    if base is _KS.TmaWarpSpecializedCooperative and m not in (128, 256):
        raise DescriptionError(f"{what}: the cooperative schedule splits tile M over two warpgroups of 64 rows: tile "
                               f"M must be 128 or 256, got {m}")
    if base is _KS.TmaWarpSpecializedPingpong and m not in (64, 128):
        raise DescriptionError(f"{what}: the ping-pong schedule computes a tile with one warpgroup: tile M must be 64 "
                               f"or 128, got {m}")
    expected_epilogue = _ES.TmaWarpSpecializedCooperative if base is _KS.TmaWarpSpecializedCooperative \
        else _ES.TmaWarpSpecialized
    if tile.epilogue_schedule not in (_ES.Auto, expected_epilogue):
        raise DescriptionError(f"{what}: with {schedule.value} the epilogue schedule must be Auto or "
                               f"{expected_epilogue.value} (CUTLASS's pointer-array TMA epilogue), got "
                               f"{tile.epilogue_schedule.value}")
    if tile.warp_count is not None and tile.warp_count != derived_warp_count(tile.threadblock_shape, schedule):
        raise DescriptionError(f"{what}: warp_count is derived on SM90 "
                               f"({list(derived_warp_count(tile.threadblock_shape, schedule))} for "
                               f"{schedule.value}); pass None or that value, got {list(tile.warp_count)}")
    if tile.stages:
        sm90.check_explicit_stages(what, tile, base is _KS.TmaWarpSpecializedCooperative, expected_epilogue,
                                   C.element, operand.bits)
    return schedule


def _check_bias(bias, functor: EpilogueFunctor | None = None) -> str | None:
    if bias == "column" and functor is not None and functor.kind in sm90.CLAMP_KINDS:
        raise DescriptionError(f"{_WHAT}: {functor.kind} with bias='column' is not built: CUTLASS 4.2 has no "
                               f"pointer-array bias fusion, so the per-group bias is pycutlass's own epilogue tree, "
                               f"and its activation node is not given the clamp's bounds (nor tested on a GPU); "
                               f"use the clamp without a bias, or bias='column' with LinearCombination or "
                               f"LinearCombinationGeneric")
    if bias is None or bias == "column":
        return bias
    if bias == "row":
        raise DescriptionError(f"{_WHAT}: bias='row' (M values per group) is not built: CUTLASS's column broadcast "
                               f"reads the vector in 16-byte vectors predicated on their first row, so a group whose "
                               f"M is not a multiple of 8 would read past its vector (and device-side sizes could "
                               f"not be checked); use bias='column' (N values per group, read element by element)")
    if bias is True:
        raise DescriptionError(f"{_WHAT}: bias=True (C as a broadcast vector, PyCUTLASS's bias) is not built for SM90 "
                               f"(TMA reads whole matrices); use bias='column' and pass the vectors as bias=")
    raise DescriptionError(f"{_WHAT}: bias must be None or 'column' (N values per group), got {bias!r}")
