"""GemmEvtArguments: a visitor GEMM's launch. ``GemmArguments(operation, problem_size, A, B, C, D, output_op)``
comes here when ``operation`` is a visitor GEMM (PyCUTLASS 2.11's surface): A and B are the GEMM's operands, the
tree's tensors and scalars come from ``output_op`` (``operation.epilogue_type(**named values, problem_size=[M,
N])``), and C and D are accepted and ignored (the tree names its own inputs and outputs). ``Mode.Array`` takes A
and B as single tensors holding the batch, as PyCUTLASS 2.11 did, and runs them as ``Mode.Batched``.

Tensor forms: M x N tensors as 2-D (M, N) with unit column stride, 3-D (batch, M, N), or packed 1-D
(batch * M * N); input vectors (row: N, column: M) contiguous, of the vector's length (broadcast over batches) or
batch times it. A reduction output, contiguous, chooses what the kernel writes by its size: complete sums (batch x M
for "row", batch x N for "column", in the compute type; zeroed before every launch, since the threadblocks add into
them atomically), or PyCUTLASS 2.11's per-tile partial sums (batch x ceil(N / tile N) x M for "row", batch x
ceil(M / tile M) x N for "column", in the compute or the output type; each slot stored once, no zeroing).
"""
from __future__ import annotations

import numpy as np

from ...description.types import LayoutType
from ...epilogue.visitor import EvtOutputOp
from ...errors import ArgumentError
from ...runtime import driver
from ...runtime.arguments import OperationArguments
from ...runtime.tensors import describe, storage_type
from ..gemm.arguments import GemmArguments
from ..families.arguments import (UNSET, check_problem_alignment, check_sm80_batch, coerce_problem_size,
                                  split_k_slices_alias)
from ..families.matrix import MatrixGeometry, check_output_geometry
from ..families.modes import Mode
from .abi import GemmEvtArgs
from .operation import GemmOperationEvt

# pycutlass_evt::ReductionMode (evt_reductions.cu.j2); the slot of every other tensor holds COMPLETE_SUMS (unused).
COMPLETE_SUMS, TILE_PARTIALS_COMPUTE, TILE_PARTIALS_OUTPUT = 0, 1, 2


class GemmEvtArguments(GemmArguments):
    def __init__(self, operation, problem_size, A, B, C=None, D=None, output_op=None, gemm_mode=Mode.Gemm,
                 split_k_slices: int = 1, batch: int = 1, stream=None, device=None, session=None, *,
                 split_k_splices=UNSET):
        if split_k_splices is not UNSET:
            split_k_slices = split_k_slices_alias(UNSET if split_k_slices == 1 else split_k_slices, split_k_splices)
        if not isinstance(operation, GemmOperationEvt):
            raise ArgumentError(f"GemmEvtArguments needs a visitor GEMM, got {type(operation).__name__}")
        OperationArguments.__init__(self, operation, stream, device, session)
        try:
            mode = Mode(gemm_mode)
        except ValueError:
            raise ArgumentError(f"gemm_mode must be Mode.Gemm, Mode.Batched or Mode.Array, got {gemm_mode!r}") from None
        if mode not in (Mode.Gemm, Mode.Batched, Mode.Array):
            raise ArgumentError(f"a visitor GEMM runs in Mode.Gemm, Mode.Batched or Mode.Array (CUTLASS's Sm80 EVT "
                                f"cannot split K), got {mode.name}")
        if mode is Mode.Array and any(isinstance(t, (list, tuple)) for t in (A, B)):
            # PyCUTLASS 2.11 built its pointer arrays from single tensors (base + i * batch stride): the same
            # addresses a batched GEMM reads, so that form runs batched. Independent matrices cannot.
            raise ArgumentError("a visitor GEMM in Mode.Array takes A and B as single tensors holding the batch "
                                "(packed 1-D or 3-D, as PyCUTLASS 2.11's examples pass them) and runs them as a "
                                "batched GEMM; lists of separate matrices need a pointer-array kernel, which "
                                "CUTLASS 4.2's Sm80 visitor GEMM (GemmWithEpilogueVisitor) does not have")
        if split_k_slices != 1:
            raise ArgumentError(f"a visitor GEMM does not split K (CUTLASS's Sm80 EVT), got split_k_slices="
                                f"{split_k_slices!r}")
        if isinstance(batch, bool) or not isinstance(batch, (int, np.integer)) or batch < 1:
            raise ArgumentError(f"batch must be a positive integer, got {batch!r}")
        if mode is Mode.Gemm and batch != 1:
            raise ArgumentError(f"batch must be 1 in Gemm mode (use Mode.Batched), got {batch}")
        check_sm80_batch(int(batch))
        if not isinstance(output_op, EvtOutputOp) or \
                output_op.description != operation.epilogue_functor.description:
            raise ArgumentError("output_op must come from operation.epilogue_type(**tensors and scalars by name, "
                                f"problem_size=[M, N]) of this operation, got {output_op!r}")
        self.gemm_mode, self.split_k_slices, self.batch = mode, 1, int(batch)
        self.problem_size = coerce_problem_size(problem_size)
        self.output_op = output_op
        m, n, k = self.problem_size
        if output_op.problem_size is not None and tuple(output_op.problem_size[:2]) != (m, n):
            raise ArgumentError(f"output_op's problem_size {list(output_op.problem_size)} differs from the GEMM's "
                                f"M, N = {[m, n]}")
        check_problem_alignment(operation, m, n, k)
        self._operands = {}
        for label, tensor, rows, cols, layout, element in (
                ("A", A, m, k, operation.A.layout, operation.A.element),
                ("B", B, k, n, operation.B.layout, operation.B.element)):
            self._operands[label] = self._describe_operand(label, tensor, rows, cols, layout, element, self.batch)
        self._tree_tensors = {name: self._describe_tree_tensor(name) for name in output_op.description.tensors}
        self._materialize()
        output_op._arguments = self

    def _describe_tree_tensor(self, name):
        op, description = self.operation, self.output_op.description
        m, n, _ = self.problem_size
        batch = self.batch
        kind = description.tensor_kind(name)
        tree = op.epilogue_functor
        info = describe(self.output_op.tensor(name), name)
        if kind.startswith("reduce"):
            return self._describe_reduction(name, kind, info)
        if info.element is not storage_type(tree.element_output):
            raise ArgumentError(f"{name}: the tree's {kind} {name!r} holds {storage_type(tree.element_output).label} "
                                f"elements, got {info.element.label}")
        mode = COMPLETE_SUMS
        is_output = kind == "store"
        if kind in ("tensor", "store"):
            shape, strides = info.shape, info.strides
            if len(shape) >= 2 and shape[-2:] == (m, n) and (strides[-1] == 1 or n == 1) and \
                    (len(shape) == 2 and batch == 1 or len(shape) == 3 and shape[0] == batch):
                ld = strides[-2]
                batch_stride = strides[0] if len(shape) == 3 else 0
            elif info.is_contiguous and info.numel == batch * m * n:
                ld, batch_stride = n, m * n
            else:
                raise ArgumentError(f"{name}: an M x N tensor ({m} x {n}, batch {batch}) must be (M, N) with unit "
                                    f"column stride, (batch, M, N), or {batch * m * n} packed elements; got shape "
                                    f"{info.shape} strides {info.strides}")
            if ld % op.C.alignment or (batch > 1 and batch_stride % op.C.alignment):
                raise ArgumentError(f"{name}: leading dimension {ld} and batch stride must be multiples of the "
                                    f"alignment {op.C.alignment}")
            if is_output and batch_stride == 0 and batch > 1:
                raise ArgumentError(f"{name}: an output needs one matrix per batch")
            if is_output and m > 1 and n > 1 and ld < n:
                raise ArgumentError(f"{name}: leading stride {ld} is smaller than the {n} elements of one row; rows of "
                                    f"an output would overlap")
            if is_output:
                check_output_geometry(info, MatrixGeometry(ld, batch_stride), LayoutType.RowMajor, m, n, batch)
        else:
            length = {"row": n, "column": m}[kind]
            if not info.is_contiguous or info.numel not in (length, batch * length):
                raise ArgumentError(f"{name}: the {kind} vector needs {length} contiguous elements (broadcast over "
                                    f"batches) or {batch} x {length}; got shape {info.shape} strides {info.strides}")
            ld, batch_stride = 0, (length if info.numel == batch * length and batch > 1 else 0)
        if info.kind == "device" and kind in ("tensor", "store", "row"):
            vector_bytes = op.C.alignment * info.itemsize
            if info.device_address % vector_bytes:
                raise ArgumentError(f"{name}: address {info.device_address:#x} is not aligned to {vector_bytes} bytes")
        return info, kind, ld, batch_stride, is_output, mode

    def _describe_reduction(self, name, kind, info):
        """A reduction's buffer says what the kernel writes: complete sums (M values per batch for "row", N for
        "column"), or PyCUTLASS 2.11's per-tile partial sums (one such vector per threadblock tile along the
        reduced dimension). Returns the slot's (info, kind, tile stride, batch stride, True, mode)."""
        tree = self.operation.epilogue_functor
        m, n, _ = self.problem_size
        batch = self.batch
        tile_m, tile_n, _ = self.operation.tile_description.threadblock_shape
        length, tiles, across = ((m, -(-n // tile_n), f"N tile of {tile_n} columns") if kind == "reduce_row"
                                 else (n, -(-m // tile_m), f"M tile of {tile_m} rows"))
        compute, output = storage_type(tree.element_compute), storage_type(tree.element_output)
        complete = info.numel == batch * length and info.element is compute
        per_tile = info.numel == batch * tiles * length and info.element in (compute, output)
        if not info.is_contiguous or not (complete or per_tile):
            types = compute.label if compute is output else f"{compute.label} or {output.label}"
            raise ArgumentError(
                f"{name}: the {kind} output takes {batch * length} contiguous {compute.label} elements (complete "
                f"sums: {length} per batch) or {batch * tiles * length} contiguous {types} elements (PyCUTLASS 2.11's "
                f"per-tile partial sums: {length} per {across}, {tiles} tiles per batch); got {info.element.label} "
                f"shape {info.shape} strides {info.strides}")
        if complete:
            return info, kind, 0, length if batch > 1 else 0, True, COMPLETE_SUMS
        mode = TILE_PARTIALS_COMPUTE if info.element is compute else TILE_PARTIALS_OUTPUT
        return info, kind, length, tiles * length if batch > 1 else 0, True, mode

    def _tensor_infos(self) -> list:
        return [info for _, info, _ in self._operands.values()] + [t[0] for t in self._tree_tensors.values()]

    def _written(self) -> list:
        return [slot[0] for slot in self._tree_tensors.values() if slot[4]]

    def _read(self) -> list:
        return self._tensor_infos()

    def _in_place(self) -> list:
        # The epilogue loads each element of an M x N input tensor in the thread that stores that element of an
        # output (one thread map for loads and stores), so an output may be the very same view as such an input.
        inputs = [slot[0] for slot in self._tree_tensors.values() if slot[1] == "tensor"]
        return [(output, source) for output in self._written() for source in inputs]

    def _allocate(self) -> None:
        self.addresses, self.lds, self.batch_strides = {}, {}, {}
        for label, (_, info, geometry) in self._operands.items():
            address = self.tensors.address(info)
            self._check_address(info, address, getattr(self.operation, label).alignment)
            self.addresses[label], self.lds[label], self.batch_strides[label] = \
                address, geometry.ld, geometry.batch_stride
        self._reductions = []
        for name, (info, kind, ld, batch_stride, is_output, mode) in self._tree_tensors.items():
            address = self.tensors.address(info, is_output=is_output)
            self.addresses[name], self.lds[name], self.batch_strides[name] = address, ld, batch_stride
            if kind.startswith("reduce") and mode == COMPLETE_SUMS:
                self._reductions.append((address, max(info.numel, 1) * info.itemsize))
        self.ptr_D = 0
        self.workspace = 0
        self.semaphore = 0

    def bind(self, loaded_op=None) -> GemmEvtArgs:
        m, n, k = self.problem_size
        description = self.output_op.description
        a = GemmEvtArgs()
        a.mode = int(Mode.Batched if self.gemm_mode is Mode.Array else self.gemm_mode)
        a.m, a.n, a.k = m, n, k
        a.batch_count = self.batch
        a.ptr_A, a.ptr_B = self.addresses["A"], self.addresses["B"]
        a.lda, a.ldb = self.lds["A"], self.lds["B"]
        a.batch_stride_A, a.batch_stride_B = self.batch_strides["A"], self.batch_strides["B"]
        for i, name in enumerate(description.tensors):
            setattr(a, f"ptr_{i}", self.addresses[name])
            setattr(a, f"ld_{i}", self.lds[name])
            setattr(a, f"batch_stride_{i}", self.batch_strides[name])
            a.reduction_mode[i] = self._tree_tensors[name][5]
        for j, value in enumerate(self.output_op.scalars):
            setattr(a, f"scalar_{j}", value)
        return a

    def after_build(self, loaded_op, launch, abi_struct) -> None:
        pass

    def before_launch(self) -> None:
        for address, nbytes in self._reductions:  # complete sums are added into their outputs atomically
            driver.memset_d8(address, 0, nbytes, self.stream)
