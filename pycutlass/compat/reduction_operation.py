"""PyCUTLASS 2.11's ``pycutlass.reduction_operation``: the split-K reduction and its Arguments."""
from __future__ import annotations

from .support import missing_names, star_names
from ..kinds import ReductionArguments, ReductionOperation

__getattr__ = missing_names(__name__, {
    "ReductionRT": "pycutlass launches CUTLASS's kernels itself (Params are built on the device), so there is no "
                   "per-operation host runtime class; use operation.run(arguments)",
    "EmitReductionInstance": "use operation.emit() for the CUDA C++ of an operation",
})

__all__ = star_names(["ReductionArguments", "ReductionOperation"])
