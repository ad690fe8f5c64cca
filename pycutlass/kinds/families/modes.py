"""GEMM modes and interleaved-operand helpers, spelled as in the users' API (``cutlass.gemm.Mode.Gemm``)."""
from __future__ import annotations

import enum

from ...description.coords import GemmCoord


class Mode(enum.IntEnum):
    """Values equal cutlass::gemm::GemmUniversalMode, which the device-side Params builder receives."""

    Gemm = 0
    GemmSplitKParallel = 1
    Batched = 2
    Array = 3
    Grouped = 4


def interleaved_column_gather(n: int) -> list[int]:
    """Column order that interleaved-32 int8 kernels expect of B (and conv filters, along K).

    CUTLASS's interleaved epilogue skips shared memory, so B's columns must be permuted within each group of 32
    the way ``cutlass::reorder_column<32>`` (tools/util/host_reorder.h) does: ``reordered[:, j] = B[:, gather[j]]``.
    """
    from ...errors import ArgumentError

    if isinstance(n, bool) or not hasattr(n, "__index__") or int(n) < 1 or int(n) % 32:
        raise ArgumentError(f"interleaved operands need a column count that is a positive multiple of 32, got {n!r}")
    gather = [0] * int(n)
    for column in range(int(n)):  # 8-column instructions, 4 threads per quad
        gather[(column // 32) * 32 + ((column % 8) // 2) * 8 + ((column % 32) // 8) * 2 + column % 2] = column
    return gather


def reorder_interleaved_b(b):
    """The logical (K, N) B of an interleaved int8 GEMM with its columns in kernel order; pack it into
    RowMajorInterleaved32 order afterwards. Works on numpy, torch and cupy arrays; the input is not modified."""
    return b[:, interleaved_column_gather(b.shape[1])]


__all__ = ["GemmCoord", "Mode", "interleaved_column_gather", "reorder_interleaved_b"]
