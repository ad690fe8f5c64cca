"""CUTLASS 2.x (Sm80-family) grouped GEMM: many independent problems in one persistent launch."""
from .arguments import GemmGroupedArguments
from .operation import GemmOperationGrouped, SchedulerMode

__all__ = ["GemmGroupedArguments", "GemmOperationGrouped", "SchedulerMode"]
