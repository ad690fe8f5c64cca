"""CUTLASS 3.x SM90 implicit-GEMM convolution (TMA im2col, wgmma) under NVRTC: the compile probe only.

Not a registered kind yet (see docs/sm90.md, "SM90 convolution"): ``nvrtc_overlay.cuh`` is what makes CUTLASS 4.2's
SM90 conv headers compile under NVRTC without editing them, and :func:`probe.probe_source` emits one fprop kernel
plus a one-thread device builder that runs CUTLASS's own ``to_underlying_arguments``.
"""
from __future__ import annotations

__all__: list[str] = []
