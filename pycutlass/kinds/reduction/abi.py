"""The split-K reduction kind's argument struct."""
from __future__ import annotations

import ctypes

from ...emit.abi import EPILOGUE_FIELDS, AbiStruct


class ReductionArgs(AbiStruct):
    _pointers_ = ("workspace", "destination", "source")
    _fields_ = [("m", ctypes.c_int32), ("n", ctypes.c_int32), ("partitions", ctypes.c_int32),
                ("reserved", ctypes.c_int32), ("partition_stride", ctypes.c_int64),
                ("workspace", ctypes.c_uint64), ("ld_workspace", ctypes.c_int64),
                ("destination", ctypes.c_uint64), ("ld_destination", ctypes.c_int64),
                ("source", ctypes.c_uint64), ("ld_source", ctypes.c_int64)] + EPILOGUE_FIELDS
