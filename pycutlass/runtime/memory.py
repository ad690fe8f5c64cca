"""Device memory through RMM, tracked so ``get_allocated_size()`` reports what pycutlass holds."""
from __future__ import annotations

_tracked = None


def get_memory_pool(init_pool_size: int = 0, max_pool_size: int | None = None):
    """Use an RMM pool (``init_pool_size`` .. ``max_pool_size`` bytes) with tracking for all pycutlass buffers.

    It also becomes RMM's current device resource, so other RMM users share the pool.
    """
    global _tracked
    import rmm

    from .driver import ensure_context

    ensure_context()
    pool = rmm.mr.PoolMemoryResource(rmm.mr.CudaMemoryResource(), initial_pool_size=int(init_pool_size),
                                     maximum_pool_size=None if max_pool_size is None else int(max_pool_size))
    _tracked = rmm.mr.TrackingResourceAdaptor(pool)
    rmm.mr.set_current_device_resource(_tracked)
    return _tracked


def tracked_resource():
    """The tracking resource pycutlass allocates from; wraps RMM's current resource if no pool was set up."""
    global _tracked
    if _tracked is None:
        import rmm

        from .driver import ensure_context

        ensure_context()
        _tracked = rmm.mr.TrackingResourceAdaptor(rmm.mr.get_current_device_resource())
    return _tracked


def get_allocated_size() -> int:
    """Bytes of device memory currently held by pycutlass allocations (0 before any)."""
    return 0 if _tracked is None else int(_tracked.get_allocated_bytes())


class _StreamRef:
    """Lets RMM order allocations on a raw stream handle (the __cuda_stream__ protocol)."""

    def __init__(self, handle: int):
        self.handle = handle

    def __cuda_stream__(self):
        return (0, self.handle)


def _rmm_stream(handle: int):
    from rmm.pylibrmm.stream import DEFAULT_STREAM, Stream

    return DEFAULT_STREAM if handle == 0 else Stream(_StreamRef(handle))


def device_buffer(nbytes: int, stream: int = 0):
    """A stream-ordered RMM DeviceBuffer of at least one byte (RMM returns null for zero)."""
    import rmm

    return rmm.DeviceBuffer(size=max(int(nbytes), 1), stream=_rmm_stream(stream), mr=tracked_resource())


def device_buffer_from_host(host_address: int, nbytes: int, stream: int = 0):
    import rmm

    if nbytes == 0:
        return device_buffer(1, stream)
    return rmm.DeviceBuffer(ptr=host_address, size=int(nbytes), stream=_rmm_stream(stream), mr=tracked_resource())
