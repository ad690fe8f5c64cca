"""A Dask worker's GPUs and the kernel binaries it holds, kept between a sweep's benchmark tasks (no Dask needed
here: :mod:`pycutlass.tune.dask_gpus` attaches them to a worker, a task outside Dask makes its own)."""
from __future__ import annotations

import contextlib
import queue
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field

GPU_RESOURCE = "GPU"  # the Dask worker resource a benchmark task asks one of


@dataclass
class GpuRunner:
    """One GPU's benchmark process on a worker, with what it has been told so far."""

    signature: tuple  # (harness, worker function, session options): a different one needs a fresh process
    worker: object  # pycutlass.tune.runner.Worker
    facts: dict | None = None
    adopted: set = field(default_factory=set)
    generation: int = 0  # the worker's process the adopted kernels were sent to

    def fresh_process(self) -> bool:
        """Whether a new process was started (after a fault, or one that died) since the kernels were adopted: then
        adopt again."""
        if self.worker.generation != self.generation:
            self.generation = self.worker.generation
            self.adopted.clear()
            return True
        return False


class GpuSlots:
    """A worker's GPUs and the kernel binaries it holds (by cache key), kept between tasks.

    Each benchmark task (``resources={"GPU": 1}``) takes a free GPU for its duration and reuses that GPU's benchmark
    process (started once: torch, CUDA context); kernels compiled or received on the worker stay held, and adopted
    in the processes that ran them."""

    def __init__(self, address: str, gpus: int):
        self.address = address
        self.gpus = gpus
        self._free: queue.Queue = queue.Queue()
        for ordinal in range(gpus):
            self._free.put(ordinal)
        self._runners: dict[int, GpuRunner] = {}
        self._lock = threading.Lock()
        self._binaries: dict[str, dict] = {}  # cache key -> what adopting it takes (operation, binary, symbols)

    def hold(self, key: str, kernel: dict) -> None:
        with self._lock:
            self._binaries[key] = kernel

    def held(self, key: str) -> dict | None:
        with self._lock:
            return self._binaries.get(key)

    @contextlib.contextmanager
    def gpu(self) -> Iterator[int]:
        """A free GPU (its ordinal among the worker's visible GPUs) for the duration of a task."""
        ordinal = self._free.get()
        try:
            yield ordinal
        finally:
            self._free.put(ordinal)

    def runner(self, ordinal: int, signature: tuple, make_worker) -> GpuRunner:
        """GPU ``ordinal``'s benchmark process for this harness (``make_worker()`` makes one when needed)."""
        with self._lock:
            current = self._runners.get(ordinal)
            if current is None or current.signature != signature:
                if current is not None:
                    current.worker.stop()
                current = self._runners[ordinal] = GpuRunner(signature, make_worker())
            return current

    def close(self) -> None:
        for runner in self._runners.values():
            runner.worker.stop()
