"""GemmOperationGrouped: many independent GEMMs of different sizes in one persistent CUTLASS 2.x kernel.

CUTLASS's ``kernel::GemmGrouped`` (through ``DefaultGemmGrouped``) runs ``threadblock_count`` persistent thread
blocks that walk the tiles of every problem. A *problem visitor* tells each block which (problem, tile) comes next:

* ``SchedulerMode.Device`` (``GroupScheduleMode::kDeviceOnly``): each warp derives the schedule on the fly from
  the problem sizes (warp-wide prefix sums). No workspace.
* ``SchedulerMode.Host`` (``GroupScheduleMode::kHostPrecompute``): the schedule (one ``ProblemInfo`` per tile,
  laid out block by block) is computed ahead and prefetched into shared memory by the kernel. It needs a
  workspace of ``workspace_bytes()`` and the group's ``tile_count()``.

How the Host schedule is computed without host C++: CUTLASS's ``ProblemVisitor::host_precompute`` is an
unannotated host function, compiled out under NVRTC (``#if !defined(__CUDACC_RTC__)``), so it can be called
neither from the device nor from our NVRTC builds. Instead every Host-mode operation emits a small kernel
``<name>_precompute`` that writes the very same layout on the device, built from CUTLASS's own
``CUTLASS_HOST_DEVICE`` pieces (``ProblemVisitor::possibly_transpose_problem``, ``grid_shape``, ``tile_count``
and the ``ProblemInfo`` type), and in parallel (one block; a block-wide scan of tile counts, then one thread per
tile). Python only sizes it (``tile_count()``, ``workspace_bytes()``: ceil-divisions over the threadblock tile),
and the precompute kernel recounts the tiles with CUTLASS's helpers and reports ``kErrorInvalidProblem`` through
the launch info when Python's count disagrees, writing nothing out of bounds; the ``ProblemInfo`` size is
``static_assert``-ed against :data:`PROBLEM_INFO_BYTES`.

Launch sequence for the runtime (see :meth:`GemmOperationGrouped.launch_plan`):

1. read ``<name>_shared_storage_bytes`` (an ``extern "C" __device__ const int``) with ``cuModuleGetGlobal``, set
   ``MAX_DYNAMIC_SHARED_SIZE_BYTES`` on the kernel when above 48 KiB, and compute the occupancy with
   ``cuOccupancyMaxActiveBlocksPerMultiprocessor(kernel, thread_count, shared_storage_bytes)``;
2. ``threadblock_count = op.grid_for(sm_count, occupancy, problem_sizes)``; 0 means there is no tile: launch nothing;
3. fill ``GemmGroupedArgs`` (``tile_count``, ``workspace``/``workspace_bytes`` for Host mode);
4. launch ``<name>_build`` <<<1, 1>>> and, in Host mode, ``<name>_precompute`` <<<1, PRECOMPUTE_THREADS>>> with the
   same ``LaunchInfo`` pointer, on the same stream; read back ``LaunchInfo`` and Params; check ``status``;
5. launch ``<name>`` with grid ``(threadblock_count, 1, 1)``, ``kThreadCount`` threads and the dynamic shared memory.

A column-major C is handled inside CUTLASS: ``DefaultGemmGrouped`` sets ``kInternalTranspose`` for a
``ColumnMajor`` output and the kernel computes the transposed problems, exchanging A/B pointers and leading
dimensions per problem itself. So the ABI struct always carries the user's (untransposed) problems.
"""
from __future__ import annotations

from ...description.tensor_description import TensorDescription
from ...description.tile_description import TileDescription
from ...description.types import IdentitySwizzle1, LayoutType, SwizzlingFunctor
from ...emit import names
from ...epilogue.functors import EpilogueFunctor
from ...errors import ArgumentError, DescriptionError
from .abi import GemmGroupedArgs
from .. import registry
from ..base import TiledOperation, check_compute_capability
from ..families.grouped import GROUPED_SWIZZLES, SchedulerMode
from ..families.sm80 import check_gemm_layouts, check_operand_types

# sizeof(GroupedProblemVisitor<...>::ProblemInfo): two int32 (problem index, first tile); static_assert-ed in C++.
PROBLEM_INFO_BYTES = 8
# Threads of the one block that runs <name>_precompute (a power of two: it scans in shared memory).
PRECOMPUTE_THREADS = 256


_WHAT = "GemmOperationGrouped"


def _as_triple(problem, index: int) -> tuple[int, int, int]:
    try:
        m, n, k = (int(v) for v in problem)
    except (TypeError, ValueError):
        raise ArgumentError(f"problem {index}: expected a GemmCoord(M, N, K), got {problem!r}") from None
    if m < 0 or n < 0 or k < 0:
        raise ArgumentError(f"problem {index}: sizes must be >= 0, got {problem!r}")
    return m, n, k


class GemmOperationGrouped(TiledOperation):
    kind = "gemm_grouped"
    abi_struct_type = GemmGroupedArgs

    def __new__(cls, *args, **kwargs):
        if cls is GemmOperationGrouped:
            # Compute capability 90 with an SM90 tile picks the CUTLASS 3.x kind (kinds/gemm_grouped_sm90, a subclass
            # of this one); a tile with an Sm80 warp arrangement keeps this CUTLASS 2.x kernel (it runs on Hopper).
            built = registry.operation_class("GemmOperationGrouped", kwargs.get("arch", args[0] if args else None),
                                             kwargs.get("tile_description", args[1] if len(args) > 1 else None))
            return object.__new__(built)  # Python then runs its class's __init__
        return super().__new__(cls)

    def __init__(self, arch: int, tile_description: TileDescription, A: TensorDescription, B: TensorDescription,
                 C: TensorDescription, epilogue_functor: EpilogueFunctor,
                 swizzling_functor: SwizzlingFunctor = IdentitySwizzle1,
                 precompute_mode: SchedulerMode = SchedulerMode.Device, bias=None, scales=None):
        if bias is not None:
            raise DescriptionError(f"{_WHAT}: bias= is built for the SM90 grouped kernel (an SM90 tile at compute "
                                   f"capability 90); the CUTLASS 2.x kernel adds a bias as a broadcast C (one "
                                   f"vector per problem in Cs)", rule="bias.unsupported")
        if scales is not None:
            raise DescriptionError(f"{_WHAT}: scales= is built for the SM90 grouped kernel (an SM90 tile at compute "
                                   f"capability 90) only", rule="scales.unsupported")
        self.compute_capability = check_compute_capability(arch)
        check_operand_types(tile_description, A, B, C, epilogue_functor, _WHAT, wide_c=True)
        if not isinstance(precompute_mode, SchedulerMode):
            raise DescriptionError(f"{_WHAT}: precompute_mode must be pycutlass.SchedulerMode.Host or "
                                   f"pycutlass.SchedulerMode.Device, got {precompute_mode!r}",
                                   rule="description.field_type")
        if swizzling_functor not in GROUPED_SWIZZLES:
            raise DescriptionError(f"{_WHAT}: swizzling_functor must be one of {[s.name for s in GROUPED_SWIZZLES]} "
                                   f"(the grouped kernel schedules its tiles itself), got {swizzling_functor!r}",
                                   rule="swizzle.unsupported")
        self._describe(arch, tile_description, A, B, C, epilogue_functor, swizzling_functor)
        self.precompute_mode = precompute_mode
        self._check_layouts()
        tile_description.check_shared_memory(arch)

    def _check_layouts(self) -> None:
        layouts = (self.A.layout, self.B.layout, self.C.layout)
        if any(layout not in (LayoutType.RowMajor, LayoutType.ColumnMajor) for layout in layouts):
            raise DescriptionError(f"{_WHAT}: A, B and C must be RowMajor or ColumnMajor (interleaved and tensor "
                                   f"layouts are not supported for grouped GEMM), got "
                                   f"A {self.A.layout.value}, B {self.B.layout.value}, C {self.C.layout.value}",
                                   rule="grouped.layout")
        # The remaining rules (int8 tensor ops read K-contiguous A and B) are the GEMM's own.
        check_gemm_layouts(self)

    # --- identity -------------------------------------------------------------------------------------------
    def _signature(self) -> tuple:
        return ("gemm_grouped", self.compute_capability, self.tile_description, self.A, self.B, self.C,
                self.epilogue_functor, self.swizzling_functor, self.precompute_mode.value)

    def _readable_name(self) -> str:
        layouts = "".join(names.LAYOUT_SHORT[d.layout] for d in (self.A, self.B, self.C))
        return f"gemm_grouped_{self._types_and_tile_name(layouts)}_{self.precompute_mode.value.lower()}"

    @property
    def transposed(self) -> bool:
        """Column-major outputs: CUTLASS's kInternalTranspose computes every problem as (B^T A^T)^T."""
        return self.C.layout is LayoutType.ColumnMajor

    @property
    def precompute_symbol(self) -> str | None:
        """The kernel that writes the Host-mode schedule (<<<1, PRECOMPUTE_THREADS>>>); None in Device mode."""
        return self.name + "_precompute" if self.precompute_mode is SchedulerMode.Host else None

    @property
    def shared_storage_symbol(self) -> str:
        """``extern "C" __device__ const int``: the kernel's dynamic shared memory, needed for the occupancy."""
        return self.name + "_shared_storage_bytes"

    @property
    def thread_count(self) -> int:
        """Threads per block of the kernel (``static_assert``-ed equal to ``Kernel::kThreadCount``)."""
        return self.tile_description.threads

    # --- scheduling (what the runtime needs) ----------------------------------------------------------------
    def problem_tile_count(self, problem) -> int:
        """Output tiles of one problem, as CUTLASS's ``GemmGroupedProblemSizeHelper`` counts them."""
        m, n, _ = _as_triple(problem, 0)
        if self.transposed:
            m, n = n, m
        tm, tn, _ = self.tile_description.threadblock_shape
        return ((m + tm - 1) // tm) * ((n + tn - 1) // tn)

    def tile_count(self, problem_sizes) -> int:
        """Output tiles of the whole group (``Params::tile_count`` of Host mode). Checked again on the device."""
        total = 0
        for index, problem in enumerate(problem_sizes):
            m, n, k = _as_triple(problem, index)
            total += self.problem_tile_count((m, n, k))
        if total >= 2 ** 31:
            raise ArgumentError(f"the group has {total} output tiles; CUTLASS's grouped scheduler counts tiles in "
                                f"int32 (at most {2 ** 31 - 1})")
        return total

    def grid_for(self, sm_count: int, occupancy: int, problem_sizes=None) -> int:
        """Persistent blocks to launch (the grid is ``(threadblock_count, 1, 1)``), as CUTLASS's ``sufficient()``.

        ``occupancy`` is cuOccupancyMaxActiveBlocksPerMultiprocessor for the kernel with its shared memory. With
        ``problem_sizes``: one full wave at most, and never more blocks than tiles. 0 means no tile: launch nothing.
        """
        for label, value in (("sm_count", sm_count), ("occupancy", occupancy)):
            if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
                raise ArgumentError(f"{self.name}: {label} must be a positive integer, got {value!r}"
                                    + (" (the kernel does not fit on an SM: too much shared memory?)"
                                       if label == "occupancy" and value == 0 else ""))
        full_wave = sm_count * occupancy
        if problem_sizes is None:
            return full_wave
        problem_sizes = list(problem_sizes)
        tiles = self.tile_count(problem_sizes)
        if len(problem_sizes) == 1:
            return tiles  # one problem: exactly one block per tile, no scheduling work
        return min(tiles, full_wave)

    def workspace_bytes(self, problem_sizes, threadblock_count: int) -> int:
        """Device workspace for the schedule: ``ProblemVisitor::get_workspace_size`` (0 in Device mode)."""
        if self.precompute_mode is SchedulerMode.Device:
            return 0
        if threadblock_count <= 0:
            raise ArgumentError(f"{self.name}: threadblock_count must be positive, got {threadblock_count!r}")
        tiles = self.tile_count(problem_sizes)
        entries_per_block = (tiles - 1 + threadblock_count) // threadblock_count
        return PROBLEM_INFO_BYTES * entries_per_block * threadblock_count

    def launch_plan(self) -> dict:
        """Symbols and launch shapes of this operation's kernels (see the module docstring for the sequence)."""
        return {
            "kernel": self.kernel_symbol,
            "builder": self.builder_symbol,  # <<<1, 1>>>
            "precompute": self.precompute_symbol,  # <<<1, PRECOMPUTE_THREADS>>> after the builder; or None
            "precompute_threads": PRECOMPUTE_THREADS,
            "shared_storage_symbol": self.shared_storage_symbol,
            "thread_count": self.thread_count,
        }

    # --- emission -------------------------------------------------------------------------------------------
    def headers(self) -> list[str]:
        return ["cutlass/gemm/kernel/default_gemm_grouped.h", "cutlass/gemm/threadblock/threadblock_swizzle.h",
                *names.epilogue_headers(self.epilogue_functor)]

    def emit_body(self) -> str:
        tile = self.tile_description
        math = tile.math_instruction
        A, B, C = self.A, self.B, self.C
        activation = self.epilogue_functor.activation
        # The user's layouts go in unchanged: DefaultGemmGrouped transposes a ColumnMajor output internally.
        return self.render(
            "gemm_grouped.cu.j2", name=self.name, summary=self.describe(),
            epilogue=names.epilogue_functor(self.epilogue_functor),
            element_a=self._operand_element(A), layout_a=names.LAYOUT[A.layout], alignment_a=A.alignment,
            element_b=self._operand_element(B), layout_b=names.LAYOUT[B.layout], alignment_b=B.alignment,
            element_c=names.ELEMENT[C.element], layout_c=names.LAYOUT[C.layout],
            element_accumulator=names.ELEMENT[math.element_accumulator],
            opclass=names.OPCLASS[math.opcode_class], arch_tag=names.arch_tag(self.family),
            threadblock_shape=tile.threadblock_shape, warp_shape=tile.warp_shape,
            instruction_shape=math.instruction_shape, swizzle=names.gemm_swizzle(self.swizzling_functor),
            stages=tile.stages, math_operation=names.MATH_OPERATION[math.cutlass_math_operation],
            schedule_mode=self.precompute_mode.cpp, host_precompute=self.precompute_mode is SchedulerMode.Host,
            transposed=self.transposed, thread_count=self.thread_count,
            problem_info_bytes=PROBLEM_INFO_BYTES, precompute_threads=PRECOMPUTE_THREADS,
            activation_args=activation.argument_names if activation else ())

    def describe(self) -> str:
        math = self.tile_description.math_instruction
        return (f"GEMM grouped sm{self.compute_capability} {math.opcode_class.name} {math.math_operation.name} "
                f"A={self.A.element.label}/{self.A.layout.value}/{self.A.alignment} "
                f"B={self.B.element.label}/{self.B.layout.value}/{self.B.alignment} "
                f"C={self.C.element.label}/{self.C.layout.value}/{self.C.alignment} "
                f"acc={math.element_accumulator.label} tile={self.tile_description.procedural_name()} "
                f"epilogue={self.epilogue_functor.describe()} swizzle={self.swizzling_functor.name} "
                f"scheduler={self.precompute_mode.value}")
