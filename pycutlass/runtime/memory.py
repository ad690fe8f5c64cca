"""Device memory through RMM, tracked per device so ``get_allocated_size()`` reports what pycutlass holds."""
from __future__ import annotations

from ..session import Session
from .device import DeviceState, Devices


def get_memory_pool(init_pool_size: int = 0, max_pool_size: int | None = None, device: int | None = None,
                    session: Session | None = None):
    """Use an RMM pool (``init_pool_size`` .. ``max_pool_size`` bytes) with tracking for pycutlass's buffers on
    ``device`` (default: the current device). It also becomes RMM's resource for that device, so other RMM users
    share the pool."""
    import rmm

    state = Devices.of(session).get(device)
    pool = rmm.mr.PoolMemoryResource(rmm.mr.CudaMemoryResource(), initial_pool_size=int(init_pool_size),
                                     maximum_pool_size=None if max_pool_size is None else int(max_pool_size))
    state.tracked_memory = rmm.mr.TrackingResourceAdaptor(pool)
    rmm.mr.set_per_device_resource(state.ordinal, state.tracked_memory)
    return state.tracked_memory


def tracked_resource(state: DeviceState):
    """The tracking resource pycutlass allocates from on a device; wraps RMM's resource if no pool was set up."""
    if state.tracked_memory is None:
        import rmm

        with state.lock:
            if state.tracked_memory is None:
                state.tracked_memory = rmm.mr.TrackingResourceAdaptor(rmm.mr.get_per_device_resource(state.ordinal))
    return state.tracked_memory


def get_allocated_size(session: Session | None = None) -> int:
    """Bytes of device memory currently held by pycutlass allocations, over all devices (0 before any)."""
    return sum(int(state.tracked_memory.get_allocated_bytes()) for state in Devices.of(session).used()
               if state.tracked_memory is not None)


class _StreamRef:
    """Lets RMM order allocations on a raw stream handle (the __cuda_stream__ protocol)."""

    def __init__(self, handle: int):
        self.handle = handle

    def __cuda_stream__(self):
        return (0, self.handle)


def _rmm_stream(handle: int):
    from rmm.pylibrmm.stream import DEFAULT_STREAM, Stream

    return DEFAULT_STREAM if handle == 0 else Stream(_StreamRef(handle))


def device_buffer(state: DeviceState, nbytes: int, stream: int = 0):
    """A stream-ordered RMM DeviceBuffer of at least one byte (RMM returns null for zero) on ``state``'s device."""
    import rmm

    return rmm.DeviceBuffer(size=max(int(nbytes), 1), stream=_rmm_stream(stream), mr=tracked_resource(state))


def device_buffer_from_host(state: DeviceState, host_address: int, nbytes: int, stream: int = 0):
    import rmm

    if nbytes == 0:
        return device_buffer(state, 1, stream)
    return rmm.DeviceBuffer(ptr=host_address, size=int(nbytes), stream=_rmm_stream(stream),
                            mr=tracked_resource(state))
