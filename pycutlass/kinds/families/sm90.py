"""What every SM90 (CUTLASS 3.x) kind shares: which tiles mean the family, its schedules' warp counts, TMA's operand
rule, the NVRTC shim its headers need, and the operation traits (``Sm90Operation``)."""
from __future__ import annotations

from pathlib import Path

from ...description.tensor_description import TensorDescription
from ...description.tile_description import TileDescription
from ...description.types import KernelScheduleType, LayoutType, TileSchedulerType
from ...emit.abi import TmaRecord
from ...emit.emitter import render
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
        raise DescriptionError(f"{what}: {label} must be RowMajor or ColumnMajor on SM90, got {desc.layout.value}")
    if desc.alignment * desc.element.bits != 128:
        raise DescriptionError(f"{what}: TMA moves 16-byte vectors, so {label}'s alignment must be "
                               f"{128 // desc.element.bits} {desc.element.label} elements; got {desc.alignment}")


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
