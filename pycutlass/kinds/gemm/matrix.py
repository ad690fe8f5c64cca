"""How a tensor is bound as a matrix operand (leading dimension, batch stride): kinds/families/matrix.py holds it, as
several kinds bind matrices."""
from __future__ import annotations

from ..families.matrix import MatrixGeometry, check_output_geometry, matrix_geometry

__all__ = ["MatrixGeometry", "check_output_geometry", "matrix_geometry"]
