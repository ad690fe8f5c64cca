"""CUTLASS 3.x SM90 implicit-GEMM convolution (TMA im2col, wgmma) under NVRTC: built by
``Conv2dOperation(..., 90, <SM90 tile>, ...)`` (fprop, dgrad at stride 1, wgrad; docs/sm90.md, "SM90 convolution").

``nvrtc_overlay.cuh`` is what makes CUTLASS 4.2's SM90 conv headers compile under NVRTC without editing them;
``probe.py`` keeps the compile probe (and the dgrad/wgrad kernels alone).
"""
from __future__ import annotations

from .arguments import Conv2dArgumentsSm90
from .operation import Conv2dOperationSm90

__all__ = ["Conv2dArgumentsSm90", "Conv2dOperationSm90"]
