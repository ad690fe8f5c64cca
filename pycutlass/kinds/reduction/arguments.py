"""ReductionArguments: reduce a parallel split-K workspace into D = epilogue(alpha * sum + beta * C)."""
from __future__ import annotations

from ...description.types import LayoutType
from ...emit.abi import fill_epilogue
from ...errors import ArgumentError
from ...runtime.arguments import OperationArguments
from ...runtime.tensors import PartialsAddress, TensorInfo, as_flat, describe, is_device_pointer, pointer_operand
from ..families.arguments import coerce_output_op
from ..families.matrix import check_output_geometry, matrix_geometry
from .abi import ReductionArgs
from .operation import ReductionOperation


class ReductionArguments(OperationArguments):
    """``workspace``: the address of ``partitions`` packed M x N slices in C's layout (``GemmArguments.ptr_D``),
    or the GemmArguments/Conv2dArguments object that owns it (which also keeps it alive).

    ``pdl=True`` launches the reduction with programmatic dependent launch: its blocks may start while the split-K
    kernel before it on the stream drains, and wait for it before reading the workspace. It hides the second
    launch's latency; it needs a reduction built with ``arch=90``."""

    def __init__(self, operation, problem_size, partitions: int, workspace, destination, source=None,
                 output_op=None, partition_stride: int | None = None, stream=None, device=None, session=None,
                 bias=None, pdl: bool = False):
        if not isinstance(operation, ReductionOperation):
            raise ArgumentError(f"ReductionArguments needs a ReductionOperation, got {type(operation).__name__}")
        if not isinstance(pdl, bool):
            raise ArgumentError(f"pdl must be True or False, got {pdl!r}")
        if pdl and operation.pdl_refusal:
            raise ArgumentError(f"pdl=True: {operation.pdl_refusal}")
        self._pdl = pdl
        if stream is None and hasattr(workspace, "stream"):
            stream = workspace.stream  # run on the producer's stream so the workspace is ready
        super().__init__(operation, stream, device, session)
        try:
            m, n = (int(v) for v in problem_size)
        except (TypeError, ValueError):
            raise ArgumentError(f"problem_size must be [M, N], got {problem_size!r}") from None
        if isinstance(partitions, bool) or int(partitions) < 1:
            raise ArgumentError(f"partitions must be a positive integer, got {partitions!r}")
        self.problem_size = (m, n)
        self.partitions = int(partitions)
        self._producer = None
        if hasattr(workspace, "ptr_D"):
            if not isinstance(workspace.ptr_D, PartialsAddress):
                raise ArgumentError(f"workspace: these {type(workspace).__name__} write D itself, not split-K partial "
                                    f"results; build them with gemm_mode=GemmSplitKParallel (GEMM) or "
                                    f"split_k_mode=SplitKMode.Parallel (Conv2d) for a ReductionOperation to reduce")
            self._producer = workspace
            workspace = workspace.ptr_D
        partials = workspace.element if isinstance(workspace, PartialsAddress) else None  # what split-K wrote
        partials_bytes = workspace.nbytes if partials is not None else None
        if partials is not None and partials is not operation.element_workspace:
            raise ArgumentError(f"workspace: the split-K partial results are {partials.label} (the operation's "
                                f"output type), but this ReductionOperation reads {operation.element_workspace.label}"
                                f" (its element_workspace, which defaults to element_accumulator); build it with "
                                f"element_workspace={partials.label}")
        if is_device_pointer(workspace):  # PyCUTLASS passed GemmArguments.ptr_D as a CUdeviceptr
            workspace = int(workspace)
        if bias not in (None, False, True):
            raise ArgumentError(f"bias must be True or False, got {bias!r}")
        if bias and source is None:
            raise ArgumentError("bias=True says source (C) is a bias vector, but source is None")
        if not isinstance(workspace, int) or workspace == 0:
            raise ArgumentError(f"workspace must be a device address (GemmArguments.ptr_D) or the arguments object "
                                f"that owns it, got {workspace!r}")
        self.workspace = workspace
        self.partition_stride = m * n if partition_stride is None else int(partition_stride)
        if partials_bytes is not None:
            _check_partials_extent(partials, partials_bytes, self.partitions, self.partition_stride, m, n)
        self.output_op = coerce_output_op(operation, output_op)
        layout = operation.matrix_layout
        contiguous = n if layout is LayoutType.RowMajor else m
        if contiguous % operation.count:
            raise ArgumentError(f"{'N' if layout is LayoutType.RowMajor else 'M'}={contiguous} must be a multiple of "
                                f"the reduction's count {operation.count}")
        if source is None and self.output_op.beta != 0:
            raise ArgumentError(f"source (C) is None but beta is {self.output_op.beta}")
        vector = n if layout is LayoutType.RowMajor else m  # PyCUTLASS's bias: one value per column of a row-major C
        destination = pointer_operand(destination, m * n, operation.C.element, "destination")
        source = pointer_operand(source, vector if bias else m * n, operation.C.element, "source")
        self._infos = {}
        for label, tensor in (("destination", destination), ("source", source)):
            if tensor is None:
                continue
            info = describe(tensor, label)
            if info.element is not operation.C.element:
                raise ArgumentError(f"{label}: expected {operation.C.element.label} elements, got {info.element.label}")
            info = self._as_matrix(info, label, m, n, vector, bool(bias))
            geometry = matrix_geometry(info, layout, m, n, 1, allow_broadcast=label == "source")
            if label == "source" and bias and not geometry.broadcast and m * n != vector:
                raise ArgumentError(f"source: bias=True says C is a bias vector of {vector} elements (or a view "
                                    f"broadcasting one), but it is a full {m} x {n} matrix (shape {info.shape}, "
                                    f"strides {info.strides})")
            if label == "destination":
                check_output_geometry(info, geometry, layout, m, n, 1)
            if geometry.ld % operation.count and not geometry.broadcast:
                raise ArgumentError(f"{label}: leading dimension {geometry.ld} must be a multiple of {operation.count}")
            self._infos[label] = (info, geometry)
        self.bias = "source" in self._infos and self._infos["source"][1].broadcast
        if self._producer is not None and self._device_request is None and self._producer.device is not None:
            self._device_request = self._producer.device.ordinal  # the workspace lives there
        self._materialize()

    def _as_matrix(self, info, label, m, n, vector, bias):
        """Tensor forms read as a packed 1-D matrix or vector: a bias with ``bias=True`` (any contiguous shape of
        ``vector`` elements) and, for a TensorNHWC C, a packed NHWC tensor (4-D, or torch's NCHW in channels_last
        memory) of the convolution's N*P*Q x K output."""
        if len(info.shape) == 1:
            return info
        if label == "source" and bias and info.numel == vector and (vector <= 1 or info.is_contiguous):
            return as_flat(info)
        if self.operation.C.layout is LayoutType.TensorNHWC and len(info.shape) == 4 and info.numel == m * n:
            # The convolution's output in NHWC dims: known from the producer's problem (wgrad's K x R x S x C has
            # C, not N, last), else any N x P x Q x n
            nhwc = getattr(self._producer, "reduction_output_nhwc", None)
            if info.is_contiguous and (tuple(info.shape) == nhwc if nhwc else info.shape[3] == n):
                return as_flat(info)
            nn, k, p, q = info.shape
            if ((nn, p, q, k) == nhwc if nhwc else k == n) and all(
                    size <= 1 or s == e for s, e, size in zip(info.strides, (p * q * k, 1, q * k, k), info.shape)):
                return as_flat(info)  # NCHW in channels_last memory
            wanted = nhwc or ("N", "P", "Q", n)
            raise ArgumentError(f"{label}: a TensorNHWC reduction writes packed NHWC: pass a contiguous "
                                f"({', '.join(map(str, wanted))}) tensor, torch's channels_last ({wanted[0]}, "
                                f"{wanted[3]}, {wanted[1]}, {wanted[2]}), or a packed 1-D one; got shape {info.shape}, "
                                f"strides {info.strides}")
        return info

    def _tensor_infos(self) -> list:
        return [info for info, _ in self._infos.values()]

    def _written(self) -> list:
        return [self._infos["destination"][0]]

    def _read(self) -> list:
        m, n = self.problem_size
        element = self.operation.element_workspace
        partials = TensorInfo("workspace", "device", element, (self.partitions, m * n), (self.partition_stride, 1),
                              device_address=self.workspace)  # the split-K partial results
        source = self._infos.get("source")
        return [partials] + ([source[0]] if source is not None and self.output_op.beta != 0 else [])

    def _in_place(self) -> list:
        source = self._infos.get("source")
        return [] if source is None else [(self._infos["destination"][0], source[0])]

    def after_build(self, loaded_op, launch, abi_struct) -> None:
        if self._pdl:
            launch.use_programmatic_dependent_launch()

    def _allocate(self) -> None:
        operation = self.operation
        self.addresses, self.lds = {}, {}
        for label, (info, geometry) in self._infos.items():
            address = self.tensors.address(info, is_output=label == "destination")
            if address % (operation.count * info.itemsize):
                raise ArgumentError(f"{label}: address {address:#x} is not aligned to {operation.count} elements")
            self.addresses[label], self.lds[label] = address, geometry.ld
        if "source" not in self.addresses:
            self.addresses["source"], self.lds["source"] = self.addresses["destination"], self.lds["destination"]

    def bind(self, loaded_op=None) -> ReductionArgs:
        m, n = self.problem_size
        transposed = self.operation.matrix_layout is LayoutType.ColumnMajor
        a = ReductionArgs()
        a.m, a.n = (n, m) if transposed else (m, n)  # the kernel reduces a row-major view
        a.partitions = self.partitions
        a.partition_stride = self.partition_stride
        a.workspace = self.workspace
        a.ld_workspace = a.n
        a.destination, a.ld_destination = self.addresses["destination"], self.lds["destination"]
        a.source, a.ld_source = self.addresses["source"], self.lds["source"]
        fill_epilogue(a, self.output_op)
        return a


def _check_partials_extent(element, nbytes: int, partitions: int, partition_stride: int, m: int, n: int) -> None:
    """A split-K workspace of known size (``nbytes`` of ``element`` partials): read no further than its end, and with
    the default stride sum every slice the kernel wrote, not part of them."""
    needed = ((partitions - 1) * partition_stride + m * n) * element.bits // 8
    if needed > nbytes:
        raise ArgumentError(f"workspace: {partitions} partitions of {m} x {n} (partition stride {partition_stride}) "
                            f"read {needed} bytes, but the split-K workspace holds {nbytes}: pass the producer's "
                            f"split_k_slices and its problem size")
    slice_bytes = m * n * element.bits // 8
    if partition_stride == m * n and slice_bytes and nbytes % slice_bytes == 0 and nbytes // slice_bytes != partitions:
        raise ArgumentError(f"workspace: the split-K kernel wrote {nbytes // slice_bytes} partitions of {m} x {n}, "
                            f"but partitions={partitions} would sum only part of them: pass the producer's "
                            f"split_k_slices")
