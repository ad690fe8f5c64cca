"""What both grouped GEMM kinds (the Sm80 family's and SM90's) take: the scheduler modes and the swizzles their
PyCUTLASS constructor accepts."""
from __future__ import annotations

import enum

from ...description.types import (BatchedIdentitySwizzle, HorizontalSwizzle, IdentitySwizzle1, IdentitySwizzle2,
                                 IdentitySwizzle4, IdentitySwizzle8)

# The grouped kernel schedules tiles with its problem visitor; the swizzle only names a type it ignores.
# BatchedIdentitySwizzle is accepted because PyCUTLASS 2.11's own grouped tests pass it; the strided-dgrad swizzles
# belong to convolutions and are rejected.
GROUPED_SWIZZLES = (IdentitySwizzle1, IdentitySwizzle2, IdentitySwizzle4, IdentitySwizzle8, HorizontalSwizzle,
                    BatchedIdentitySwizzle)


class SchedulerMode(enum.Enum):
    """Who computes the order in which the persistent blocks visit the tiles of the group."""

    Device = "Device"  # cutlass::gemm::kernel::GroupScheduleMode::kDeviceOnly
    Host = "Host"  # cutlass::gemm::kernel::GroupScheduleMode::kHostPrecompute (precomputed, here on the device)

    @property
    def cpp(self) -> str:
        member = "kDeviceOnly" if self is SchedulerMode.Device else "kHostPrecompute"
        return f"cutlass::gemm::kernel::GroupScheduleMode::{member}"

    def __repr__(self) -> str:
        return f"pycutlass.SchedulerMode.{self.value}"
