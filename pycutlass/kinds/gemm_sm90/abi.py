"""The SM90 GEMM's argument struct (its builder also writes a TmaRecord, emit/abi.py, per TMA descriptor)."""
from __future__ import annotations

import ctypes

from ...emit.abi import EPILOGUE_FIELDS, AbiStruct


class Sm90GemmArgs(AbiStruct):
    """What Python hands the device-side Params builder. Runtime knobs that need no recompile live here: raster
    order (0 heuristic, 1 along M, 2 along N), swizzle size, stream-K splits and decomposition (0 heuristic,
    1 data-parallel, 2 split-K, 3 stream-K), and the SM count the persistent grid is sized for."""

    _pointers_ = ("ptr_A", "ptr_B", "ptr_C", "ptr_D", "ptr_bias", "workspace")
    _fields_ = [("m", ctypes.c_int32), ("n", ctypes.c_int32), ("k", ctypes.c_int32), ("l", ctypes.c_int32),
                ("mode", ctypes.c_int32), ("sm_count", ctypes.c_int32), ("raster_order", ctypes.c_int32),
                ("swizzle", ctypes.c_int32), ("splits", ctypes.c_int32), ("decomposition", ctypes.c_int32),
                ("max_active_clusters", ctypes.c_int32), ("reserved", ctypes.c_int32),
                ("ptr_A", ctypes.c_uint64), ("ptr_B", ctypes.c_uint64), ("ptr_C", ctypes.c_uint64),
                ("ptr_D", ctypes.c_uint64), ("ptr_bias", ctypes.c_uint64), ("workspace", ctypes.c_uint64),
                ("lda", ctypes.c_int64), ("ldb", ctypes.c_int64), ("ldc", ctypes.c_int64), ("ldd", ctypes.c_int64),
                ("batch_stride_A", ctypes.c_int64), ("batch_stride_B", ctypes.c_int64),
                ("batch_stride_C", ctypes.c_int64), ("batch_stride_D", ctypes.c_int64),
                ("batch_stride_bias", ctypes.c_int64)] + EPILOGUE_FIELDS


class Sm90BlockwiseGemmArgs(AbiStruct):
    """Sm90GemmArgs for operations built with ``scales="blockwise"`` (fp8 with block-wise scales): the same fields,
    then the two scale tensors (float32; their CuTe layouts are computed by the builder from the problem shape, with
    scale_a's K blocks ``scale_a_ld`` apart). A struct of its own, so that the units of every other SM90 GEMM stay as
    they are."""

    _pointers_ = Sm90GemmArgs._pointers_ + ("ptr_scale_a", "ptr_scale_b")
    _fields_ = Sm90GemmArgs._fields_ + [("ptr_scale_a", ctypes.c_uint64), ("ptr_scale_b", ctypes.c_uint64),
                                        ("scale_a_ld", ctypes.c_int64)]
