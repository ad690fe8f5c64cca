"""The Dask worker plugin that keeps a worker's GPU slots and kernel binaries between a sweep's tasks
(:class:`pycutlass.tune.gpu_slots.GpuSlots`). ``DaskExecutor`` registers it on every worker, so the state belongs to
the worker and ends with it. Imported only where Dask is in use."""
from __future__ import annotations

from distributed import WorkerPlugin

from .gpu_slots import GPU_RESOURCE, GpuSlots

PLUGIN_NAME = "pycutlass-gpus"


class GpuWorkers(WorkerPlugin):
    """Gives a worker declaring ``GPU=N`` its N slots; stops their benchmark processes when the worker closes."""

    idempotent = True  # registered again (another executor on the same cluster): the running processes stay
    name = PLUGIN_NAME

    def setup(self, worker) -> None:
        state = getattr(worker, "state", None)
        resources = getattr(state, "total_resources", None) or getattr(worker, "total_resources", None) or {}
        self.slots = GpuSlots(worker.address, max(1, int(resources.get(GPU_RESOURCE, 1))))

    def teardown(self, worker) -> None:
        self.slots.close()


def worker_slots() -> GpuSlots | None:
    """This Dask worker's slots (None outside a worker, or where no executor registered the plugin)."""
    from distributed import get_worker

    try:
        plugin = get_worker().plugins.get(PLUGIN_NAME)
    except ValueError:  # not inside a worker
        return None
    return getattr(plugin, "slots", None)
