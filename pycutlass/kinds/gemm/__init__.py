"""CUTLASS 2.x (Sm80-family) GEMM: Gemm, serial and parallel split-K, Batched and Array modes."""
from .arguments import GemmArguments
from .operation import GemmOperationUniversal

__all__ = ["GemmArguments", "GemmOperationUniversal"]
