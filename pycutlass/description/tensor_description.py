"""TensorDescription: element type, layout and vector alignment of one operand."""
from __future__ import annotations

from dataclasses import dataclass

from ..errors import DescriptionError
from .types import DataType, LayoutType

MAX_ACCESS_BITS = 256  # the widest access any operand may use (C of a tensor-op GEMM); A and B: 128


@dataclass(frozen=True)
class TensorDescription:
    element: DataType
    layout: LayoutType
    alignment: int = 1

    def __post_init__(self):
        if not isinstance(self.element, DataType):
            raise DescriptionError(f"TensorDescription.element must be a DataType, got {self.element!r}",
                                   rule="description.field_type")
        if not isinstance(self.layout, LayoutType):
            raise DescriptionError(f"TensorDescription.layout must be a layout (e.g. pycutlass.RowMajor), "
                                   f"got {self.layout!r}", rule="description.field_type")
        # CUTLASS's double-precision kernels access one element at a time. A and B (cp.async, ldmatrix) move at most
        # 128 bits per access; a tensor-op GEMM epilogue writes C/D with up to 256 bits (arch::global_store<.., 32>,
        # as CUTLASS's generator does for f16 -> f32 and s8 -> s32 with alignment 8). The operations check the
        # per-operand limit (TensorDescription does not know which operand it is).
        max_alignment = 1 if self.element is DataType.float64 else MAX_ACCESS_BITS // self.element.bits
        allowed = [a for a in (1, 2, 4, 8, 16) if a <= max_alignment]
        if not isinstance(self.alignment, int) or isinstance(self.alignment, bool) or self.alignment not in allowed:
            raise DescriptionError(
                f"alignment {self.alignment!r} is not valid for {self.element.label}: a vector access is at most "
                f"128 bits for A and B and 256 bits for a tensor-op GEMM's C, so the alignment (in elements) must be "
                f"one of {allowed}", rule="alignment.invalid")
        if self.layout.is_interleaved and self.element is not DataType.int8 and \
                self.layout not in (LayoutType.TensorNC32HW32, LayoutType.TensorC32RSK32):
            raise DescriptionError(f"interleaved layout {self.layout.value} is only supported for int8",
                                   rule="tensor.interleaved_type")

    @property
    def access_bits(self) -> int:
        return self.alignment * self.element.bits
