"""The SM90 conv's argument struct (its builder also writes a TmaRecord, emit/abi.py, per TMA descriptor)."""
from __future__ import annotations

import ctypes

from ...emit.abi import EPILOGUE_FIELDS, AbiStruct


class Sm90Conv2dArgs(AbiStruct):
    """What Python hands the device-side Params builder of ``ConvUniversal`` (fprop: A activation NHWC, B filter
    KRSC, C/D output NPQK, all packed). CUTLASS 4.2's SM90 conv has no split-K or stream-K: a wgrad split by images
    builds one of these per slice (``Sm90ConvSlices``)."""

    _pointers_ = ("ptr_A", "ptr_B", "ptr_C", "ptr_D")
    _fields_ = [("n", ctypes.c_int32), ("h", ctypes.c_int32), ("w", ctypes.c_int32), ("c", ctypes.c_int32),
                ("k", ctypes.c_int32), ("r", ctypes.c_int32), ("s", ctypes.c_int32),
                ("p", ctypes.c_int32), ("q", ctypes.c_int32),
                ("pad_h", ctypes.c_int32), ("pad_w", ctypes.c_int32),
                ("stride_h", ctypes.c_int32), ("stride_w", ctypes.c_int32),
                ("dilation_h", ctypes.c_int32), ("dilation_w", ctypes.c_int32), ("mode", ctypes.c_int32),
                ("upper_pad_h", ctypes.c_int32), ("upper_pad_w", ctypes.c_int32),
                ("ptr_A", ctypes.c_uint64), ("ptr_B", ctypes.c_uint64), ("ptr_C", ctypes.c_uint64),
                ("ptr_D", ctypes.c_uint64)] + EPILOGUE_FIELDS


class Sm90ConvSlices(AbiStruct):
    """The one argument of a wgrad's ``<name>_slices`` kernel (parallel split-K by images): the slices' Params, built
    like any other and copied to the device one after another, ``slice_bytes`` apart; blockIdx.z picks one."""

    _pointers_ = ("params",)
    _fields_ = [("params", ctypes.c_uint64), ("slice_bytes", ctypes.c_int64)]


class Sm90Conv2dPersistentArgs(AbiStruct):
    """``Sm90Conv2dArgs`` plus the SMs the persistent cooperative kernel's grid may use (whole clusters)."""

    _pointers_ = Sm90Conv2dArgs._pointers_
    _fields_ = Sm90Conv2dArgs._fields_ + [("sm_count", ctypes.c_int32), ("reserved", ctypes.c_int32)]


class Sm90WgradTapsArgs(AbiStruct):
    """``Sm90Conv2dArgs`` for the filter-tap-reuse wgrad kernel (``filter_taps_wgrad.cuh``), plus its parallel
    split-K slice count (one launch, ``gridDim.z`` slices; 1 writes the gradient itself)."""

    _pointers_ = Sm90Conv2dArgs._pointers_
    _fields_ = Sm90Conv2dArgs._fields_ + [("splits", ctypes.c_int32), ("reserved", ctypes.c_int32)]
