"""``pycutlass.gemm``: GEMM coordinates and modes, spelled as in the users' API (``cutlass.gemm.Mode.Gemm``)."""
from __future__ import annotations

from .kinds.gemm.modes import GemmCoord, Mode, interleaved_column_gather, reorder_interleaved_b

__all__ = ["GemmCoord", "Mode", "interleaved_column_gather", "reorder_interleaved_b"]
