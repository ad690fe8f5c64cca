"""Per-device state of a session: the primary context, loaded modules and operations, and memory tracking.

Nothing is pinned to device 0: an operation runs on the device of its tensors (or an explicit ``device=``), and each
device loads its own copy of a module, compiled for that device's target.
"""
from __future__ import annotations

import threading

from ..description.target import Target
from ..errors import ArgumentError
from ..session import Session, SessionState
from . import driver


class DeviceState:
    """One GPU as a session sees it. Created on first use of the device; lives as long as the session."""

    def __init__(self, ordinal: int):
        self.ordinal = ordinal
        self.context = driver.retain_primary_context(ordinal)
        self._context_id = int(self.context)
        self._get_current = driver._driver().cuCtxGetCurrent
        self.make_current()
        major = driver.device_attribute(ordinal, "COMPUTE_CAPABILITY_MAJOR")
        minor = driver.device_attribute(ordinal, "COMPUTE_CAPABILITY_MINOR")
        self.compute_capability = major * 10 + minor
        self.target = Target(self.compute_capability)
        self.sm_count = driver.device_attribute(ordinal, "MULTIPROCESSOR_COUNT")
        self.name = driver.device_name(ordinal)
        self.lock = threading.RLock()
        self.modules: dict[str, object] = {}  # cubin sha256 -> CUmodule
        self.operations: dict[tuple[str, str], object] = {}  # (cubin sha256, operation name) -> LoadedOperation
        self.by_name: dict[tuple, object] = {}  # (operation name, backend) -> LoadedOperation, for fast lookups
        self.tracked_memory = None  # rmm TrackingResourceAdaptor, see runtime.memory

    def make_current(self) -> None:
        """Make this device's context current on this thread (one driver query when it already is)."""
        err, current = self._get_current()
        if err or current is None or int(current) != self._context_id:
            driver.make_current(self.context)

    def __repr__(self) -> str:
        return f"<pycutlass device {self.ordinal}: {self.name} ({self.target.name})>"


class Devices(SessionState):
    """The devices a session has used, by ordinal."""

    def __init__(self, session: Session):
        super().__init__(session)
        self._states: dict[int, DeviceState] = {}
        self._lock = threading.Lock()

    def get(self, ordinal: int | None = None) -> DeviceState:
        """The device ``ordinal`` (default: the session's device, else this thread's current CUDA device, else 0),
        made current on this thread."""
        if ordinal is None:
            ordinal = self.default_ordinal()
        if isinstance(ordinal, bool) or not isinstance(ordinal, int) or ordinal < 0:
            raise ArgumentError(f"device must be a CUDA device ordinal (0, 1, ...), got {ordinal!r}")
        state = self._states.get(ordinal)
        if state is None:
            with self._lock:
                state = self._states.get(ordinal)
                if state is None:
                    state = self._states[ordinal] = DeviceState(ordinal)
        state.make_current()
        return state

    def default_ordinal(self) -> int:
        chosen = self.session.options.get("device")
        if chosen is not None:
            return int(chosen)
        driver.init()
        current = driver.current_device_ordinal()
        return 0 if current is None else current

    def used(self) -> list[DeviceState]:
        return list(self._states.values())


def device_of(ordinal: int | None = None, session: Session | None = None) -> DeviceState:
    return Devices.of(session).get(ordinal)


def normalize_device(device) -> int | None:
    """``device=`` as users write it: None, an int, ``"cuda:1"``, or a torch/cupy device object."""
    if device is None:
        return None
    if isinstance(device, bool):
        raise ArgumentError(f"device must be a CUDA device ordinal, got {device!r}")
    if isinstance(device, int):
        return device
    if isinstance(device, str):
        text = device.strip().lower()
        if text.startswith("cuda:") and text[5:].isdigit():
            return int(text[5:])
        if text.isdigit():
            return int(text)
        raise ArgumentError(f"device {device!r} is not a CUDA device; write 1, 'cuda:1' or pass a torch device")
    index = getattr(device, "index", None)
    if index is None:
        index = getattr(device, "id", None)
    if isinstance(index, int):
        return index
    raise ArgumentError(f"device must be a CUDA device ordinal, 'cuda:N' or a torch/cupy device, got {device!r}")
