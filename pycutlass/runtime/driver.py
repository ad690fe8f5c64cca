"""Thin, checked access to the CUDA driver (cuda.bindings). Nothing here runs at import time.

pycutlass works in each device's primary context, the one torch, cupy and RMM use, so pointers and streams
from those libraries are valid for our launches. This module holds no state: which contexts are retained and
what is loaded in them lives in the session's per-device state (``runtime.device``).
"""
from __future__ import annotations

import ctypes
import functools

from ..errors import CudaError, NoGpuError

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


def init() -> None:
    """cuInit, turning a missing driver or GPU into NoGpuError (cuda-bindings raises when libcuda is missing)."""
    driver = _driver()
    try:
        (err,) = driver.cuInit(0)
    except Exception as exc:
        raise NoGpuError(f"no usable GPU: the CUDA driver could not be loaded ({exc}). Compiling works without a "
                         f"GPU; running needs one") from None
    if err != driver.CUresult.CUDA_SUCCESS:
        raise NoGpuError(f"no usable GPU: cuInit returned {err!r}. Compiling works without a GPU; running needs one")


def device_count() -> int:
    init()
    return int(check(_driver().cuDeviceGetCount(), "cuDeviceGetCount"))


def retain_primary_context(ordinal: int):
    """The device's primary context (the one torch, cupy and RMM use), retained for the caller."""
    init()
    count = device_count()
    if not 0 <= ordinal < count:
        raise NoGpuError(f"there is no CUDA device {ordinal}; this machine has {count} (0..{count - 1})")
    dev = check(_driver().cuDeviceGet(ordinal), "cuDeviceGet")
    return check(_driver().cuDevicePrimaryCtxRetain(dev), "cuDevicePrimaryCtxRetain")


def make_current(context) -> None:
    """Make ``context`` current on this thread (a no-op when it already is)."""
    driver = _driver()
    current = check(driver.cuCtxGetCurrent(), "cuCtxGetCurrent")
    if current is None or int(current) != int(context):
        check(driver.cuCtxSetCurrent(context), "cuCtxSetCurrent")


def current_device_ordinal() -> int | None:
    """The device of this thread's current context (set by torch.cuda.set_device, cupy, ...), or None."""
    driver = _driver()
    current = check(driver.cuCtxGetCurrent(), "cuCtxGetCurrent")
    if current is None or int(current) == 0:
        return None
    return int(check(driver.cuCtxGetDevice(), "cuCtxGetDevice"))


def device_attribute(ordinal: int, name: str) -> int:
    driver = _driver()
    dev = check(driver.cuDeviceGet(ordinal), "cuDeviceGet")
    attribute = getattr(driver.CUdevice_attribute, f"CU_DEVICE_ATTRIBUTE_{name}")
    return check(driver.cuDeviceGetAttribute(attribute, dev), f"cuDeviceGetAttribute({name})")


def device_name(ordinal: int) -> str:
    driver = _driver()
    dev = check(driver.cuDeviceGet(ordinal), "cuDeviceGet")
    raw = check(driver.cuDeviceGetName(256, dev), "cuDeviceGetName")
    return raw.split(b"\0", 1)[0].decode(errors="replace") if isinstance(raw, bytes) else str(raw)


def load_module(binary: bytes, what: str):
    """Load into the current context (the caller made its device's context current)."""
    driver = _driver()
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


def kernel_launcher():
    """``(cuLaunchKernelEx, CUDA_SUCCESS)`` of cuda.bindings, for launchers that keep them. A launch passes a
    ``launch_config`` made once per stream instead of cuLaunchKernel's grid, block, shared memory and stream
    (converted on every call): run() 4.5 against 5.4 us on an H100 host."""
    driver = _driver()
    return driver.cuLaunchKernelEx, driver.CUresult.CUDA_SUCCESS


def launch_config(grid, block, shared_memory_bytes: int, stream: int, programmatic: bool = False):
    """cuLaunchKernelEx's config for one kernel on ``stream``. ``programmatic``: programmatic dependent launch (PDL):
    the kernel may start while the stream's previous kernel finishes, and must wait (griddepcontrol.wait) before
    it touches global memory."""
    cuda = _driver()
    config = cuda.CUlaunchConfig()
    config.gridDimX, config.gridDimY, config.gridDimZ = grid
    config.blockDimX, config.blockDimY, config.blockDimZ = block
    config.sharedMemBytes = shared_memory_bytes
    config.hStream = cuda.CUstream(stream)
    if programmatic:
        attribute = cuda.CUlaunchAttribute()
        attribute.id = cuda.CUlaunchAttributeID.CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION
        attribute.value.programmaticStreamSerializationAllowed = 1
        config.attrs = [attribute]
        config.numAttrs = 1
    return config


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
    """Driver memory in the current context that lives as long as a loaded module (not tracked by RMM)."""
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


# ---- TMA descriptors ---------------------------------------------------------------------------------------------
_TENSOR_MAP_BYTES = 128


@functools.cache  # libcuda is loaded once per process anyway
def _tensor_map_encoder():
    """libcuda's cuTensorMapEncodeTiled through ctypes: cheaper per call than through cuda.bindings."""
    encoder = ctypes.CDLL("libcuda.so.1").cuTensorMapEncodeTiled
    encoder.restype = ctypes.c_int
    encoder.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_uint32, ctypes.c_void_p, ctypes.c_void_p,
                        ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int, ctypes.c_int, ctypes.c_int,
                        ctypes.c_int]
    return encoder


def encode_tma_descriptor(record, out_address: int, what: str) -> None:
    """Encode the descriptor a builder's TmaRecord describes into the 128 bytes at ``out_address`` (64-byte aligned
    host memory)."""
    rank = int(record.rank)
    dims = (ctypes.c_uint64 * rank)(*record.dims[:rank])
    strides = (ctypes.c_uint64 * max(rank - 1, 1))(*record.strides[1:rank])
    box = (ctypes.c_uint32 * rank)(*record.box[:rank])
    element_strides = (ctypes.c_uint32 * rank)(*record.element_strides[:rank])
    err = _tensor_map_encoder()(out_address, record.data_type, rank, record.address, dims, strides, box,
                                element_strides, record.interleave, record.swizzle, record.l2_promotion,
                                record.oob_fill)
    if err:
        check((_driver().CUresult(err),), f"cuTensorMapEncodeTiled(rank {rank}, dims {list(record.dims[:rank])}, byte "
                                          f"strides {list(record.strides[1:rank])}, box {list(record.box[:rank])}, "
                                          f"address {record.address:#x})", what)


@functools.cache
def _im2col_encoder():
    """libcuda's cuTensorMapEncodeIm2col through ctypes, like the tiled encoder."""
    encoder = ctypes.CDLL("libcuda.so.1").cuTensorMapEncodeIm2col
    encoder.restype = ctypes.c_int
    encoder.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_uint32, ctypes.c_void_p, ctypes.c_void_p,
                        ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_uint32, ctypes.c_uint32,
                        ctypes.c_void_p, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_int]
    return encoder


def encode_im2col_descriptor(capture, out_address: int, what: str) -> None:
    """Encode the im2col descriptor an SM90 conv builder captured (``kinds.conv2d_sm90.probe.Im2colCapture``: the
    arguments CUTLASS's make_im2col_tma_copy_desc computed) into the 128 bytes at ``out_address`` (64-byte aligned)."""
    rank = int(capture.rank)
    spatial = rank - 2
    dims = (ctypes.c_uint64 * rank)(*capture.dims[:rank])
    strides = (ctypes.c_uint64 * (rank - 1))(*capture.strides[:rank - 1])
    lower = (ctypes.c_int * spatial)(*capture.lower[:spatial])
    upper = (ctypes.c_int * spatial)(*capture.upper[:spatial])
    element_strides = (ctypes.c_uint32 * rank)(*capture.elem_strides[:rank])
    err = _im2col_encoder()(out_address, capture.data_type, rank, capture.address, dims, strides, lower, upper,
                            capture.range_c, capture.range_whdn, element_strides, 0, capture.swizzle,
                            capture.l2_promotion, capture.oob_fill)
    if err:
        check((_driver().CUresult(err),), f"cuTensorMapEncodeIm2col(rank {rank}, dims {list(capture.dims[:rank])}, "
                                          f"byte strides {list(capture.strides[:rank - 1])}, corners "
                                          f"{list(capture.lower[:spatial])}/{list(capture.upper[:spatial])}, "
                                          f"{capture.range_c} channels x {capture.range_whdn} pixels, address "
                                          f"{capture.address:#x})", what)
