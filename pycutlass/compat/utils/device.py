"""``pycutlass.utils.device``: PyCUTLASS's ``device_cc()``."""
from __future__ import annotations

from ...compiler import target as _target
from ...errors import NoGpuError


def device_cc(device: int = 0) -> int:
    """The compute capability of GPU ``device`` as an integer (90 on H100/H200, 80 on A100).

    Asked of the driver (``cuDeviceGetAttribute``) without creating a CUDA context; raises ``NoGpuError`` when
    there is no usable GPU (no driver, no device, or no device ``device``).
    """
    cc = _target.detected_compute_capability(device)
    if cc is None:
        raise NoGpuError(f"device_cc({device}): no usable GPU {device} (the CUDA driver reports none, or is missing)")
    return cc


__all__ = ["device_cc"]
