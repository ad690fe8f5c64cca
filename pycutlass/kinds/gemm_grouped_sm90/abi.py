"""The SM90 grouped GEMM's argument struct: per-group arrays live on the device, the struct points at them (its
builder also writes a TmaRecord, emit/abi.py, per prototype TMA descriptor)."""
from __future__ import annotations

import ctypes

from ...emit.abi import EPILOGUE_FIELDS, AbiStruct


class Sm90GroupedGemmArgs(AbiStruct):
    """What Python hands the device-side Params builder. Nothing here depends on the per-group sizes (they stay on
    the device and the kernel reads them), so Params built for one group serve every group of the same count.
    ``raster_order``: 0 heuristic, 1 along M, 2 along N; ``sm_count``: SMs the persistent grid (and the per-SM
    tensormap slots of the workspace) are sized for."""

    _pointers_ = ("problem_sizes", "ptr_A", "ptr_B", "ptr_C", "ptr_D", "lda", "ldb", "ldc", "ldd", "workspace")
    _fields_ = [("problem_count", ctypes.c_int32), ("sm_count", ctypes.c_int32), ("raster_order", ctypes.c_int32),
                ("swizzle", ctypes.c_int32), ("max_active_clusters", ctypes.c_int32), ("reserved", ctypes.c_int32),
                ("problem_sizes", ctypes.c_uint64),  # device array of Shape<int, int, int> (3 x int32)
                ("ptr_A", ctypes.c_uint64), ("ptr_B", ctypes.c_uint64), ("ptr_C", ctypes.c_uint64),
                ("ptr_D", ctypes.c_uint64),  # device arrays of pointers
                ("lda", ctypes.c_uint64), ("ldb", ctypes.c_uint64), ("ldc", ctypes.c_uint64),
                ("ldd", ctypes.c_uint64),  # device arrays of CUTLASS's internal strides (one int64 each)
                ("workspace", ctypes.c_uint64),  # per-SM tensormap slots
                ("workspace_bytes", ctypes.c_int64)] + EPILOGUE_FIELDS
