"""ReductionOperation: sums the partial products of parallel split-K and applies the epilogue."""
from __future__ import annotations

from importlib import resources

from ...description.coords import MatrixCoord
from ...description.tensor_description import TensorDescription
from ...description.types import DataType, LayoutType
from ...emit import names
from ...epilogue.functors import EpilogueFunctor
from ...errors import DescriptionError
from .abi import ReductionArgs
from ..base import Operation, check_compute_capability


def split_k_reduction_kernel() -> str:
    """pycutlass's split-K reduction kernel (include-guarded: a unit may hold several reductions)."""
    return resources.files(__package__).joinpath("split_k_reduction.cuh").read_text()


def _integer_within(value, low: int, high: int) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and low <= value <= high


class ReductionOperation(Operation):
    kind = "reduction"
    abi_struct_type = ReductionArgs

    def __init__(self, shape: MatrixCoord, C: TensorDescription, element_accumulator: DataType,
                 element_workspace: DataType | None = None, element_compute: DataType | None = None,
                 epilogue_functor: EpilogueFunctor | None = None, count: int = 1, partitions_per_stage: int = 4,
                 arch: int = 80, partition_lanes: int | None = None):
        self.compute_capability = check_compute_capability(arch)
        if not isinstance(shape, MatrixCoord):
            shape = MatrixCoord(*shape)
        if not isinstance(C, TensorDescription):
            raise DescriptionError(f"ReductionOperation: C must be a TensorDescription, got {C!r}",
                                   rule="description.field_type")
        if C.layout not in (LayoutType.RowMajor, LayoutType.ColumnMajor, LayoutType.TensorNHWC):
            raise DescriptionError(f"ReductionOperation: C must be RowMajor, ColumnMajor or TensorNHWC (a convolution's "
                                   f"output, reduced as its implicit GEMM's row-major NPQ x K matrix), got "
                                   f"{C.layout.value}", rule="reduction.layout")
        element_workspace = element_workspace or element_accumulator
        if epilogue_functor is None:
            from ...epilogue import LinearCombination

            epilogue_functor = LinearCombination(C.element, count, element_accumulator, element_compute)
        if element_compute is None:  # float64 for a float64 reduction, else float32 (as LinearCombination)
            element_compute = epilogue_functor.element_epilogue
        if epilogue_functor.element_output is not C.element or epilogue_functor.alignment != count:
            raise DescriptionError("ReductionOperation: the epilogue must write C's element type with alignment == "
                                   f"count ({count}); got {epilogue_functor.element_output.label} x "
                                   f"{epilogue_functor.alignment}", rule="reduction.epilogue")
        if epilogue_functor.element_accumulator is not element_accumulator:
            raise DescriptionError("ReductionOperation: the epilogue's accumulator type must be element_accumulator",
                                   rule="reduction.epilogue")
        # The kernel (split_k_reduction.cuh, after CUTLASS's ReduceSplitK) moves AlignedArray<T, count> values: up to
        # 256 bits, the widest C of a tensor-op GEMM or conv epilogue (float32 x 8), whose parallel split-K it reduces.
        if count < 1 or count & (count - 1) or count * C.element.bits > 256:
            raise DescriptionError(f"ReductionOperation: count {count} must be a power of two within one 256-bit "
                                   f"access of the {C.element.label} output", rule="reduction.count")
        rows, cols = shape
        if rows < 1 or cols < count or cols % count or (cols // count) * rows > 1024:
            raise DescriptionError(f"ReductionOperation: shape {rows}x{cols} needs cols a multiple of count {count} "
                                   f"and at most 1024 threads ((cols / count) * rows)", rule="reduction.shape")
        if not _integer_within(partitions_per_stage, 1, 16):
            raise DescriptionError(f"ReductionOperation: partitions_per_stage (the loads one thread issues at once) "
                                   f"must be an integer from 1 to 16, got {partitions_per_stage!r}",
                                   rule="reduction.shape")
        if partition_lanes is not None and not _integer_within(partition_lanes, 1, 64):
            raise DescriptionError(f"ReductionOperation: partition_lanes (the thread groups of a block that share "
                                   f"the partitions) must be None (chosen per launch) or an integer from 1 to 64, "
                                   f"got {partition_lanes!r}", rule="reduction.shape")
        self.shape = (rows, cols)
        self.C = C
        self.element_accumulator = element_accumulator
        self.element_workspace = element_workspace
        self.element_compute = element_compute
        self.epilogue_functor = epilogue_functor
        self.count = count
        self.partitions_per_stage = partitions_per_stage
        self.partition_lanes = partition_lanes

    @property
    def pdl_refusal(self) -> str | None:
        """The kernel waits on the previous grid (griddepcontrol.wait) where it is compiled for SM90 or newer: built
        with arch=90, it may start under the split-K kernel that writes its workspace."""
        if self.compute_capability < 90:
            return (f"programmatic dependent launch needs a reduction built with arch=90 (this one is built for "
                    f"{self.compute_capability}; its kernel would not wait on the split-K kernel before it)")
        return None

    @property
    def matrix_layout(self) -> LayoutType:
        """The layout of the M x N matrix reduced: a TensorNHWC C (PyCUTLASS's conv parallel split-K) is the implicit
        GEMM's NPQ x K output, row-major."""
        return LayoutType.RowMajor if self.C.layout is LayoutType.TensorNHWC else self.C.layout

    def _signature(self) -> tuple:
        return ("reduction", self.compute_capability, self.shape, self.C, self.element_accumulator,
                self.element_workspace, self.element_compute, self.epilogue_functor, self.count,
                self.partitions_per_stage, self.partition_lanes)

    def _readable_name(self) -> str:
        s = names.SHORT
        return (f"reduce_splitk_{s[self.element_workspace]}{s[self.element_accumulator]}{s[self.C.element]}_"
                f"{self.shape[0]}x{self.shape[1]}_c{self.count}" +
                (f"_l{self.partition_lanes}" if self.partition_lanes else ""))

    def headers(self) -> list[str]:
        return ["cutlass/array.h", "cutlass/functional.h", "cutlass/matrix_shape.h", "cutlass/tensor_ref.h",
                "cutlass/layout/matrix.h", "cutlass/reduction/thread/reduction_operators.h",
                *names.epilogue_headers(self.epilogue_functor)]

    def emit_body(self) -> str:
        activation = self.epilogue_functor.activation
        return self.render("reduction.cu.j2", name=self.name, summary=self.describe(),
                      split_k_reduction_kernel=split_k_reduction_kernel(),
                      epilogue=names.epilogue_functor(self.epilogue_functor), shape=self.shape,
                      element_accumulator=names.ELEMENT[self.element_accumulator],
                      element_workspace=names.ELEMENT[self.element_workspace], count=self.count,
                      partitions_per_stage=self.partitions_per_stage, max_lanes=self.partition_lanes or 0,
                      activation_args=activation.argument_names if activation else ())

    def describe(self) -> str:
        return (f"split-K reduction {self.element_workspace.label}->{self.C.element.label}/{self.C.layout.value} "
                f"shape={self.shape} count={self.count} lanes={self.partition_lanes or 'auto'} "
                f"epilogue={self.epilogue_functor.describe()}")
