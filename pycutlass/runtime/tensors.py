"""Tensor adapters: torch, numpy, cupy, ``__cuda_array_interface__`` and DLPack objects -> a device view.

Device tensors are used in place (their strides give leading dimensions and batch strides). Host tensors
(numpy, CPU torch) must be dense; they are copied to the device when the arguments are built and, for
outputs, copied back by ``arguments.sync()``. Validation that needs no GPU (dtype, shape, strides) happens
in ``describe()``, before any allocation.
"""
from __future__ import annotations

import math
import sys
from dataclasses import dataclass, field

import numpy as np

from ..description.types import DataType
from ..errors import ArgumentError

_NUMPY_TO_TYPE = {np.dtype(np.float64): DataType.float64, np.dtype(np.float32): DataType.float32,
                  np.dtype(np.float16): DataType.float16, np.dtype(np.int8): DataType.int8,
                  np.dtype(np.int32): DataType.int32}
_TYPESTR_TO_TYPE = {"<f8": DataType.float64, "<f4": DataType.float32, "<f2": DataType.float16,
                    "|i1": DataType.int8, "<i1": DataType.int8, "<i4": DataType.int32}
_TORCH_NAMES = {"float64": DataType.float64, "float32": DataType.float32, "float16": DataType.float16,
                "bfloat16": DataType.bfloat16, "int8": DataType.int8, "int32": DataType.int32,
                "float8_e4m3fn": DataType.float8_e4m3, "float8_e5m2": DataType.float8_e5m2}


def storage_type(element: DataType) -> DataType:
    """tf32 operands are float32 in memory."""
    return DataType.float32 if element is DataType.tfloat32 else element


@dataclass
class TensorInfo:
    """What the kernel needs to know about one operand, found without touching the GPU."""

    name: str
    kind: str  # "device" or "host"
    element: DataType
    shape: tuple[int, ...]
    strides: tuple[int, ...]  # in elements
    source: object = field(repr=False, default=None)
    device_address: int = 0  # for device tensors
    host_array: np.ndarray | None = field(repr=False, default=None)  # for host tensors (dense)
    torch_cpu: object = field(repr=False, default=None)  # a CPU torch tensor to copy results back into
    device_index: int | None = None

    @property
    def numel(self) -> int:
        return math.prod(self.shape)

    @property
    def itemsize(self) -> int:
        return self.element.bits // 8

    @property
    def is_contiguous(self) -> bool:
        """Row-major packed (C order), ignoring dimensions of size 1."""
        expected = 1
        for n, s in zip(reversed(self.shape), reversed(self.strides)):
            if n > 1 and s != expected:
                return False
            expected *= n
        return True

    def span_bytes(self) -> int:
        """Bytes from the first to one past the last element addressed (strides may be 0 or permuted)."""
        if any(s == 0 for s in self.shape):
            return 0
        last = sum((n - 1) * abs(st) for n, st in zip(self.shape, self.strides))
        return (last + 1) * self.itemsize


def _is_torch(obj) -> bool:
    return type(obj).__module__.startswith("torch") and hasattr(obj, "data_ptr")


def describe(obj, name: str) -> TensorInfo:
    """Classify ``obj`` and read dtype, shape and strides. Raises ArgumentError for anything unusable."""
    if obj is None:
        raise ArgumentError(f"{name}: a tensor is required, got None")
    if _is_torch(obj):  # first: the common case (grouped Arguments describe hundreds of tensors)
        dtype_name = str(obj.dtype)[6:]  # "torch.float16" -> "float16"
        element = _TORCH_NAMES.get(dtype_name)
        if element is None:
            raise ArgumentError(f"{name}: torch dtype {obj.dtype} is not supported; use one of "
                                f"{sorted(_TORCH_NAMES)}")
        if obj.layout is not sys.modules["torch"].strided:
            raise ArgumentError(f"{name}: a {obj.layout} torch tensor has no strided storage to read; pass a dense "
                                f"tensor (.to_dense())")
        if obj.is_neg():  # the memory holds the negated values (a lazily negated view, such as z.conj().imag)
            raise ArgumentError(f"{name}: the tensor has torch's negative bit set, so its memory holds the negated "
                                f"values; pass tensor.resolve_neg()")
        shape, strides = tuple(obj.shape), obj.stride()
        index = obj.get_device()  # -1 off CUDA
        if index >= 0:
            return TensorInfo(name, "device", element, shape, strides, obj, device_address=obj.data_ptr(),
                              device_index=index)
        if obj.device.type != "cpu":
            raise ArgumentError(f"{name}: torch tensors must be on a CUDA device or the CPU, got {obj.device}")
        host = obj.detach()
        if dtype_name == "bfloat16":
            array = host.view(dtype=__import__("torch").int16).numpy()
        elif element.is_fp8:
            array = host.view(dtype=__import__("torch").int8).numpy()
        else:
            array = host.numpy()
        info = _host_info(array, name, element)
        info.torch_cpu = obj
        return info
    if isinstance(obj, DevicePointerTensor):
        return describe_pointer(obj, name)
    if is_device_pointer(obj):
        raise ArgumentError(f"{name}: a raw CUdeviceptr carries no shape; it is accepted only for the A, B, C, D "
                            f"operands of GEMM, Conv2d and Reduction Arguments (packed, sized from the problem)")
    if isinstance(obj, np.ndarray):
        element = _NUMPY_TO_TYPE.get(obj.dtype)
        if element is None:  # ml_dtypes
            element = {"bfloat16": DataType.bfloat16, "float8_e4m3fn": DataType.float8_e4m3,
                       "float8_e5m2": DataType.float8_e5m2}.get(obj.dtype.name)
        if element is None:
            raise ArgumentError(f"{name}: numpy dtype {obj.dtype} is not supported; use float64, float32, "
                                f"float16, bfloat16 (ml_dtypes), int8 or int32")
        return _host_info(obj, name, element)
    cai = getattr(obj, "__cuda_array_interface__", None)
    if cai is not None:
        element = _TYPESTR_TO_TYPE.get(cai["typestr"])
        if element is None:
            raise ArgumentError(f"{name}: element type {cai['typestr']!r} is not supported")
        shape = tuple(int(s) for s in cai["shape"])
        itemsize = element.bits // 8
        if cai.get("strides") is None:
            strides = _contiguous_strides(shape)
        else:
            byte_strides = tuple(int(s) for s in cai["strides"])
            if any(s % itemsize for s in byte_strides):
                raise ArgumentError(f"{name}: strides {byte_strides} bytes are not multiples of the element size")
            strides = tuple(s // itemsize for s in byte_strides)
        address = int(cai["data"][0])
        return TensorInfo(name, "device", element, shape, strides, obj, device_address=address)
    if hasattr(obj, "__dlpack__"):
        try:
            import torch

            return describe(torch.utils.dlpack.from_dlpack(obj), name)
        except ImportError:
            pass
        try:
            import cupy

            return describe(cupy.from_dlpack(obj), name)
        except ImportError:
            pass
        raise ArgumentError(f"{name}: a DLPack tensor needs torch or cupy installed to be read")
    raise ArgumentError(f"{name}: expected a torch tensor, numpy array, cupy array or an object with "
                        f"__cuda_array_interface__ or __dlpack__, got {type(obj).__name__}")


_PLAIN_TORCH_TYPES = frozenset({("torch", "Tensor"), ("torch.nn.parameter", "Parameter")})


def torch_signature(obj):
    """(dtype, shape, strides, device) of a plain CUDA torch tensor or parameter, read cheaply; None for anything
    else (other subclasses may override what the signature reads)."""
    kind = type(obj)
    if (kind.__module__, kind.__name__) not in _PLAIN_TORCH_TYPES or not obj.is_cuda or obj.is_neg():
        return None  # a negated view must reach describe(), which refuses it
    return obj.dtype, obj.shape, obj.stride(), obj.get_device()


def _contiguous_strides(shape) -> tuple[int, ...]:
    strides, step = [], 1
    for n in reversed(shape):
        strides.append(step)
        step *= max(int(n), 1)
    return tuple(reversed(strides))


def _is_dense(array: np.ndarray) -> bool:
    """True when the array fills one block of memory in some axis order (e.g. a transposed contiguous array)."""
    if array.size <= 1:
        return True
    dims = sorted((abs(st), n) for n, st in zip(array.shape, array.strides) if n > 1)
    expected = array.itemsize
    for stride, n in dims:
        if stride != expected:
            return False
        expected *= n
    return all(st >= 0 for st in array.strides)


def _host_info(array: np.ndarray, name: str, element: DataType) -> TensorInfo:
    # The block is copied as is, so the device copy keeps the array's strides.
    if not _is_dense(array):
        raise ArgumentError(f"{name}: host arrays must be dense (a contiguous array, possibly transposed) to be "
                            f"copied to the GPU (shape {array.shape}, strides {array.strides}); pass a contiguous "
                            f"array or a device tensor")
    itemsize = array.itemsize
    strides = tuple(s // itemsize for s in array.strides)
    if array.size <= 1:
        strides = _contiguous_strides(array.shape)
    return TensorInfo(name, "host", element, tuple(array.shape), strides, array, host_array=array)


class DeviceTensors:
    """Owns the device copies of host tensors for one Arguments object on one device and copies outputs back."""

    def __init__(self, device, stream: int):
        self.device = device  # runtime.device.DeviceState
        self.stream = stream
        self.buffers = []  # keep-alive for every buffer the kernel sees
        self._host_sources = []  # host arrays an async upload still reads
        self._copy_back: list[tuple[TensorInfo, object]] = []

    def address(self, info: TensorInfo, is_output: bool = False) -> int:
        """The device address of ``info``'s first element, copying host tensors in."""
        if info.kind == "device":
            return info.device_address
        from .memory import device_buffer, device_buffer_from_host

        array = info.host_array
        if array.size == 0:
            buffer = device_buffer(self.device, 1, self.stream)
        else:
            buffer = device_buffer_from_host(self.device, array.ctypes.data, array.nbytes, self.stream)
        self.buffers.append(buffer)
        if is_output:
            self._copy_back.append((info, buffer))
        return int(buffer.ptr)

    def allocate(self, nbytes: int) -> int:
        from .memory import device_buffer

        buffer = device_buffer(self.device, nbytes, self.stream)
        self.buffers.append(buffer)
        return int(buffer.ptr)

    def zeros(self, nbytes: int) -> int:
        """A zero-filled allocation, ordered on the stream."""
        from . import driver

        address = self.allocate(nbytes)
        driver.memset_d8(address, 0, max(int(nbytes), 1), self.stream)
        return address

    def upload(self, data: bytes | np.ndarray) -> int:
        """A device copy of small host data we own (pointer arrays, problem sizes), kept alive with the arguments.

        Ordered on the stream with no host synchronization (RMM's copying constructor synchronizes the default
        stream); the host array stays referenced until these arguments go, so the copy always reads it intact.
        """
        from . import driver

        array = np.frombuffer(data, dtype=np.uint8) if isinstance(data, (bytes, bytearray)) else \
            np.ascontiguousarray(data)
        self._host_sources.append(array)
        address = self.allocate(array.nbytes)
        if array.nbytes:
            driver.memcpy_htod(address, array.ctypes.data, array.nbytes, self.stream)
        return address

    def copy_back(self) -> None:
        """After the stream is synchronized: copy host-tensor outputs back into the user's arrays."""
        from . import driver

        for info, buffer in self._copy_back:
            array = info.host_array
            if array.size:
                driver.memcpy_dtoh(array.ctypes.data, int(buffer.ptr), array.nbytes, self.stream)
        if self._copy_back:
            driver.synchronize_stream(self.stream)
        for info, _ in self._copy_back:
            if info.torch_cpu is not None and info.host_array.ctypes.data != info.torch_cpu.data_ptr():
                import torch

                info.torch_cpu.copy_(torch.from_numpy(info.host_array))


def tensors_device(infos, explicit: int | None, what: str) -> int | None:
    """The one device all device tensors live on (or ``explicit``), None when every tensor is on the host.

    torch tensors say their device; other device memory is asked of the driver. Mixed devices are an error.
    """
    from . import driver

    found: dict[int, str] = {}
    for info in infos:
        if info.kind != "device" or not info.numel:
            continue
        ordinal = info.device_index
        if ordinal is None and info.device_address:
            ordinal = driver.pointer_device_ordinal(info.device_address)
            if ordinal is None:
                raise ArgumentError(f"{info.name}: address {info.device_address:#x} is not device memory known to "
                                    f"the CUDA driver")
            info.device_index = ordinal
        if isinstance(info.source, DevicePointerTensor):
            _check_pointer_extent(info)
        if ordinal is not None:
            found.setdefault(ordinal, info.name)
    if explicit is not None:
        for ordinal, name in found.items():
            if ordinal != explicit:
                raise ArgumentError(f"{what}: {name} is on cuda:{ordinal} but device={explicit} was asked for")
        return explicit
    if len(found) > 1:
        listed = ", ".join(f"{name} on cuda:{ordinal}" for ordinal, name in sorted(found.items()))
        raise ArgumentError(f"{what}: the tensors are on different devices ({listed}); put them on one device")
    return next(iter(found), None)


# --- PyCUTLASS compatibility: raw device pointers and reordered copies ----------------------------------------------

def is_device_pointer(obj) -> bool:
    """True for ``cuda.bindings.driver.CUdeviceptr`` (or the older ``cuda.cuda.CUdeviceptr``), which PyCUTLASS 2.11
    accepted for packed operands. Plain ints are not pointers here (an int is too easily a size or a handle)."""
    kind = type(obj)
    return kind.__name__ == "CUdeviceptr" and kind.__module__.split(".")[0] == "cuda"


class PartialsAddress(int):
    """The device address of a parallel split-K workspace (``GemmArguments.ptr_D``, ``Conv2dArguments.ptr_D``) that
    also says which type its partial results are stored in, so a ReductionArguments given the bare address, as
    PyCUTLASS's scripts pass it, can check that it reads them as that type, and that it reads no further than the
    workspace's ``nbytes``."""

    element: DataType
    nbytes: int | None

    def __new__(cls, address: int, element: DataType, nbytes: int | None = None):
        self = super().__new__(cls, address)
        self.element = element
        self.nbytes = nbytes
        return self


class DevicePointerTensor:
    """A packed 1-D view of ``numel`` elements at a raw device address (a PyCUTLASS ``CUdeviceptr`` operand).

    The extent comes from the problem size, never from the pointer, so the address must be known to the CUDA
    driver (checked when the device is chosen) and the allocation must hold the extent (checked here when the driver
    can say how large the allocation is)."""

    _TYPESTR = {DataType.float64: "<f8", DataType.float32: "<f4", DataType.tfloat32: "<f4", DataType.float16: "<f2",
                DataType.bfloat16: "<i2", DataType.int8: "|i1", DataType.int32: "<i4"}

    def __init__(self, pointer, numel: int, element: DataType, name: str):
        address = int(pointer)
        if element not in self._TYPESTR:
            raise ArgumentError(f"{name}: CUdeviceptr operands of {element.label} elements are not supported")
        if address == 0 and numel:
            raise ArgumentError(f"{name}: a null CUdeviceptr cannot hold {numel} elements")
        self.pointer, self.address, self.numel, self.element = pointer, address, int(numel), element
        self.__cuda_array_interface__ = {"shape": (int(numel),), "typestr": self._TYPESTR[element], "strides": None,
                                         "data": (address, False), "version": 3}


def pointer_operand(obj, numel: int, element: DataType, name: str):
    """``obj`` itself, or a DevicePointerTensor of ``numel`` ``element``s if it is a CUdeviceptr."""
    if not is_device_pointer(obj):
        return obj
    return DevicePointerTensor(obj, numel, element, name)


def describe_pointer(tensor: DevicePointerTensor, name: str) -> TensorInfo:
    info = TensorInfo(name, "device", tensor.element if tensor.element is not DataType.tfloat32 else DataType.float32,
                      (tensor.numel,), (1,), tensor, device_address=tensor.address)
    return info


def gathered_copy(obj, name: str, view_shape: tuple, axis: int, index) -> object:
    """A new contiguous tensor of ``obj``'s library, device and shape: ``obj`` (contiguous, read as ``view_shape``)
    with ``axis`` gathered by ``index`` (``out[..., j, ...] = obj[..., index[j], ...]``). Used to put interleaved
    operands into the order the kernels read, as PyCUTLASS's Arguments did; the input is not modified."""
    index = np.asarray(index, dtype=np.int64)
    if _is_torch(obj):
        import torch

        source = obj.detach()
        if not source.is_contiguous():
            raise ArgumentError(f"{name}: only a contiguous tensor can be reordered")
        picked = source.reshape(view_shape).index_select(axis, torch.as_tensor(index, device=source.device))
        return picked.reshape(obj.shape).contiguous()
    if isinstance(obj, np.ndarray):
        return np.ascontiguousarray(np.take(np.ascontiguousarray(obj).reshape(view_shape), index, axis=axis)) \
            .reshape(obj.shape)
    if hasattr(obj, "__cuda_array_interface__") or hasattr(obj, "__dlpack__"):
        try:
            import cupy
        except ImportError:
            cupy = None
        if cupy is not None:
            array = cupy.asarray(obj) if hasattr(obj, "__cuda_array_interface__") else cupy.from_dlpack(obj)
            picked = cupy.take(cupy.ascontiguousarray(array).reshape(view_shape), cupy.asarray(index), axis=axis)
            return cupy.ascontiguousarray(picked).reshape(array.shape)
        if hasattr(obj, "__dlpack__"):
            try:
                import torch

                return gathered_copy(torch.utils.dlpack.from_dlpack(obj), name, view_shape, axis, index)
            except ImportError:
                pass
    raise ArgumentError(f"{name}: interleaved operands are reordered into the kernel's order inside the Arguments, "
                        f"which needs a torch, numpy or cupy tensor (got {type(obj).__name__}); reorder it yourself "
                        f"and pass reordered=True")


def _check_pointer_extent(info: TensorInfo) -> None:
    """A CUdeviceptr operand's extent (from the problem size) must lie inside its allocation."""
    from . import driver

    try:
        bindings = driver._driver()
        err, base, size = bindings.cuMemGetAddressRange(info.device_address)
    except Exception:  # noqa: BLE001 - an older binding: the ordinal check above is all we can do
        return
    if err != bindings.CUresult.CUDA_SUCCESS:
        raise ArgumentError(f"{info.name}: address {info.device_address:#x} is not device memory known to the CUDA "
                            f"driver")
    end = int(base) + int(size)
    needed = info.device_address + info.numel * info.itemsize
    if needed > end:
        raise ArgumentError(f"{info.name}: the problem size needs {info.numel} elements ({info.numel * info.itemsize} "
                            f"bytes) at {info.device_address:#x}, but its allocation ends {end - info.device_address} "
                            f"bytes after it")


def as_flat(info: TensorInfo) -> TensorInfo:
    """The same memory read as a packed 1-D tensor (the caller checked it is contiguous in the order it means)."""
    return TensorInfo(info.name, info.kind, info.element, (info.numel,), (1,), info.source,
                      device_address=info.device_address, host_array=info.host_array, torch_cpu=info.torch_cpu,
                      device_index=info.device_index)
