"""Load compiled operations on a device and launch them with Params built on the device.

Every kind's builder (``<name>_build``, one thread) turns the kind's ABI struct into CUTLASS's own ``Params`` and a
``LaunchInfo``. Building costs a launch and a blocking read-back, so Params are cached per loaded operation, keyed
by the ABI struct without its device addresses: a new Arguments object for a problem the operation has already seen
copies the cached bytes and patches the addresses in place, with no builder launch and no synchronization.

Where the addresses sit inside Params is learnt, never mirrored: on a miss the builder runs twice, once with the
real addresses and once with each address moved by its own distinct offset, and every 8-byte word that moved by
exactly one of those offsets is that address plus a constant. Params in which anything else changed are not
cached (that problem is built every time).
"""
from __future__ import annotations

import collections
import ctypes
import os
import struct
import threading
from dataclasses import dataclass

from ..emit.abi import MAX_TMA_RECORDS, TMA_IM2COL, TMA_TILED, LaunchInfo, TmaRecord
from ..errors import ArgumentError, CudaError
from . import driver
from .im2col import Im2colCapture

MAX_PARAMS_BYTES = 4096  # pycutlass_detail::kMaxParamsBytes
_STATIC_SHARED_MEMORY_LIMIT = 48 * 1024
_PARAMS_CACHE_ENTRIES = 1024
_MASK64 = (1 << 64) - 1
# A build slot: LaunchInfo, then Params at a 256-byte aligned offset (they are constructed in place there), then
# the records of the TMA descriptors inside Params (kinds whose kernels use TMA).
_PARAMS_OFFSET = 256
_SLOT_BYTES = _PARAMS_OFFSET + MAX_PARAMS_BYTES + MAX_TMA_RECORDS * ctypes.sizeof(TmaRecord)
_TMA_BYTES = 128


GRID_LIMITS = (2**31 - 1, 65535, 65535)  # CUDA's gridDim.x, y, z


def check_grid(grid, name: str) -> None:
    """A launch grid CUDA accepts. The Sm80 family puts N tiles in y and batches or split-K slices in z, so a large
    batched problem can ask for more than 65535 there: refuse it before the launch, as CUTLASS's can_implement does."""
    if any(not 0 <= extent <= limit for extent, limit in zip(grid, GRID_LIMITS)):  # int32 words: < 0 overflowed
        raise ArgumentError(f"{name}: the problem needs a launch grid of {tuple(grid)} thread blocks; CUDA allows at "
                            f"most {GRID_LIMITS[0]} x {GRID_LIMITS[1]} x {GRID_LIMITS[2]}. Split the batch across "
                            f"calls, use fewer split-K slices, or a tile (or swizzle) with fewer blocks along y")


def _probe_offset(index: int) -> int:
    """How far the probe build moves address ``index``: distinct, and 64 KiB-aligned like any vector access."""
    return (index + 1) << 36


class _Readback(ctypes.Structure):
    _pack_ = 1
    _fields_ = [("info", LaunchInfo), ("gap", ctypes.c_byte * (_PARAMS_OFFSET - ctypes.sizeof(LaunchInfo))),
                ("params", ctypes.c_byte * MAX_PARAMS_BYTES), ("records", TmaRecord * MAX_TMA_RECORDS)]


@dataclass(frozen=True)
class _ParamsTemplate:
    info: tuple  # (grid, block, shared memory bytes, semaphore count, workspace bytes, its bytes to zero)
    params: bytes
    patches: tuple  # (byte offset, address index, constant)


class LoadedOperation:
    """An operation's functions in a module loaded on one device, scratch memory for builds, and cached Params."""

    def __init__(self, device, operation, compiled):
        self.device = device
        self.name = operation.name
        module = device.modules.get(compiled.sha256)
        if module is None:
            module = device.modules[compiled.sha256] = driver.load_module(compiled.binary, operation.name)
        self.module = module
        self.kernel = driver.get_function(module, compiled.kernel_symbol)
        self.builder = driver.get_function(module, compiled.builder_symbol)
        self.dynamic_smem_opt_in = _STATIC_SHARED_MEMORY_LIMIT
        self.lock = threading.Lock()
        # Two build slots (real and probe), each LaunchInfo then Params: one copy brings everything back.
        self.scratch = driver.allocate_persistent(2 * _SLOT_BYTES, self.name)
        self._functions: dict[str, object] = {}
        self._function_smem: dict[str, int] = {}  # the dynamic shared memory each of them may use
        self._globals: dict[str, int] = {}
        self._params: collections.OrderedDict = collections.OrderedDict()
        self.verifying = self._verify = os.environ.get("PYCUTLASS_VERIFY_PARAMS") == "1"  # tests: build and compare
        self.builder_launches = 0  # for tests and benchmarks: how often a builder ran
        self.params_reused = 0  # and how often cached Params served a new problem

    # --- module facts a kind's launch planning may ask for -----------------------------------------------------
    def function(self, symbol: str, shared_memory_bytes: int = 0):
        """Another kernel of the module, allowed ``shared_memory_bytes`` of dynamic shared memory (set once)."""
        found = self._functions.get(symbol)
        if found is None:
            found = self._functions[symbol] = driver.get_function(self.module, symbol)
        if shared_memory_bytes > self._function_smem.get(symbol, _STATIC_SHARED_MEMORY_LIMIT):
            driver.set_dynamic_shared_memory(found, shared_memory_bytes, f"{self.name} ({symbol})")
            self._function_smem[symbol] = shared_memory_bytes
        return found

    def global_int(self, symbol: str, stream: int) -> int:
        """An ``extern "C" __device__ const int`` the emitted code exports (e.g. a kernel's shared memory)."""
        found = self._globals.get(symbol)
        if found is None:
            cuda = driver._driver()
            address, size = driver.check(cuda.cuModuleGetGlobal(self.module, symbol.encode()),
                                         f"cuModuleGetGlobal({symbol})", self.name)
            if int(size) != 4:
                raise CudaError(f"{symbol} is {int(size)} bytes, expected an int", operation=self.name)
            holder = ctypes.c_int32()
            driver.memcpy_dtoh(ctypes.addressof(holder), int(address), 4, stream)
            driver.synchronize_stream(stream, self.name)
            found = self._globals[symbol] = int(holder.value)
        return found

    def occupancy(self, block_threads: int, shared_memory_bytes: int) -> int:
        self.ensure_shared_memory(shared_memory_bytes)
        return driver.occupancy(self.kernel, block_threads, shared_memory_bytes, self.name)

    def ensure_shared_memory(self, nbytes: int) -> None:
        if nbytes > self.dynamic_smem_opt_in:
            driver.set_dynamic_shared_memory(self.kernel, nbytes, self.name)
            self.dynamic_smem_opt_in = nbytes

    # --- Params -----------------------------------------------------------------------------------------------
    def params_for(self, abi_struct, stream: int) -> tuple[tuple, ctypes.Array]:
        """CUTLASS Params for ``abi_struct`` and its launch shape: from the cache when this problem was seen."""
        fields = type(abi_struct)._pointers_
        addresses = [getattr(abi_struct, f) for f in fields]
        key = _shape_key(abi_struct, addresses)
        template = self._params.get(key)
        if template is not None:
            self.params_reused += 1
            if not self._verify:
                return template.info, _patched(template, addresses)
        with self.lock:
            if key not in self._params or self._verify:
                info, params, template = self._build_and_probe(abi_struct, fields, addresses, stream)
                if self._verify and self._params.get(key) is not None:
                    cached = self._params[key]
                    patched = bytes(_patched(cached, addresses))
                    if cached.info != info or patched != bytes(params):
                        differ = [i for i in range(len(patched)) if patched[i] != bytes(params)[i]]
                        raise CudaError(f"{self.name}: patched Params differ from freshly built ones at bytes "
                                        f"{differ[:16]} (launch {cached.info} vs {info})", operation=self.name)
                self._params[key] = template
                while len(self._params) > _PARAMS_CACHE_ENTRIES:
                    self._params.popitem(last=False)
                return info, params
            template = self._params[key]
        if template is None:  # Params that cannot be patched: build this one
            return self.build(abi_struct, stream)
        return template.info, _patched(template, addresses)

    def check_patched(self, abi_struct, launch: "PreparedLaunch", stream: int) -> None:
        """Build Params for ``abi_struct`` and compare them with a patched launch's (PYCUTLASS_VERIFY_PARAMS)."""
        info, built = self.build(abi_struct, stream)
        if info != (launch.grid, launch.block, launch.shared_memory_bytes, launch.semaphore_count,
                    launch.workspace_bytes, launch.workspace_zero_bytes) or \
                bytes(built) != bytes(launch.params):
            raise CudaError(f"{self.name}: patched Params differ from freshly built ones", operation=self.name)

    def cached_template(self, abi_struct):
        """The cached Params template for ``abi_struct``'s problem (None if there is none or it cannot be patched):
        kinds that memoize a seen problem keep it and patch it directly (``patched``)."""
        fields = type(abi_struct)._pointers_
        return self._params.get(_shape_key(abi_struct, [getattr(abi_struct, f) for f in fields]))

    def build(self, abi_struct, stream: int) -> tuple[tuple, ctypes.Array]:
        """Run the builder once on ``abi_struct``; blocks until Params are back."""
        with self.lock:
            self._launch_builder(abi_struct, 0, stream)
            readback = _Readback()
            driver.memcpy_dtoh(ctypes.addressof(readback), self.scratch, _SLOT_BYTES, stream)
            driver.synchronize_stream(stream, self.name + " builder")
        return self._check(readback)

    def _build_and_probe(self, abi_struct, fields, addresses, stream):
        probe = type(abi_struct).from_buffer_copy(abi_struct)
        for index, (field, address) in enumerate(zip(fields, addresses)):
            if address:  # null stays null: the builder may branch on it (and the key records it)
                setattr(probe, field, (address + _probe_offset(index)) & _MASK64)
        self._launch_builder(abi_struct, 0, stream)
        self._launch_builder(probe, 1, stream)
        both = (_Readback * 2)()
        driver.memcpy_dtoh(ctypes.addressof(both), self.scratch, 2 * _SLOT_BYTES, stream)
        driver.synchronize_stream(stream, self.name + " builder")
        info, params = self._check(both[0])
        probe_info, probe_params = self._check(both[1])
        template = None
        if probe_info == info:
            patches = _find_patches(bytes(params), bytes(probe_params), addresses)
            if patches is not None:
                template = _ParamsTemplate(info, bytes(params), patches)
        return info, params, template

    def _launch_builder(self, abi_struct, slot: int, stream: int) -> None:
        self.builder_launches += 1
        info_ptr = ctypes.c_uint64(self.scratch + slot * _SLOT_BYTES)
        params_ptr = ctypes.c_uint64(self.scratch + slot * _SLOT_BYTES + _PARAMS_OFFSET)
        args = driver.pointer_array(ctypes.addressof(abi_struct), ctypes.addressof(info_ptr),
                                    ctypes.addressof(params_ptr))
        driver.launch(self.builder, (1, 1, 1), (1, 1, 1), 0, stream, ctypes.addressof(args), self.name + " builder")

    def _check(self, readback) -> tuple[tuple, ctypes.Array]:
        info = readback.info
        if info.status != 0:
            raise ArgumentError(f"{self.name}: CUTLASS rejected the arguments (cutlass::Status {info.status})")
        if not 0 < info.params_bytes <= MAX_PARAMS_BYTES:
            raise CudaError(f"{self.name}: the builder reported {info.params_bytes} Params bytes", operation=self.name)
        params = (ctypes.c_byte * info.params_bytes).from_buffer_copy(readback.params)
        if info.tma_count:
            self._encode_tma(readback, info, params)
        check_grid((info.grid_x, info.grid_y, info.grid_z), self.name)
        shape = ((info.grid_x, info.grid_y, info.grid_z), (info.block_x, info.block_y, info.block_z),
                 info.shared_memory_bytes, info.semaphore_count, int(info.workspace_bytes),
                 int(info.workspace_bytes) if info.workspace_zero_bytes < 0 else int(info.workspace_zero_bytes))
        return shape, params

    def _encode_tma(self, readback, info, params) -> None:
        """TMA descriptors cannot be encoded on the device: encode what the builder recorded, in place."""
        if not 0 < info.tma_count <= MAX_TMA_RECORDS:
            raise CudaError(f"{self.name}: the builder reported {info.tma_count} TMA descriptors", operation=self.name)
        staging = (ctypes.c_byte * (2 * _TMA_BYTES))()  # the encoder writes to 64-byte aligned memory
        aligned = (ctypes.addressof(staging) + 63) & ~63
        for record in readback.records[:info.tma_count]:
            if record.status or not 0 <= record.offset <= info.params_bytes - _TMA_BYTES or record.offset % 64:
                raise CudaError(f"{self.name}: TMA record at offset {record.offset} is not encodable (status "
                                f"{record.status})", operation=self.name)
            if record.mode == TMA_IM2COL:
                # SM90 conv: the descriptor's bytes hold the im2col encode arguments CUTLASS computed.
                raw = ctypes.string_at(ctypes.addressof(params) + record.offset, _TMA_BYTES)  # c_byte slices are signed
                try:
                    capture = Im2colCapture(raw)
                except ValueError as exc:
                    raise CudaError(f"{self.name}: im2col TMA record at offset {record.offset}: {exc}",
                                    operation=self.name) from None
                driver.encode_im2col_descriptor(capture, aligned, self.name)
            elif record.mode == TMA_TILED:
                driver.encode_tma_descriptor(record, aligned, self.name)
            else:
                raise CudaError(f"{self.name}: TMA record at offset {record.offset} has mode {record.mode}",
                                operation=self.name)
            ctypes.memmove(ctypes.addressof(params) + record.offset, aligned, _TMA_BYTES)


def _shape_key(abi_struct, addresses) -> bytes:
    """The ABI struct without its addresses, plus which addresses are null: what the Params depend on."""
    raw = bytearray(bytes(abi_struct))
    for offset in type(abi_struct).pointer_offsets():
        raw[offset:offset + 8] = b"\0" * 8
    raw.extend(bytes(1 if a == 0 else 0 for a in addresses))
    return bytes(raw)


def _find_patches(params: bytes, probe: bytes, addresses) -> tuple | None:
    """Words that moved by exactly one address's probe offset; None if anything else changed."""
    if len(params) != len(probe):
        return None
    patches = []
    moved = {_probe_offset(i): i for i, a in enumerate(addresses) if a}
    for offset in range(0, len(params) - len(params) % 8, 8):
        word, probe_word = params[offset:offset + 8], probe[offset:offset + 8]
        if word == probe_word:
            continue
        value = struct.unpack("<Q", word)[0]
        index = moved.get((struct.unpack("<Q", probe_word)[0] - value) & _MASK64)
        if index is None:
            return None
        patches.append((offset, index, (value - addresses[index]) & _MASK64))
    tail = len(params) - len(params) % 8
    if params[tail:] != probe[tail:]:
        return None
    return tuple(patches)


def patched_launch(loaded_op: LoadedOperation, template: _ParamsTemplate, addresses) -> "PreparedLaunch":
    """A launch from a cached template and new addresses (in the ABI struct's ``_pointers_`` order)."""
    loaded_op.params_reused += 1
    grid, block, smem, semaphores, workspace, zeroed = template.info
    return PreparedLaunch(loaded_op.kernel, grid, block, smem, _patched(template, addresses), semaphores,
                          loaded_op.name, workspace, zeroed)


def _patched(template: _ParamsTemplate, addresses) -> ctypes.Array:
    params = (ctypes.c_byte * len(template.params)).from_buffer_copy(template.params)
    for offset, index, constant in template.patches:
        struct.pack_into("<Q", params, offset, (addresses[index] + constant) & _MASK64)
    return params


def loaded(operation, device, session) -> LoadedOperation:
    """``operation`` loaded on ``device`` (a DeviceState), compiled for the device's target if needed."""
    from ..compiler.manager import Compiler

    compiler = Compiler.of(session)
    backend = compiler.backend
    found = device.by_name.get((operation.name, backend))  # the fast path of every new Arguments object
    if found is not None:
        return found
    compiled = compiler.compiled_for(operation, device.target)
    key = (compiled.sha256, operation.name)
    with device.lock:
        found = device.operations.get(key)
        if found is None:
            found = device.operations[key] = LoadedOperation(device, operation, compiled)
        device.by_name[(operation.name, backend)] = found
    return found


def _launch_nothing(*_):
    return (driver.kernel_launcher()[1],)


@dataclass
class PreparedLaunch:
    """Everything a launch needs, computed once per Arguments: run() then costs one cuLaunchKernelEx."""

    function: object
    grid: tuple[int, int, int]
    block: tuple[int, int, int]
    shared_memory_bytes: int
    params: ctypes.Array
    semaphore_count: int
    name: str
    workspace_bytes: int = 0
    workspace_zero_bytes: int = 0  # the workspace's last bytes, which must be zero at every launch

    def __post_init__(self):
        self.param_pointers = driver.pointer_array(ctypes.addressof(self.params))
        self.param_address = ctypes.addressof(self.param_pointers)
        self.empty = 0 in self.grid  # CUDA rejects empty grids; an empty problem has nothing to write
        # run()'s hot path: one call with the fixed arguments bound here (no per-call import or tuple building);
        # an empty grid binds a launcher that does nothing, so launch() needs no test for it.
        self._cu_launch, self._success = driver.kernel_launcher()
        if self.empty:
            self._cu_launch = _launch_nothing
        self.programmatic = False
        # (handle, launch config) of the last stream: one attribute, so a thread never pairs one stream's handle
        # with another's config
        self._bound_stream = (None, None)

    def use_programmatic_dependent_launch(self) -> None:
        """Launch with programmatic stream serialization (PDL) in the config: the kernel's blocks may
        start while the stream's previous kernel drains. Only for kernels that wait (griddepcontrol.wait) before
        their first global access: CUTLASS 3.x GEMM kernels built with CUTLASS_ENABLE_GDC_FOR_SM90."""
        if self.empty or self.programmatic:
            return
        self.programmatic = True
        self._bound_stream = (None, None)  # the next launch makes a config with the attribute

    def launch(self, stream: int) -> None:
        bound = self._bound_stream
        if stream != bound[0]:
            bound = self._bound_stream = (stream, driver.launch_config(self.grid, self.block, self.shared_memory_bytes,
                                                                       stream, self.programmatic))
        (err,) = self._cu_launch(bound[1], self.function, self.param_address, 0)
        if err != self._success:  # the fast path stays a single call; errors get the full treatment
            driver.check((err,), "cuLaunchKernelEx", self.name)


def prepare(loaded_op: LoadedOperation, abi_struct, stream: int) -> PreparedLaunch:
    """Params for ``abi_struct`` (cached or built) and the kernel's launch shape."""
    (grid, block, smem, semaphores, workspace, zeroed), params = loaded_op.params_for(abi_struct, stream)
    loaded_op.ensure_shared_memory(smem)
    return PreparedLaunch(loaded_op.kernel, grid, block, smem, params, semaphores, loaded_op.name, workspace, zeroed)


class PatchedLauncher:
    """A seen problem ready to launch again on other addresses: the cached Params live in one buffer whose address
    words are rewritten in place (under a lock: the launch copies the parameters before it returns), then the
    buffer's PreparedLaunch. For callers that launch the same problem many times on new tensors
    (``pycutlass.torch``)."""

    def __init__(self, loaded_op: LoadedOperation, template: _ParamsTemplate, programmatic: bool = False):
        grid, block, smem, *_ = template.info
        self.name = loaded_op.name
        self.device = loaded_op.device
        self.params = (ctypes.c_byte * len(template.params)).from_buffer_copy(template.params)
        self._launch = PreparedLaunch(loaded_op.kernel, grid, block, smem, self.params, 0, loaded_op.name)
        if programmatic:  # PreparedLaunch.use_programmatic_dependent_launch says which kernels may
            self._launch.use_programmatic_dependent_launch()
        self.empty = self._launch.empty
        self._pointers_address = self._launch.param_address
        self.patches = template.patches
        self._lock = threading.Lock()
        loaded_op.ensure_shared_memory(smem)

    @property
    def programmatic(self) -> bool:
        return self._launch.programmatic

    def launch(self, addresses, stream: int) -> None:
        """``addresses`` in the ABI struct's ``_pointers_`` order."""
        if self.empty:
            return
        with self._lock:
            params = self.params
            for offset, index, constant in self.patches:
                struct.pack_into("<Q", params, offset, (addresses[index] + constant) & _MASK64)
            self.device.make_current()
            self._launch.launch(stream)


class BoundLaunch:
    """A call signature bound to a loaded kernel: each new call's addresses are patched into the cached Params and
    launched (``PatchedLauncher``), with no Arguments built. ``roles`` says which of the caller's operands each
    address field of the kind's ABI struct holds (-1: null); ``checks`` the access width each operand must keep."""

    __slots__ = ("launcher", "roles", "checks", "loaded_op")

    def __init__(self, loaded_op, template, roles, vector_bytes, programmatic=False):
        self.loaded_op = loaded_op
        self.launcher = PatchedLauncher(loaded_op, template, programmatic=programmatic)
        self.roles = roles
        self.checks = tuple(sorted({(role, vector_bytes[role]) for role in roles if role >= 0}))

    def launch(self, tensors, stream: int) -> bool:
        """``launch_pointers`` with the operands' addresses read from torch tensors (None: absent)."""
        return self.launch_pointers([0 if t is None else t.data_ptr() for t in tensors], stream)

    def launch_pointers(self, pointers, stream: int) -> bool:
        """Launch on these operand addresses (in the binding's operand order); False, launching nothing, when one
        is not aligned to its kernel's accesses (an unaligned view: the caller picks another kernel)."""
        for role, vector_bytes in self.checks:
            if pointers[role] % vector_bytes:
                return False
        self.launcher.launch([0 if role < 0 else pointers[role] for role in self.roles], stream)
        return True


def bind_launch(arguments, addresses, vector_bytes) -> BoundLaunch | None:
    """Bind the call ``arguments`` ran (a kind's Arguments) to its operands' ``addresses`` (0: absent; the output
    last): which operand each address field of the ABI struct came from. None when that is not clear-cut (copies,
    workspaces, aliasing operands, Params that cannot be patched): such calls build Arguments every time."""
    loaded_op, abi = getattr(arguments, "_loaded_op", None), getattr(arguments, "_abi_struct", None)
    if loaded_op is None or abi is None:
        return None
    template = loaded_op.cached_template(abi)
    if template is None:
        return None
    roles = []
    last = len(addresses) - 1
    for name in type(abi)._pointers_:
        address = getattr(abi, name)
        if not address:
            roles.append(-1)
            continue
        owners = {i for i, a in enumerate(addresses) if a and a == address}
        if len(owners) != 1:
            if len(owners) > 1 and last in owners and name in ("ptr_C", "ptr_D"):
                owners = {last}  # C absent reads as D: the output
            else:
                return None
        roles.append(owners.pop())
    return BoundLaunch(loaded_op, template, tuple(roles), vector_bytes, getattr(arguments, "_pdl", False))
