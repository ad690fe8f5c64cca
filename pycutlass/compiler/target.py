"""Which GPU architecture to compile for: an explicit target, else the GPU's, else the operation's own."""
from __future__ import annotations

import functools


@functools.lru_cache(maxsize=None)
def detected_compute_capability(device: int = 0) -> int | None:
    """The compute capability of GPU ``device`` (no context is created), or None without a usable GPU."""
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


def resolve_target(explicit: int | None, operation_capability: int) -> int:
    """SASS is not forward compatible across major architectures, so build for the GPU that will run it."""
    if explicit is not None:
        return explicit
    detected = detected_compute_capability()
    return detected if detected is not None else operation_capability
