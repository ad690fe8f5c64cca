"""What every Arguments class shares: a stream, owned device buffers, a prepared launch, and sync()."""
from __future__ import annotations

from ...errors import ArgumentError
from .. import driver
from ..launch import PreparedLaunch, prepare
from ..tensors import DeviceTensors


def stream_handle(stream) -> int:
    """Accepts None (the default stream), an int handle, torch/cupy streams or __cuda_stream__ objects."""
    if stream is None:
        return 0
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


class OperationArguments:
    """Subclasses validate everything in ``__init__`` before calling ``_materialize()``, which allocates."""

    def __init__(self, operation, stream=None):
        self.operation = operation
        self.stream = stream_handle(stream)
        self._prepared: PreparedLaunch | None = None
        self.tensors: DeviceTensors | None = None

    def _materialize(self) -> None:
        driver.ensure_context()
        self.tensors = DeviceTensors(self.stream)

    def abi_struct(self):
        raise NotImplementedError

    def before_launch(self) -> None:
        """Work that must precede every launch (none by default)."""

    def prepared(self) -> PreparedLaunch:
        if self._prepared is None:
            self._prepared = prepare(self.operation, self.abi_struct(), self.stream)
        return self._prepared

    def launch(self) -> None:
        launch = self.prepared()
        self.before_launch()
        launch.launch(self.stream)

    def sync(self) -> None:
        """Wait for the stream; copy outputs held in host arrays back into them."""
        driver.synchronize_stream(self.stream, self.operation.name)
        self.tensors.copy_back()
