"""PyCUTLASS 2.11's ``pycutlass.conv2d_operation``: the Conv2d operation and its Arguments."""
from __future__ import annotations

from .support import missing_names, star_names
from ..kinds import Conv2dArguments, Conv2dOperation, Conv2dProblemSize, IteratorAlgorithm, StrideSupport

__getattr__ = missing_names(__name__, {
    "Conv2dRT": "pycutlass launches CUTLASS's kernels itself (Params are built on the device), so there is no "
                "per-operation host runtime class; use operation.run(arguments)",
    "EmitConv2dInstance": "use operation.emit() for the CUDA C++ of an operation",
})

__all__ = star_names(["Conv2dArguments", "Conv2dOperation", "Conv2dProblemSize", "IteratorAlgorithm", "StrideSupport"])
