"""What every SM90 (CUTLASS 3.x) kind shares: which tiles mean the family, its schedules' warp counts, shared memory
and epilogue fusion rules, TMA's operand rule, the description rules every SM90 kind states (one function each),
the NVRTC shim its headers need, and the operation traits (``Sm90Operation``). The CUDA C++ the GEMM and the
pointer-array templates share is ``sm90_pieces.cu.j2``."""
from __future__ import annotations

import math
from pathlib import Path

from ...description.tensor_description import TensorDescription
from ...description.tile_description import TileDescription
from ...description.types import (DataType, EpilogueScheduleType, KernelScheduleType, LayoutType, OpClass,
                                  TileSchedulerType)
from ...emit.abi import TmaRecord
from ...emit.emitter import render
from ...epilogue.functors import EpilogueFunctor
from ...errors import DescriptionError

_KS, _TS = KernelScheduleType, TileSchedulerType
_PLAIN = (LayoutType.RowMajor, LayoutType.ColumnMajor)

# CUTLASS 4.2's SM90 headers use a few C++17 std names NVRTC's std lacks.
NVRTC_SHIM = """#ifdef __CUDACC_RTC__
#include <cuda/std/type_traits>
namespace std {
template <class T> inline constexpr bool is_pointer_v = cuda::std::is_pointer_v<T>;
template <class... T> using void_t = cuda::std::void_t<T...>;
template <class T> inline constexpr bool is_const_v = cuda::std::is_const_v<T>;
template <class T> inline constexpr bool is_integral_v = cuda::std::is_integral_v<T>;  // cutlass/util/packed_stride.hpp
}  // namespace std
#endif"""

_SMEM_BYTES = 227 * 1024
_SMEM_MARGIN = 2 * 1024  # barriers, bias vectors, tensormaps: under 2 KiB (GPU-run tiles at 224 KiB + epilogue fit)


def epilogue_tile_shape(tile_shape, cooperative: bool, element_c, epilogue_tile=None) -> tuple[int, int]:
    """The sub-tile CUTLASS's SM90 TMA epilogue writes at a time: ``epilogue_tile`` when given, else its builder's
    rule for ``EpilogueTileAuto``: 128 (cooperative) or 64 rows by 32 columns (64 for an 8-bit D of N a multiple of
    64 without the cooperative schedule)."""
    if epilogue_tile is not None:
        return tuple(epilogue_tile)
    m, n = tile_shape[0], tile_shape[1]
    epi_m = min(128 if cooperative else 64, m)
    epi_n = math.gcd(min(64 if element_c.bits == 8 and n % 64 == 0 and not cooperative else 32, n), n)
    return epi_m, epi_n


def epilogue_smem_bytes(tile_shape, cooperative: bool, epilogue: EpilogueScheduleType, element_c,
                        epilogue_tile=None) -> int:
    """Shared memory of CUTLASS's SM90 TMA epilogue (its builder's rule, for explicit stage counts; stages=0 leaves
    the carve-out to CUTLASS): up to 2 stages of D's epilogue tile and 4 of C's, one buffer when C and D are the same
    type wider than 8 bits (C's stages are then at least D's + 1). NoSmemWarpSpecialized has none."""
    if epilogue is EpilogueScheduleType.NoSmemWarpSpecialized:
        return 0
    m, n = tile_shape[0], tile_shape[1]
    epi_m, epi_n = epilogue_tile_shape(tile_shape, cooperative, element_c, epilogue_tile)
    tiles = (m // epi_m) * (n // epi_n)
    stages_d = min(tiles, 2)
    reuse = element_c.bits > 8  # C and D share the element type in pycutlass's templates
    stages_c = max(min(tiles, 4), stages_d + 1) if reuse else min(tiles, 4)
    stage = epi_m * epi_n * element_c.bits // 8
    return max(stages_c, stages_d) * stage if reuse else (stages_c + stages_d) * stage


def _stage_bytes(tile_shape, operand_bits: int) -> int:
    """One main-loop stage: an A and a B tile."""
    m, n, k = tile_shape
    return (m + n) * k * operand_bits // 8


def automatic_stages(tile_shape, operand_bits: int, cooperative: bool, element_c, epilogue_tile=None) -> int:
    """The main-loop stages of ``stages=0`` beside a TMA epilogue's buffers: what its buffers leave of the SM."""
    buffers = epilogue_smem_bytes(tile_shape, cooperative, EpilogueScheduleType.TmaWarpSpecialized, element_c,
                                  epilogue_tile)
    return (_SMEM_BYTES - buffers - _SMEM_MARGIN) // _stage_bytes(tile_shape, operand_bits)


# Epilogue tile widths the GPU suite runs (16-, 32-bit outputs); the rows are the builder's (see check_epilogue_tile).
EPILOGUE_TILE_N = (32, 64, 128)
_EPILOGUE_TILE_OUTPUTS = (DataType.float16, DataType.bfloat16, DataType.float32)


def check_epilogue_tile(what: str, tile: TileDescription, cooperative: bool, epilogue: EpilogueScheduleType,
                        element_c, operand_bits: int) -> None:
    """An explicit ``epilogue_tile`` (rows, columns): the rows CUTLASS's builder gives the schedule (both consumer
    warpgroups' 128 rows for the cooperative kernel, one warpgroup's 64 otherwise; the tile's M when smaller), columns
    32, 64 or 128 that divide the tile's N, a TMA epilogue and a 16- or 32-bit floating-point output: what the GPU
    suite has run. With ``stages=0`` the main loop gets what the epilogue's buffers leave of the SM, and CUTLASS's main
    loops static_assert at least 2 stages (explicit counts are checked by check_explicit_stages). None (CUTLASS's
    automatic tile) is always accepted."""
    if tile.epilogue_tile is None:
        return
    rows, columns = tile.epilogue_tile
    m, n = tile.threadblock_shape[0], tile.threadblock_shape[1]
    if epilogue is EpilogueScheduleType.NoSmemWarpSpecialized:
        raise DescriptionError(f"{what}: epilogue_tile is the TMA epilogue's sub-tile; NoSmemWarpSpecialized stores "
                               f"from registers and has none (leave epilogue_tile=None)", rule="sm90.epilogue_tile")
    if element_c not in _EPILOGUE_TILE_OUTPUTS:
        raise DescriptionError(f"{what}: an explicit epilogue_tile is built for float16, bfloat16 and float32 "
                               f"outputs, got {element_c.label} (leave epilogue_tile=None)", rule="sm90.epilogue_tile")
    wanted = min(128 if cooperative else 64, m)
    allowed = [c for c in EPILOGUE_TILE_N if c <= n and n % c == 0]
    if rows != wanted or columns not in allowed:
        schedule = "cooperative kernel (both consumer warpgroups)" if cooperative else "kernel (one warpgroup)"
        raise DescriptionError(f"{what}: epilogue_tile must be ({wanted}, N) for a {m}x{n} tile of the {schedule}, "
                               f"with N one of {allowed}; got {tuple(tile.epilogue_tile)}", rule="sm90.epilogue_tile")
    if not tile.stages:
        buffers = epilogue_smem_bytes(tile.threadblock_shape, cooperative, epilogue, element_c, tile.epilogue_tile)
        stages = automatic_stages(tile.threadblock_shape, operand_bits, cooperative, element_c, tile.epilogue_tile)
        if stages < 2:
            raise DescriptionError(f"{what}: the {rows}x{columns} epilogue tile's {element_c.label} buffers take "
                                   f"{buffers // 1024} KiB of shared memory, which leaves a {m}x{n}x"
                                   f"{tile.threadblock_shape[2]} main loop {stages} stage(s) of the 2 CUTLASS needs; "
                                   f"use fewer columns, a smaller tile or a 16-bit output", rule="sm90.epilogue_tile")


def check_explicit_stages(what: str, tile: TileDescription, cooperative: bool, epilogue: EpilogueScheduleType,
                          element_c, operand_bits: int) -> None:
    """Explicit stage counts must fit the SM's 227 KiB beside the epilogue's buffers (CUTLASS would fail the launch
    with an invalid shared-memory size)."""
    m, n, k = tile.threadblock_shape
    stage = _stage_bytes(tile.threadblock_shape, operand_bits)
    mainloop = tile.stages * stage
    epilogue_bytes = epilogue_smem_bytes(tile.threadblock_shape, cooperative, epilogue, element_c, tile.epilogue_tile)
    if tile.stages < 2 or mainloop + epilogue_bytes + _SMEM_MARGIN > _SMEM_BYTES:
        most = (_SMEM_BYTES - epilogue_bytes - _SMEM_MARGIN) // stage
        allowed = f"2 to {most} stages" if most >= 2 else "no explicit count fits this tile"
        raise DescriptionError(f"{what}: {tile.stages} stages of a {m}x{n}x{k} tile take {mainloop // 1024} KiB of "
                               f"shared memory, and the epilogue's {element_c.label} buffers {epilogue_bytes // 1024} "
                               f"KiB: more than the {_SMEM_BYTES // 1024} KiB an SM has (or below 2 stages). Use "
                               f"stages=0 (CUTLASS's automatic count) or fewer stages ({allowed})",
                               rule="smem.capacity")


# Epilogue functors the SM90 kinds build through CUTLASS's fusion operations. The two clamps are
# LinCombEltAct<Clamp> with the output type's bounds (cutlass::platform::numeric_limits, as CUTLASS 2.x's
# LinearCombinationClamp): D = convert(min(max(alpha * acc + beta * C (+ bias), lowest), max)).
EPILOGUE_KINDS = ("LinearCombination", "LinearCombinationGeneric", "LinearCombinationClamp",
                  "FastLinearCombinationClamp")
CLAMP_KINDS = ("LinearCombinationClamp", "FastLinearCombinationClamp")
CLAMP_ACTIVATION = "cutlass::epilogue::thread::Clamp"


def fusion_activation(functor: EpilogueFunctor) -> tuple[str | None, tuple[str, ...], bool]:
    """The activation template of the fusion (None: a plain linear combination), the names of its runtime
    arguments, and whether it is the clamp (whose bounds the builder sets from the output type)."""
    if functor.kind in CLAMP_KINDS:
        return CLAMP_ACTIVATION, (), True
    if functor.activation is not None:
        return functor.activation.cpp_template, functor.activation.argument_names, False
    return None, (), False


def epilogue_suffix(functor: EpilogueFunctor) -> str:
    """What a readable operation name says about the epilogue functor."""
    if functor.kind == "LinearCombinationClamp":
        return "_clamp"
    if functor.kind == "FastLinearCombinationClamp":
        return "_fastclamp"
    return f"_{functor.activation.name}" if functor.activation else ""


def epilogue_tile_suffix(tile: TileDescription) -> str:
    """What a readable operation name says about an explicit epilogue tile (nothing for CUTLASS's automatic one)."""
    return f"_e{tile.epilogue_tile[0]}x{tile.epilogue_tile[1]}" if tile.epilogue_tile else ""


def epilogue_tile_signature(tile: TileDescription) -> tuple:
    """The signature entry of an explicit epilogue tile; none for the automatic one, so its names stay as they were."""
    return (("epilogue_tile", tile.epilogue_tile),) if tile.epilogue_tile else ()


def epilogue_tile_text(tile: TileDescription) -> str:
    """What ``describe()`` says about an explicit epilogue tile (nothing for the automatic one)."""
    return f"epilogue_tile={tile.epilogue_tile[0]}x{tile.epilogue_tile[1]} " if tile.epilogue_tile else ""


def derived_warp_count(tile_shape, kernel_schedule: KernelScheduleType) -> tuple[int, int, int]:
    """Cooperative kernels split the tile's M over two consumer warpgroups; the others use one per tile."""
    if kernel_schedule.base is _KS.TmaWarpSpecializedCooperative:
        return (8, 1, 1)
    return (4, 1, 1)


def resolve_kernel_schedule(tile: TileDescription, element) -> KernelScheduleType:
    """``Auto`` as CUTLASS's builder would choose it: cooperative for 128-row-multiple tiles (with fp8's fast
    accumulation for fp8 operands), else the basic warp-specialized kernel."""
    schedule = tile.kernel_schedule
    if schedule is not _KS.Auto:
        return schedule
    if tile.tile_scheduler is _TS.StreamK or tile.threadblock_shape[0] % 128 == 0:
        schedule = _KS.TmaWarpSpecializedCooperative
    else:
        schedule = _KS.TmaWarpSpecialized
    if element.is_fp8:
        schedule = schedule.fp8_fast_accum
    return schedule


def is_sm90_tile(tile) -> bool:
    """Whether a tile given with compute capability 90 means this family: any tile but one that states an Sm80 warp
    arrangement (a warp_count other than the one CUTLASS 3.x derives), as PyCUTLASS 2.11 scripts do with the
    device's 90; those keep the CUTLASS 2.x kernel they were written for (it runs on Hopper)."""
    if not isinstance(tile, TileDescription) or tile.sm90_only or tile.warp_count is None:
        return True
    schedule = resolve_kernel_schedule(tile, tile.math_instruction.element_a)
    return tile.warp_count == derived_warp_count(tile.threadblock_shape, schedule)


def check_tma_operand(what: str, label: str, desc: TensorDescription) -> None:
    """TMA moves A, B, C and D as 16-byte vectors of a row- or column-major matrix."""
    if desc.layout not in _PLAIN:
        raise DescriptionError(f"{what}: {label} must be RowMajor or ColumnMajor on SM90, got {desc.layout.value}",
                               rule="sm90.layout")
    check_tma_alignment(what, label, desc)


def check_tma_alignment(what: str, label: str, desc: TensorDescription) -> None:
    """TMA moves 16-byte vectors: an operand's alignment is 16 bytes of its elements."""
    if desc.alignment * desc.element.bits != 128:
        raise DescriptionError(f"{what}: TMA moves 16-byte vectors, so {label}'s alignment must be "
                               f"{128 // desc.element.bits} {desc.element.label} elements; got {desc.alignment}",
                               rule="sm90.alignment_16b")


# ---- rules every SM90 kind states (GEMM, the pointer-array kernel of grouped GEMM and Array mode, convolution) ----
def check_tensor_op(what: str, math, kernel: str) -> None:
    """``kernel``: what the message calls the kind's kernel ("the SM90 family", "the SM90 convolution")."""
    if math.opcode_class is not OpClass.TensorOp:
        raise DescriptionError(f"{what}: {kernel} computes on tensor cores (OpClass.TensorOp); SIMT kernels are in "
                               f"the Sm80 family (compute capability 80)", rule="sm90.tensor_op")


def check_operand_element(what: str, label: str, desc: TensorDescription, element, allowed=None) -> None:
    """A and B hold what the instruction multiplies (``allowed``: the element types that stand for it)."""
    if desc.element not in (allowed or (element,)):
        raise DescriptionError(f"{what}: {label}.element is {desc.element.label} but the math instruction "
                               f"multiplies {element.label}", rule="sm90.operand_element")


def check_k_major(what: str, A: TensorDescription, B: TensorDescription, operands: str) -> None:
    """wgmma reads operands narrower or wider than 16 bits from shared memory K-major only."""
    if (A.layout, B.layout) != (LayoutType.RowMajor, LayoutType.ColumnMajor):
        raise DescriptionError(f"{what}: wgmma reads {operands} operands K-major only: A must be RowMajor and B "
                               f"ColumnMajor (got A {A.layout.value}, B {B.layout.value}); only 16-bit types take "
                               f"every layout", rule="sm90.k_major")


def check_epilogue_kind(what: str, functor: EpilogueFunctor, allowed: tuple, kernel: str, advice: str) -> None:
    if functor.kind not in allowed:
        raise DescriptionError(f"{what}: the {functor.kind} epilogue is not built for {kernel}; use {advice}",
                               rule="sm90.epilogue_kind")


def check_epilogue_types(what: str, functor: EpilogueFunctor, C: TensorDescription, accumulator) -> None:
    """The epilogue writes C's element and alignment, reads the instruction's accumulators (``accumulator``; None:
    any), computes in float32."""
    if functor.element_output is not C.element or functor.alignment != C.alignment:
        raise DescriptionError(f"{what}: the epilogue writes {functor.element_output.label} x {functor.alignment} but "
                               f"C is {C.element.label} x {C.alignment}; they must match", rule="epilogue.output_type")
    if accumulator is not None and functor.element_accumulator is not accumulator:
        raise DescriptionError(f"{what}: the epilogue reads {functor.element_accumulator.label} accumulators but the "
                               f"math instruction accumulates in {accumulator.label}",
                               rule="epilogue.accumulator_type")
    if functor.element_epilogue is not DataType.float32:
        raise DescriptionError(f"{what}: SM90 epilogues compute in float32, got {functor.element_epilogue.label}",
                               rule="sm90.epilogue_compute")


def check_tile_n(what: str, n: int, allowed: tuple) -> None:
    """Tile widths the kind's GPU suite has proven correct (wgmma offers more)."""
    if n not in allowed:
        spoken = f"one of {list(allowed)}" if len(allowed) > 3 else f"{', '.join(map(str, allowed[:-1]))} or " \
            f"{allowed[-1]}"
        raise DescriptionError(f"{what}: tile N must be {spoken}, got {n}", rule="sm90.tile_n")


BLOCK_SCALE = (1, 128, 128)  # fp8 block-wise scales' granularity along M, N, K (the DeepSeek-V3 recipe)


def check_block_scale_tile(what: str, tile: TileDescription) -> None:
    """Block-wise scaled kernels: CUTLASS 4.2's blockwise accumulation takes one 128 x 128 scale block of B per tile
    (fp8_accumulation.hpp static_asserts one scale of B per accumulator column block for 256-wide tiles)."""
    m, n, k = tile.threadblock_shape
    if n != BLOCK_SCALE[1] or k != BLOCK_SCALE[2]:
        raise DescriptionError(f"{what}: tile N and K must be {BLOCK_SCALE[1]} (one 128 x 128 scale block of B per "
                               f"tile; CUTLASS 4.2's blockwise accumulation does not build wider tiles), got "
                               f"{[m, n, k]}", rule="scales.unsupported")


def check_tile_k(what: str, k: int, operand) -> None:
    """Tile K spans the 128-byte TMA swizzle atom exactly."""
    if k * operand.bits // 8 != 128:
        raise DescriptionError(f"{what}: tile K must be {128 * 8 // operand.bits} {operand.label} elements (the "
                               f"128-byte TMA swizzle atom), got {k}", rule="sm90.tile_k_bytes")


def check_cluster_shape(what: str, tile: TileDescription) -> None:
    """The clusters the GPU suite proves (CUTLASS has 4-CTA ones too)."""
    if tuple(tile.cluster_shape) not in ((1, 1, 1), (2, 1, 1), (1, 2, 1)):
        raise DescriptionError(f"{what}: cluster_shape must be [1, 1, 1], [2, 1, 1] or [1, 2, 1], got "
                               f"{list(tile.cluster_shape)}", rule="sm90.cluster_shape")


def check_fast_accum(what: str, schedule: KernelScheduleType, fp8: bool, operands: str) -> None:
    if schedule.is_fp8_fast_accum and not fp8:
        raise DescriptionError(f"{what}: {schedule.value} accumulates fp8 products fast; the operands are {operands}",
                               rule="sm90.fast_accum_operands")


def check_schedule_tile_m(what: str, schedule: KernelScheduleType, m: int, one_warpgroup: str,
                          advice: str = "") -> None:
    """Cooperative kernels split tile M over two warpgroups of 64 rows; the others compute it with one
    (``one_warpgroup``: how the message names such a kernel)."""
    if schedule.base is _KS.TmaWarpSpecializedCooperative:
        if m not in (128, 256):
            raise DescriptionError(f"{what}: the cooperative schedule splits tile M over two warpgroups of 64 rows: "
                                   f"tile M must be 128 or 256 (a multiple of 128 up to 256), got {m}",
                                   rule="sm90.cooperative_tile_m")
    elif m not in (64, 128):
        raise DescriptionError(f"{what}: {one_warpgroup} computes a tile with one warpgroup: tile M must be 64 or 128, "
                               f"got {m}{advice}", rule="sm90.schedule_tile_m")


def check_default_tile_scheduler(what: str, tile: TileDescription, why: str) -> None:
    if tile.tile_scheduler is not _TS.Default:
        raise DescriptionError(f"{what}: {why}; tile_scheduler must be Default, got {tile.tile_scheduler.name}",
                               rule="sm90.tile_scheduler")


def check_epilogue_schedule(what: str, tile: TileDescription, wanted: EpilogueScheduleType, context: str) -> None:
    """Kinds whose kernel schedule fixes the epilogue schedule: Auto or that one."""
    if tile.epilogue_schedule not in (EpilogueScheduleType.Auto, wanted):
        raise DescriptionError(f"{what}: the epilogue schedule (epilogue_schedule) must be Auto or {wanted.value} "
                               f"{context}, got {tile.epilogue_schedule.value}", rule="sm90.epilogue_schedule")


def check_derived_warp_count(what: str, tile: TileDescription, schedule: KernelScheduleType) -> None:
    derived = derived_warp_count(tile.threadblock_shape, schedule)
    if tile.warp_count is not None and tuple(tile.warp_count) != derived:
        raise DescriptionError(f"{what}: warp_count is derived on SM90 ({list(derived)} for {schedule.value}); pass "
                               f"None or that value, got {list(tile.warp_count)}", rule="sm90.warp_count_derived")


def helpers_code() -> str:
    """Helpers every SM90 operation of a translation unit uses (TMA records, strides): identical text, emitted once."""
    return render(Path(__file__).parent / "sm90_helpers.cu.j2")


class Sm90Operation:
    """The traits every SM90 kind's operation has; listed first among its bases (before its Sm80-family sibling,
    whose PyCUTLASS constructor builds it)."""

    family = "sm90"
    required_backend = "nvrtc"  # the Params builder needs -default-device (see kinds/gemm_sm90)
    takes = staticmethod(is_sm90_tile)

    @property
    def cluster_shape(self) -> tuple[int, int, int]:
        """Thread-block cluster shape (CTAs along M, N, L)."""
        return self.tile_description.cluster_shape

    def abi_structs(self) -> tuple:
        """The kind's structs plus the TMA descriptor records its builder reports."""
        return (*super().abi_structs(), TmaRecord)

    def preamble(self) -> list[str]:
        """Before any include: the NVRTC shim of CUTLASS's SM90 headers."""
        return [NVRTC_SHIM]

    def shared_code(self) -> str:
        return helpers_code()
