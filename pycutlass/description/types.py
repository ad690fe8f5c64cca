"""Enumerations shared by every description: data types, layouts, op classes, math operations, swizzles.

These are pure data. Their C++ spellings live in ``pycutlass.emit.names`` and their numpy/torch
spellings in ``pycutlass.runtime.tensors``, so this module imports nothing heavy.
"""
from __future__ import annotations

import enum
from dataclasses import dataclass


class DataType(enum.Enum):
    """Element types of operands and accumulators. ``bits`` is the storage size."""

    # Enum hashes a member by its name in Python code; members are singletons compared by identity, so object's
    # hash is equivalent and far cheaper (building Arguments looks types and layouts up per operand).
    __hash__ = object.__hash__

    float64 = ("float64", 64)
    float32 = ("float32", 32)
    tfloat32 = ("tfloat32", 32)  # stored as float32, multiplied on tensor cores as tf32
    float16 = ("float16", 16)
    bfloat16 = ("bfloat16", 16)
    int8 = ("int8", 8)
    int32 = ("int32", 32)
    float8_e4m3 = ("float8_e4m3", 8)  # OCP fp8 (torch.float8_e4m3fn), SM90 family only
    float8_e5m2 = ("float8_e5m2", 8)

    def __init__(self, label: str, bits: int):
        self.label = label
        self.bits = bits

    @property
    def is_integer(self) -> bool:
        return self in (DataType.int8, DataType.int32)

    @property
    def is_float(self) -> bool:
        return not self.is_integer

    @property
    def is_fp8(self) -> bool:
        return self in (DataType.float8_e4m3, DataType.float8_e5m2)

    def __repr__(self) -> str:
        return f"pycutlass.{self.label}"


class LayoutType(enum.Enum):
    __hash__ = object.__hash__  # as DataType's
    RowMajor = "RowMajor"
    ColumnMajor = "ColumnMajor"
    RowMajorInterleaved32 = "RowMajorInterleaved32"
    ColumnMajorInterleaved32 = "ColumnMajorInterleaved32"
    TensorNHWC = "TensorNHWC"
    TensorNC32HW32 = "TensorNC32HW32"
    TensorC32RSK32 = "TensorC32RSK32"

    @property
    def is_matrix(self) -> bool:
        return self in MATRIX_LAYOUTS

    @property
    def is_interleaved(self) -> bool:
        return self in INTERLEAVED_LAYOUTS

    def __repr__(self) -> str:
        return f"pycutlass.{self.value}"


MATRIX_LAYOUTS = frozenset({LayoutType.RowMajor, LayoutType.ColumnMajor,
                            LayoutType.RowMajorInterleaved32, LayoutType.ColumnMajorInterleaved32})
INTERLEAVED_LAYOUTS = frozenset({LayoutType.RowMajorInterleaved32, LayoutType.ColumnMajorInterleaved32,
                                 LayoutType.TensorNC32HW32, LayoutType.TensorC32RSK32})
TENSOR_LAYOUTS = frozenset({LayoutType.TensorNHWC, LayoutType.TensorNC32HW32, LayoutType.TensorC32RSK32})


class OpClass(enum.Enum):
    TensorOp = "TensorOp"
    Simt = "Simt"


class MathOperation(enum.Enum):
    multiply_add = "multiply_add"
    multiply_add_fast_f32 = "multiply_add_fast_f32"
    multiply_add_fast_f16 = "multiply_add_fast_f16"
    multiply_add_fast_bf16 = "multiply_add_fast_bf16"
    multiply_add_saturate = "multiply_add_saturate"


@dataclass(frozen=True)
class SwizzlingFunctor:
    """Threadblock rasterization. ``log_tile`` is the CTA swizzle width of identity swizzles."""

    name: str
    kind: str  # "gemm", "batched", "strided_dgrad", "horizontal"
    log_tile: int = 0

    def __repr__(self) -> str:
        return f"pycutlass.{self.name}"


IdentitySwizzle1 = SwizzlingFunctor("IdentitySwizzle1", "gemm", 1)
IdentitySwizzle2 = SwizzlingFunctor("IdentitySwizzle2", "gemm", 2)
IdentitySwizzle4 = SwizzlingFunctor("IdentitySwizzle4", "gemm", 4)
IdentitySwizzle8 = SwizzlingFunctor("IdentitySwizzle8", "gemm", 8)
HorizontalSwizzle = SwizzlingFunctor("HorizontalSwizzle", "horizontal")
BatchedIdentitySwizzle = SwizzlingFunctor("BatchedIdentitySwizzle", "batched")
StridedDgradIdentitySwizzle1 = SwizzlingFunctor("StridedDgradIdentitySwizzle1", "strided_dgrad", 1)
StridedDgradIdentitySwizzle4 = SwizzlingFunctor("StridedDgradIdentitySwizzle4", "strided_dgrad", 4)
StridedDgradHorizontalSwizzle = SwizzlingFunctor("StridedDgradHorizontalSwizzle", "strided_dgrad_horizontal")

# GemmUniversal takes swizzles whose tile offset comes from a log tile; the horizontal one is conv-only.
GEMM_SWIZZLES = (IdentitySwizzle1, IdentitySwizzle2, IdentitySwizzle4, IdentitySwizzle8, BatchedIdentitySwizzle)
CONV_SWIZZLES = (IdentitySwizzle1, IdentitySwizzle2, IdentitySwizzle4, IdentitySwizzle8, HorizontalSwizzle,
                 StridedDgradIdentitySwizzle1, StridedDgradIdentitySwizzle4, StridedDgradHorizontalSwizzle)


# ---- CUTLASS 3.x (SM90 family) knobs: more dimensions of TileDescription ------------------------------------------
class KernelScheduleType(enum.Enum):
    """How the SM90 main loop is organized (cutlass::gemm::Kernel*). ``Auto`` is resolved by the operation."""

    Auto = "Auto"
    TmaWarpSpecialized = "TmaWarpSpecialized"
    TmaWarpSpecializedCooperative = "TmaWarpSpecializedCooperative"
    TmaWarpSpecializedPingpong = "TmaWarpSpecializedPingpong"
    TmaWarpSpecializedFP8FastAccum = "TmaWarpSpecializedFP8FastAccum"
    TmaWarpSpecializedCooperativeFP8FastAccum = "TmaWarpSpecializedCooperativeFP8FastAccum"
    TmaWarpSpecializedPingpongFP8FastAccum = "TmaWarpSpecializedPingpongFP8FastAccum"

    @property
    def is_fp8_fast_accum(self) -> bool:
        return self.value.endswith("FP8FastAccum")

    @property
    def base(self) -> "KernelScheduleType":
        """The schedule without its FP8FastAccum suffix."""
        return KernelScheduleType(self.value.removesuffix("FP8FastAccum"))

    @property
    def fp8_fast_accum(self) -> "KernelScheduleType":
        """The schedule's FP8FastAccum form (what CUTLASS's builder picks for fp8 operands)."""
        return KernelScheduleType(self.base.value + "FP8FastAccum")

    def __repr__(self) -> str:
        return f"pycutlass.KernelScheduleType.{self.name}"


class EpilogueScheduleType(enum.Enum):
    Auto = "Auto"
    TmaWarpSpecialized = "TmaWarpSpecialized"
    TmaWarpSpecializedCooperative = "TmaWarpSpecializedCooperative"
    NoSmemWarpSpecialized = "NoSmemWarpSpecialized"

    def __repr__(self) -> str:
        return f"pycutlass.EpilogueScheduleType.{self.name}"


class TileSchedulerType(enum.Enum):
    Default = "Default"  # persistent (a non-persistent grid for TmaWarpSpecialized)
    Persistent = "Default"
    StreamK = "StreamK"

    def __repr__(self) -> str:
        return f"pycutlass.TileSchedulerType.{self.name}"
