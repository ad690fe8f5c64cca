"""What every Arguments class shares, and the small interface through which the runtime runs every kernel kind.

A kind's Arguments class (in ``kinds/<kind>/arguments.py``):

1. validates everything in ``__init__`` without touching the GPU;
2. calls ``self._materialize()`` last. That is the first GPU step: the device is chosen from the tensors
   (``_tensor_infos()``, or ``device=``), the kind copies and allocates what it needs through ``self.tensors``
   (``_allocate()``), and Params are prepared, so the first ``run()`` only launches (and is capturable in a CUDA
   graph);
3. implements ``bind(loaded)``, which plans the launch for its problem and returns its ABI struct filled in (it may
   ask ``loaded`` for module facts such as the occupancy), and optionally ``after_build(loaded, prepared, abi)``.
"""
from __future__ import annotations

import collections
import threading

from ..errors import ArgumentError
from ..session import Session, SessionState, current
from . import driver
from .device import Devices, normalize_device
from .launch import PreparedLaunch, loaded, patched_launch, prepare
from .overlap import byte_range, check_outputs_apart, same_geometry
from .tensors import DeviceTensors, tensors_device, torch_signature


def stream_handle(stream) -> int:
    """Accepts None (the default stream), an int handle, torch/cupy streams or __cuda_stream__ objects."""
    if stream is None:
        return 0
    if isinstance(stream, bool):
        raise ArgumentError(f"stream must be None, an int handle, or a torch/cupy stream; got {stream!r}")
    if isinstance(stream, int):
        return stream
    if hasattr(stream, "__cuda_stream__"):
        return int(stream.__cuda_stream__()[1])
    for attribute in ("cuda_stream", "ptr", "handle"):
        if hasattr(stream, attribute):
            return int(getattr(stream, attribute))
    try:
        return int(stream)
    except (TypeError, ValueError):
        raise ArgumentError(f"stream must be None, an int handle, or a torch/cupy stream; got {stream!r}") from None


class ArgumentsMemo(SessionState):
    """What validating and binding found for a problem, by a cheap signature of the call (tensor dtypes, shapes,
    strides and devices; never addresses). A kind's Arguments use it to make a new object for a problem already
    seen without validating it again: only what depends on addresses (their alignment) is checked per call."""

    LIMIT = 4096

    def __init__(self, session: Session):
        super().__init__(session)
        self._entries: collections.OrderedDict = collections.OrderedDict()
        self._lock = threading.Lock()

    def get(self, key):
        return self._entries.get(key)

    def put(self, key, entry) -> None:
        with self._lock:
            self._entries[key] = entry
            while len(self._entries) > self.LIMIT:
                self._entries.popitem(last=False)


class _Seen:
    """What the full path found for one problem signature: the kind's attributes and the cached Params."""

    __slots__ = ("attributes", "loaded_op", "template", "tensors", "vector_bytes", "abi_struct", "extra", "footprint")

    def __init__(self, attributes, loaded_op, template, tensors, vector_bytes, abi_struct, extra, footprint):
        self.attributes, self.loaded_op, self.template = attributes, loaded_op, template
        self.tensors, self.vector_bytes, self.abi_struct, self.extra = tensors, vector_bytes, abi_struct, extra
        self.footprint = footprint


class Footprint:
    """Where each address of a seen problem reaches, relative to it, and which ones the kernel writes: enough to
    tell, from new addresses alone, that no output can overlap another operand (the full path decides otherwise)."""

    __slots__ = ("pairs",)

    def __init__(self, operands, written, in_place):
        written_ids = {id(info) for info in written}
        # (output, source) that may share an address: the same view, as the signature fixes both views
        allowed = {(id(output), id(source)) for output, source in in_place if same_geometry(output, source)}
        spans = [None if info is None or info.kind != "device" or not info.numel else
                 tuple(edge - info.device_address for edge in byte_range(info)) for info in operands]
        # (output position, other position, their reaches, whether the two may share one address)
        self.pairs = tuple(
            (p, q, *spans[p], *spans[q], (id(operands[p]), id(operands[q])) in allowed)
            for p in range(len(operands)) for q in range(len(operands))
            if p != q and spans[p] is not None and spans[q] is not None and id(operands[p]) in written_ids and
            not (q < p and id(operands[q]) in written_ids))

    def apart(self, addresses) -> bool:
        for p, q, p_low, p_high, q_low, q_high, may_share in self.pairs:
            a, b = addresses[p], addresses[q]
            if a + p_low < b + q_high and b + q_low < a + p_high and not (may_share and a == b):
                return False
        return True


def memo_key(*call, tensors, stream, session):
    """The fast path's key: ``call`` (operation name, sizes, modes, epilogue values), the stream, the session and
    the signatures of ``tensors``; None when a tensor is not a plain CUDA torch tensor or a value is unhashable."""
    signatures = torch_signatures(tensors)
    if signatures is None:
        return None
    try:
        key = (*call, stream_handle(stream), id(session or current()), signatures)
        hash(key)
    except (ArgumentError, TypeError):  # an odd stream, an unhashable output_op: the full path judges
        return None
    return key


def torch_signatures(tensors) -> tuple | None:
    """Signatures of plain CUDA torch tensors (None entries stay None); None if any other tensor is given."""
    signatures = []
    for tensor in tensors:
        if tensor is None:
            signatures.append(None)
            continue
        signature = torch_signature(tensor)
        if signature is None:
            return None
        signatures.append(signature)
    return tuple(signatures)


class OperationArguments:
    """Base of every kind's Arguments: stream, device, owned device buffers, a prepared launch, and sync()."""

    _runs_before_launch = False  # True for kinds that override before_launch (an instance may narrow it)

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        if "_runs_before_launch" not in cls.__dict__:  # a kind may set it in its class body
            cls._runs_before_launch = cls.before_launch is not OperationArguments.before_launch

    def __init__(self, operation, stream=None, device=None, session: Session | None = None):
        self.operation = operation
        self.stream = stream_handle(stream)
        self.session = session if session is not None else current()
        if not isinstance(self.session, Session):
            raise ArgumentError(f"session must be a pycutlass.Session, got {session!r}")
        self._device_request = normalize_device(device)
        self._prepared: PreparedLaunch | None = None
        self.tensors: DeviceTensors | None = None
        self.device = None

    def _take_flags(self, bias, reordered) -> None:
        """PyCUTLASS's ``bias=`` and pycutlass's ``reordered=`` keywords, checked; the kind applies them."""
        if bias not in (None, False, True):
            raise ArgumentError(f"bias must be True or False, got {bias!r}")
        if not isinstance(reordered, bool):
            raise ArgumentError(f"reordered must be True or False, got {reordered!r}")
        self.reordered = reordered

    def _materialize(self) -> None:
        check_outputs_apart(self._written(), self._read(), self._in_place())
        self._attach_device(self._tensor_infos())
        self._allocate()
        self._prepare()

    def _attach_device(self, infos) -> None:
        ordinal = tensors_device(list(infos), self._device_request, self.operation.name)
        self.device = Devices.of(self.session).get(ordinal)
        self.tensors = DeviceTensors(self.device, self.stream)

    # --- the fast path for problems seen before -------------------------------------------------------------
    # A kind that offers it computes a memo key (a signature of everything but addresses, or None), tries
    # ``_from_memo`` first, and after the full path calls ``_remember``. Addresses come in ``_pointers_`` order;
    # missing trailing ones (semaphores) are null.
    def _from_memo(self, memo_key, session, addresses, keep_alive) -> bool:
        seen = ArgumentsMemo.of(session).get(memo_key)
        if seen is None:
            return False
        for address, vector_bytes in zip(addresses, seen.vector_bytes):
            if not address or address % vector_bytes:
                return False  # the full path says what is wrong
        if not seen.footprint.apart(addresses):
            return False  # an output may overlap another operand: the full path decides exactly
        self.__dict__.update(seen.attributes)
        self.tensors = seen.tensors  # device tensors only: nothing was copied in, nothing to copy back
        self._launch_from(seen, addresses, keep_alive)
        return True

    def _launch_from(self, seen, addresses, keep_alive) -> None:
        """Patch the seen problem's Params with new addresses (``_pointers_`` order, missing trailing ones null)."""
        self._keep_alive = keep_alive
        fields = type(seen.abi_struct)._pointers_
        addresses = (*addresses, *(0,) * (len(fields) - len(addresses)))
        self._prepared = patched_launch(seen.loaded_op, seen.template, addresses)
        if seen.loaded_op.verifying:  # tests: the fast path's Params must equal freshly built ones
            abi_struct = type(seen.abi_struct).from_buffer_copy(seen.abi_struct)
            for field, address in zip(fields, addresses):
                setattr(abi_struct, field, address)
            seen.loaded_op.check_patched(abi_struct, self._prepared, self.stream)

    def _remember(self, memo_key, vector_bytes, attribute_names, extra=None, operands=()) -> None:
        """``operands``: the TensorInfo behind each address (None: absent or standing in for another)."""
        template = self._loaded_op.cached_template(self._abi_struct)
        if template is None:  # Params that cannot be patched: such a problem takes the full path every time
            return
        names = ("operation", "session", "stream", "device", "_device_request", *attribute_names)
        attributes = {name: getattr(self, name) for name in names}
        # A fresh, empty DeviceTensors: the memo must not keep this object's buffers alive.
        seen = _Seen(attributes, self._loaded_op, template, DeviceTensors(self.device, self.stream),
                     tuple(vector_bytes), self._abi_struct, extra,
                     Footprint(operands, self._written(), self._in_place()))
        ArgumentsMemo.of(self.session).put(memo_key, seen)

    # --- the kind interface ---------------------------------------------------------------------------------
    def _tensor_infos(self) -> list:
        """Every TensorInfo the kind validated (they decide the device)."""
        raise NotImplementedError

    def _written(self) -> list:
        """The TensorInfos the kernel writes (from ``_tensor_infos()``): none may overlap another operand."""
        raise NotImplementedError

    def _read(self) -> list:
        """The TensorInfos the kernel reads for this problem (all by default; a kind may leave out an operand that
        this call never reads, such as C with beta = 0)."""
        return self._tensor_infos()

    def _in_place(self) -> list:
        """(output, source) TensorInfo pairs that may be the very same view: the kernel reads each element of the
        source before the thread that read it writes that element of the output (D = C in an epilogue)."""
        return []

    def _allocate(self) -> None:
        """Copy host tensors and allocate through ``self.tensors`` (the device is current)."""

    def bind(self, loaded_op):
        """The kind's ABI struct for this problem, filled in. ``loaded_op`` answers module questions."""
        raise NotImplementedError

    def after_build(self, loaded_op, launch: PreparedLaunch, abi_struct) -> None:
        """Work after Params exist (none by default)."""

    def before_launch(self) -> None:
        """Work that must precede every launch (none by default)."""

    # --- execution ------------------------------------------------------------------------------------------
    def _prepare(self) -> PreparedLaunch:
        if self._prepared is None:
            loaded_op = loaded(self.operation, self.device, self.session)
            abi_struct = self.bind(loaded_op)
            launch = prepare(loaded_op, abi_struct, self.stream)
            self.after_build(loaded_op, launch, abi_struct)
            self._prepared = launch
            self._loaded_op, self._abi_struct = loaded_op, abi_struct
        return self._prepared

    prepared = _prepare

    def launch_for(self, operation) -> None:
        """``operation.run(arguments)`` comes here: check the pairing, then launch on the arguments' stream.

        run()'s hot path, kept flat: for reused arguments one context query and one cuLaunchKernelEx, and
        ``before_launch`` only where a kind has work there."""
        if operation is not self.operation and operation != self.operation:
            raise ArgumentError(f"these arguments were built for {self.operation.name}, not {operation.name}")
        launch = self._prepared or self._prepare()
        self.device.make_current()
        if self._runs_before_launch:
            self.before_launch()
        launch.launch(self.stream)

    def sync(self) -> None:
        """Wait for the stream; copy outputs held in host arrays back into them."""
        self.device.make_current()
        driver.synchronize_stream(self.stream, self.operation.name)
        self.tensors.copy_back()
