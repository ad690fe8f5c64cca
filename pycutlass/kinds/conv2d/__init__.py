"""CUTLASS 2.x (Sm80-family) implicit-GEMM Conv2d: fprop, dgrad and wgrad."""
from .arguments import Conv2dArguments
from .operation import Conv2dOperation
from .problem import Conv2dProblemSize, IteratorAlgorithm, StrideSupport

__all__ = ["Conv2dArguments", "Conv2dOperation", "Conv2dProblemSize", "IteratorAlgorithm", "StrideSupport"]
