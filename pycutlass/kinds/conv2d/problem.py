"""The ``pycutlass.conv`` namespace's enums and problem sizes: kinds/families/conv.py holds them, as both conv kinds
(the Sm80 family's and SM90's) use them."""
from __future__ import annotations

from ..families.conv import (Conv2dProblemSize, ConvKind, IteratorAlgorithm, Mode, Operator, SplitKMode,  # noqa: F401
                             StrideSupport, __all__, _as_operator, _rebuild, implicit_gemm_problem_size,
                             implicit_gemm_tensor_a_extent, implicit_gemm_tensor_a_size, implicit_gemm_tensor_b_extent,
                             implicit_gemm_tensor_b_size, implicit_gemm_tensor_c_extent, implicit_gemm_tensor_c_size,
                             interleaved_filter_gather, reorder_interleaved_filter)
