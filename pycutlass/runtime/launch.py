"""Load compiled operations and launch them: build Params on the device once, then launch with those bytes.

Both compiler backends produce the same cubin layout (kernel + builder per operation), so this path is shared.
"""
from __future__ import annotations

import ctypes
import threading
from dataclasses import dataclass

from ..emit.abi import LaunchInfo
from ..errors import ArgumentError, CudaError
from . import driver

MAX_PARAMS_BYTES = 4096  # pycutlass_detail::kMaxParamsBytes
_STATIC_SHARED_MEMORY_LIMIT = 48 * 1024

_modules: dict[str, object] = {}
_loaded: dict[tuple[str, str], "LoadedOperation"] = {}
_lock = threading.Lock()


class LoadedOperation:
    """An operation's kernel and builder functions in a loaded module, plus a scratch buffer for building."""

    def __init__(self, operation, compiled):
        self.name = operation.name
        module = _modules.get(compiled.sha256)
        if module is None:
            module = _modules[compiled.sha256] = driver.load_module(compiled.binary, operation.name)
        self.kernel = driver.get_function(module, compiled.kernel_symbol)
        self.builder = driver.get_function(module, compiled.builder_symbol)
        self.dynamic_smem_opt_in = _STATIC_SHARED_MEMORY_LIMIT
        self.build_lock = threading.Lock()
        # Where the builder writes Params; lives with the module, like the kernel itself.
        self.scratch_info = driver.allocate_persistent(ctypes.sizeof(LaunchInfo) + MAX_PARAMS_BYTES, self.name)
        self.scratch_params = self.scratch_info + ctypes.sizeof(LaunchInfo)

    def ensure_shared_memory(self, nbytes: int) -> None:
        if nbytes > self.dynamic_smem_opt_in:
            driver.set_dynamic_shared_memory(self.kernel, nbytes, self.name)
            self.dynamic_smem_opt_in = nbytes


def loaded(operation) -> LoadedOperation:
    from ..compiler.manager import COMPILER

    driver.ensure_context()
    compiled = COMPILER.lookup(operation)
    if compiled is None:
        compiled = COMPILER.add_module([operation])[0]
    key = (compiled.sha256, operation.name)
    found = _loaded.get(key)
    if found is None:
        with _lock:
            found = _loaded.get(key)
            if found is None:
                found = _loaded[key] = LoadedOperation(operation, compiled)
    return found


class _Readback(ctypes.Structure):
    _pack_ = 1
    _fields_ = [("info", LaunchInfo), ("params", ctypes.c_byte * MAX_PARAMS_BYTES)]


@dataclass
class PreparedLaunch:
    """Everything a launch needs, computed once per Arguments: run() then costs one cuLaunchKernel."""

    function: object
    grid: tuple[int, int, int]
    block: tuple[int, int, int]
    shared_memory_bytes: int
    params: ctypes.Array
    param_pointers: ctypes.Array
    semaphore_count: int
    name: str

    @property
    def empty(self) -> bool:
        return 0 in self.grid

    def launch(self, stream: int) -> None:
        if self.empty:  # CUDA rejects empty grids; an empty problem has nothing to write
            return
        driver.launch(self.function, self.grid, self.block, self.shared_memory_bytes, stream,
                      self.param_address, self.name)

    def __post_init__(self):
        self.param_address = ctypes.addressof(self.param_pointers)


def prepare(operation, abi_struct, stream: int) -> PreparedLaunch:
    """Run the operation's device-side Params builder on ``abi_struct`` and read back Params and grid."""
    op = loaded(operation)
    # LaunchInfo and the Params bytes sit back to back in the scratch buffer: one copy brings both.
    readback = _Readback()
    with op.build_lock:
        info_ptr = ctypes.c_uint64(op.scratch_info)
        params_ptr = ctypes.c_uint64(op.scratch_params)
        args = driver.pointer_array(ctypes.addressof(abi_struct), ctypes.addressof(info_ptr),
                                    ctypes.addressof(params_ptr))
        driver.launch(op.builder, (1, 1, 1), (1, 1, 1), 0, stream, ctypes.addressof(args), operation.name + " builder")
        driver.memcpy_dtoh(ctypes.addressof(readback), op.scratch_info, ctypes.sizeof(readback), stream)
        driver.synchronize_stream(stream, operation.name + " builder")
    info, params = readback.info, readback.params
    if info.status != 0:
        raise ArgumentError(f"{operation.name}: CUTLASS rejected the arguments (cutlass::Status {info.status})")
    if not 0 < info.params_bytes <= MAX_PARAMS_BYTES:
        raise CudaError(f"{operation.name}: the builder reported {info.params_bytes} Params bytes", operation=operation.name)
    op.ensure_shared_memory(info.shared_memory_bytes)
    pointers = driver.pointer_array(ctypes.addressof(params))
    return PreparedLaunch(op.kernel, (info.grid_x, info.grid_y, info.grid_z), (info.block_x, info.block_y, info.block_z),
                          info.shared_memory_bytes, params, pointers, info.semaphore_count, operation.name)


def launch_operation(operation, arguments) -> None:
    if arguments.operation is not operation and arguments.operation != operation:
        raise ArgumentError(f"these arguments were built for {arguments.operation.name}, not {operation.name}")
    arguments.launch()
