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
from ...description.types import EpilogueScheduleType, IdentitySwizzle1, KernelScheduleType, SwizzlingFunctor
from ...epilogue.functors import EpilogueFunctor
from ...errors import DescriptionError
from ..families.grouped import GROUPED_SWIZZLES, SchedulerMode
from ..families.sm90 import (CLAMP_KINDS, Sm90Operation, check_block_scale_tile, derived_warp_count,
                             epilogue_tile_signature)
from ..families.sm90_ptr_array import (  # noqa: F401  (their names as this module had them)
    BLOCK_SCALE, BLOCKWISE_SCHEDULES, EPILOGUE_WARP_GROUPS, GROUPED_EPILOGUES, PTR_ARRAY_HEADERS, TMA_DESCRIPTOR_BYTES,
    check_ptr_array, ptr_array_description, ptr_array_readable_name, render_ptr_array_kernel, tensormap_workspace_bytes)
from ..families.sm90_ptr_array import GROUPED_WHAT as _WHAT
from ..gemm_grouped.operation import GemmOperationGrouped
from .abi import (Sm90BlockwiseGroupedGemmArgs, Sm90BlockwiseGroupedSizesArgs, Sm90GroupedGemmArgs,
                  Sm90GroupedSizesArgs)

_KS = KernelScheduleType

_GROUPED_EPILOGUE_HINT = " (any activation), with bias='column' for a per-group bias"


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
    Beta stays one scalar. ``scales="rowwise"``: D_g = act(alpha * scale_a_g[m] * scale_b_g[n] * (A_g @ B_g) + beta *
    C_g), one float32 scale per row of A_g and per column of B_g (fp8 quantization per token and per channel, as
    ``torch._scaled_grouped_mm``'s row-wise form); the arguments take them as ``scale_a=`` and ``scale_b=``. Not
    built with a bias or the clamp (rejected).

    ``scales="blockwise"`` (fp8 operands): D_g = act(alpha * sum_kb scale_a_g[m, kb] * scale_b_g[n / 128, kb] *
    (A_g @ B_g over K block kb) + beta * C_g), float32 scales per 1 x 128 block of A_g and per 128 x 128 block of B_g
    (the DeepSeek-V3 recipe), applied in CUTLASS's pointer-array blockwise main loops (cooperative or ping-pong, tile
    N and K 128). The arguments take them as ``scale_a=`` and ``scale_b=``, with the group sizes as a device tensor
    (the sizes kernel computes every group's scale pointers and layouts on the device).
    """

    kind = "gemm_grouped_sm90"
    abi_struct_type = Sm90GroupedGemmArgs  # the builder's struct
    sizes_struct_type = Sm90GroupedSizesArgs  # the sizes kernel's

    def __new__(cls, *args, **kwargs):
        return object.__new__(cls)

    def __init__(self, arch: int, tile_description: TileDescription, A: TensorDescription, B: TensorDescription,
                 C: TensorDescription, epilogue_functor: EpilogueFunctor,
                 swizzling_functor: SwizzlingFunctor = IdentitySwizzle1,
                 precompute_mode: SchedulerMode = SchedulerMode.Device, bias=None, scales=None):
        if arch != 90 or isinstance(arch, bool):
            raise DescriptionError(f"GemmOperationGroupedSm90 is compute capability 90, got {arch!r}",
                                   rule="target.compute_capability")
        self.compute_capability = 90
        if precompute_mode is not SchedulerMode.Device:
            raise DescriptionError(f"{_WHAT}: CUTLASS's SM90 group scheduler walks the groups on the device; "
                                   f"precompute_mode must be SchedulerMode.Device, got {precompute_mode!r}",
                                   rule="grouped.precompute_mode")
        if swizzling_functor not in GROUPED_SWIZZLES:
            raise DescriptionError(f"{_WHAT}: swizzling_functor must be one of {[s.name for s in GROUPED_SWIZZLES]}, "
                                   f"got {swizzling_functor!r}", rule="swizzle.unsupported")
        self._describe(90, tile_description, A, B, C, epilogue_functor, swizzling_functor)
        self.precompute_mode = precompute_mode
        self.kernel_schedule = check_ptr_array(tile_description, A, B, C, epilogue_functor,
                                      epilogue_hint=_GROUPED_EPILOGUE_HINT, fp8=True)
        self.bias = _check_bias(bias, epilogue_functor)
        self.scales = _check_scales(scales, self.bias, epilogue_functor)
        if self.scales == "blockwise":
            self.kernel_schedule = _check_blockwise(tile_description, self.kernel_schedule)
            # Structs of their own (per-group scale layouts), so that every other grouped unit stays as it is.
            self.abi_struct_type, self.sizes_struct_type = Sm90BlockwiseGroupedGemmArgs, Sm90BlockwiseGroupedSizesArgs


    # --- identity -------------------------------------------------------------------------------------------
    def abi_structs(self) -> tuple:
        return (*super().abi_structs(), self.sizes_struct_type)

    def _signature(self) -> tuple:
        tile = self.tile_description
        return ("gemm_grouped_sm90", tile.threadblock_shape, tile.stages, tile.math_instruction, tile.cluster_shape,
                self.kernel_schedule, self.A, self.B, self.C, self.epilogue_functor, self.bias) + \
            ((self.scales,) if self.scales else ()) + epilogue_tile_signature(tile)  # (new fields keep old names)

    def _readable_name(self) -> str:
        return ptr_array_readable_name(self, "gemm_grouped_sm90") + ("_biasc" if self.bias else "") + \
            {None: "", "rowwise": "_rowscale", "blockwise": "_bw"}[self.scales]

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
                               f"sm_count CTAs); see GemmGroupedArguments.threadblock_count after a run",
                               rule="grouped.persistent_grid")

    def workspace_bytes(self, sm_count: int, threadblock_count: int | None = None) -> int:
        """Per-SM tensormap slots: C and one D per epilogue warpgroup, then A and B (CUTLASS's get_workspace_size,
        which the builder reports too; the runtime checks that both agree)."""
        return tensormap_workspace_bytes(self.name, sm_count)

    @property
    def sizes_symbol(self) -> str:
        """The kernel that turns device-side group sizes into the per-group arrays (run before each such launch)."""
        return self.name + "_sizes"

    sizes_threads = 1024  # one block; the template's __launch_bounds__

    def sizes_block(self, groups: int) -> int:
        """Threads of the sizes kernel's one block for ``groups`` groups: the next power of two from one warp up to
        ``sizes_threads``. Its scan takes log2(threads) steps of two block-wide barriers each, and it runs before
        every launch, so a block no wider than the groups keeps it short."""
        return min(self.sizes_threads, max(32, 1 << max(groups - 1, 0).bit_length()))

    def launch_plan(self) -> dict:
        return {"kernel": self.kernel_symbol, "builder": self.builder_symbol, "precompute": None,
                "sizes": self.sizes_symbol, "thread_count": self.thread_count}

    # --- emission -------------------------------------------------------------------------------------------
    def headers(self) -> list[str]:
        return list(PTR_ARRAY_HEADERS) + (["cutlass/detail/blockwise_scale_layout.hpp"] if self.scales == "blockwise"
                                          else [])

    def emit_body(self) -> str:
        return render_ptr_array_kernel(self, Path(__file__).parent / "gemm_grouped_sm90.cu.j2", bias=self.bias,
                                       sizes_kernel=True, scales=self.scales)

    def describe(self) -> str:
        return ptr_array_description(self, "grouped") + (f" bias={self.bias}" if self.bias else "") + \
            (f" scales={self.scales}" if self.scales else "")


def _check_scales(scales, bias, functor: EpilogueFunctor) -> str | None:
    if scales is None:
        return None
    if scales not in ("rowwise", "blockwise"):
        raise DescriptionError(f"{_WHAT}: scales must be None, 'rowwise' (one float32 scale per row of A and per "
                               f"column of B in every group) or 'blockwise' (fp8: float32 scales per 1x128 block of "
                               f"A and 128x128 block of B in every group), got {scales!r}", rule="scales.unsupported")
    if bias is not None:
        raise DescriptionError(f"{_WHAT}: scales={scales!r} with a bias is not built (one epilogue tree each); fold "
                               f"the bias into C with beta=1, or build the operation without one",
                               rule="scales.unsupported")
    if functor.kind in CLAMP_KINDS:
        raise DescriptionError(f"{_WHAT}: {functor.kind} with scales={scales!r} is not built (the epilogue sets no "
                               f"clamp bounds); use LinearCombination or LinearCombinationGeneric",
                               rule="scales.unsupported")
    return scales


def _check_blockwise(tile: TileDescription, schedule: KernelScheduleType) -> KernelScheduleType:
    """What CUTLASS's pointer-array blockwise main loops take (the rules of the SM90 GEMM's scales="blockwise");
    returns the schedule they run: Auto's fp8 fast accumulation resolves to the plain schedule, since the blockwise
    loop promotes into float32 itself."""
    what = f"{_WHAT} with scales='blockwise'"
    math = tile.math_instruction
    if not (math.element_a.is_fp8 and math.element_b.is_fp8):
        raise DescriptionError(f"{what}: block-wise scales are built for fp8 operands (float8_e4m3 / float8_e5m2, "
                               f"any pair), got {math.element_a.label} x {math.element_b.label}",
                               rule="scales.unsupported")
    if tile.kernel_schedule is not _KS.Auto and schedule.is_fp8_fast_accum:
        raise DescriptionError(f"{what}: {schedule.value} accumulates without promotion; the blockwise main loop "
                               f"promotes into float32 every 128 of K itself: use Auto, TmaWarpSpecializedCooperative "
                               f"or TmaWarpSpecializedPingpong", rule="scales.unsupported")
    check_block_scale_tile(what, tile)
    if tile.stages:
        raise DescriptionError(f"{what}: the blockwise main loop keeps its scales in shared memory beside the "
                               f"operands; leave stages=0 (the builder carves them), got {tile.stages}",
                               rule="scales.unsupported")
    if tile.epilogue_schedule is EpilogueScheduleType.NoSmemWarpSpecialized:  # (check_ptr_array refuses it too)
        raise DescriptionError(f"{what}: built with the TMA epilogues only (Auto)", rule="scales.unsupported")
    base = schedule.base
    if base not in BLOCKWISE_SCHEDULES:
        raise DescriptionError(f"{what}: CUTLASS's pointer-array blockwise main loops are cooperative or ping-pong, "
                               f"got {schedule.value}", rule="scales.unsupported")
    return base


def _check_bias(bias, functor: EpilogueFunctor | None = None) -> str | None:
    if bias == "column" and functor is not None and functor.kind in CLAMP_KINDS:
        raise DescriptionError(f"{_WHAT}: {functor.kind} with bias='column' is not built: CUTLASS 4.2 has no "
                               f"pointer-array bias fusion, so the per-group bias is pycutlass's own epilogue tree, "
                               f"and its activation node is not given the clamp's bounds (nor tested on a GPU); "
                               f"use the clamp without a bias, or bias='column' with LinearCombination or "
                               f"LinearCombinationGeneric", rule="bias.unsupported")
    if bias is None or bias == "column":
        return bias
    if bias == "row":
        raise DescriptionError(f"{_WHAT}: bias='row' (M values per group) is not built: CUTLASS's column broadcast "
                               f"reads the vector in 16-byte vectors predicated on their first row, so a group whose "
                               f"M is not a multiple of 8 would read past its vector (and device-side sizes could "
                               f"not be checked); use bias='column' (N values per group, read element by element)",
                               rule="bias.unsupported")
    if bias is True:
        raise DescriptionError(f"{_WHAT}: bias=True (C as a broadcast vector, PyCUTLASS's bias) is not built for SM90 "
                               f"(TMA reads whole matrices); use bias='column' and pass the vectors as bias=",
                               rule="bias.unsupported")
    raise DescriptionError(f"{_WHAT}: bias must be None or 'column' (N values per group), got {bias!r}",
                           rule="bias.unsupported")
