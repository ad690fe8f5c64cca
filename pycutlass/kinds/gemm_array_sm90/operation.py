"""The SM90 (CUTLASS 3.x) GEMM for PyCUTLASS's Array mode: ``GemmOperationUniversal(90, ..., array=True)``.

Why a separate kernel: CUTLASS 3.x reads a batch of matrices at arbitrary addresses only through its pointer-array
schedules (``KernelPtrArrayTmaWarpSpecializedCooperative`` / ``...Pingpong``), whose TMA descriptors are prototypes
re-targeted per batch entry on the device (``tensormap.replace`` into a per-SM workspace). The ordinary SM90 kernel
holds one descriptor per operand over a strided batch (the L mode). Compiling both into every SM90 operation would
double its compile (about a minute each on two cores), so the description says which one to build: ``array=True``.

The kernel is the grouped kind's (``kinds/gemm_grouped_sm90``, its template and builder unchanged) run with ``batch``
equal problem sizes: the same machinery, already proven on an H100, rather than a second pointer-array template over
``cutlass::gemm::ArrayProblemShape`` that would differ only in reading one size instead of ``batch`` copies of it.
What it accepts is what that kernel does: f16 or bf16 operands, f32 accumulation, f16/bf16/f32 output, cooperative or
ping-pong schedules, clusters up to two CTAs, ``LinearCombination``, ``LinearCombinationGeneric`` (any activation) and
``LinearCombinationClamp``; no bias vector and no stream-K (CUTLASS's group scheduler).
"""
from __future__ import annotations

from pathlib import Path

from ...description.tensor_description import TensorDescription
from ...description.tile_description import TileDescription
from ...description.types import (GEMM_SWIZZLES, EpilogueScheduleType, IdentitySwizzle1, KernelScheduleType,
                                  SwizzlingFunctor, TileSchedulerType)
from ...epilogue.functors import EpilogueFunctor
from ...errors import DescriptionError
from ..families.sm90 import epilogue_tile_signature
from ..families.sm90_ptr_array import (PTR_ARRAY_HEADERS, check_ptr_array, ptr_array_description,
                                       ptr_array_readable_name, render_ptr_array_kernel, tensormap_workspace_bytes)
from ..gemm_sm90.operation import GemmOperationSm90
from .abi import Sm90GroupedGemmArgs

_KS, _ES = KernelScheduleType, EpilogueScheduleType
_WHAT = "GemmOperationUniversal(90, ..., array=True)"
EPILOGUES = ("LinearCombination", "LinearCombinationGeneric", "LinearCombinationClamp")


class GemmOperationArraySm90(GemmOperationSm90):
    """``GemmOperationUniversal(90, tile_description, A, B, C, epilogue_functor, swizzling_functor, array=True)``:
    runs Mode.Array (lists of matrices, or tensors holding the batch), and Mode.Batched / Mode.Gemm through the same
    pointer arrays. An ``IdentitySwizzleN`` sets the default swizzle of the group scheduler (a runtime argument)."""

    kind = "gemm_array_sm90"
    abi_struct_type = Sm90GroupedGemmArgs
    array = True
    pdl_refusal = "CUTLASS's pointer-array kernels do not wait on the previous grid (no griddepcontrol.wait)"

    def __init__(self, arch: int, tile_description: TileDescription, A: TensorDescription, B: TensorDescription,
                 C: TensorDescription, epilogue_functor: EpilogueFunctor,
                 swizzling_functor: SwizzlingFunctor = IdentitySwizzle1, visitor: bool = False, bias=None,
                 array: bool = True, scales=None):
        if scales is not None:
            raise DescriptionError(f"{_WHAT}: scales={scales!r} is not built for the pointer-array kernel",
                                   rule="scales.unsupported")
        if arch != 90 or isinstance(arch, bool):
            raise DescriptionError(f"GemmOperationArraySm90 is compute capability 90, got {arch!r}",
                                   rule="target.compute_capability")
        if array is not True:
            raise DescriptionError(f"{_WHAT}: GemmOperationArraySm90 is the pointer-array kernel; array must be True, "
                                   f"got {array!r} (GemmOperationUniversal(90, ...) without it builds the ordinary "
                                   f"SM90 kernel)", rule="description.field_type")
        self.compute_capability = 90
        if visitor:
            raise DescriptionError(f"{_WHAT}: the epilogue visitor tree is built for the Sm80 family only",
                                   rule="evt.unsupported")
        if bias is not None:
            raise DescriptionError(f"{_WHAT}: bias={bias!r} is not built for the pointer-array kernel (no pointer-array "
                                   f"bias fusion here); build the operation without array=True (Mode.Array with "
                                   f"tensors holding the batch runs batched there) or add the bias through C",
                                   rule="bias.unsupported")
        if swizzling_functor not in GEMM_SWIZZLES:
            raise DescriptionError(f"{_WHAT}: swizzling_functor must be one of {[s.name for s in GEMM_SWIZZLES]}, got "
                                   f"{swizzling_functor!r}", rule="swizzle.unsupported")
        self.bias = None
        self._describe(90, tile_description, A, B, C, epilogue_functor, swizzling_functor)
        self.kernel_schedule = check_ptr_array(
            tile_description, A, B, C, epilogue_functor, what=_WHAT, epilogues=EPILOGUES,
            kernel="the SM90 pointer-array kernel",
            other_types="build the operation without array=True (Mode.Array with tensors holding the batch runs "
                        "batched there, for every SM90 type), or use compute capability 80 for lists of matrices")
        self.epilogue_schedule = _ES.TmaWarpSpecializedCooperative \
            if self.kernel_schedule is _KS.TmaWarpSpecializedCooperative else _ES.TmaWarpSpecialized
        self.tile_scheduler = TileSchedulerType.Default

    # --- identity -------------------------------------------------------------------------------------------
    def _signature(self) -> tuple:
        tile = self.tile_description
        return ("gemm_array_sm90", tile.threadblock_shape, tile.stages, tile.math_instruction, tile.cluster_shape,
                self.kernel_schedule, self.A, self.B, self.C, self.epilogue_functor) + \
            epilogue_tile_signature(tile)  # (the automatic tile keeps the names)

    def _readable_name(self) -> str:
        return ptr_array_readable_name(self, "gemm_array_sm90")

    @property
    def thread_count(self) -> int:
        """Threads per CTA: one producer warpgroup plus two consumer warpgroups (both schedules)."""
        return 384

    def workspace_bytes(self, sm_count: int) -> int:
        """Per-SM tensormap slots (the grouped kernel's formula; the builder reports it too and the arguments check
        that both agree)."""
        return tensormap_workspace_bytes(self.name, sm_count)

    # --- emission -------------------------------------------------------------------------------------------
    def headers(self) -> list[str]:
        return list(PTR_ARRAY_HEADERS)  # the grouped kind's kernel: the same headers

    def emit_body(self) -> str:
        # No bias (rejected above) and no device-sizes kernel: that one is the grouped kind's (its ABI struct,
        # Sm90GroupedSizesArgs, is defined by grouped units only); the entries' sizes are uploaded with the pointers.
        return render_ptr_array_kernel(self, Path(__file__).parent / "gemm_array_sm90.cu.j2", bias=None,
                                       sizes_kernel=False)

    def describe(self) -> str:
        return ptr_array_description(self, "array")
