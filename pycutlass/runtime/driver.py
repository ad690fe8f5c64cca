"""Thin, checked access to the CUDA driver (cuda.bindings). Nothing here runs at import time.

pycutlass works in the device's primary context, the one torch, cupy and RMM use, so pointers and streams
from those libraries are valid for our launches.
"""
from __future__ import annotations

import ctypes
import threading

from ..errors import CudaError, NoGpuError

_lock = threading.Lock()
_context = None
_device_ordinal = None


def _driver():
    from cuda.bindings import driver

    return driver


def check(result, what: str, operation: str = ""):
    """Unpack a cuda.bindings result tuple, raising CudaError naming the call (and operation) on failure."""
    driver = _driver()
    err, *values = result if isinstance(result, tuple) else (result,)
    if err != driver.CUresult.CUDA_SUCCESS:
        _, name = driver.cuGetErrorName(err)
        _, text = driver.cuGetErrorString(err)
        name = name.decode() if isinstance(name, bytes) else str(err)
        text = text.decode() if isinstance(text, bytes) else ""
        where = f" for {operation}" if operation else ""
        raise CudaError(f"{what} failed{where}: {name} ({text})", code=name, operation=operation)
    if not values:
        return None
    return values[0] if len(values) == 1 else tuple(values)


def ensure_context(device: int = 0):
    """Make the device's primary context current on this thread (creating it once per process)."""
    global _context, _device_ordinal
    driver = _driver()
    if _context is None:
        with _lock:
            if _context is None:
                try:
                    (err,) = driver.cuInit(0)
                except Exception as exc:  # cuda-bindings raises when libcuda itself is missing
                    raise NoGpuError(f"no usable GPU: the CUDA driver could not be loaded ({exc}). Compiling works "
                                     f"without a GPU; running needs one") from None
                if err != driver.CUresult.CUDA_SUCCESS:
                    raise NoGpuError(f"no usable GPU: cuInit returned {err!r}. Compiling works without a GPU; "
                                     f"running needs one")
                dev = check(driver.cuDeviceGet(device), "cuDeviceGet")
                _context = check(driver.cuDevicePrimaryCtxRetain(dev), "cuDevicePrimaryCtxRetain")
                _device_ordinal = device
    current = check(driver.cuCtxGetCurrent(), "cuCtxGetCurrent")
    if current is None or int(current) != int(_context):
        check(driver.cuCtxSetCurrent(_context), "cuCtxSetCurrent")
    return _context


def device_ordinal() -> int:
    ensure_context()
    return _device_ordinal


def device_attribute(name: str) -> int:
    driver = _driver()
    ensure_context()
    dev = check(driver.cuDeviceGet(_device_ordinal), "cuDeviceGet")
    attribute = getattr(driver.CUdevice_attribute, f"CU_DEVICE_ATTRIBUTE_{name}")
    return check(driver.cuDeviceGetAttribute(attribute, dev), f"cuDeviceGetAttribute({name})")


def load_module(binary: bytes, what: str):
    driver = _driver()
    ensure_context()
    return check(driver.cuModuleLoadData(binary), "cuModuleLoadData", what)


def get_function(module, symbol: str):
    return check(_driver().cuModuleGetFunction(module, symbol.encode()), f"cuModuleGetFunction({symbol})", symbol)


def set_dynamic_shared_memory(function, nbytes: int, what: str) -> None:
    driver = _driver()
    attribute = driver.CUfunction_attribute.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES
    check(driver.cuFuncSetAttribute(function, attribute, nbytes), "cuFuncSetAttribute(max dynamic smem)", what)


def occupancy(function, block_threads: int, shared_memory_bytes: int, what: str) -> int:
    driver = _driver()
    return check(driver.cuOccupancyMaxActiveBlocksPerMultiprocessor(function, block_threads, shared_memory_bytes),
                 "cuOccupancyMaxActiveBlocksPerMultiprocessor", what)


def launch(function, grid, block, shared_memory_bytes: int, stream: int, params_address: int, what: str) -> None:
    """``params_address``: the address of a void*[] holding one pointer per kernel parameter."""
    from cuda.bindings.driver import CUresult, cuLaunchKernel

    (err,) = cuLaunchKernel(function, grid[0], grid[1], grid[2], block[0], block[1], block[2],
                            shared_memory_bytes, stream, params_address, 0)
    if err != CUresult.CUDA_SUCCESS:  # the fast path stays a single call; errors get the full treatment
        check((err,), "cuLaunchKernel", what)


def memcpy_dtoh(host_address: int, device_address: int, nbytes: int, stream: int) -> None:
    driver = _driver()
    check(driver.cuMemcpyDtoHAsync(host_address, device_address, nbytes, stream), "cuMemcpyDtoHAsync")


def memcpy_htod(device_address: int, host_address: int, nbytes: int, stream: int) -> None:
    driver = _driver()
    check(driver.cuMemcpyHtoDAsync(device_address, host_address, nbytes, stream), "cuMemcpyHtoDAsync")


def memset_d8(device_address: int, value: int, nbytes: int, stream: int) -> None:
    check(_driver().cuMemsetD8Async(device_address, value, nbytes, stream), "cuMemsetD8Async")


def synchronize_stream(stream: int, what: str = "") -> None:
    check(_driver().cuStreamSynchronize(stream), "cuStreamSynchronize", what)


def allocate_persistent(nbytes: int, what: str) -> int:
    """Driver memory that lives as long as a loaded module (not argument memory, so not tracked by RMM)."""
    ensure_context()
    return int(check(_driver().cuMemAlloc(nbytes), "cuMemAlloc", what))


def pointer_device_ordinal(address: int) -> int | None:
    """The device a pointer's memory lives on, or None if the driver does not know the pointer."""
    driver = _driver()
    attribute = driver.CUpointer_attribute.CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL
    err, value = driver.cuPointerGetAttribute(attribute, address)
    if err != driver.CUresult.CUDA_SUCCESS:
        return None
    return int(value)


def pointer_array(*addresses: int):
    """A ctypes void*[] whose address is what cuLaunchKernel takes as kernelParams."""
    return (ctypes.c_void_p * len(addresses))(*addresses)
