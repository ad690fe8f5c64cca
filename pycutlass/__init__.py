"""pycutlass: build, compile, cache, launch and tune CUTLASS kernels from Python objects.

``import pycutlass as cutlass`` runs the snippets of the PyCUTLASS guide. Importing creates no files, starts no
CUDA context and needs no GPU: CUDA, RMM and the compilers are touched only when used.

PyCUTLASS 2.11's module paths work too (``pycutlass.gemm_operation``, ``conv2d_operation``,
``reduction_operation``, ``memory_manager``, ``library``, ``utils.device``, ``utils.reference_model``), and
``from pycutlass import *`` gives what its scripts take from it. Those modules live in ``pycutlass.compat``; each
old path is the same module. See docs/porting.md.
"""
from __future__ import annotations

import importlib.util as _importlib_util
import sys as _sys

from . import cache, compiler, conv, gemm, utils  # noqa: F401  (namespaces of the users' API)
from .description.coords import GemmCoord, MatrixCoord, Tensor4DCoord
from .description.math_instruction import MathInstruction
from .description.tensor_description import TensorDescription
from .description.target import Target
from .description.tile_description import TileDescription
from .description.types import (BatchedIdentitySwizzle, DataType, EpilogueScheduleType, HorizontalSwizzle,
                                 IdentitySwizzle1, KernelScheduleType, TileSchedulerType,
                                 IdentitySwizzle2, IdentitySwizzle4, IdentitySwizzle8, LayoutType, MathOperation,
                                 OpClass, StridedDgradHorizontalSwizzle, StridedDgradIdentitySwizzle1,
                                 StridedDgradIdentitySwizzle4, SwizzlingFunctor)
from .epilogue import (FastLinearCombinationClamp, LinearCombination, LinearCombinationClamp,
                       LinearCombinationGeneric, gelu, gelu_taylor, hardswish, identity, leaky_relu, relu, sigmoid,
                       silu, tanh)
from .epilogue.visitor import EpilogueVisitTree, reduction_op
from .errors import (ArgumentError, CacheError, CacheIntegrityWarning, CompilationError, CudaError,
                     DescriptionError, NoGpuError, PyCutlassError, ToolchainError)
from .kinds import (Conv2dArguments, Conv2dOperation, Conv2dProblemSize, GemmArguments, GemmGroupedArguments,
                    GemmOperationGrouped, GemmOperationUniversal, IteratorAlgorithm, ReductionArguments,
                    ReductionOperation, SchedulerMode, StrideSupport)
from .runtime.memory import get_allocated_size, get_memory_pool
from .session import Session
from .utils import Conv2dReferenceModule, ReferenceModule
# PyCUTLASS 2.11's module paths, importable as attributes as there (all light: no torch, no CUDA).
from . import conv2d_operation, gemm_operation, library, memory_manager, reduction_operation  # noqa: F401,E402
from .library import GemmKind  # noqa: E402  (PyCUTLASS's `from pycutlass import *` carried library's names)

__version__ = "0.1.0"

float64 = DataType.float64
float32 = DataType.float32
tfloat32 = DataType.tfloat32
float16 = DataType.float16
bfloat16 = DataType.bfloat16
int8 = DataType.int8
int32 = DataType.int32
float8_e4m3 = DataType.float8_e4m3
float8_e5m2 = DataType.float8_e5m2

RowMajor = LayoutType.RowMajor
ColumnMajor = LayoutType.ColumnMajor
RowMajorInterleaved32 = LayoutType.RowMajorInterleaved32
ColumnMajorInterleaved32 = LayoutType.ColumnMajorInterleaved32
TensorNHWC = LayoutType.TensorNHWC
TensorNC32HW32 = LayoutType.TensorNC32HW32
TensorC32RSK32 = LayoutType.TensorC32RSK32

__all__ = [
    "ArgumentError", "BatchedIdentitySwizzle", "CacheError", "CacheIntegrityWarning", "ColumnMajor",
    "ColumnMajorInterleaved32", "CompilationError", "Conv2dArguments", "Conv2dOperation", "Conv2dProblemSize",
    "Conv2dReferenceModule", "CudaError", "DataType", "DescriptionError", "FastLinearCombinationClamp",
    "GemmArguments", "GemmCoord",
    "GemmGroupedArguments", "GemmOperationGrouped", "GemmOperationUniversal", "HorizontalSwizzle",
    "IdentitySwizzle1", "IdentitySwizzle2", "IdentitySwizzle4", "IdentitySwizzle8", "IteratorAlgorithm",
    "LayoutType", "LinearCombination", "LinearCombinationClamp", "LinearCombinationGeneric", "MathInstruction",
    "MathOperation", "MatrixCoord", "NoGpuError", "OpClass", "PyCutlassError", "ReductionArguments",
    "ReferenceModule",
    "ReductionOperation", "RowMajor", "Session", "RowMajorInterleaved32", "SchedulerMode", "StrideSupport",
    "StridedDgradHorizontalSwizzle", "StridedDgradIdentitySwizzle1", "StridedDgradIdentitySwizzle4",
    "SwizzlingFunctor", "Target", "Tensor4DCoord", "TensorC32RSK32", "TensorDescription", "TensorNC32HW32", "TensorNHWC",
    "TileDescription", "ToolchainError", "bfloat16", "compiler", "conv", "description", "emit", "epilogue",
    "errors", "float16", "cache", "kinds", "session", "float32", "float64", "gelu", "gemm", "get_allocated_size", "get_memory_pool",
    "gelu_taylor", "hardswish", "identity", "int32", "int8", "leaky_relu", "relu", "runtime", "sigmoid", "silu",
    "tanh", "tfloat32", "utils", "EpilogueVisitTree", "reduction_op",
    "KernelScheduleType", "EpilogueScheduleType", "TileSchedulerType", "float8_e4m3", "float8_e5m2", "GemmKind",
]

# PyCUTLASS 2.11 came with a pybind module named `cutlass` holding the same names (cutlass.float16,
# cutlass.gemm.GemmCoord, cutlass.conv.Operator, ...). Its scripts `import cutlass` after `import pycutlass`, and its
# `from pycutlass import *` handed out that module as `cutlass`. Both work here with pycutlass itself standing in, the
# import only when no real `cutlass` package (such as NVIDIA's CuTe DSL) is installed, so nothing is ever shadowed.
cutlass = _sys.modules[__name__]
if "cutlass" not in _sys.modules and _importlib_util.find_spec("cutlass") is None:
    _sys.modules["cutlass"] = cutlass
__all__.append("cutlass")


def __getattr__(name: str):
    # PyCUTLASS 2.11's `from pycutlass import *` carried `rmm` (its memory manager imported it); its scripts call
    # `rmm.rmm_cupy_allocator`. Imported only when asked for, so `import pycutlass` stays light.
    if name == "rmm":
        from ._compat import library
        return library("rmm")
    if name == "load_pack":  # kernel packs (docs/packs.md): imported on first use
        from .pack import load_pack
        return load_pack
    if name == "packs":
        from .pack import installed_packs
        return installed_packs
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__.append("rmm")
