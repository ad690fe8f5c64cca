"""Operation descriptions: what to compute, with which tiles and epilogue; each emits, compiles and runs."""
from .base import Operation
from .gemm import GemmOperationUniversal
from .reduction import ReductionOperation

__all__ = ["GemmOperationUniversal", "Operation", "ReductionOperation"]
from .gemm_grouped import GemmOperationGrouped, SchedulerMode  # noqa: E402

__all__ += ["GemmOperationGrouped", "SchedulerMode"]
from .conv2d import Conv2dOperation  # noqa: E402

__all__ += ["Conv2dOperation"]
