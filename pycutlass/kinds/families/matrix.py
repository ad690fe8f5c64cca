"""How a tensor addresses a matrix operand: leading dimension and batch stride, derived from its strides.

Accepted forms, for a (rows x cols) operand and ``batch`` matrices:
- 2-D (rows, cols) when batch == 1, any strides the layout can address (RowMajor: unit column stride;
  ColumnMajor: unit row stride);
- 3-D (batch, rows, cols), the batch stride read from the tensor (0 broadcasts an input);
- 1-D, packed (PyCUTLASS style): batch * rows * cols contiguous elements;
- C only: a bias vector broadcast over rows (RowMajor: length cols; ColumnMajor: length rows), or a 2-D view
  whose leading stride is 0 (``bias.expand(M, N)`` in torch).
Interleaved-32 layouts take contiguous tensors of rows * cols elements in the interleaved order.
Anything else raises ArgumentError naming the operand; nothing is copied to "fix" a view.
"""
from __future__ import annotations

from dataclasses import dataclass

from ...description.types import LayoutType
from ...errors import ArgumentError
from ...runtime.tensors import TensorInfo


@dataclass(frozen=True)
class MatrixGeometry:
    ld: int
    batch_stride: int
    broadcast: bool = False


def _packed_ld(layout: LayoutType, rows: int, cols: int) -> int:
    if layout is LayoutType.RowMajor:
        return max(cols, 1)
    if layout is LayoutType.ColumnMajor:
        return max(rows, 1)
    if layout is LayoutType.ColumnMajorInterleaved32:
        return 32 * rows
    if layout is LayoutType.RowMajorInterleaved32:
        return 32 * cols
    raise ArgumentError(f"layout {layout.value} is not a matrix layout")


def _ld_from_strides(info: TensorInfo, layout: LayoutType, rows: int, cols: int, row_stride: int,
                     col_stride: int, allow_broadcast: bool) -> tuple[int, bool]:
    if layout is LayoutType.RowMajor:
        unit, ld, extent, needed = col_stride, row_stride, rows, cols
    else:
        unit, ld, extent, needed = row_stride, col_stride, cols, rows
    contiguous_dim = cols if layout is LayoutType.RowMajor else rows
    if unit != 1 and contiguous_dim > 1:
        raise ArgumentError(
            f"{info.name}: a {layout.value} operand needs unit stride along its "
            f"{'columns' if layout is LayoutType.RowMajor else 'rows'}, but the tensor's strides are "
            f"{info.strides}; pass a {'row' if layout is LayoutType.RowMajor else 'column'}-contiguous view or "
            f"change the operation's layout")
    if extent <= 1:
        return _packed_ld(layout, rows, cols), False  # the kernel never steps along this dimension
    if ld == 0 and allow_broadcast:
        return 0, True
    if ld < needed:
        raise ArgumentError(f"{info.name}: leading stride {ld} is smaller than the {needed} elements of one "
                            f"{'row' if layout is LayoutType.RowMajor else 'column'}; rows would overlap")
    return ld, False


def matrix_geometry(info: TensorInfo, layout: LayoutType, rows: int, cols: int, batch: int,
                    allow_broadcast: bool = False) -> MatrixGeometry:
    shape, strides = info.shape, info.strides
    expected = f"({rows}, {cols})" if batch == 1 else f"({batch}, {rows}, {cols})"
    if rows == 0 or cols == 0:
        # An empty operand is never addressed, and libraries report arbitrary strides for it (torch: (0, 0)).
        if info.numel != 0:
            raise ArgumentError(f"{info.name}: expected shape {expected}, got {shape}")
        return MatrixGeometry(_packed_ld(layout, rows, cols), rows * cols)
    if layout.is_interleaved:
        if info.numel != batch * rows * cols or not info.is_contiguous:
            raise ArgumentError(f"{info.name}: an interleaved {layout.value} operand must be a contiguous tensor of "
                                f"{batch * rows * cols} elements in interleaved order; got shape {shape}, strides "
                                f"{strides}")
        return MatrixGeometry(_packed_ld(layout, rows, cols), rows * cols)
    if len(shape) == 1:
        if strides and strides[0] != 1 and shape[0] > 1:
            raise ArgumentError(f"{info.name}: a 1-D operand must be contiguous, got stride {strides[0]}")
        if shape[0] == batch * rows * cols:
            return MatrixGeometry(_packed_ld(layout, rows, cols), rows * cols)
        vector = cols if layout is LayoutType.RowMajor else rows
        if allow_broadcast and shape[0] == vector:
            return MatrixGeometry(0, 0, broadcast=True)
        hint = f" or a bias vector of {vector}" if allow_broadcast else ""
        raise ArgumentError(f"{info.name}: 1-D operand has {shape[0]} elements; expected {batch * rows * cols} "
                            f"(packed {expected}){hint}")
    if len(shape) == 2:
        if batch != 1:
            raise ArgumentError(f"{info.name}: with batch {batch} pass a 3-D tensor of shape {expected} "
                                f"(use a batch stride of 0 to reuse one matrix); got shape {shape}")
        if allow_broadcast and shape == (1, cols) and layout is LayoutType.RowMajor and rows > 1:
            return MatrixGeometry(0, 0, broadcast=True)
        if shape != (rows, cols):
            raise ArgumentError(f"{info.name}: expected shape {expected}, got {shape}")
        ld, broadcast = _ld_from_strides(info, layout, rows, cols, strides[0], strides[1], allow_broadcast)
        return MatrixGeometry(ld, rows * cols, broadcast)
    if len(shape) == 3:
        if shape != (batch, rows, cols):
            raise ArgumentError(f"{info.name}: expected shape {expected}, got {shape}")
        ld, broadcast = _ld_from_strides(info, layout, rows, cols, strides[1], strides[2], allow_broadcast)
        return MatrixGeometry(ld, strides[0] if batch > 1 else rows * cols, broadcast)
    raise ArgumentError(f"{info.name}: expected a 1-D, 2-D or 3-D tensor of shape {expected}, got shape {shape}")



def elements_distinct(extents_and_strides) -> bool:
    """Whether a strided view gives every element its own address: taking its dimensions by increasing stride,
    each stride must step past everything the smaller ones reach. That decides every view made by slicing and
    permuting a contiguous tensor, such as a batched (B, M, N) view of (M, B, N) memory, whose batches interleave
    row by row without sharing an element; a view it cannot decide counts as overlapping."""
    reach = 0
    for extent, stride in sorted(((e, abs(s)) for e, s in extents_and_strides if e > 1), key=lambda d: d[1]):
        if stride <= reach:
            return False
        reach += (extent - 1) * stride
    return True


def check_output_geometry(info: TensorInfo, geometry: MatrixGeometry, layout: LayoutType, rows: int, cols: int,
                          batch: int) -> None:
    """Outputs may not broadcast, and no two of their elements may share an address: two tiles would race."""
    if geometry.broadcast:
        raise ArgumentError(f"{info.name}: the output cannot be a broadcast view")
    if batch > 1 and rows and cols:
        if layout.is_interleaved:
            apart = abs(geometry.batch_stride) >= rows * cols
        else:
            contiguous, strided = (cols, rows) if layout is LayoutType.RowMajor else (rows, cols)
            apart = elements_distinct(((contiguous, 1), (strided, geometry.ld), (batch, geometry.batch_stride)))
        if not apart:
            raise ArgumentError(f"{info.name}: batch stride {geometry.batch_stride} with leading dimension "
                                f"{geometry.ld} makes output matrices overlap (batches of {rows} x {cols} must not "
                                f"share an element)")
