"""``pycutlass.gemm``: GEMM coordinates and modes, spelled as in the users' API (``cutlass.gemm.Mode.Gemm``)."""
from __future__ import annotations

import enum

from .description.coords import GemmCoord


class Mode(enum.IntEnum):
    """Values equal cutlass::gemm::GemmUniversalMode, which the device-side Params builder receives."""

    Gemm = 0
    GemmSplitKParallel = 1
    Batched = 2
    Array = 3
    Grouped = 4


__all__ = ["GemmCoord", "Mode"]
