"""CUTLASS 3.x SM90 GEMM (TMA + warpgroup MMA): built by ``GemmOperationUniversal(90, ...)``."""
from .arguments import GemmArgumentsSm90
from .operation import GemmOperationSm90

__all__ = ["GemmArgumentsSm90", "GemmOperationSm90"]
