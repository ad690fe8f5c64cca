"""The Conv2d kind's argument struct: what Python hands the device-side Params builder of ImplicitGemmConvolution."""
from __future__ import annotations

import ctypes

from ...emit.abi import EPILOGUE_FIELDS, AbiStruct


class Conv2dArgs(AbiStruct):
    _pointers_ = ("ptr_A", "ptr_B", "ptr_C", "ptr_D", "semaphore")
    _fields_ = [("n", ctypes.c_int32), ("h", ctypes.c_int32), ("w", ctypes.c_int32), ("c", ctypes.c_int32),
                ("k", ctypes.c_int32), ("r", ctypes.c_int32), ("s", ctypes.c_int32),
                ("p", ctypes.c_int32), ("q", ctypes.c_int32),
                ("pad_h", ctypes.c_int32), ("pad_w", ctypes.c_int32),
                ("stride_h", ctypes.c_int32), ("stride_w", ctypes.c_int32),
                ("dilation_h", ctypes.c_int32), ("dilation_w", ctypes.c_int32),
                ("mode", ctypes.c_int32), ("split_k_slices", ctypes.c_int32), ("groups", ctypes.c_int32),
                ("split_k_mode", ctypes.c_int32), ("reserved", ctypes.c_int32),
                ("ptr_A", ctypes.c_uint64), ("ptr_B", ctypes.c_uint64), ("ptr_C", ctypes.c_uint64),
                ("ptr_D", ctypes.c_uint64), ("semaphore", ctypes.c_uint64),
                # Strides (elements) of C's W, H and N dimensions; zeros broadcast a bias vector.
                ("stride_c_w", ctypes.c_int64), ("stride_c_h", ctypes.c_int64), ("stride_c_n", ctypes.c_int64),
                ] + EPILOGUE_FIELDS
