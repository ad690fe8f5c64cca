"""The visitor GEMM's argument struct: the GEMM's own fields plus a fixed number of tensor slots and scalars.

Slot ``i`` holds the i-th tensor of the tree (inputs in parameter order, then outputs in return order:
``EvtDescription.tensors``); ``scalar_j`` the j-th scalar. Unused slots stay zero. A reduction's slot uses
``ld_i`` as the distance between threadblock tiles' partial sums (0 for complete sums) and ``reduction_mode[i]``
(``pycutlass_evt::ReductionMode``: complete sums, or per-tile partials in the compute or the output type).
"""
from __future__ import annotations

import ctypes

from ...emit.abi import AbiStruct
from ...epilogue.visitor import MAX_SCALARS, MAX_TENSORS

_TENSOR_FIELDS = [(f"{field}_{i}", ctype) for i in range(MAX_TENSORS)
                  for field, ctype in (("ptr", ctypes.c_uint64), ("ld", ctypes.c_int64),
                                       ("batch_stride", ctypes.c_int64))]


class GemmEvtArgs(AbiStruct):
    _pointers_ = ("ptr_A", "ptr_B", *(f"ptr_{i}" for i in range(MAX_TENSORS)))
    _fields_ = [("mode", ctypes.c_int32), ("m", ctypes.c_int32), ("n", ctypes.c_int32), ("k", ctypes.c_int32),
                ("batch_count", ctypes.c_int32), ("reserved", ctypes.c_int32),
                ("ptr_A", ctypes.c_uint64), ("ptr_B", ctypes.c_uint64),
                ("lda", ctypes.c_int64), ("ldb", ctypes.c_int64),
                ("batch_stride_A", ctypes.c_int64), ("batch_stride_B", ctypes.c_int64),
                *_TENSOR_FIELDS,
                ("reduction_mode", ctypes.c_int32 * MAX_TENSORS),
                *((f"scalar_{j}", ctypes.c_double) for j in range(MAX_SCALARS))]
