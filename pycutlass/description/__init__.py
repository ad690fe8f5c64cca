"""Pure, immutable, validated descriptions: types, instructions, tiles, tensors, coordinates."""
from .coords import GemmCoord, MatrixCoord, Tensor4DCoord
from .math_instruction import VALID_MATH_INSTRUCTIONS, MathInstruction
from .tensor_description import TensorDescription
from .tile_description import TileDescription
from .types import DataType, LayoutType, MathOperation, OpClass, SwizzlingFunctor

__all__ = ["DataType", "GemmCoord", "LayoutType", "MathInstruction", "MathOperation", "MatrixCoord", "OpClass",
           "SwizzlingFunctor", "Tensor4DCoord", "TensorDescription", "TileDescription", "VALID_MATH_INSTRUCTIONS"]
