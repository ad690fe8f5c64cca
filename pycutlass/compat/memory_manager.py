"""PyCUTLASS 2.11's ``pycutlass.memory_manager``: the RMM pool and the bytes pycutlass holds."""
from __future__ import annotations

from .support import missing_names
from ..runtime.memory import get_allocated_size, get_memory_pool

_ARGS = ("Arguments objects copy host tensors to the device and own their buffers; pass numpy/torch/cupy tensors "
         "to them (docs/arguments.md)")
__getattr__ = missing_names(__name__, {
    "PoolMemoryManager": "use pycutlass.get_memory_pool(init_pool_size, max_pool_size), which installs an RMM pool",
    "todevice": _ARGS, "device_mem_alloc": _ARGS, "align_size": _ARGS,
})

__all__ = ["get_allocated_size", "get_memory_pool", "rmm"]
