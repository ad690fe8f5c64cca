"""The grouped GEMM kind's argument struct: per-problem arrays live on the device, the struct points at them."""
from __future__ import annotations

import ctypes

from ...emit.abi import EPILOGUE_FIELDS, AbiStruct


class GemmGroupedArgs(AbiStruct):
    _pointers_ = ("problem_sizes", "ptr_A", "ptr_B", "ptr_C", "ptr_D", "lda", "ldb", "ldc", "ldd", "workspace")
    _fields_ = [("problem_count", ctypes.c_int32), ("threadblock_count", ctypes.c_int32),
                ("tile_count", ctypes.c_int32), ("reserved", ctypes.c_int32),
                ("problem_sizes", ctypes.c_uint64),  # device array of cutlass::gemm::GemmCoord (3 x int32)
                ("ptr_A", ctypes.c_uint64), ("ptr_B", ctypes.c_uint64), ("ptr_C", ctypes.c_uint64),
                ("ptr_D", ctypes.c_uint64),  # device arrays of pointers
                ("lda", ctypes.c_uint64), ("ldb", ctypes.c_uint64), ("ldc", ctypes.c_uint64),
                ("ldd", ctypes.c_uint64),  # device arrays of int64 leading dimensions
                ("workspace", ctypes.c_uint64),  # the SchedulerMode.Host schedule (ProblemInfo per tile)
                ("workspace_bytes", ctypes.c_int64),  # its size, checked by <name>_precompute
                ] + EPILOGUE_FIELDS
