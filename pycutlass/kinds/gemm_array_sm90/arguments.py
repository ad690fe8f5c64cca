"""GemmArguments for SM90 operations built with ``array=True``: the surface of the Sm80 GEMM's Array mode (``batch``
matrices of one problem size, as lists of matrices or as tensors holding the batch), run by the pointer-array kernel.
``GemmArguments(op, ...)`` hands out this class when ``op`` is such an operation.

One device buffer holds what the kernel reads per batch entry: the size (the same ``batch`` times), the A/B/C/D
pointers and the leading dimensions (one per operand, as in the Sm80 Array mode). The workspace holds the per-SM
tensormap slots the kernel rewrites per entry. Both belong to the arguments. Mode.Batched and Mode.Gemm run through
the same arrays (pointers base + i * batch stride).
"""
from __future__ import annotations

import numpy as np

from ...emit.abi import fill_epilogue
from ...errors import ArgumentError
from ...runtime.arguments import OperationArguments
from ...runtime.launch import PreparedLaunch
from ..families.modes import Mode
from ..families.grouped_arguments import fill_group_arrays, pack_problem_arrays
from ..families.sm90_arguments import check_group_knobs, check_workspace, persistent_sm_count
from ..gemm_sm90.arguments import GemmArgumentsSm90
from .abi import Sm90GroupedGemmArgs
from .operation import GemmOperationArraySm90


class GemmArgumentsArraySm90(GemmArgumentsSm90):
    """``GemmArguments(op, problem_size, A, B, C, D, output_op=None, gemm_mode=Mode.Array, split_k_slices=1,
    batch=1, stream=None, device=None, session=None, *, raster_order=None, swizzle=None, sm_count=None)`` for an
    operation built with ``GemmOperationUniversal(90, ..., array=True)``.

    - Mode.Array: ``A``, ``B``, ``C``, ``D`` are lists of ``batch`` matrices (each at its own address; one leading
      dimension per operand), or tensors holding the batch. Mode.Batched and Mode.Gemm are accepted too.
    - ``raster_order`` ("along_m" (default), "along_n", "heuristic"), ``swizzle`` (1, 2, 4, 8; default from the
      operation's IdentitySwizzleN), ``sm_count`` (SMs the persistent grid may use, a multiple of the cluster size;
      default all, rounded down to whole clusters): no recompile. No bias vector, split-K or decomposition.
    After building, ``threadblock_count`` is the persistent grid (CTAs).
    """

    _runs_before_launch = False  # before_launch has nothing to do here

    def __init__(self, operation, problem_size, A, B, C, D, *positional, bias=None, raster_order=None, swizzle=None,
                 decomposition=None, sm_count=None, **keywords):
        if not isinstance(operation, GemmOperationArraySm90):
            raise ArgumentError(f"GemmArgumentsArraySm90 needs an operation built with GemmOperationUniversal(90, ..., "
                                f"array=True), got {type(operation).__name__}")
        if decomposition is not None:
            raise ArgumentError(f"decomposition={decomposition!r} needs a stream-K operation; the pointer-array kernel "
                                f"uses CUTLASS's group scheduler")
        self._group_knobs = check_group_knobs(operation, raster_order, swizzle, sm_count)
        super().__init__(operation, problem_size, A, B, C, D, *positional, bias=bias, **keywords)

    # No fast path: Params hold the addresses of this object's device arrays, not of the tensors.
    def _from_memo(self, memo_key, session, addresses, keep_alive) -> bool:
        return False

    def _remember(self, memo_key, vector_bytes, attribute_names, extra=None, operands=()) -> None:
        return

    # --- device state ---------------------------------------------------------------------------------------
    @property
    def entries(self) -> int:
        """GEMMs in the batch (1 in Mode.Gemm)."""
        return self.batch if self.gemm_mode in (Mode.Batched, Mode.Array) else 1

    def _allocate(self) -> None:
        op = self.operation
        m, n, k = self.problem_size
        count = self.entries
        self.sm_count = persistent_sm_count(op, self._group_knobs[2], self.device)
        self.workspace, self.workspace_bytes, self.threadblock_count = 0, 0, 0
        self.device_arrays, self.ptr_D = {}, 0
        if m == 0 or n == 0:  # nothing to write (K == 0 was refused); nothing launches
            return
        pointers, lds = {}, {}
        for label, (form, infos, geometry) in self._operands.items():
            alignment = (op.C if label == "D" else getattr(op, label)).alignment
            if form == "list":
                addresses = [self.tensors.address(info, is_output=label == "D") for info in infos]
                for info, address in zip(infos, addresses):
                    self._check_address(info, address, alignment)
            else:
                address = self.tensors.address(infos, is_output=label == "D")
                self._check_address(infos, address, alignment)
                addresses = [address + i * geometry.batch_stride * infos.itemsize for i in range(count)]
            pointers[label] = np.array(addresses, dtype=np.uint64)
            lds[label] = np.full(count, geometry.ld, dtype=np.int64)
        if "C" not in pointers:  # beta == 0 without C: C aliases D and is never read
            pointers["C"], lds["C"] = pointers["D"], lds["D"]
        sizes = np.tile(np.array([m, n, k], dtype=np.int32), (count, 1))
        blob, offsets = pack_problem_arrays(sizes, pointers, lds)
        base = self.tensors.upload(blob)
        self.device_arrays = {field: base + offset for field, offset in offsets.items()}
        self.ptr_D = self.device_arrays["ptr_D"]
        # The per-SM tensormap slots; the kernel writes them before reading, so they need no clearing.
        self.workspace_bytes = op.workspace_bytes(self.sm_count)
        self.workspace = self.tensors.allocate(self.workspace_bytes)

    def bind(self, loaded_op=None) -> Sm90GroupedGemmArgs:
        raster, swizzle, _ = self._group_knobs
        a = Sm90GroupedGemmArgs()
        a.problem_count = self.entries
        a.sm_count = self.sm_count
        a.raster_order = raster
        a.swizzle = swizzle or self.operation.default_swizzle
        a.max_active_clusters = 0
        fill_group_arrays(a, self)
        fill_epilogue(a, self.output_op)
        return a

    def after_build(self, loaded_op, launch, abi_struct) -> None:
        check_workspace(self, launch)

    def _prepare(self) -> PreparedLaunch:
        if self._prepared is None and not self.device_arrays:  # an empty M or N: no output tile
            import ctypes

            self._prepared = PreparedLaunch(None, (0, 1, 1), (self.operation.thread_count, 1, 1), 0,
                                            (ctypes.c_byte * 8)(), 0, self.operation.name)
        return OperationArguments._prepare(self)

    prepared = _prepare

    def before_launch(self) -> None:
        """Nothing: the tensormap slots are written by the kernel before it reads them."""
__all__ = ["GemmArgumentsArraySm90"]
