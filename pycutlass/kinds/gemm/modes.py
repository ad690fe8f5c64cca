"""GEMM modes and interleaved-operand helpers (``cutlass.gemm.Mode.Gemm``): kinds/families/modes.py holds them, as
several kinds use them."""
from __future__ import annotations

from ..families.modes import GemmCoord, Mode, interleaved_column_gather, reorder_interleaved_b

__all__ = ["GemmCoord", "Mode", "interleaved_column_gather", "reorder_interleaved_b"]
