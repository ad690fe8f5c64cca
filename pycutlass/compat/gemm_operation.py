"""PyCUTLASS 2.11's ``pycutlass.gemm_operation``: the GEMM operations and their Arguments."""
from __future__ import annotations

from .support import missing_names, star_names
from ..kinds import (GemmArguments, GemmGroupedArguments, GemmOperationGrouped, GemmOperationUniversal,
                    SchedulerMode)

_RUNTIME = ("pycutlass launches CUTLASS's kernels itself (Params are built on the device), so there is no "
            "per-operation host runtime class; use operation.run(arguments)")
_EMIT = "use operation.emit() for the CUDA C++ of an operation"
__getattr__ = missing_names(__name__, {
    "GemmRTbase": _RUNTIME, "GemmRTUniversal": _RUNTIME, "GemmRTGrouped": _RUNTIME,
    "GemmOperationBase": "use GemmOperationUniversal or GemmOperationGrouped",
    "EmitGemmUniversalInstance": _EMIT, "EmitGemmGroupedInstance": _EMIT,
    "transpose_layout": "a column-major C is handled by the operation itself",
})

__all__ = star_names(["GemmArguments", "GemmGroupedArguments", "GemmOperationGrouped", "GemmOperationUniversal",
           "SchedulerMode"])
