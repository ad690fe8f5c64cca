"""The SM90 grouped GEMM's argument structs: per-group arrays live on the device, the structs point at them (its
builder also writes a TmaRecord, emit/abi.py, per prototype TMA descriptor)."""
from __future__ import annotations

import ctypes

from ...emit.abi import AbiStruct
from ..families.sm90_ptr_array import (  # noqa: F401  (the pointer-array kernel's structs)
    Sm90BlockwiseGroupedGemmArgs, Sm90GroupedGemmArgs)


class Sm90GroupedSizesArgs(AbiStruct):
    """What the device-sizes kernel (``<name>_sizes``, launched before every run of arguments whose group sizes are
    a device tensor) reads and writes: it turns the caller's sizes into the kernel's per-group arrays.

    In: ``sizes`` (int32, ``columns`` = 3 for rows of M, N, K or 1 for M only), the packed A, C and D (rows of
    ``*_row_bytes`` each; ``c_base`` 0 when C aliases D), the per-group B pointers, the bounds (``rows_cap`` rows of
    the packed operands, ``n_cap``, ``k_cap``) and the zeroed stand-in for K = 0 groups. Out: the per-group arrays
    the grouped kernel reads, and ``flags`` (an int32 the kernel ORs its findings into: see SIZE_FLAGS)."""

    _pointers_ = ("sizes", "a_base", "c_base", "d_base", "b_pointers", "stand_in", "problem_sizes", "ptr_A", "ptr_B",
                  "ptr_C", "ptr_D", "lda", "ldb", "flags", "scale_a_base", "ptr_scale_a")
    _fields_ = [("group_count", ctypes.c_int32), ("columns", ctypes.c_int32), ("n_cap", ctypes.c_int32),
                ("k_cap", ctypes.c_int32), ("k_stand_in", ctypes.c_int32),
                ("contiguous", ctypes.c_int32),  # bit 0: N must be a multiple of align_n, bit 1: K of align_k
                ("align_n", ctypes.c_int32), ("align_k", ctypes.c_int32),
                ("rows_cap", ctypes.c_int64),
                # Masked layout: every group owns group_rows rows starting *_group_bytes after the previous group's
                # (0: the packed layout, groups one after the other).
                ("group_rows", ctypes.c_int64), ("a_group_bytes", ctypes.c_int64), ("c_group_bytes", ctypes.c_int64),
                ("d_group_bytes", ctypes.c_int64),
                ("sizes", ctypes.c_uint64),
                ("a_base", ctypes.c_uint64), ("c_base", ctypes.c_uint64), ("d_base", ctypes.c_uint64),
                ("a_row_bytes", ctypes.c_int64), ("c_row_bytes", ctypes.c_int64), ("d_row_bytes", ctypes.c_int64),
                ("b_pointers", ctypes.c_uint64), ("lda_value", ctypes.c_int64), ("ldb_value", ctypes.c_int64),
                ("stand_in", ctypes.c_uint64), ("stand_in_lda", ctypes.c_int64), ("stand_in_ldb", ctypes.c_int64),
                ("problem_sizes", ctypes.c_uint64), ("ptr_A", ctypes.c_uint64), ("ptr_B", ctypes.c_uint64),
                ("ptr_C", ctypes.c_uint64), ("ptr_D", ctypes.c_uint64), ("lda", ctypes.c_uint64),
                ("ldb", ctypes.c_uint64), ("flags", ctypes.c_uint64),
                # Row-wise scales: the (rows,) or (groups, capacity) float32 scale_a; out: its per-group pointers
                # (ptr_scale_a null when the operation has no scales).
                ("scale_a_base", ctypes.c_uint64), ("scale_a_group_bytes", ctypes.c_int64),
                ("ptr_scale_a", ctypes.c_uint64)]


class Sm90BlockwiseGroupedSizesArgs(AbiStruct):
    """Sm90GroupedSizesArgs for operations built with ``scales="blockwise"`` (a struct of its own, so that the sizes
    kernels of other grouped operations stay as they are). In: scale_a (``scale_a_base``, ``scale_a_group_bytes``
    as for row-wise scales; ``scale_a_ld``: elements between its K blocks) and scale_b (``scale_b_base``,
    ``scale_b_group_bytes`` between groups, ``scale_b_ld`` elements between its N blocks). Out: the per-group scale
    pointers (``ptr_scale_a``, ``ptr_scale_b``) and CuTe layouts (``layout_scale_a``, ``layout_scale_b``: CUTLASS's
    LayoutSFA / LayoutSFB of each group's shape, computed on the device)."""

    _pointers_ = Sm90GroupedSizesArgs._pointers_ + ("scale_b_base", "ptr_scale_b", "layout_scale_a", "layout_scale_b")
    _fields_ = Sm90GroupedSizesArgs._fields_ + [
        ("scale_a_ld", ctypes.c_int64), ("scale_b_base", ctypes.c_uint64), ("scale_b_group_bytes", ctypes.c_int64),
        ("scale_b_ld", ctypes.c_int64), ("ptr_scale_b", ctypes.c_uint64), ("layout_scale_a", ctypes.c_uint64),
        ("layout_scale_b", ctypes.c_uint64)]


# What the device-sizes kernel reports in ``flags`` (sticky: ORed by every run until reset). Every case is clamped
# on the device so that nothing is read or written out of bounds; the affected groups' results are wrong or missing.
SIZE_FLAGS = {
    1: "the sum of M over the groups exceeds the rows of the packed A/C/D, or (masked layout) a count exceeds the "
       "capacity (the excess rows were dropped)",
    2: "a group's N exceeds the N of B/D (clamped)",
    4: "a group's K exceeds the K of A/B (clamped)",
    8: "a negative size (taken as 0)",
    16: "a group's N or K is not a multiple of the operand's alignment along its contiguous dimension (group skipped)",
}
