"""CUTLASS 3.x (SM90) grouped GEMM: the pointer-array kernel, built by ``GemmOperationGrouped(90, ...)`` with an
SM90 tile."""
from .arguments import GemmGroupedArgumentsSm90
from .operation import GemmOperationGroupedSm90

__all__ = ["GemmGroupedArgumentsSm90", "GemmOperationGroupedSm90"]
