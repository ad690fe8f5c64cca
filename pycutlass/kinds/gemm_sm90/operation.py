"""The SM90 (CUTLASS 3.x) GEMM: TMA loads, warpgroup MMA, warp-specialized schedules, clusters, persistent and
stream-K tile schedulers, epilogues through CUTLASS's SM90 fusion operations.

``GemmOperationUniversal(90, ...)`` builds one (compute capability 90 picks the 3.x family; 80 keeps the Sm80
family, which runs on Hopper too). Everything CUTLASS would reject with a ``static_assert`` after a ~30 s compile is
rejected here, with the rule, before anything compiles.

The kernel's ``Params`` are built on the device by a one-thread builder that runs CUTLASS's own collective and
tile-scheduler ``to_underlying_arguments``; only the part of the kernel-level glue that asks the host for the SM
count is written in the template (the count comes in the ABI struct). TMA descriptors cannot be encoded on the device:
the builder reports, for each, its offset in Params and the exact ``cuTensorMapEncodeTiled`` arguments (from the TMA
copy types), and the runtime encodes them (``runtime/launch.py``). Only NVRTC compiles such a builder
(``-default-device`` turns CUTLASS's unannotated host functions into device functions), so the operation asks for
NVRTC whatever the session's backend is, and the compile report says so.
"""
from __future__ import annotations


from ...description.tensor_description import TensorDescription
from ...description.tile_description import TileDescription
from ...description.types import (GEMM_SWIZZLES, DataType, EpilogueScheduleType, IdentitySwizzle1,
                                   KernelScheduleType, LayoutType, SwizzlingFunctor, TileSchedulerType)
from ...emit import names
from ...epilogue.functors import EpilogueFunctor
from ...errors import DescriptionError
from .. import registry
from ..families.sm90 import (  # noqa: F401  (their names as this module had them)
    CLAMP_ACTIVATION, CLAMP_KINDS, EPILOGUE_KINDS, NVRTC_SHIM, Sm90Operation, check_explicit_stages, check_tma_operand,
    derived_warp_count, epilogue_smem_bytes, epilogue_suffix, epilogue_tile_signature, epilogue_tile_suffix,
    epilogue_tile_text, fusion_activation, resolve_kernel_schedule)
from ..families.sm90 import (BLOCK_SCALE, check_block_scale_tile, check_cluster_shape, check_derived_warp_count,
                             check_epilogue_kind, check_epilogue_tile, check_epilogue_types, check_fast_accum,
                             check_k_major, check_operand_element, check_schedule_tile_m, check_tensor_op, check_tile_k, check_tile_n)
from ..base import check_description_types
from ..gemm.operation import GemmOperationUniversal
from .abi import Sm90BlockwiseGemmArgs, Sm90GemmArgs

_KS, _ES, _TS = KernelScheduleType, EpilogueScheduleType, TileSchedulerType
_F16, _BF16, _F32, _TF32 = DataType.float16, DataType.bfloat16, DataType.float32, DataType.tfloat32
_S8, _S32, _E4M3, _E5M2 = DataType.int8, DataType.int32, DataType.float8_e4m3, DataType.float8_e5m2

# Operand type -> accumulators wgmma offers for it.
_ACCUMULATORS = {_F16: (_F32, _F16), _BF16: (_F32,), _TF32: (_F32,), _F32: (_F32,), _E4M3: (_F32,), _E5M2: (_F32,),
                 _S8: (_S32,)}
_FLOAT_OUTPUTS = (_F16, _BF16, _F32)
_PLAIN = (LayoutType.RowMajor, LayoutType.ColumnMajor)
TILE_N = (32, 64, 128, 192, 256)  # the tile widths the GPU suite proves


_KERNEL_SCHEDULES = {
    _KS.TmaWarpSpecialized: "cutlass::gemm::KernelTmaWarpSpecialized",
    _KS.TmaWarpSpecializedCooperative: "cutlass::gemm::KernelTmaWarpSpecializedCooperative",
    _KS.TmaWarpSpecializedPingpong: "cutlass::gemm::KernelTmaWarpSpecializedPingpong",
    _KS.TmaWarpSpecializedFP8FastAccum: "cutlass::gemm::KernelTmaWarpSpecializedFP8FastAccum",
    _KS.TmaWarpSpecializedCooperativeFP8FastAccum: "cutlass::gemm::KernelTmaWarpSpecializedCooperativeFP8FastAccum",
    _KS.TmaWarpSpecializedPingpongFP8FastAccum: "cutlass::gemm::KernelTmaWarpSpecializedPingpongFP8FastAccum",
}
_EPILOGUE_SCHEDULES = {
    _ES.TmaWarpSpecialized: "cutlass::epilogue::TmaWarpSpecialized",
    _ES.TmaWarpSpecializedCooperative: "cutlass::epilogue::TmaWarpSpecializedCooperative",
    _ES.NoSmemWarpSpecialized: "cutlass::epilogue::NoSmemWarpSpecialized",
}
_TILE_SCHEDULERS = {_TS.Default: "cutlass::gemm::PersistentScheduler", _TS.StreamK: "cutlass::gemm::StreamKScheduler"}

# Grid dependency control: with it CUTLASS's GemmUniversal kernels (warp-specialized, cooperative, ping-pong) run
# griddepcontrol.wait before their first global access and launch_dependents near their end, so Arguments may launch
# them with programmatic dependent launch (pdl=True); launched without it, the wait returns at once. It changes the
# binary and every header of a unit sees it: it is a unit macro (in the source, so in the cache key).
GDC_MACRO = "CUTLASS_ENABLE_GDC_FOR_SM90"

BIAS_MODES = ("row", "column")  # one value per row of D (M values) or per column (N values)

# scales="blockwise": fp8 with float32 scales per 1 x 128 block of A (each row, every 128 of K) and per 128 x 128
# block of B (the DeepSeek-V3 recipe); CUTLASS's blockwise main loops, which promote into float32 every 128 of K.
_BLOCKWISE_SCHEDULES = {
    _KS.TmaWarpSpecializedCooperative: "cutlass::gemm::KernelTmaWarpSpecializedCooperativeFP8Blockwise",
    _KS.TmaWarpSpecializedPingpong: "cutlass::gemm::KernelTmaWarpSpecializedPingpongFP8Blockwise",
}


def _array_requested(args: tuple, kwargs: dict) -> bool:
    """Whether ``GemmOperationUniversal(90, tile, A, B, C, epilogue, swizzle, visitor, bias, array)`` says array=True."""
    return kwargs.get("array", args[9] if len(args) > 9 else False) is True


class GemmOperationSm90(Sm90Operation, GemmOperationUniversal):
    """``GemmOperationUniversal(90, tile_description, A, B, C, epilogue_functor, swizzling_functor, bias=None)``.

    ``bias``: None, ``"row"`` (a vector of M values added to every column: CUTLASS's per-row bias) or ``"column"``
    (N values added to every row); D = activation(alpha * A @ B + beta * C + bias). The vector comes with the
    arguments (``GemmArguments(..., bias=vector)``).

    ``scales="blockwise"`` (fp8 operands): D = activation(alpha * sum_kb scale_a[m, kb] * scale_b[n / 128, kb] *
    (A @ B over K block kb) + beta * C), float32 scales per 1 x 128 block of A and per 128 x 128 block of B (the
    DeepSeek-V3 recipe), accumulated in float32 every 128 of K (CUTLASS's blockwise main loops; cooperative or
    ping-pong, tile N and K 128, the default tile scheduler). The scales come with the arguments
    (``scale_a=``, ``scale_b=``). The 2.x ``swizzling_functor`` is accepted for PyCUTLASS code:
    an ``IdentitySwizzleN`` sets the default swizzle size N of the tile scheduler (a runtime argument here).
    """

    kind = "gemm_sm90"
    scales = None  # "blockwise": fp8 with block-wise scales (BLOCK_SCALE)
    array = False  # built for Mode.Array's lists of matrices (the pointer-array kernel, kinds/gemm_array_sm90)
    # FastLinearCombinationClamp is the clamp of LinearCombinationClamp here (exact int32 -> float conversion), so
    # CUTLASS 2.x's K <= 256 limit of its fast converters does not apply.
    fast_clamp_max_k = None
    # split_k_slices > 1 is stream-K, which adds the K slices' partials in the accumulator type (kinds/gemm's
    # check_split_k_output)
    serial_split_k_through_output = False

    def __new__(cls, *args, **kwargs):
        # array=True builds the pointer-array kernel (kinds/gemm_array_sm90, a subclass of this one).
        if cls is GemmOperationSm90 and _array_requested(args, kwargs):
            array_kind = registry.select("GemmOperationUniversal", sm90_tile=True, array=True)
            return object.__new__(array_kind.operation_class())  # Python then runs its __init__
        return object.__new__(cls)

    def __init__(self, arch: int, tile_description: TileDescription, A: TensorDescription, B: TensorDescription,
                 C: TensorDescription, epilogue_functor: EpilogueFunctor,
                 swizzling_functor: SwizzlingFunctor = IdentitySwizzle1, visitor: bool = False, bias=None,
                 array: bool = False, direct_store: bool = False, scales=None):
        if arch != 90:
            raise DescriptionError(f"GemmOperationSm90 is compute capability 90, got {arch!r}",
                                   rule="target.compute_capability")
        if direct_store is not False:
            raise DescriptionError("direct_store=True is the Sm80 family's register-to-global epilogue; the SM90 "
                                   "kernels store through their own (TMA) epilogue. Use an Sm80 tile (with "
                                   "warp_count) for direct_store", rule="direct_store.unsupported")
        if array is not False:
            raise DescriptionError(f"array must be True (CUTLASS's pointer-array kernel, for Mode.Array with lists of "
                                   f"matrices) or False, got {array!r}" if array is not True else
                                   "GemmOperationSm90 is the ordinary SM90 kernel; build array=True operations "
                                   "through GemmOperationUniversal(90, ..., array=True)", rule="description.field_type")
        self.compute_capability = 90
        if visitor:
            raise DescriptionError("the epilogue visitor tree is built for the Sm80 family only; for SM90 use "
                                   "LinearCombinationGeneric and bias='row'/'column'", rule="evt.unsupported")
        if bias not in (None, *BIAS_MODES):
            raise DescriptionError(f"bias must be None, 'row' (M values, one per row of D) or 'column' (N values), "
                                   f"got {bias!r}", rule="bias.unsupported")
        if swizzling_functor not in GEMM_SWIZZLES:
            raise DescriptionError(f"swizzling_functor must be one of {[s.name for s in GEMM_SWIZZLES]}, got "
                                   f"{swizzling_functor!r}", rule="swizzle.unsupported")
        if scales not in (None, "blockwise"):
            raise DescriptionError(f"scales must be None or 'blockwise' (fp8 with float32 scales per 1x128 block of A "
                                   f"and 128x128 block of B), got {scales!r}", rule="scales.unsupported")
        self.bias = bias
        self.scales = scales
        self._describe(90, tile_description, A, B, C, epilogue_functor, swizzling_functor)
        self.kernel_schedule, self.epilogue_schedule = _check(tile_description, A, B, C, epilogue_functor, bias)
        self.tile_scheduler = tile_description.tile_scheduler
        if scales:
            self.kernel_schedule = _check_blockwise(tile_description, self.kernel_schedule, C, epilogue_functor, bias)

    @property
    def abi_struct_type(self):
        """The builder's argument struct: block-scaled operations carry the two scale pointers."""
        return Sm90BlockwiseGemmArgs if self.scales else Sm90GemmArgs

    # --- identity -------------------------------------------------------------------------------------------
    def _signature(self) -> tuple:
        tile = self.tile_description
        return ("gemm_sm90", tile.threadblock_shape, tile.stages, tile.math_instruction, tile.cluster_shape,
                self.kernel_schedule, self.epilogue_schedule, self.tile_scheduler, self.A, self.B, self.C,
                self.epilogue_functor, self.bias) + ((self.scales,) if self.scales else ()) + \
            epilogue_tile_signature(tile)

    def _readable_name(self) -> str:
        tile = self.tile_description
        math = tile.math_instruction
        s = names.SHORT
        layouts = "".join(names.LAYOUT_SHORT[d.layout] for d in (self.A, self.B, self.C))
        m, n, k = tile.threadblock_shape
        cm, cn, _ = tile.cluster_shape
        schedule = {"TmaWarpSpecialized": "ws", "TmaWarpSpecializedCooperative": "coop",
                    "TmaWarpSpecializedPingpong": "pp"}[self.kernel_schedule.base.value]
        if self.kernel_schedule.is_fp8_fast_accum:
            schedule += "fa"
        if self.scales:
            schedule += "_bw"
        extra = ("_sk" if self.tile_scheduler is _TS.StreamK else "") + epilogue_tile_suffix(tile) + \
            ("_nosmem" if self.epilogue_schedule is _ES.NoSmemWarpSpecialized else "") + \
            (f"_bias{self.bias[0]}" if self.bias else "") + epilogue_suffix(self.epilogue_functor)
        return (f"gemm_sm90_{s[self.A.element]}{s[self.B.element]}{s[self.C.element]}{s[math.element_accumulator]}_"
                f"{layouts}_{m}x{n}x{k}_c{cm}x{cn}_s{tile.stages}_{schedule}{extra}_"
                f"a{self.A.alignment}{self.B.alignment}{self.C.alignment}")

    @property
    def transposed(self) -> bool:
        return False  # CUTLASS 3.x writes either layout of D directly

    @property
    def warp_count(self) -> tuple[int, int, int]:
        """The warps CUTLASS computes with (consumer warpgroups x 4, along M): what ``warp_count`` may say."""
        return derived_warp_count(self.tile_description.threadblock_shape, self.kernel_schedule)

    @property
    def default_swizzle(self) -> int:
        """The tile scheduler's swizzle size when the arguments give none (from a 2.x IdentitySwizzleN)."""
        return self.swizzling_functor.log_tile if self.swizzling_functor.kind == "gemm" else 1

    # --- emission -------------------------------------------------------------------------------------------
    @property
    def pdl_refusal(self) -> str | None:
        """Why Arguments may not launch this kernel with programmatic dependent launch (None: they may)."""
        if self.tile_scheduler is _TS.StreamK:
            return ("CUTLASS 4.2's stream-K tile scheduler does not compile with grid dependency control "
                    "(is_last_tile binds a const member to a non-const reference)")
        return None

    @property
    def unit_macros(self) -> tuple[str, ...]:
        """Macros this operation's whole translation unit must define (compiler.manager never mixes sets)."""
        return (GDC_MACRO,) if self.pdl_refusal is None else ()

    def preamble(self) -> list[str]:
        """Before any include: CUTLASS 4.2's SM90 headers use a few C++17 std names NVRTC's std lacks; then the
        unit's macros."""
        return [NVRTC_SHIM, *(f"#define {macro} 1" for macro in self.unit_macros)]

    def headers(self) -> list[str]:
        return ["cute/tensor.hpp", "cutlass/gemm/collective/collective_builder.hpp",
                "cutlass/epilogue/collective/collective_builder.hpp", "cutlass/epilogue/thread/activation.h",
                "cutlass/gemm/kernel/gemm_universal.hpp", "cutlass/gemm/dispatch_policy.hpp"] + \
            (["cutlass/detail/blockwise_scale_layout.hpp"] if self.scales else [])

    def emit_body(self) -> str:
        tile = self.tile_description
        math = tile.math_instruction
        activation, activation_args, clamp = fusion_activation(self.epilogue_functor)
        return self.render(
            "gemm_sm90.cu.j2", name=self.name, summary=self.describe(),
            element_a=self._operand_element(self.A), layout_a=names.LAYOUT[self.A.layout], alignment_a=self.A.alignment,
            element_b=self._operand_element(self.B), layout_b=names.LAYOUT[self.B.layout], alignment_b=self.B.alignment,
            element_c=names.ELEMENT[self.C.element], layout_c=names.LAYOUT[self.C.layout], alignment_c=self.C.alignment,
            element_accumulator=names.ELEMENT[math.element_accumulator],
            element_compute=names.ELEMENT[self.epilogue_functor.element_epilogue],
            tile_shape=tile.threadblock_shape, cluster_shape=tile.cluster_shape, stages=tile.stages,
            epilogue_tile=tile.epilogue_tile,
            kernel_schedule=(_BLOCKWISE_SCHEDULES if self.scales else _KERNEL_SCHEDULES)[self.kernel_schedule],
            kernel_family=self.kernel_schedule.base.value,
            epilogue_schedule=_EPILOGUE_SCHEDULES[self.epilogue_schedule],
            tile_scheduler=_TILE_SCHEDULERS[self.tile_scheduler], stream_k=self.tile_scheduler is _TS.StreamK,
            activation=activation, activation_args=activation_args, clamp=clamp,
            bias=self.bias, tma_epilogue=self.epilogue_schedule is not _ES.NoSmemWarpSpecialized,
            block_scale=BLOCK_SCALE if self.scales else None, abi_struct=self.abi_struct_type.__name__)

    def describe(self) -> str:
        tile = self.tile_description
        math = tile.math_instruction
        return (f"GEMM sm90 A={self.A.element.label}/{self.A.layout.value}/{self.A.alignment} "
                f"B={self.B.element.label}/{self.B.layout.value}/{self.B.alignment} "
                f"C={self.C.element.label}/{self.C.layout.value}/{self.C.alignment} "
                f"acc={math.element_accumulator.label} tile={list(tile.threadblock_shape)} "
                f"cluster={list(tile.cluster_shape)} stages={tile.stages or 'auto'} "
                f"kernel={self.kernel_schedule.value} epilogue={self.epilogue_schedule.value} "
                f"{epilogue_tile_text(tile)}"
                f"scheduler={self.tile_scheduler.name} epilogue_op={self.epilogue_functor.describe()}"
                f"{' bias=' + self.bias if self.bias else ''}{' scales=' + self.scales if self.scales else ''}")


def _check_blockwise(tile: TileDescription, schedule: KernelScheduleType, C, functor, bias) -> KernelScheduleType:
    """What CUTLASS's SM90 blockwise main loops take (as far as the GPU suite covers them); returns the schedule
    they run (Auto's fp8 fast accumulation resolves to the plain schedule: the blockwise loop promotes itself)."""
    what = "GemmOperationUniversal(90, scales='blockwise')"
    math = tile.math_instruction
    if not (math.element_a.is_fp8 and math.element_b.is_fp8):
        raise DescriptionError(f"{what}: block-wise scales are built for fp8 operands (float8_e4m3 / float8_e5m2), "
                               f"got {math.element_a.label} x {math.element_b.label}", rule="scales.unsupported")
    if tile.kernel_schedule is not _KS.Auto and schedule.is_fp8_fast_accum:
        raise DescriptionError(f"{what}: {schedule.value} accumulates without promotion; the blockwise main loop "
                               f"promotes into float32 every 128 of K itself: use Auto, TmaWarpSpecializedCooperative "
                               f"or TmaWarpSpecializedPingpong", rule="scales.unsupported")
    base = schedule.base
    if base is _KS.TmaWarpSpecialized:  # Auto on a 64-row tile
        base = _KS.TmaWarpSpecializedPingpong if tile.kernel_schedule is _KS.Auto else base
    if base not in _BLOCKWISE_SCHEDULES:
        raise DescriptionError(f"{what}: CUTLASS's blockwise main loops are cooperative or ping-pong, got "
                               f"{schedule.value}", rule="scales.unsupported")
    check_block_scale_tile(what, tile)
    if tile.tile_scheduler is not _TS.Default:
        raise DescriptionError(f"{what}: the blockwise main loops are built with the default tile scheduler, got "
                               f"{tile.tile_scheduler.name}", rule="scales.unsupported")
    if tile.stages:
        raise DescriptionError(f"{what}: the blockwise main loop keeps its scales in shared memory beside the "
                               f"operands; leave stages=0 (the builder carves them), got {tile.stages}",
                               rule="scales.unsupported")
    if tile.epilogue_schedule is _ES.NoSmemWarpSpecialized:
        raise DescriptionError(f"{what}: built with the TMA epilogues only (Auto), got NoSmemWarpSpecialized",
                               rule="scales.unsupported")
    if bias is not None or functor.kind in CLAMP_KINDS:
        raise DescriptionError(f"{what}: not built with bias= or {functor.kind} (use LinearCombination or "
                               f"LinearCombinationGeneric)", rule="scales.unsupported")
    if C.element.is_fp8:
        raise DescriptionError(f"{what}: fp8 outputs are not built with block-wise scales (C must be float16, "
                               f"bfloat16 or float32)", rule="scales.unsupported")
    return base


def _check(tile: TileDescription, A, B, C, functor, bias) -> tuple[KernelScheduleType, EpilogueScheduleType]:
    """CUTLASS 3.x's rules for an SM90 TMA warp-specialized GEMM; returns the resolved (kernel, epilogue) schedules."""
    what = "GemmOperationUniversal(90)"
    check_description_types(tile, A, B, C, functor, what)
    math = tile.math_instruction
    check_tensor_op(what, math, "the SM90 family")
    operand = math.element_a
    if operand not in _ACCUMULATORS:
        raise DescriptionError(f"{what}: {operand.label} operands are not in the SM90 family (it takes float16, "
                               f"bfloat16, tfloat32, float8_e4m3/e5m2 and int8); use compute capability 80 for "
                               f"{operand.label}", rule="sm90.operand_type")
    if math.element_accumulator not in _ACCUMULATORS[operand]:
        raise DescriptionError(f"{what}: {operand.label} operands accumulate in "
                               f"{[a.label for a in _ACCUMULATORS[operand]]} on SM90, got "
                               f"{math.element_accumulator.label}", rule="sm90.accumulator")
    for label, desc, element in (("A", A, math.element_a), ("B", B, math.element_b)):
        check_operand_element(what, label, desc, element, (element, _F32) if element is _TF32 else None)
        check_tma_operand(what, label, desc)
    if operand.bits != 16:
        check_k_major(what, A, B, operand.label)
    outputs = {_S8: (_S8, _S32)}.get(operand, _FLOAT_OUTPUTS + ((_E4M3, _E5M2) if operand.is_fp8 else ()))
    if C.element not in outputs:
        raise DescriptionError(f"{what}: C of {C.element.label} is not supported with {operand.label} operands; "
                               f"choose one of {[e.label for e in outputs]}", rule="sm90.output_type")
    check_tma_operand(what, "C", C)
    check_epilogue_kind(what, functor, EPILOGUE_KINDS, "the SM90 family", "LinearCombination, "
                        "LinearCombinationGeneric (any activation) or LinearCombinationClamp / "
                        "FastLinearCombinationClamp, optionally with bias='row'/'column'")
    check_epilogue_types(what, functor, C, math.element_accumulator)

    # --- tile, cluster, schedules -----------------------------------------------------------------------------
    m, n, k = tile.threadblock_shape
    if m not in (64, 128, 256):
        raise DescriptionError(f"{what}: tile M must be 64, 128 or 256 (wgmma works in 64-row steps per warpgroup), "
                               f"got {m}", rule="sm90.tile_m")
    # Tile N, tile K and the cluster are limited to what the GPU suite has proven correct (other wgmma N, swizzle
    # widths and 4-CTA clusters exist in CUTLASS, but an accepted description must compute correctly).
    # 32 gives decode shapes (M <= 128) enough CTAs to stream B from every SM; 192 tiles 3000-wide outputs in one
    # wave. Both are wgmma N values whose TMA boxes and epilogue tiles CUTLASS's builders derive unchanged.
    check_tile_n(what, n, TILE_N)
    check_tile_k(what, k, operand)
    check_cluster_shape(what, tile)
    schedule = resolve_kernel_schedule(tile, operand)
    check_fast_accum(what, schedule, operand.is_fp8, operand.label)
    base = schedule.base
    check_schedule_tile_m(what, schedule, m, base.value, " (use the cooperative schedule)")
    if tile.tile_scheduler is _TS.StreamK and base is not _KS.TmaWarpSpecializedCooperative:
        raise DescriptionError(f"{what}: the stream-K tile scheduler runs with the cooperative schedule only, got "
                               f"{schedule.value}", rule="sm90.stream_k_schedule")
    epilogue = tile.epilogue_schedule
    if epilogue is _ES.Auto:
        epilogue = _ES.TmaWarpSpecializedCooperative if base is _KS.TmaWarpSpecializedCooperative \
            else _ES.TmaWarpSpecialized
    elif epilogue is _ES.TmaWarpSpecializedCooperative and base is not _KS.TmaWarpSpecializedCooperative:
        raise DescriptionError(f"{what}: the TmaWarpSpecializedCooperative epilogue needs the cooperative kernel "
                               f"schedule, got {schedule.value}", rule="sm90.epilogue_schedule")
    elif epilogue is _ES.TmaWarpSpecialized and base is _KS.TmaWarpSpecializedCooperative:
        raise DescriptionError(f"{what}: a cooperative kernel takes the TmaWarpSpecializedCooperative (or "
                               f"NoSmemWarpSpecialized) epilogue, got TmaWarpSpecialized",
                               rule="sm90.epilogue_schedule")
    if epilogue is _ES.NoSmemWarpSpecialized and (functor.activation is not None or bias or
                                                  functor.kind in CLAMP_KINDS):
        raise DescriptionError(f"{what}: the NoSmemWarpSpecialized epilogue is CUTLASS's plain linear combination; "
                               f"activations, clamps and bias need a TMA epilogue schedule",
                               rule="sm90.nosmem_epilogue")
    check_derived_warp_count(what, tile, schedule)
    check_epilogue_tile(what, tile, base is _KS.TmaWarpSpecializedCooperative, epilogue, C.element, operand.bits)
    if tile.stages:
        check_explicit_stages(what, tile, base is _KS.TmaWarpSpecializedCooperative, epilogue, C.element,
                              operand.bits)
    return schedule, epilogue
