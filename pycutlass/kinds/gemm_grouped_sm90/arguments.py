"""GemmGroupedArguments for SM90 grouped operations: the surface of the Sm80-family grouped GEMM (lists of tensors,
one per group), plus the group scheduler's runtime knobs. ``GemmGroupedArguments(op, ...)`` hands out this class
when ``op`` is an SM90 grouped operation.

One device buffer holds the per-group arrays the kernel reads: sizes (``Shape<int, int, int>``), A/B/C/D pointers and
CUTLASS's internal strides (one int64 leading dimension each; the builder checks that layout on the device). The
workspace holds the per-SM tensormap slots the kernel rewrites per group. Both belong to the arguments.

Zero-sized groups: M == 0 or N == 0 has no output tile (the scheduler skips it). K == 0 must still write
D = epilogue(beta * C), but CUTLASS's main loop leaves the accumulators unset when a tile has no K iteration, so such a
group runs with K = one 16-byte vector and A and B pointing at a zeroed stand-in: the product is exactly 0.
"""
from __future__ import annotations

import numpy as np

from ...description.types import LayoutType
from ...emit.abi import fill_epilogue
from ...errors import ArgumentError, CudaError
from ..gemm_grouped.arguments import GemmGroupedArguments, _alias, pack_problem_arrays
from .abi import Sm90GroupedGemmArgs
from .operation import GemmOperationGroupedSm90

# None: CUTLASS's own default for groups (along M; its heuristic looks at the grid, not at the groups' shapes).
RASTER_ORDERS = {None: 1, "heuristic": 0, "along_m": 1, "along_n": 2}


class GemmGroupedArgumentsSm90(GemmGroupedArguments):
    """``GemmGroupedArguments(op, problem_sizes, As, Bs, Cs, Ds, output_op=None, stream=None, device=None,
    session=None, *, raster_order=None, swizzle=None, sm_count=None)`` for an SM90 grouped operation.

    As for the Sm80-family kernel, except: C may not be a broadcast vector (TMA reads whole matrices), and the knobs
    ``raster_order`` ("along_m" (default), "along_n", "heuristic"), ``swizzle`` (1, 2, 4, 8; default from the
    operation's IdentitySwizzleN) and ``sm_count`` (SMs the persistent grid may use, a multiple of the cluster size;
    default all, rounded down to whole clusters) need no recompile.
    After building, ``threadblock_count`` is the persistent grid (CTAs) and ``tile_count`` the group's output tiles.
    """

    operation_type = GemmOperationGroupedSm90

    def __init__(self, operation, problem_sizes, As=None, Bs=None, Cs=None, Ds=None, output_op=None, stream=None,
                 device=None, session=None, *, A=None, B=None, C=None, D=None, raster_order=None, swizzle=None,
                 sm_count=None):
        if A is not None or B is not None or C is not None or D is not None:
            As, Bs, Cs, Ds = (_alias(plural, plural_value, single, single_value) for plural, plural_value, single,
                              single_value in (("As", As, "A", A), ("Bs", Bs, "B", B), ("Cs", Cs, "C", C),
                                               ("Ds", Ds, "D", D)))
        if not isinstance(operation, GemmOperationGroupedSm90):
            raise ArgumentError(f"GemmGroupedArgumentsSm90 needs an SM90 GemmOperationGrouped, got "
                                f"{type(operation).__name__}")
        self._knobs = _check_knobs(operation, raster_order, swizzle, sm_count)
        self._validate_and_prepare(operation, problem_sizes, As, Bs, Cs, Ds, output_op, stream, device, session)

    def _describe_operand(self, index: int, label: str, tensor, rows: int, cols: int, desc):
        info, geometry = super()._describe_operand(index, label, tensor, rows, cols, desc)
        if label == "C" and geometry.broadcast:
            raise ArgumentError(f"Cs[{index}] (problem {index}, operand C): C broadcast from a vector is not built for "
                                f"SM90 grouped operations (TMA reads whole matrices); pass an M x N matrix")
        return info, geometry

    # --- device state ---------------------------------------------------------------------------------------
    def _allocate(self) -> None:
        op = self.operation
        count = len(self.problem_sizes)
        self.threadblock_count = 0
        self.workspace, self.workspace_bytes = 0, 0
        cluster = op.cluster_shape[0] * op.cluster_shape[1]
        # CUTLASS sizes a clustered grid from the SM count without rounding it to whole clusters.
        self.sm_count = self._knobs[2] or self.device.sm_count // cluster * cluster
        if self.tile_count == 0:  # nothing launches (GemmGroupedArguments._prepare)
            self.device_arrays = {}
            return
        sizes = np.zeros((count, 3), dtype=np.int32)
        pointers = {label: np.zeros(count, dtype=np.uint64) for label in "ABCD"}
        lds = {label: np.zeros(count, dtype=np.int64) for label in "ABCD"}
        stand_in = self._empty_k_stand_in()
        k_stand_in = op.empty_k_stand_in
        for index, (problem, operands) in enumerate(zip(self.problem_sizes, self._operands)):
            m, n, k = problem
            empty_k = k == 0 and m > 0 and n > 0
            sizes[index] = (m, n, k_stand_in if empty_k else k)
            for label in "ABDC":
                if label not in operands:  # beta == 0 without C: C aliases D and is never read
                    pointers["C"][index], lds["C"][index] = pointers["D"][index], lds["D"][index]
                    continue
                if label in "AB" and empty_k:
                    pointers[label][index] = stand_in
                    lds[label][index] = _stand_in_ld(op, label, m, n)
                    continue
                info, geometry = operands[label]
                pointers[label][index] = self.tensors.address(info, is_output=label == "D")
                lds[label][index] = geometry.ld
        blob, offsets = pack_problem_arrays(sizes, pointers, lds)
        base = self.tensors.upload(blob)
        self.device_arrays = {field: base + offset for field, offset in offsets.items()}
        # The per-SM tensormap slots; the kernel writes them before reading, so they need no clearing.
        self.workspace_bytes = op.workspace_bytes(self.sm_count)
        self.workspace = self.tensors.allocate(self.workspace_bytes)

    def _empty_k_stand_in(self) -> int:
        """A zeroed buffer that A and B of every K == 0 group read as an M x K' / K' x N matrix (0 when none)."""
        op = self.operation
        extents = [max(m, n) for m, n, k in self.problem_sizes if k == 0 and m and n]
        if not extents:
            return 0
        alignment = max(op.A.alignment, op.B.alignment)
        elements = op.empty_k_stand_in * (-(-max(extents) // alignment) * alignment)
        return self.tensors.zeros(elements * op.A.element.bits // 8)

    def bind(self, loaded_op=None) -> Sm90GroupedGemmArgs:
        op = self.operation
        raster, swizzle, _ = self._knobs
        a = Sm90GroupedGemmArgs()
        a.problem_count = len(self.problem_sizes)
        a.sm_count = self.sm_count
        a.raster_order = raster
        a.swizzle = swizzle or op.default_swizzle
        a.max_active_clusters = 0
        a.problem_sizes = self.device_arrays["problem_sizes"]
        a.ptr_A, a.ptr_B, a.ptr_C, a.ptr_D = (self.device_arrays[f"ptr_{x}"] for x in "ABCD")
        a.lda, a.ldb, a.ldc, a.ldd = (self.device_arrays[f"ld{x}"] for x in "abcd")
        a.workspace = self.workspace
        a.workspace_bytes = self.workspace_bytes
        fill_epilogue(a, self.output_op)
        return a

    def after_build(self, loaded_op, launch, abi_struct) -> None:
        if launch.workspace_bytes != self.workspace_bytes:
            raise CudaError(f"{self.operation.name}: the builder sized the tensormap workspace at "
                            f"{launch.workspace_bytes} bytes, pycutlass at {self.workspace_bytes} (sm_count "
                            f"{self.sm_count})", operation=self.operation.name)
        self.threadblock_count = launch.grid[0] * launch.grid[1] * launch.grid[2]


def _stand_in_ld(op, label: str, m: int, n: int) -> int:
    """Leading dimension of the K == 0 stand-in read as A (M x K') or B (K' x N) in the operation's layouts."""
    desc, extent = (op.A, m) if label == "A" else (op.B, n)
    k_contiguous = (desc.layout is LayoutType.RowMajor) == (label == "A")
    if k_contiguous:
        return op.empty_k_stand_in
    return -(-extent // desc.alignment) * desc.alignment


def _check_knobs(operation, raster_order, swizzle, sm_count) -> tuple:
    if raster_order not in RASTER_ORDERS:
        raise ArgumentError(f"raster_order must be one of {list(RASTER_ORDERS)}, got {raster_order!r}")
    if swizzle not in (None, 1, 2, 4, 8):
        raise ArgumentError(f"swizzle must be 1, 2, 4 or 8, got {swizzle!r}")
    if sm_count is not None:
        if isinstance(sm_count, bool) or not isinstance(sm_count, int) or sm_count < 1:
            raise ArgumentError(f"sm_count must be a positive integer, got {sm_count!r}")
        cluster = operation.cluster_shape[0] * operation.cluster_shape[1]
        if sm_count % cluster:
            raise ArgumentError(f"sm_count={sm_count} is not a multiple of the operation's cluster of {cluster} CTAs; "
                                f"the persistent grid is made of whole clusters")
    return (RASTER_ORDERS[raster_order], swizzle or 0, sm_count or 0)
