"""CUTLASS 3.x (SM90) GEMM in PyCUTLASS's Array mode (a batch of same-sized GEMMs given as arrays of pointers): the
pointer-array kernel, built by ``GemmOperationUniversal(90, ..., array=True)``."""
from .arguments import GemmArgumentsArraySm90
from .operation import GemmOperationArraySm90

__all__ = ["GemmArgumentsArraySm90", "GemmOperationArraySm90"]
