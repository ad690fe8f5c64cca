"""PyCUTLASS 2.11's ``pycutlass.library``: the description classes and enums.

PyCUTLASS's tables of C++ spellings (``DataTypeTag``, ``LayoutTag``, ...) are not here: pycutlass keeps them in
``pycutlass.emit.names``, which is not public API.
"""
from __future__ import annotations

import enum

from .support import missing_names
from ..description.math_instruction import MathInstruction
from ..description.tensor_description import TensorDescription
from ..description.tile_description import TileDescription
from ..description.types import DataType, LayoutType, MathOperation, OpClass, SwizzlingFunctor
from ..kinds import IteratorAlgorithm, SchedulerMode, StrideSupport
from ..kinds.conv2d.problem import ConvKind, Mode as ConvMode, SplitKMode



class GemmKind(enum.Enum):
    """PyCUTLASS 2.11's GEMM kinds. Its test scripts use the enum to pick what to build (test/unit/test_sm80.py:
    Universal -> GemmOperationUniversal, Grouped -> GemmOperationGrouped); pycutlass builds those two."""
    Gemm = enum.auto()
    Sparse = enum.auto()
    Universal = enum.auto()
    PlanarComplex = enum.auto()
    PlanarComplexArray = enum.auto()
    Grouped = enum.auto()


_TAGS = "pycutlass emits the C++ spellings itself (pycutlass.emit.names; not public API)"
_UNSUPPORTED = "pycutlass builds GEMM (universal, grouped), Conv2d and the split-K reduction only"
__getattr__ = missing_names(__name__, {
    **{name: _TAGS for name in (
        "DataTypeTag", "DataTypeNames", "ShortDataTypeNames", "DataTypeSize", "LayoutTag", "ShortLayoutTypeNames",
        "MathOperationTag", "OpcodeClassTag", "OpcodeClassNames", "SwizzlingFunctorTag", "SchedulerModeTag",
        "ConvKindTag", "ConvKindNames", "IteratorAlgorithmTag", "IteratorAlgorithmNames", "StrideSupportTag",
        "ConvModeTag", "ComplexTransformTag", "TransposedLayout", "SubstituteTemplate")},
    **{name: _UNSUPPORTED for name in ("RankKKind", "TrmmKind", "SymmKind", "BlasMode", "SideMode",
                                       "FillMode", "DiagType", "ComplexMultiplyOp", "OperationKind")},
    "SharedMemPerCC": "use pycutlass.Target.parse(cc).shared_memory_per_block",
})

__all__ = ["ConvKind", "ConvMode", "DataType", "GemmKind", "IteratorAlgorithm", "LayoutType", "MathInstruction", "MathOperation",
           "OpClass", "SchedulerMode", "SplitKMode", "StrideSupport", "SwizzlingFunctor", "TensorDescription",
           "TileDescription"]
