"""The GEMM kind's argument struct: what Python hands the device-side Params builder of GemmUniversal."""
from __future__ import annotations

import ctypes

from ...emit.abi import EPILOGUE_FIELDS, AbiStruct


class GemmUniversalArgs(AbiStruct):
    _pointers_ = ("ptr_A", "ptr_B", "ptr_C", "ptr_D", "semaphore")
    _fields_ = [("mode", ctypes.c_int32), ("m", ctypes.c_int32), ("n", ctypes.c_int32), ("k", ctypes.c_int32),
                ("batch_count", ctypes.c_int32), ("reserved", ctypes.c_int32),
                ("ptr_A", ctypes.c_uint64), ("ptr_B", ctypes.c_uint64), ("ptr_C", ctypes.c_uint64),
                ("ptr_D", ctypes.c_uint64), ("semaphore", ctypes.c_uint64),
                ("lda", ctypes.c_int64), ("ldb", ctypes.c_int64), ("ldc", ctypes.c_int64), ("ldd", ctypes.c_int64),
                ("batch_stride_A", ctypes.c_int64), ("batch_stride_B", ctypes.c_int64),
                ("batch_stride_C", ctypes.c_int64), ("batch_stride_D", ctypes.c_int64)] + EPILOGUE_FIELDS
