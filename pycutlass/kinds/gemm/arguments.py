"""GemmArguments: tensors, problem size, mode and epilogue values for one GemmOperationUniversal launch."""
from __future__ import annotations

import numpy as np

from ...description.coords import GemmCoord
from ...description.types import LayoutType
from ...emit.abi import fill_epilogue
from ...epilogue.functors import EpilogueArguments
from ...errors import ArgumentError
from ...runtime.arguments import OperationArguments, memo_key
from ...runtime.tensors import describe, storage_type
from .abi import GemmUniversalArgs
from .matrix import check_output_geometry, matrix_geometry
from .modes import Mode
from .operation import GemmOperationUniversal


def coerce_problem_size(problem_size) -> GemmCoord:
    if isinstance(problem_size, GemmCoord):
        return problem_size
    try:
        m, n, k = problem_size
    except (TypeError, ValueError):
        raise ArgumentError(f"problem_size must be a pycutlass.gemm.GemmCoord(M, N, K), got {problem_size!r}") \
            from None
    return GemmCoord(m, n, k)


def coerce_output_op(operation, output_op) -> EpilogueArguments:
    if output_op is None:
        return operation.epilogue_type(1.0, 0.0)
    if isinstance(output_op, EpilogueArguments):
        if len(output_op.activation_args) != operation.epilogue_functor.num_activation_args:
            return operation.epilogue_type(output_op.alpha, output_op.beta, *output_op.activation_args)
        return output_op
    if isinstance(output_op, (list, tuple)):
        return operation.epilogue_type(*output_op)
    raise ArgumentError(f"output_op must come from operation.epilogue_type(alpha, beta, ...), got {output_op!r}")


def _positive_int(name: str, value) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
        raise ArgumentError(f"{name} must be a positive integer, got {value!r}")
    return int(value)


def check_problem_alignment(operation, m: int, n: int, k: int) -> None:
    """CUTLASS's can_implement: vector accesses along the contiguous dimension must not straddle rows."""
    checks = []
    for label, desc, contiguous in (("A", operation.A, {LayoutType.RowMajor: ("K", k), LayoutType.ColumnMajor: ("M", m)}),
                                    ("B", operation.B, {LayoutType.RowMajor: ("N", n), LayoutType.ColumnMajor: ("K", k)}),
                                    ("C", operation.C, {LayoutType.RowMajor: ("N", n), LayoutType.ColumnMajor: ("M", m)})):
        if desc.layout in contiguous:
            dim, extent = contiguous[desc.layout]
            checks.append((label, desc.alignment, dim, extent))
        else:  # interleaved-32
            dim, extent = ("N", n) if label == "C" else ("K", k)
            checks.append((label, 32, dim, extent))
    for label, alignment, dim, extent in checks:
        if extent % alignment:
            raise ArgumentError(f"{operation.name}: {label} is accessed {alignment} elements at a time along {dim}, "
                                f"so {dim} must be a multiple of {alignment}; got {dim}={extent}. Use an operation "
                                f"with a smaller {label} alignment")


def _memo_key(operation, problem_size, A, B, C, D, output_op, gemm_mode, split_k_slices, batch, stream, device,
              session):
    """A signature of the call for the fast path (plain Gemm mode on CUDA torch tensors), or None."""
    if gemm_mode != Mode.Gemm or split_k_slices != 1 or batch != 1 or device is not None or \
            type(problem_size) not in (GemmCoord, tuple) or not isinstance(operation, GemmOperationUniversal) or \
            0 in tuple(problem_size):  # empty problems allocate stand-ins: always the full path
        return None
    return memo_key(operation.name, problem_size, output_op, tensors=(A, B, C, D), stream=stream, session=session)


# Arguments of operations that GemmOperationUniversal builds for other kinds (visitor=True), by operation type.
VISITOR_ARGUMENTS: dict = {}


class GemmArguments(OperationArguments):
    """D = epilogue(alpha * A @ B + beta * C) in one of four modes (``pycutlass.gemm.Mode``).

    ``Gemm`` with ``split_k_slices`` > 1 is serial split-K. ``GemmSplitKParallel`` writes ``split_k_slices``
    partial products to a workspace owned by these arguments (``ptr_D``); reduce it into D with a
    ReductionOperation and ReductionArguments. ``Batched`` takes 3-D tensors (or packed 1-D) and ``Array`` takes
    lists of matrices (or 3-D tensors), ``batch`` of each.
    """

    def __new__(cls, operation=None, *args, **kwargs):
        visitor_arguments = VISITOR_ARGUMENTS.get(type(operation))  # kinds/gemm_evt registers its Arguments
        if cls is GemmArguments and visitor_arguments is not None:
            return visitor_arguments(operation, *args, **kwargs)
        return super().__new__(cls)

    def __init__(self, operation, problem_size, A, B, C, D, output_op=None, gemm_mode=Mode.Gemm,
                 split_k_slices: int = 1, batch: int = 1, stream=None, device=None, session=None):
        memo_key = _memo_key(operation, problem_size, A, B, C, D, output_op, gemm_mode, split_k_slices, batch,
                             stream, device, session)
        if memo_key is not None:
            d = D.data_ptr()
            addresses = (A.data_ptr(), B.data_ptr(), d if C is None else C.data_ptr(), d)
            if self._from_memo(memo_key, session, addresses, (A, B, C, D)):
                self.ptr_D = d
                return
        self._validate_and_prepare(operation, problem_size, A, B, C, D, output_op, gemm_mode, split_k_slices, batch,
                                   stream, device, session)
        if memo_key is not None:
            op = self.operation
            self._remember(memo_key, [x.alignment * x.element.bits // 8 for x in (op.A, op.B, op.C, op.C)],
                           ("gemm_mode", "problem_size", "output_op", "split_k_slices", "batch"))

    def _validate_and_prepare(self, operation, problem_size, A, B, C, D, output_op, gemm_mode, split_k_slices, batch,
                              stream, device, session):
        if not isinstance(operation, GemmOperationUniversal):
            raise ArgumentError(f"GemmArguments needs a GemmOperationUniversal, got {type(operation).__name__}")
        super().__init__(operation, stream, device, session)
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
        self.output_op = coerce_output_op(operation, output_op)
        m, n, k = self.problem_size
        check_problem_alignment(operation, m, n, k)
        functor = operation.epilogue_functor
        if functor.kind == "FastLinearCombinationClamp" and k > 256:
            raise ArgumentError(f"FastLinearCombinationClamp is exact only for K <= 256, got K={k}")
        if mode is Mode.GemmSplitKParallel:
            if functor.activation is not None or functor.kind != "LinearCombination":
                raise ArgumentError("GemmSplitKParallel writes raw partial sums: build the GEMM with a "
                                    "LinearCombination epilogue and apply alpha, beta and activations in the "
                                    "ReductionOperation")
            self.output_op = operation.epilogue_type(1.0, 0.0)
        if C is None and self.output_op.beta != 0 and mode is not Mode.GemmSplitKParallel:
            raise ArgumentError(f"C is None but beta is {self.output_op.beta}; pass C or set beta to 0")

        batch_count = self.batch
        self._operands = {}
        for label, tensor, rows, cols, layout, element in (
                ("A", A, m, k, operation.A.layout, operation.A.element),
                ("B", B, k, n, operation.B.layout, operation.B.element),
                ("C", C, m, n, operation.C.layout, operation.C.element),
                ("D", D, m, n, operation.C.layout, operation.C.element)):
            if label == "C" and C is None:
                continue
            self._operands[label] = self._describe_operand(label, tensor, rows, cols, layout, element, batch_count)
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
        geometry = matrix_geometry(info, layout, rows, cols, batch, allow_broadcast=label == "C")
        if label == "D":
            check_output_geometry(info, geometry, layout, rows, cols, batch)
        self._check_alignment(label, info, geometry)
        return ("tensor", info, geometry)

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
            self.workspace = self.tensors.allocate(self.split_k_slices * m * n * itemsize)
            self.ptr_D = self.workspace
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
