"""TensorDescription: element type, layout and vector alignment of one operand."""
from __future__ import annotations

from dataclasses import dataclass

from ..errors import DescriptionError
from .types import DataType, LayoutType


@dataclass(frozen=True)
class TensorDescription:
    element: DataType
    layout: LayoutType
    alignment: int = 1

    def __post_init__(self):
        if not isinstance(self.element, DataType):
            raise DescriptionError(f"TensorDescription.element must be a DataType, got {self.element!r}")
        if not isinstance(self.layout, LayoutType):
            raise DescriptionError(f"TensorDescription.layout must be a layout (e.g. pycutlass.RowMajor), "
                                   f"got {self.layout!r}")
        # CUTLASS's double-precision kernels access one element at a time.
        max_alignment = 1 if self.element is DataType.float64 else 128 // self.element.bits
        allowed = [a for a in (1, 2, 4, 8, 16) if a <= max_alignment]
        if not isinstance(self.alignment, int) or self.alignment not in allowed:
            raise DescriptionError(
                f"alignment {self.alignment!r} is not valid for {self.element.label}: a vector access is at most "
                f"128 bits, so the alignment (in elements) must be one of {allowed}")
        if self.layout.is_interleaved and self.element is not DataType.int8 and \
                self.layout not in (LayoutType.TensorNC32HW32, LayoutType.TensorC32RSK32):
            raise DescriptionError(f"interleaved layout {self.layout.value} is only supported for int8")

    @property
    def access_bits(self) -> int:
        return self.alignment * self.element.bits
