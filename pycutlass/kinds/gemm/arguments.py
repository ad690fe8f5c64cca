"""GemmArguments: tensors, problem size, mode and epilogue values for one GemmOperationUniversal launch."""
from __future__ import annotations

import numpy as np

from ...description.coords import GemmCoord
from ...description.types import LayoutType
from ...emit.abi import fill_epilogue
from ...errors import ArgumentError
from ...runtime.arguments import OperationArguments, memo_key
from ...runtime.tensors import PartialsAddress, describe, gathered_copy, pointer_operand, storage_type
from .. import registry
from .abi import GemmUniversalArgs
from ..families.arguments import (  # noqa: F401  (their names as this module had them)
    UNSET, _positive_int, check_keywords, check_problem_alignment, check_sm80_batch, check_split_k_output,
    coerce_output_op, coerce_problem_size, compat_positional, problem_alignment_checks, split_k_slices_alias,
    zero_unwritten_partials)
from ..families.matrix import MatrixGeometry, check_output_geometry, matrix_geometry
from ..families.modes import Mode, interleaved_column_gather
from .operation import GemmOperationUniversal


def _memo_key(operation, problem_size, A, B, C, D, output_op, gemm_mode, split_k_slices, batch, stream, device,
              session, bias, reordered):
    """A signature of the call for the fast path (plain Gemm mode on CUDA torch tensors), or None.

    ``bias`` changes how C is bound, so it is part of the key. Interleaved operands reordered inside the Arguments
    are bound through a copy, never the caller's B: those calls always take the full path."""
    if gemm_mode != Mode.Gemm or split_k_slices != 1 or batch != 1 or device is not None or \
            type(problem_size) not in (GemmCoord, tuple) or not isinstance(operation, GemmOperationUniversal) or \
            0 in tuple(problem_size) or \
            (operation.B.layout.is_interleaved and not reordered):  # empty problems allocate stand-ins
        return None
    if bias not in (None, False, True):
        return None  # the full path says what is wrong
    return memo_key(operation.name, problem_size, output_op, bool(bias), bool(reordered), tensors=(A, B, C, D),
                    stream=stream, session=session)


def bias_vector_length(layout: LayoutType, rows: int, cols: int) -> int:
    """PyCUTLASS's bias: one value per column of a RowMajor C, per row of a ColumnMajor one."""
    return cols if layout is LayoutType.RowMajor else rows


def reorder_interleaved_operand_b(B, k: int, n: int, batch: int = 1, name: str = "B"):
    """A copy of a RowMajorInterleaved32 B (contiguous, ``batch`` * K * N elements in interleaved memory order) with
    its columns in the kernel's order, as PyCUTLASS's ``reorder_column<32>`` inside GemmArguments did."""
    if isinstance(B, (list, tuple)):  # Array mode: one matrix per entry
        return [reorder_interleaved_operand_b(b, k, n, 1, f"{name}[{i}]") for i, b in enumerate(B)]
    info = describe(B, name)
    if info.numel != batch * k * n or not info.is_contiguous:
        raise ArgumentError(f"{name}: an interleaved RowMajorInterleaved32 operand must be a contiguous tensor of "
                            f"{batch * k * n} elements in interleaved order; got shape {info.shape}, strides "
                            f"{info.strides}")
    if n % 32 or k % 32:
        raise ArgumentError(f"{name}: interleaved B needs K and N multiples of 32, got K={k}, N={n}")
    # RowMajorInterleaved32 (K, N): offset = (k / 32) * 32 * N + n * 32 + k % 32, i.e. a (K/32, N, 32) array per
    # matrix; batched matrices follow one another.
    return gathered_copy(B, name, (batch * k // 32, n, 32), 1, interleaved_column_gather(n))


class GemmArguments(OperationArguments):
    """D = epilogue(alpha * A @ B + beta * C) in one of four modes (``pycutlass.gemm.Mode``).

    ``Gemm`` with ``split_k_slices`` > 1 is serial split-K. ``GemmSplitKParallel`` writes ``split_k_slices``
    partial products to a workspace owned by these arguments (``ptr_D``); reduce it into D with a
    ReductionOperation and ReductionArguments. ``Batched`` takes 3-D tensors (or packed 1-D) and ``Array`` takes
    lists of matrices (or 3-D tensors), ``batch`` of each.
    """

    def __new__(cls, operation=None, *args, **kwargs):
        if cls is GemmArguments:
            # The operation's kind may have its own arguments (the registry says: gemm_evt, gemm_sm90, ...). Python
            # then runs that subclass's __init__ once (calling the class here would run it twice).
            found = registry.arguments_class("GemmArguments", operation)
            if kwargs:
                check_keywords(found or cls, operation, kwargs)
            if found is not None:
                return super().__new__(found)
        return super().__new__(cls)

    _POSITIONAL = ("output_op", "gemm_mode", "split_k_slices", "batch", "stream", "device", "session")

    def __init__(self, operation, problem_size, A, B, C, D, *positional, output_op=UNSET, gemm_mode=UNSET,
                 split_k_slices=UNSET, batch=UNSET, stream=UNSET, device=UNSET, session=UNSET, bias=None,
                 reordered: bool = False, split_k_splices=UNSET):
        # Signature: (operation, problem_size, A, B, C, D, output_op=None, gemm_mode=Mode.Gemm, split_k_slices=1,
        # batch=1, stream=None, device=None, session=None, *, bias=None, reordered=False), or PyCUTLASS's
        # (operation, problem_size, A, B, C, D, gemm_mode, **keywords).
        if positional:
            given = compat_positional("GemmArguments", positional, self._POSITIONAL,
                                      dict(output_op=output_op, gemm_mode=gemm_mode, split_k_slices=split_k_slices,
                                           batch=batch, stream=stream, device=device, session=session),
                                      "gemm_mode", Mode)
            output_op, gemm_mode, split_k_slices, batch, stream, device, session = (
                given[name] for name in self._POSITIONAL)
        if split_k_splices is not UNSET:
            split_k_slices = split_k_slices_alias(split_k_slices, split_k_splices)
        # (the plain keyword call stays cheap: it is the fast path's)
        output_op = None if output_op is UNSET else output_op
        gemm_mode = Mode.Gemm if gemm_mode is UNSET else gemm_mode
        split_k_slices = 1 if split_k_slices is UNSET else split_k_slices
        batch = 1 if batch is UNSET else batch
        stream = None if stream is UNSET else stream
        device = None if device is UNSET else device
        session = None if session is UNSET else session
        memo_key = _memo_key(operation, problem_size, A, B, C, D, output_op, gemm_mode, split_k_slices, batch,
                             stream, device, session, bias, reordered)
        if memo_key is not None:
            d = D.data_ptr()
            addresses = (A.data_ptr(), B.data_ptr(), d if C is None else C.data_ptr(), d)
            if self._from_memo(memo_key, session, addresses, (A, B, C, D)):
                self.ptr_D = d
                return
        self._validate_and_prepare(operation, problem_size, A, B, C, D, output_op, gemm_mode, split_k_slices, batch,
                                   stream, device, session, bias, reordered)
        if memo_key is not None:
            op = self.operation
            self._remember(memo_key, [x.alignment * x.element.bits // 8 for x in (op.A, op.B, op.C, op.C)],
                           ("gemm_mode", "problem_size", "output_op", "split_k_slices", "batch", "bias",
                            "reordered"), operands=self._memo_operands())

    def _memo_operands(self) -> list:
        """The TensorInfo behind each fast-path address (A, B, C, D); None where C is absent or not read."""
        read = {id(info) for info in self._read()}
        return [next((info for info in self._operand_infos(label) if id(info) in read or label == "D"), None)
                for label in "ABCD"]

    def _validate_and_prepare(self, operation, problem_size, A, B, C, D, output_op, gemm_mode, split_k_slices, batch,
                              stream, device, session, bias=None, reordered=False):
        if not isinstance(operation, GemmOperationUniversal):
            raise ArgumentError(f"GemmArguments needs a GemmOperationUniversal, got {type(operation).__name__}")
        super().__init__(operation, stream, device, session)
        self._take_flags(bias, reordered)
        try:
            if isinstance(gemm_mode, bool):
                raise ValueError
            mode = Mode(gemm_mode)
        except ValueError:
            raise ArgumentError(f"gemm_mode must be one of {[m.name for m in Mode if m != Mode.Grouped]}, "
                                f"got {gemm_mode!r}") from None
        if mode is Mode.Grouped:
            raise ArgumentError("grouped GEMMs use GemmOperationGrouped and GemmGroupedArguments")
        self.gemm_mode = mode
        self.problem_size = coerce_problem_size(problem_size)
        self.split_k_slices = _positive_int("split_k_slices", split_k_slices)
        self.batch = _positive_int("batch", batch)
        if mode in (Mode.Batched, Mode.Array) and self.split_k_slices != 1:
            raise ArgumentError(f"split_k_slices must be 1 in {mode.name} mode, got {self.split_k_slices}")
        if mode in (Mode.Gemm, Mode.GemmSplitKParallel) and self.batch != 1:
            raise ArgumentError(f"batch must be 1 in {mode.name} mode (use Mode.Batched or Mode.Array), "
                                f"got {self.batch}")
        if operation.family == "sm80":
            check_sm80_batch(self.batch)
        self.output_op = coerce_output_op(operation, output_op)
        m, n, k = self.problem_size
        check_problem_alignment(operation, m, n, k)
        functor = operation.epilogue_functor
        fast_clamp_max_k = operation.fast_clamp_max_k  # None: exact for every K (SM90)
        if functor.kind == "FastLinearCombinationClamp" and fast_clamp_max_k is not None and k > fast_clamp_max_k:
            raise ArgumentError(f"FastLinearCombinationClamp is exact only for K <= {fast_clamp_max_k}, got K={k}")
        check_split_k_output(operation, mode, self.split_k_slices, self.output_op)
        if mode is Mode.GemmSplitKParallel:
            if functor.activation is not None or functor.kind != "LinearCombination":
                raise ArgumentError("GemmSplitKParallel writes raw partial sums: build the GEMM with a "
                                    "LinearCombination epilogue and apply alpha, beta and activations in the "
                                    "ReductionOperation")
            self.output_op = operation.epilogue_type(1.0, 0.0)
        if C is None and self.output_op.beta != 0 and mode is not Mode.GemmSplitKParallel:
            raise ArgumentError(f"C is None but beta is {self.output_op.beta}; pass C or set beta to 0")

        batch_count = self.batch
        if bias and C is None:
            raise ArgumentError("bias=True says C is a bias vector, but C is None")
        if bias and operation.C.layout.is_interleaved:
            raise ArgumentError(f"bias=True: a bias vector needs a RowMajor or ColumnMajor C, the operation's C is "
                                f"{operation.C.layout.value}")
        self._bias_requested = bool(bias)
        # Raw CUdeviceptr operands (PyCUTLASS): packed in the operation's layouts, sized from the problem.
        vector = bias_vector_length(operation.C.layout, m, n)
        A = pointer_operand(A, batch_count * m * k, operation.A.element, "A")
        B = pointer_operand(B, batch_count * k * n, operation.B.element, "B")
        C = pointer_operand(C, batch_count * (vector if bias else m * n), operation.C.element, "C")
        D = pointer_operand(D, batch_count * m * n, operation.C.element, "D")
        if operation.B.layout.is_interleaved and not reordered and B is not None and k and n:
            # PyCUTLASS reordered B (cutlass::reorder_column<32>) inside its Arguments: do the same, in a copy these
            # arguments own (the caller's B is left as it is). reordered=True: B is already in the kernel's order.
            if isinstance(B, (list, tuple)) and len(B) != batch_count:
                raise ArgumentError(f"B: Array mode with batch {batch_count} needs {batch_count} matrices, got "
                                    f"{len(B)}")
            B = self._reordered_B = reorder_interleaved_operand_b(
                B, k, n, batch_count if mode in (Mode.Batched, Mode.Array) else 1)
        self._operands = {}
        for label, tensor, rows, cols, layout, element in (
                ("A", A, m, k, operation.A.layout, operation.A.element),
                ("B", B, k, n, operation.B.layout, operation.B.element),
                ("C", C, m, n, operation.C.layout, operation.C.element),
                ("D", D, m, n, operation.C.layout, operation.C.element)):
            if label == "C" and C is None:
                continue
            self._operands[label] = self._describe_operand(label, tensor, rows, cols, layout, element, batch_count)
        self.bias = "C" in self._operands and self._operands["C"][2].broadcast
        self._materialize()

    # --- validation (no GPU) --------------------------------------------------------------------------------
    def _describe_operand(self, label, tensor, rows, cols, layout, element, batch):
        parallel = self.gemm_mode is Mode.GemmSplitKParallel
        if self.gemm_mode is Mode.Array and isinstance(tensor, (list, tuple)):
            if len(tensor) != batch:
                raise ArgumentError(f"{label}: Array mode with batch {batch} needs {batch} matrices, got {len(tensor)}")
            infos = [describe(t, f"{label}[{i}]") for i, t in enumerate(tensor)]
            geometries = [matrix_geometry(info, layout, rows, cols, 1, allow_broadcast=label == "C")
                          for info in infos]
            if len({g.ld for g in geometries}) > 1:
                raise ArgumentError(f"{label}: every matrix of an Array GEMM must have the same leading dimension, "
                                    f"got {sorted({g.ld for g in geometries})}")
            for info in infos:
                self._check_dtype(info, element, label, parallel)
                self._check_alignment(label, info, geometries[0])
            return ("list", infos, geometries[0])
        info = describe(tensor, label)
        self._check_dtype(info, element, label, parallel)
        if label == "C" and not layout.is_interleaved:
            geometry = self._bias_geometry(info, layout, rows, cols, batch)
            if geometry is not None:
                self._check_alignment(label, info, geometry)
                return ("tensor", info, geometry)
        elif label == "C" and self._bias_requested:
            raise ArgumentError(f"bias=True: a bias vector needs a RowMajor or ColumnMajor C, got {layout.value}")
        geometry = matrix_geometry(info, layout, rows, cols, batch, allow_broadcast=label == "C")
        if label == "D":
            check_output_geometry(info, geometry, layout, rows, cols, batch)
        self._check_alignment(label, info, geometry)
        return ("tensor", info, geometry)

    def _bias_geometry(self, info, layout, rows, cols, batch):
        """C read as PyCUTLASS's bias (None: C is a matrix, read by matrix_geometry).

        With ``bias=True`` C must hold one vector (of N values for a RowMajor C, of M for a ColumnMajor one), or one
        per batch (batch stride of one vector, as PyCUTLASS's batched_stride_C): any contiguous shape of that many
        elements. Without it, a C of exactly one vector's elements is a bias when the broadcast dimension is not 1
        (PyCUTLASS's auto-detection), and a C of one vector per batch is one too when it cannot be a full C."""
        vector = bias_vector_length(layout, rows, cols)
        full = batch * rows * cols
        numel = info.numel
        if self._bias_requested:
            if numel not in (vector, batch * vector):
                try:
                    geometry = matrix_geometry(info, layout, rows, cols, batch, allow_broadcast=True)
                except ArgumentError:
                    geometry = None
                if geometry is None or not geometry.broadcast:
                    raise ArgumentError(
                        f"{info.name}: bias=True says C is a bias vector of {vector} elements (one per "
                        f"{'column' if layout is LayoutType.RowMajor else 'row'} of the {layout.value} {rows} x "
                        f"{cols} C{', or one per batch' if batch > 1 else ''}, or a view broadcasting one), but it "
                        f"holds {numel} elements (shape {info.shape}, strides {info.strides})")
                return geometry
        else:
            broadcast_extent = rows if layout is LayoutType.RowMajor else cols
            if numel == full or broadcast_extent == 1 or numel not in (vector, batch * vector) or \
                    (len(info.shape) == 1 and numel == vector):  # 1-D vectors: matrix_geometry reads them
                return None
            if len(info.shape) >= 2 and info.shape[-2:] in ((rows, cols), (1, cols)):
                return None  # a (possibly broadcast) matrix view: read by its strides
        if numel > 1 and not info.is_contiguous:
            raise ArgumentError(f"{info.name}: a bias vector must be contiguous, got shape {info.shape}, strides "
                                f"{info.strides}")
        return MatrixGeometry(0, vector if numel == batch * vector and batch > 1 else 0, broadcast=True)

    def _check_alignment(self, label, info, geometry):
        """Leading dimensions, batch strides and device addresses must allow the operation's vector accesses."""
        op = self.operation
        if info.numel == 0:
            return  # never addressed
        alignment = (op.C if label == "D" else getattr(op, label)).alignment
        if op.C.layout.is_interleaved or geometry.broadcast:
            alignment_of_strides = 1
        else:
            alignment_of_strides = alignment
        if geometry.ld % alignment_of_strides:
            raise ArgumentError(f"{info.name}: leading dimension {geometry.ld} is not a multiple of the operation's "
                                f"{label} alignment {alignment}")
        if self.batch > 1 and geometry.batch_stride % alignment_of_strides:
            raise ArgumentError(f"{info.name}: batch stride {geometry.batch_stride} is not a multiple of the "
                                f"operation's {label} alignment {alignment}")
        if info.kind == "device":
            self._check_address(info, info.device_address, alignment)

    def _check_dtype(self, info, element, label, parallel):
        if parallel and label in ("C", "D"):
            return  # C and D belong to the reduction in parallel split-K; it checks them
        if info.element is not storage_type(element):
            raise ArgumentError(f"{info.name}: the operation expects {storage_type(element).label} elements, got "
                                f"{info.element.label}")

    # --- device state ---------------------------------------------------------------------------------------
    def _tensor_infos(self) -> list:
        return [info for form, found, _ in self._operands.values() for info in (found if form == "list" else [found])]

    def _operand_infos(self, label) -> list:
        if label not in self._operands:
            return []
        form, found, _ = self._operands[label]
        return list(found) if form == "list" else [found]

    def _written(self) -> list:
        # In parallel split-K the GEMM writes only its own workspace; C and D are the reduction's.
        return [] if self.gemm_mode is Mode.GemmSplitKParallel else self._operand_infos("D")

    def _read(self) -> list:
        _, _, k = self.problem_size
        unread = {"C"} if self.output_op.beta == 0 else set()  # the epilogue loads no source with beta = 0
        if k == 0:
            unread |= {"A", "B"}  # a zeroed stand-in is read instead
        skipped = {id(info) for label in unread for info in self._operand_infos(label)}
        return [info for info in self._tensor_infos() if id(info) not in skipped]

    def _in_place(self) -> list:
        return list(zip(self._operand_infos("D"), self._operand_infos("C")))

    def _allocate(self) -> None:
        op = self.operation
        m, n, k = self.problem_size
        self.addresses, self.lds, self.batch_strides = {}, {}, {}
        parallel = self.gemm_mode is Mode.GemmSplitKParallel
        for label, (form, infos, geometry) in self._operands.items():
            if parallel and label in ("C", "D"):
                continue  # they belong to the reduction: not copied here, so sync() cannot overwrite its result
            alignment = getattr(op, label if label != "D" else "C").alignment
            if form == "list":
                addresses = [self.tensors.address(info, is_output=label == "D") for info in infos]
                for info, address in zip(infos, addresses):
                    self._check_address(info, address, alignment)
                self.addresses[label] = self.tensors.upload(np.array(addresses, dtype=np.uint64))
                self.batch_strides[label] = 0
            else:
                address = self.tensors.address(infos, is_output=label == "D")
                self._check_address(infos, address, alignment)
                if self.gemm_mode is Mode.Array:
                    itemsize = infos.itemsize
                    pointers = np.array([address + i * geometry.batch_stride * itemsize for i in range(self.batch)],
                                        dtype=np.uint64)
                    self.addresses[label] = self.tensors.upload(pointers)
                else:
                    self.addresses[label] = address
                self.batch_strides[label] = geometry.batch_stride
            self.lds[label] = geometry.ld
        if k == 0:
            # Nothing is multiplied, but the main loop still forms A/B addresses: give it a real, zeroed buffer
            # (an empty tensor's pointer may be null) with leading dimension 0 so every address stays inside it.
            stand_in = self.tensors.zeros(256)
            for label in ("A", "B"):
                if self.gemm_mode is Mode.Array:
                    self.addresses[label] = self.tensors.upload(np.full(self.batch, stand_in, dtype=np.uint64))
                else:
                    self.addresses[label] = stand_in
                self.lds[label] = 0
                self.batch_strides[label] = 0
        if parallel:
            self.addresses["D"], self.lds["D"], self.batch_strides["D"] = 0, 0, 0  # the workspace, below
        if "C" not in self.addresses:  # beta == 0: the kernel does not read C
            self.addresses["C"], self.lds["C"], self.batch_strides["C"] = (self.addresses["D"], self.lds["D"],
                                                                           self.batch_strides["D"])
        self.workspace = 0
        self.ptr_D = self.addresses["D"]
        if self.gemm_mode is Mode.GemmSplitKParallel:
            # Partial products, packed in D's layout, one M x N slice per split.
            itemsize = op.C.element.bits // 8
            self._slice_bytes = m * n * itemsize
            self.workspace = self.tensors.allocate(self.split_k_slices * self._slice_bytes)
            self.ptr_D = PartialsAddress(self.workspace, op.C.element, self.split_k_slices * self._slice_bytes)
            self.workspace_ld = n if op.C.layout is LayoutType.RowMajor else m
            self.addresses["C"] = self.addresses["D"] = self.workspace
            self.lds["C"] = self.lds["D"] = self.workspace_ld
            self.batch_strides["C"] = self.batch_strides["D"] = m * n
        self.semaphore = 0
        if self.gemm_mode is Mode.Gemm and self.split_k_slices > 1:
            tm, tn, _ = op.tile_description.threadblock_shape
            rows, cols = (n, m) if op.transposed else (m, n)
            count = -(-rows // tm) * -(-cols // tn)
            self.semaphore = self.tensors.zeros(4 * max(count, 1))  # the kernel resets it after use
            self._semaphore_capacity = count

    def _check_address(self, info, address, alignment):
        vector_bytes = alignment * info.itemsize
        if address % vector_bytes:
            raise ArgumentError(f"{info.name}: address {address:#x} is not aligned to the operation's {vector_bytes}-"
                                f"byte vector accesses (alignment {alignment}); use an aligned tensor or an "
                                f"operation with a smaller alignment")

    def bind(self, loaded_op=None) -> GemmUniversalArgs:
        m, n, k = self.problem_size
        a = GemmUniversalArgs()
        a.mode = int(self.gemm_mode)
        a.m, a.n, a.k = m, n, k
        a.batch_count = self.batch if self.gemm_mode in (Mode.Batched, Mode.Array) else self.split_k_slices
        a.ptr_A, a.ptr_B, a.ptr_C, a.ptr_D = (self.addresses[x] for x in "ABCD")
        a.semaphore = self.semaphore
        a.lda, a.ldb, a.ldc, a.ldd = (self.lds[x] for x in "ABCD")
        a.batch_stride_A, a.batch_stride_B, a.batch_stride_C, a.batch_stride_D = (self.batch_strides[x] for x in "ABCD")
        fill_epilogue(a, self.output_op)
        return a

    def after_build(self, loaded_op, launch, abi_struct) -> None:
        if launch.semaphore_count > getattr(self, "_semaphore_capacity", 0):
            raise ArgumentError(f"{self.operation.name}: serial split-K needs {launch.semaphore_count} semaphores, "
                                f"{getattr(self, '_semaphore_capacity', 0)} were allocated")
        if self.gemm_mode is Mode.GemmSplitKParallel:
            zero_unwritten_partials(self, launch, self.split_k_slices, self._slice_bytes)
