"""GemmGroupedArguments for SM90 grouped operations: the surface of the Sm80-family grouped GEMM (lists of tensors,
one per group), plus the group scheduler's runtime knobs. ``GemmGroupedArguments(op, ...)`` hands out this class
when ``op`` is an SM90 grouped operation.

One device buffer holds the per-group arrays the kernel reads: sizes (``Shape<int, int, int>``), A/B/C/D pointers and
CUTLASS's internal strides (one int64 leading dimension each; the builder checks that layout on the device). The
workspace holds the per-SM tensormap slots the kernel rewrites per group. Both belong to the arguments.

Zero-sized groups: M == 0 or N == 0 has no output tile (the scheduler skips it). K == 0 must still write
D = epilogue(beta * C), but CUTLASS's main loop leaves the accumulators unset when a tile has no K iteration, so such a
group runs with K = one 16-byte vector and A and B pointing at a zeroed stand-in: the product is exactly 0.

Device-side sizes (``problem_sizes`` an int32 device tensor of shape (groups, 3) or (groups,)): the operands are one
packed A (rows x K, RowMajor), one packed D (and C) (rows x N, RowMajor), and B as a (groups, K, N) tensor or a list
of groups matrices. The host knows only the group count and the bounds (rows, N, K); a small kernel
(``<name>_sizes``) runs before every launch and turns the sizes into the per-group arrays (each group's first row is
the sum of the M before it), clamping every size to the bounds, so the grouped kernel never leaves the caller's
tensors whatever the sizes. Violations are reported in a sticky device flag (``size_flags()``, ``check_sizes()``).
The masked layout (decode under CUDA graphs) passes A, C and D as (groups, capacity, columns) instead: group g's
rows start its own slab and its M (at most the capacity) is read from the sizes; rows past it are not written.

Block-wise scales (operations built with ``scales="blockwise"``) take device-side sizes only: the sizes kernel points
every group at its scales and computes their CuTe layouts (CUTLASS's for the group's shape, with the caller's strides).
"""
from __future__ import annotations

import ctypes
import functools

import numpy as np

from ...description.types import DataType, LayoutType
from ...emit.abi import fill_epilogue
from ...errors import ArgumentError
from ...runtime import driver
from ...runtime.arguments import OperationArguments
from ...runtime.tensors import describe, storage_type
from ..families.arguments import coerce_output_op
from ..families.matrix import matrix_geometry
from ..families.grouped_arguments import (fill_group_arrays, is_device_sizes, pack_arrays, pack_problem_arrays,
                                          plural_alias, problem_arrays)
from ..families.sm90_arguments import (  # noqa: F401  (their names as this module had them)
    GROUP_RASTER_ORDERS as RASTER_ORDERS, check_group_knobs, check_sm_count, check_workspace, persistent_sm_count)
from ..gemm_grouped.arguments import GemmGroupedArguments
from ..families.sm90_ptr_array import BLOCK_SCALE, SCALE_LAYOUT_BYTES
from .abi import SIZE_FLAGS
from .operation import GemmOperationGroupedSm90

_TMA_BYTES = 16  # TMA: 16-byte aligned addresses and strides
_FLAGS_BYTES = 16  # the device-sizes kernel's sticky flag word (int32), padded


def _part_pointers(parts, address_of) -> np.ndarray:
    """Per group, its tensor's address (each tensor resolved once) plus the group's byte offset; 0 for an empty
    tensor. ``parts``: (TensorInfo, byte offset) per group."""
    bases, pointers = {}, np.zeros(len(parts), dtype=np.uint64)
    for g, (info, offset) in enumerate(parts):
        if id(info) not in bases:
            bases[id(info)] = address_of(info) if info.numel else 0
        pointers[g] = bases[id(info)] + offset if bases[id(info)] else 0
    return pointers


class GemmGroupedArgumentsSm90(GemmGroupedArguments):
    """``GemmGroupedArguments(op, problem_sizes, As, Bs, Cs, Ds, output_op=None, stream=None, device=None,
    session=None, *, raster_order=None, swizzle=None, sm_count=None)`` for an SM90 grouped operation.

    As for the Sm80-family kernel, except: C may not be a broadcast vector (TMA reads whole matrices), and the knobs
    ``raster_order`` ("along_m" (default), "along_n", "heuristic"), ``swizzle`` (1, 2, 4, 8; default from the
    operation's IdentitySwizzleN) and ``sm_count`` (SMs the persistent grid may use, a multiple of the cluster size;
    default all, rounded down to whole clusters) need no recompile.

    ``alpha=``: per-group alphas (one float32 per group, e.g. an fp8 MoE's scale_a[g] * scale_b[g]) in place of the
    epilogue's scalar alpha: a float32 device tensor of shape (groups,) is read by every launch (update it in place,
    also under a CUDA graph); a host sequence or array is copied when the arguments are built.
    After building, ``threadblock_count`` is the persistent grid (CTAs) and ``tile_count`` the group's output tiles.
    """

    operation_type = GemmOperationGroupedSm90

    def __init__(self, operation, problem_sizes, As=None, Bs=None, Cs=None, Ds=None, output_op=None, stream=None,
                 device=None, session=None, *, A=None, B=None, C=None, D=None, raster_order=None, swizzle=None,
                 sm_count=None, bias=None, alpha=None, scale_a=None, scale_b=None):
        if A is not None or B is not None or C is not None or D is not None:
            As, Bs, Cs, Ds = (plural_alias(plural, plural_value, single, single_value)
                              for plural, plural_value, single, single_value in
                              (("As", As, "A", A), ("Bs", Bs, "B", B), ("Cs", Cs, "C", C), ("Ds", Ds, "D", D)))
        if not isinstance(operation, GemmOperationGroupedSm90):
            raise ArgumentError(f"GemmGroupedArgumentsSm90 needs an SM90 GemmOperationGrouped, got "
                                f"{type(operation).__name__}")
        self._knobs = check_group_knobs(operation, raster_order, swizzle, sm_count)
        if bias is not None and operation.bias is None:
            raise ArgumentError(f"{operation.name} was built without a bias; build it with bias='column' to pass bias=")
        if bias is None and operation.bias is not None:
            raise ArgumentError(f"{operation.name} adds a bias vector per group (N values); pass them as bias=")
        given = (scale_a is not None, scale_b is not None)
        if any(given) and not operation.scales:
            raise ArgumentError(f"{operation.name} was built without row-wise scales; build it with "
                                f"scales='rowwise' (or 'blockwise' for fp8) to pass scale_a= and scale_b=")
        if operation.scales == "rowwise" and not all(given):
            raise ArgumentError(f"{operation.name} scales every row of A and column of B (scales='rowwise'); pass "
                                f"both scale_a= (M float32 values per group) and scale_b= (N per group)")
        if operation.scales == "blockwise" and not all(given):
            raise ArgumentError(f"{operation.name} scales every 1x128 block of A and 128x128 block of B "
                                f"(scales='blockwise'); pass both scale_a= (rows, ceil(K/128)) and scale_b= (groups, "
                                f"ceil(N/128), ceil(K/128)), float32")
        self._bias = bias
        self._scale_a, self._scale_b = scale_a, scale_b
        self._scale_a_parts, self._scale_b_parts, self._scale_a_info = [], [], None
        self._alpha = alpha
        self._alpha_info = self._alpha_host = None
        self._sizes_launch = None
        self.masked = False
        self.device_sizes = is_device_sizes(problem_sizes)
        if operation.scales == "blockwise" and not self.device_sizes:
            raise ArgumentError(f"{operation.name}: block-wise scales take the group sizes as an int32 device tensor "
                                f"((groups,) M per group, or (groups, 3)) with packed or masked operands (the sizes "
                                f"kernel computes every group's scale layouts on the device); got host sizes")
        if self.device_sizes:
            self._validate_device_sizes(operation, problem_sizes, As, Bs, Cs, Ds, output_op, stream, device, session)
        else:
            self._validate_and_prepare(operation, problem_sizes, As, Bs, Cs, Ds, output_op, stream, device, session)

    @property
    def group_count(self) -> int:
        return self._group_count if self.device_sizes else len(self.problem_sizes)

    def _describe_operand(self, index: int, label: str, tensor, rows: int, cols: int, desc):
        info, geometry = super()._describe_operand(index, label, tensor, rows, cols, desc)
        if label == "C" and geometry.broadcast:
            raise ArgumentError(f"Cs[{index}] (problem {index}, operand C): C broadcast from a vector is not built for "
                                f"SM90 grouped operations (TMA reads whole matrices); pass an M x N matrix")
        return info, geometry

    # --- bias vectors (operations built with bias="column") ------------------------------------------------
    def _describe_bias(self, widths: list[int], device_only: bool) -> None:
        """``bias=``: a list of one vector per group (group g's at least ``widths[g]`` values), or one 2-D tensor
        (groups, X) with unit column stride and X >= every width. Keeps, per group, (TensorInfo, byte offset)."""
        element = storage_type(self.operation.C.element)
        self._bias_parts = [] if self._bias is None else \
            _vector_parts("bias", self._bias, widths, element, device_only, "N", "is added in C's element type")

    # --- row-wise scales (operations built with scales="rowwise") -------------------------------------------------
    def _describe_scales(self, rows: list[int], widths: list[int], device_only: bool) -> None:
        """Host sizes: ``scale_b=`` as a bias (a list of vectors or a (groups, N) tensor); ``scale_a=`` the same form
        with M values per group, or one 1-D tensor of sum(M) values (the groups' rows one after the other)."""
        if not self.operation.scales:
            return
        f32 = DataType.float32
        self._scale_b_parts = _vector_parts("scale_b", self._scale_b, widths, f32, device_only, "N", "is float32")
        value = self._scale_a
        if not isinstance(value, (list, tuple)):
            info = describe(value, "scale_a")
            if len(info.shape) == 1:  # packed: group g's scales start after the rows before it
                total = sum(rows)
                if info.shape[0] < total or (info.shape[0] > 1 and info.strides[0] != 1):
                    raise ArgumentError(f"scale_a: a 1-D scale_a holds every group's rows one after the other: "
                                        f"expected a contiguous vector of at least {total} values, got shape "
                                        f"{info.shape}, strides {info.strides}")
                _check_vector_kind(info, f32, device_only, "is float32")
                offsets = np.concatenate([[0], np.cumsum(rows)[:-1]]).astype(np.int64) * info.itemsize
                self._scale_a_parts = [(info, int(offset)) for offset in offsets]
                return
        self._scale_a_parts = _vector_parts("scale_a", value, rows, f32, device_only, "M", "is float32")

    def _describe_device_scales(self, count: int, rows: int, n_cap: int, k_cap: int) -> None:
        """Device sizes: ``scale_b=`` as for host sizes; ``scale_a=`` a (rows,) float32 device vector beside the
        packed A, or (groups, capacity) in the masked layout; the sizes kernel points each group at its rows."""
        if not self.operation.scales:
            return
        if self.operation.scales == "blockwise":
            self._describe_block_scales(count, rows, n_cap, k_cap)
            return
        f32 = DataType.float32
        self._scale_b_parts = _vector_parts("scale_b", self._scale_b, [n_cap] * count, f32, True, "N", "is float32")
        info = describe(self._scale_a, "scale_a")
        _check_vector_kind(info, f32, True, "is float32")
        expected = (count, rows) if self.masked else (rows,)
        if info.shape != expected or (rows > 1 and info.strides[-1] != 1):
            form = f"({count}, {rows}): a row of capacity scales per group (the masked layout)" if self.masked else \
                f"({rows},): one per row of the packed A"
            raise ArgumentError(f"scale_a: expected a float32 tensor of shape {form}, with unit stride along the "
                                f"rows; got shape {info.shape}, strides {info.strides}")
        self._scale_a_info = info
        self._scale_a_group_bytes = info.strides[0] * info.itemsize if self.masked and count > 1 else 0

    def _describe_block_scales(self, count: int, rows: int, n_cap: int, k_cap: int) -> None:
        """Block-wise scales (device sizes): ``scale_a`` (rows, ceil(K/128)) with unit stride along the rows (each K
        block's M values contiguous, as DeepGEMM and torch's block-wise scaled_mm keep them: ``s.t().contiguous().t()``
        of a (rows, ceil(K/128)) tensor), the groups' rows concatenated as in the packed A; in the masked layout
        (groups, capacity, ceil(K/128)), M-major per group. ``scale_b`` (groups, ceil(N/128), ceil(K/128)), K blocks
        contiguous. Strides between K blocks (scale_a) and N blocks (scale_b) are free (padded for alignment is
        fine): the sizes kernel writes them into each group's layout. Lists of per-group tensors are refused: the
        sizes kernel addresses every group from one base."""
        f32 = DataType.float32
        k_blocks, n_blocks = -(-k_cap // BLOCK_SCALE[2]), -(-n_cap // BLOCK_SCALE[1])
        for name, value in (("scale_a", self._scale_a), ("scale_b", self._scale_b)):
            if isinstance(value, (list, tuple)):  # the sizes kernel addresses every group from one base
                raise ArgumentError(f"{name}: block-wise scales are one tensor for all groups (see below), got a list")
        a_info = describe(self._scale_a, "scale_a")
        b_info = describe(self._scale_b, "scale_b")
        for info in (a_info, b_info):
            _check_vector_kind(info, f32, True, "is float32")
            if info.numel and info.device_address % 4:
                raise ArgumentError(f"{info.name}: address {info.device_address:#x} is not 4-byte aligned")
        a_shape = (count, rows, k_blocks) if self.masked else (rows, k_blocks)
        m_stride = a_info.strides[-2] if len(a_info.shape) == len(a_shape) else None
        ld_a = a_info.strides[-1] if len(a_info.shape) == len(a_shape) else None
        if a_info.shape != a_shape or (rows > 1 and m_stride != 1) or (k_blocks > 1 and ld_a < rows):
            form = f"({count}, {rows}, {k_blocks}) (groups, capacity, ceil(K/128)), M-major per group" if self.masked \
                else f"({rows}, {k_blocks}) (rows of the packed A, ceil(K/128))"
            raise ArgumentError(f"scale_a: block-wise scales of A are a float32 tensor {form}, with unit stride along "
                                f"M (each K block's rows contiguous: s.t().contiguous().t() of a row-major tensor) "
                                f"and at least M between K blocks; got shape {a_info.shape}, strides {a_info.strides}")
        b_shape = (count, n_blocks, k_blocks)
        if b_info.shape != b_shape or (k_blocks > 1 and b_info.strides[2] != 1) or \
                (n_blocks > 1 and b_info.strides[1] < k_blocks):
            raise ArgumentError(f"scale_b: block-wise scales of B are one float32 tensor {b_shape} (groups, "
                                f"ceil(N/128), ceil(K/128)) with contiguous K blocks; got shape {b_info.shape}, "
                                f"strides {b_info.strides}")
        ld_b = b_info.strides[1]
        if max(ld_a or 0, ld_b) >= 2 ** 31:
            raise ArgumentError("scale_a / scale_b: strides of 2^31 elements or more do not fit CUTLASS's int32 "
                                "scale layouts")
        self._scale_a_info, self._scale_b_info = a_info, b_info
        self._scale_a_group_bytes = a_info.strides[0] * 4 if self.masked else 0
        self._scale_a_ld = ld_a if k_blocks > 1 else max(rows, 1)
        self._scale_b_group_bytes, self._scale_b_ld = b_info.strides[0] * 4, ld_b if n_blocks > 1 else k_blocks

    def _scale_pointers(self) -> list:
        """The per-group scale pointer arrays to upload with the per-group arrays (host sizes: both)."""
        if not self.operation.scales:
            return []
        return [("ptr_scale_a", _part_pointers(self._scale_a_parts, self.tensors.address)),
                ("ptr_scale_b", _part_pointers(self._scale_b_parts, self.tensors.address))]

    # --- per-group alphas -----------------------------------------------------------------------------------
    def _describe_alpha(self, count: int) -> None:
        """``alpha=``: G float32 values. A device tensor is referenced (read at every launch); host values are kept
        to be uploaded with the per-group arrays."""
        alpha = self._alpha
        if alpha is None:
            return
        if isinstance(alpha, (int, float)) and not isinstance(alpha, bool):
            raise ArgumentError("alpha=: pass one value per group (a sequence or a float32 tensor of shape (groups,)); "
                                "a single alpha goes in output_op")
        if isinstance(alpha, (list, tuple)):
            values = np.asarray(alpha, dtype=np.float64)
            if values.shape != (count,) or not np.all(np.isfinite(values)):
                raise ArgumentError(f"alpha=: expected {count} finite values (one per group), got "
                                    f"{len(alpha)} value(s)" + ("" if values.shape != (count,) else " with inf/NaN"))
            self._alpha_host = values.astype(np.float32)
            return
        info = describe(alpha, "alpha")
        if info.element is not DataType.float32:
            raise ArgumentError(f"alpha: per-group alphas are float32, got {info.element.label}")
        if info.shape != (count,) or (count > 1 and info.strides[0] != 1):
            raise ArgumentError(f"alpha: expected a contiguous vector of {count} values (one per group), got shape "
                                f"{info.shape}, strides {info.strides}")
        if info.kind == "device":
            if info.device_address % 4:
                raise ArgumentError(f"alpha: address {info.device_address:#x} is not 4-byte aligned")
            self._alpha_info = info
        else:
            values = np.ascontiguousarray(info.host_array, dtype=np.float32).reshape(count)
            if not np.all(np.isfinite(values)):
                raise ArgumentError(f"alpha: expected {count} finite values (one per group), got inf/NaN")
            self._alpha_host = values

    def _alpha_array(self) -> list:
        """The per-group alphas to upload with the per-group arrays (host values only)."""
        return [("alpha", self._alpha_host)] if self._alpha_host is not None else []

    def _alpha_pointer(self) -> int:
        if self._alpha_info is not None:
            return self.tensors.address(self._alpha_info)
        return self.device_arrays.get("alpha", 0)

    def _bias_pointers(self) -> np.ndarray:
        return _part_pointers(self._bias_parts, self.tensors.address)

    def _materialize(self) -> None:
        if not self.device_sizes:
            self._describe_bias([n for _, n, _ in self.problem_sizes], device_only=False)
            self._describe_scales([m for m, _, _ in self.problem_sizes], [n for _, n, _ in self.problem_sizes],
                                  device_only=False)
            self._describe_alpha(len(self.problem_sizes))
        super()._materialize()

    def _tensor_infos(self) -> list:
        vectors = [*getattr(self, "_bias_parts", []), *self._scale_a_parts, *self._scale_b_parts]
        if self._scale_a_info is not None:
            vectors.append((self._scale_a_info, 0))
        if getattr(self, "_scale_b_info", None) is not None:
            vectors.append((self._scale_b_info, 0))
        extra = list({id(info): info for info, _ in vectors}.values())  # bias and scale vectors
        if self._alpha_info is not None:
            extra.append(self._alpha_info)
        if self.device_sizes:
            return [self._sizes_info, *self._packed.values(), *self._b_infos, *extra]
        return super()._tensor_infos() + extra

    def _written(self) -> list:
        return [self._packed["D"]] if self.device_sizes else super()._written()

    def _read(self) -> list:
        if not self.device_sizes:
            return super()._read()
        unread = self._packed.get("C") if self.output_op.beta == 0 else None  # no source is loaded
        return [info for info in self._tensor_infos() if info is not unread]

    def _in_place(self) -> list:
        if not self.device_sizes:
            return super()._in_place()
        return [(self._packed["D"], self._packed["C"])] if "C" in self._packed else []

    # --- device-side sizes ------------------------------------------------------------------------------------
    def _validate_device_sizes(self, op, sizes, As, Bs, Cs, Ds, output_op, stream, device, session) -> None:
        OperationArguments.__init__(self, op, stream, device, session)
        info = describe(sizes, "problem_sizes")
        shape, strides = info.shape, info.strides
        if info.kind != "device":
            raise ArgumentError("problem_sizes: a tensor of sizes must be device memory (int32, shape (groups, 3) or "
                                "(groups,)); pass host sizes as a list of (M, N, K)")
        if info.element is not DataType.int32:
            raise ArgumentError(f"problem_sizes: the sizes must be int32, got {info.element.label}")
        if len(shape) == 2 and shape[1] == 3 and (shape[0] <= 1 or strides == (3, 1)):
            columns = 3
        elif len(shape) == 1 and (shape[0] <= 1 or strides == (1,)):
            columns = 1
        else:
            raise ArgumentError(f"problem_sizes: expected a contiguous int32 tensor of shape (groups, 3) (M, N, K per "
                                f"group) or (groups,) (M per group), got shape {shape}, strides {strides}")
        count = shape[0]
        if count < 1:
            raise ArgumentError("problem_sizes: at least one group is needed")
        if op.A.layout is not LayoutType.RowMajor or op.C.layout is not LayoutType.RowMajor:
            raise ArgumentError(f"{op.name}: device-side sizes pack the groups' rows into one A and one D, so A and C "
                                f"must be RowMajor (got A {op.A.layout.value}, C {op.C.layout.value})")
        self._sizes_info, self._columns, self._group_count = info, columns, count
        self.problem_sizes = sizes
        self.tile_count = None  # known on the device only
        self.output_op = coerce_output_op(op, output_op)

        def one(name, value):
            if isinstance(value, (list, tuple)):
                if len(value) != 1:
                    raise ArgumentError(f"{name}: with device-side sizes pass one packed tensor (rows x columns, the "
                                        f"groups' rows one after the other), got a list of {len(value)}")
                value = value[0]
            return value

        a_tensor = one("As", As)
        # A 3-D A (groups, capacity, K) is the masked layout: group g's rows start its own slab.
        self.masked = a_tensor is not None and len(describe(a_tensor, "As").shape) == 3
        matrix = functools.partial(self._device_slabs, groups=count) if self.masked else self._device_matrix
        a_info = matrix("As", a_tensor, op.A, None, None)
        rows, k_cap = a_info.shape[-2:]
        d_info = matrix("Ds", one("Ds", Ds), op.C, rows, None)
        n_cap = d_info.shape[-1]
        packed = {"A": a_info, "D": d_info}
        if Cs is not None and one("Cs", Cs) is not None:
            packed["C"] = matrix("Cs", one("Cs", Cs), op.C, rows, n_cap)
        elif self.output_op.beta != 0:
            raise ArgumentError(f"Cs is None but beta is {self.output_op.beta}; pass C or set beta to 0")
        self._packed = packed
        self._b_infos, self._b_parts, self._ldb = self._device_b(op, Bs, count, k_cap, n_cap)
        self._caps = (rows, n_cap, k_cap)
        self._describe_bias([n_cap] * count, device_only=True)
        self._describe_device_scales(count, rows, n_cap, k_cap)
        self._describe_alpha(count)
        self._materialize()

    @staticmethod
    def _device_operand(name, tensor, desc):
        """A device tensor of the operand's element type (device-side sizes take nothing else)."""
        if tensor is None:
            raise ArgumentError(f"{name}: a tensor is required, got None")
        info = describe(tensor, name)
        if info.kind != "device":
            raise ArgumentError(f"{name}: with device-side sizes every tensor must be device memory (the launch is "
                                f"meant to be captured in a CUDA graph); got a host tensor")
        if info.element is not storage_type(desc.element):
            raise ArgumentError(f"{name}: the operation expects {storage_type(desc.element).label} elements, got "
                                f"{info.element.label}")
        return info

    def _device_matrix(self, name, tensor, desc, rows, cols):
        """A packed RowMajor operand on the device: (rows, cols) where given, aligned for TMA."""
        info = self._device_operand(name, tensor, desc)
        if len(info.shape) != 2:
            raise ArgumentError(f"{name}: expected one packed 2-D tensor (rows x columns), got shape {info.shape}")
        if (rows is not None and info.shape[0] != rows) or (cols is not None and info.shape[1] != cols):
            raise ArgumentError(f"{name}: expected shape ({rows}, {cols if cols is not None else 'N'}) (the rows of "
                                f"the packed A), got {info.shape}")
        geometry = matrix_geometry(info, LayoutType.RowMajor, info.shape[0], info.shape[1], 1)
        info.ld = geometry.ld
        if info.numel:
            if geometry.broadcast:
                raise ArgumentError(f"{name}: a packed operand cannot be a broadcast view")
            if info.shape[1] % desc.alignment or geometry.ld % desc.alignment:
                raise ArgumentError(f"{name}: columns {info.shape[1]} and leading dimension {geometry.ld} must be "
                                    f"multiples of the operation's alignment {desc.alignment} (each group's rows "
                                    f"must start 16-byte aligned)")
            if info.device_address % _TMA_BYTES:
                raise ArgumentError(f"{name}: address {info.device_address:#x} is not 16-byte aligned (TMA)")
        return info

    def _device_slabs(self, name, tensor, desc, rows, cols, *, groups):
        """A masked-layout operand: (groups, capacity, cols), each group's slab RowMajor, aligned for TMA."""
        info = self._device_operand(name, tensor, desc)
        if len(info.shape) != 3 or info.shape[0] != groups or (rows is not None and info.shape[1] != rows) or \
                (cols is not None and info.shape[2] != cols):
            raise ArgumentError(f"{name}: the masked layout (a 3-D A) takes every operand as (groups, capacity, "
                                f"columns) = ({groups}, {rows if rows is not None else 'capacity'}, "
                                f"{cols if cols is not None else 'columns'}), got shape {info.shape}")
        capacity, columns = info.shape[1:]
        geometry = matrix_geometry(info, LayoutType.RowMajor, capacity, columns, groups)
        info.ld, info.group_bytes = geometry.ld, geometry.batch_stride * info.itemsize
        if info.numel:
            if geometry.broadcast or (groups > 1 and geometry.batch_stride < capacity * geometry.ld):
                raise ArgumentError(f"{name}: the groups' slabs overlap (stride between groups "
                                    f"{geometry.batch_stride} elements for {capacity} rows of {geometry.ld})")
            if columns % desc.alignment or geometry.ld % desc.alignment or info.group_bytes % _TMA_BYTES:
                raise ArgumentError(f"{name}: columns {columns}, leading dimension {geometry.ld} and the stride "
                                    f"between groups ({geometry.batch_stride} elements) must keep every row "
                                    f"16-byte aligned (multiples of the operation's alignment {desc.alignment})")
            if info.device_address % _TMA_BYTES:
                raise ArgumentError(f"{name}: address {info.device_address:#x} is not 16-byte aligned (TMA)")
        return info

    def _device_b(self, op, Bs, count, k_cap, n_cap):
        """B as one (groups, K, N) tensor or a list of groups (K, N) matrices: per-group pointers, one ld."""
        desc = op.B
        element = storage_type(desc.element)
        contiguous = n_cap if desc.layout is LayoutType.RowMajor else k_cap
        if contiguous % desc.alignment:
            raise ArgumentError(f"Bs: B's contiguous extent ({'N' if desc.layout is LayoutType.RowMajor else 'K'} = "
                                f"{contiguous}) must be a multiple of the operation's alignment {desc.alignment}")

        def check(info):
            if info.kind != "device":
                raise ArgumentError(f"{info.name}: with device-side sizes every tensor must be device memory")
            if info.element is not element:
                raise ArgumentError(f"{info.name}: the operation expects {element.label} elements, got "
                                    f"{info.element.label}")
            if info.numel and info.device_address % _TMA_BYTES:
                raise ArgumentError(f"{info.name}: address {info.device_address:#x} is not 16-byte aligned (TMA)")

        if isinstance(Bs, (list, tuple)):
            if len(Bs) != count:
                raise ArgumentError(f"Bs has {len(Bs)} matrices but problem_sizes has {count} groups")
            infos, lds = [], set()
            for g, tensor in enumerate(Bs):
                info = describe(tensor, f"Bs[{g}]")
                check(info)
                geometry = matrix_geometry(info, desc.layout, k_cap, n_cap, 1)
                lds.add(geometry.ld)
                infos.append(info)
            if len(lds) > 1:
                raise ArgumentError(f"Bs: every B must have the same leading dimension (one per launch), got "
                                    f"{sorted(lds)}")
            ld = lds.pop()
            parts = [(info, 0) for info in infos]
        else:
            if Bs is None:
                raise ArgumentError("Bs: a (groups, K, N) tensor or a list of groups (K, N) matrices is required")
            info = describe(Bs, "Bs")
            check(info)
            if len(info.shape) != 3:
                raise ArgumentError(f"Bs: expected a ({count}, {k_cap}, N) tensor or a list of {count} matrices, got "
                                    f"shape {info.shape}")
            geometry = matrix_geometry(info, desc.layout, k_cap, n_cap, count)
            ld = geometry.ld
            if count > 1 and (geometry.batch_stride * info.itemsize) % _TMA_BYTES:
                raise ArgumentError(f"Bs: the stride between groups ({geometry.batch_stride} elements) must keep "
                                    f"every matrix 16-byte aligned (TMA)")
            infos = [info]
            parts = [(info, g * geometry.batch_stride * info.itemsize) for g in range(count)]
        if k_cap and n_cap and ld % desc.alignment:
            raise ArgumentError(f"Bs: leading dimension {ld} is not a multiple of the operation's B alignment "
                                f"{desc.alignment}")
        return infos, parts, ld

    def _allocate_device_sizes(self) -> None:
        op = self.operation
        count = self._group_count
        rows, n_cap, k_cap = self._caps
        a_info, d_info, c_info = (self._packed.get(x) for x in "ADC")
        address = {label: (self.tensors.address(info, is_output=label == "D") if info.numel else 0)
                   for label, info in self._packed.items()}
        b_pointers = _part_pointers(self._b_parts, lambda info: info.device_address)
        ld_d = d_info.ld
        ld_c = c_info.ld if c_info is not None else ld_d
        arrays = [("problem_sizes", np.zeros((count, 3), dtype=np.int32))] + \
            [(f"ptr_{x}", np.zeros(count, dtype=np.uint64)) for x in "ABCD"] + \
            [("lda", np.zeros(count, dtype=np.int64)), ("ldb", np.zeros(count, dtype=np.int64)),
             ("ldc", np.full(count, ld_c, dtype=np.int64)), ("ldd", np.full(count, ld_d, dtype=np.int64)),
             ("b_pointers", b_pointers)]
        if op.bias:
            arrays.append(("ptr_bias", self._bias_pointers()))
        if op.scales == "blockwise":  # the sizes kernel writes all four (a K = 0 group reads the stand-in)
            arrays += [("ptr_scale_a", np.zeros(count, dtype=np.uint64)),
                       ("ptr_scale_b", np.zeros(count, dtype=np.uint64)),
                       ("layout_scale_a", np.zeros(count * SCALE_LAYOUT_BYTES, dtype=np.uint8)),
                       ("layout_scale_b", np.zeros(count * SCALE_LAYOUT_BYTES, dtype=np.uint8))]
        elif op.scales:  # the sizes kernel writes ptr_scale_a; scale_b's pointers are known here
            arrays += [("ptr_scale_a", np.zeros(count, dtype=np.uint64)),
                       ("ptr_scale_b", _part_pointers(self._scale_b_parts, self.tensors.address))]
        arrays += self._alpha_array()
        blob, offsets = pack_arrays(arrays)
        base = self.tensors.upload(blob)
        self.device_arrays = {field: base + offset for field, offset in offsets.items()}
        self._flags = self.tensors.zeros(_FLAGS_BYTES)

        # The zeroed stand-in that A and B of K = 0 groups read (as for host sizes), sized for the bounds.
        k_may_be_zero = self._columns == 3 or k_cap == 0
        stand_in_k = op.empty_k_stand_in
        ldb_stand_in = stand_in_k if op.B.layout is LayoutType.ColumnMajor else \
            -(-max(n_cap, 1) // op.B.alignment) * op.B.alignment
        stand_in = 0
        if k_may_be_zero:
            # A and B both start at the stand-in: A is rows x K' (K' apart), B K' x N_cap (columns K' apart, or K'
            # rows ldb apart), so it must hold the larger of the two
            b_elements = stand_in_k * (ldb_stand_in if op.B.layout is LayoutType.RowMajor else
                                       -(-max(n_cap, 1) // op.B.alignment) * op.B.alignment)
            elements = max(stand_in_k * max(rows, 1), b_elements)
            if op.scales == "blockwise":  # K = 0 groups read zero scales there too (M of A's, N / 128 of B's)
                elements = max(elements, 4 * max(rows, -(-n_cap // BLOCK_SCALE[1]), 1) * 8 // op.A.element.bits)
            stand_in = self.tensors.zeros(elements * op.A.element.bits // 8)

        s = op.sizes_struct_type()
        s.group_count, s.columns, s.n_cap, s.k_cap, s.k_stand_in = count, self._columns, n_cap, k_cap, stand_in_k
        # Alignment of the contiguous extents the device must check: N for a RowMajor B and for D (always RowMajor
        # here), K for A (RowMajor) and a ColumnMajor B.
        s.contiguous, s.align_n, s.align_k = 3, max(op.C.alignment, op.B.alignment if op.B.layout is
                                                    LayoutType.RowMajor else 1), \
            max(op.A.alignment, op.B.alignment if op.B.layout is LayoutType.ColumnMajor else 1)
        s.rows_cap, s.sizes = rows, self._sizes_info.device_address
        if self.masked:
            s.group_rows = rows  # the capacity; 0 keeps the packed layout
            s.a_group_bytes, s.d_group_bytes = a_info.group_bytes, d_info.group_bytes
            s.c_group_bytes = c_info.group_bytes if c_info is not None else 0
        s.a_base, s.c_base, s.d_base = address["A"], address.get("C", 0), address["D"]
        item_a, item_c = a_info.itemsize, d_info.itemsize
        s.a_row_bytes, s.c_row_bytes, s.d_row_bytes = a_info.ld * item_a, ld_c * item_c, ld_d * item_c
        s.b_pointers, s.lda_value, s.ldb_value = self.device_arrays["b_pointers"], a_info.ld, self._ldb
        s.stand_in, s.stand_in_lda, s.stand_in_ldb = stand_in, stand_in_k, ldb_stand_in
        s.problem_sizes = self.device_arrays["problem_sizes"]
        s.ptr_A, s.ptr_B, s.ptr_C, s.ptr_D = (self.device_arrays[f"ptr_{x}"] for x in "ABCD")
        s.lda, s.ldb, s.flags = self.device_arrays["lda"], self.device_arrays["ldb"], self._flags
        if op.scales:
            s.scale_a_base = self.tensors.address(self._scale_a_info)
            s.scale_a_group_bytes, s.ptr_scale_a = self._scale_a_group_bytes, self.device_arrays["ptr_scale_a"]
        if op.scales == "blockwise":
            s.scale_a_ld, s.scale_b_base = self._scale_a_ld, self.tensors.address(self._scale_b_info)
            s.scale_b_group_bytes, s.scale_b_ld = self._scale_b_group_bytes, self._scale_b_ld
            s.ptr_scale_b = self.device_arrays["ptr_scale_b"]
            s.layout_scale_a, s.layout_scale_b = (self.device_arrays[f"layout_scale_{x}"] for x in "ab")
        self._sizes_struct = s

    def size_flags(self, reset: bool = False) -> int:
        """The device-sizes kernel's findings since the last reset (synchronizes the stream): a bitmask of
        ``SIZE_FLAGS``; 0 when every size was within the bounds. ``reset`` clears it afterwards."""
        if not self.device_sizes:
            return 0
        holder = ctypes.c_int32()
        self.device.make_current()
        driver.memcpy_dtoh(ctypes.addressof(holder), self._flags, 4, self.stream)
        driver.synchronize_stream(self.stream, self.operation.name)
        if reset:
            driver.memset_d8(self._flags, 0, 4, self.stream)
        return int(holder.value)

    def check_sizes(self, reset: bool = True) -> None:
        """Raise ArgumentError if a run since the last reset met sizes outside the bounds (they were clamped on the
        device; the affected groups' results are wrong or missing)."""
        flags = self.size_flags(reset)
        if flags:
            found = "; ".join(text for bit, text in SIZE_FLAGS.items() if flags & bit)
            rows = f"capacity {self._caps[0]} per group" if self.masked else f"rows {self._caps[0]}"
            raise ArgumentError(f"{self.operation.name}: device-side sizes out of bounds ({rows}, "
                                f"N {self._caps[1]}, K {self._caps[2]}): {found}")

    def before_launch(self) -> None:
        if self._sizes_launch is not None:
            function, parameters, threads = self._sizes_launch
            driver.launch(function, (1, 1, 1), (threads, 1, 1), 0, self.stream, ctypes.addressof(parameters),
                          self.operation.name + " sizes")

    # --- device state ---------------------------------------------------------------------------------------
    def _allocate(self) -> None:
        op = self.operation
        if self.device_sizes:
            self.sm_count = persistent_sm_count(op, self._knobs[2], self.device)
            self.threadblock_count = 0
            self._allocate_device_sizes()
            self.workspace_bytes = op.workspace_bytes(self.sm_count)
            self.workspace = self.tensors.allocate(self.workspace_bytes)
            return
        self.threadblock_count = 0
        self.workspace, self.workspace_bytes = 0, 0
        self.sm_count = persistent_sm_count(op, self._knobs[2], self.device)
        if self.tile_count == 0:  # nothing launches (GemmGroupedArguments._prepare)
            self.device_arrays = {}
            return
        stand_in = self._empty_k_stand_in()
        sizes, pointers, lds = problem_arrays(self.problem_sizes, self._operands, self.tensors.address,
                                              lambda label, m, n: (stand_in, _stand_in_ld(op, label, m, n)),
                                              op.empty_k_stand_in)
        blob, offsets = pack_problem_arrays(sizes, pointers, lds,
                                            ([("ptr_bias", self._bias_pointers())] if op.bias else []) +
                                            self._scale_pointers() + self._alpha_array())
        base = self.tensors.upload(blob)
        self.device_arrays = {field: base + offset for field, offset in offsets.items()}
        # The per-SM tensormap slots; the kernel writes them before reading, so they need no clearing.
        self.workspace_bytes = op.workspace_bytes(self.sm_count)
        self.workspace = self.tensors.allocate(self.workspace_bytes)

    def _empty_k_stand_in(self) -> int:
        """A zeroed buffer that A and B of every K == 0 group read as an M x K' / K' x N matrix (0 when none)."""
        op = self.operation
        extents = [max(m, n) for m, n, k in self.problem_sizes if k == 0 and m and n]
        if not extents:
            return 0
        alignment = max(op.A.alignment, op.B.alignment)
        elements = op.empty_k_stand_in * (-(-max(extents) // alignment) * alignment)
        return self.tensors.zeros(elements * op.A.element.bits // 8)

    def bind(self, loaded_op=None):  # Sm90GroupedGemmArgs, or Sm90BlockwiseGroupedGemmArgs for block-wise scales
        op = self.operation
        raster, swizzle, _ = self._knobs
        a = op.abi_struct_type()
        a.problem_count = self.group_count
        a.sm_count = self.sm_count
        a.raster_order = raster
        a.swizzle = swizzle or op.default_swizzle
        a.max_active_clusters = 0
        fill_group_arrays(a, self)
        a.ptr_bias = self.device_arrays.get("ptr_bias", 0)
        a.ptr_scale_a = self.device_arrays.get("ptr_scale_a", 0)
        a.ptr_scale_b = self.device_arrays.get("ptr_scale_b", 0)
        a.alpha_ptr = self._alpha_pointer()
        if op.scales == "blockwise":
            a.layout_scale_a = self.device_arrays.get("layout_scale_a", 0)
            a.layout_scale_b = self.device_arrays.get("layout_scale_b", 0)
        fill_epilogue(a, self.output_op)
        return a

    def after_build(self, loaded_op, launch, abi_struct) -> None:
        check_workspace(self, launch)
        if self.device_sizes:
            function = loaded_op.function(self.operation.sizes_symbol)
            # the group count is fixed for these arguments, so the block width is too
            self._sizes_launch = (function, driver.pointer_array(ctypes.addressof(self._sizes_struct)),
                                  self.operation.sizes_block(self._group_count))


def _check_vector_kind(info, element, device_only: bool, what: str) -> None:
    if info.element is not element:
        raise ArgumentError(f"{info.name}: the vector {what}, {element.label}; got {info.element.label}")
    if device_only and info.kind != "device":
        raise ArgumentError(f"{info.name}: with device-side sizes every tensor must be device memory (the launch is "
                            f"meant to be captured in a CUDA graph); got a host tensor")


def _vector_parts(name: str, value, widths: list[int], element, device_only: bool, extent: str, what: str) -> list:
    """Per-group vectors (a bias, row-wise scales): a list of one contiguous vector per group (group g's at least
    ``widths[g]`` values), or one 2-D tensor (groups, X) with unit column stride and X >= every width. Returns, per
    group, (TensorInfo, byte offset)."""
    count = len(widths)
    if isinstance(value, (list, tuple)):
        if len(value) != count:
            raise ArgumentError(f"{name} has {len(value)} vector(s) but there are {count} group(s)")
        infos = [describe(vector, f"{name}[{g}]") for g, vector in enumerate(value)]
        for g, info in enumerate(infos):
            if len(info.shape) != 1 or (info.shape[0] > 1 and info.strides[0] != 1):
                raise ArgumentError(f"{name}[{g}]: expected a contiguous 1-D vector of {widths[g]} values "
                                    f"({extent} of group {g}), got shape {info.shape}, strides {info.strides}")
            if info.shape[0] < widths[g]:
                raise ArgumentError(f"{name}[{g}]: group {g} has {extent} = {widths[g]} but its {name} has "
                                    f"{info.shape[0]} values")
        parts = [(info, 0) for info in infos]
    else:
        info = describe(value, name)
        width = max(widths, default=0)
        if len(info.shape) != 2 or info.shape[0] != count or info.shape[1] < width or \
                (info.shape[1] > 1 and info.strides[1] != 1):
            raise ArgumentError(f"{name}: expected a list of {count} vectors or a ({count}, {extent}) tensor with "
                                f"contiguous rows and {extent} >= {width}, got shape {info.shape}, strides "
                                f"{info.strides}")
        infos = [info]
        parts = [(info, g * info.strides[0] * info.itemsize) for g in range(count)]
    for info in infos:
        _check_vector_kind(info, element, device_only, what)
    return parts


def _stand_in_ld(op, label: str, m: int, n: int) -> int:
    """Leading dimension of the K == 0 stand-in read as A (M x K') or B (K' x N) in the operation's layouts."""
    desc, extent = (op.A, m) if label == "A" else (op.B, n)
    k_contiguous = (desc.layout is LayoutType.RowMajor) == (label == "A")
    if k_contiguous:
        return op.empty_k_stand_in
    return -(-extent // desc.alignment) * desc.alignment


