"""Which GPU a compile is for when no target is given: ask the driver, creating no context."""
from __future__ import annotations


def detected_compute_capability(device: int = 0) -> int | None:
    """The compute capability of GPU ``device``, or None without a usable GPU (no context is created)."""
    try:
        from cuda.bindings import driver
    except ImportError:
        return None
    try:
        (err,) = driver.cuInit(0)
    except Exception:  # cuda-bindings raises (not returns) when libcuda is missing
        return None
    if err != driver.CUresult.CUDA_SUCCESS:
        return None
    err, dev = driver.cuDeviceGet(device)
    if err != driver.CUresult.CUDA_SUCCESS:
        return None
    attr = driver.CUdevice_attribute
    _, major = driver.cuDeviceGetAttribute(attr.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, dev)
    _, minor = driver.cuDeviceGetAttribute(attr.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, dev)
    return major * 10 + minor
