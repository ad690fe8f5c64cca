"""Conv2dArguments: tensors, problem size, split-K mode and epilogue values for one Conv2dOperation launch.

Accepted tensor forms for an operand whose CUTLASS extent is (N, H, W, C) (see ``pycutlass.conv`` for which
extent each operand of fprop / dgrad / wgrad has):

- 4-D (N, H, W, C), packed NHWC (numpy / cupy / torch ``contiguous()``);
- 4-D torch-style (N, C, H, W) in ``channels_last`` memory (its strides are the packed NHWC ones);
- 1-D packed (PyCUTLASS style): N * H * W * C contiguous elements in NHWC order;
- C only: a bias vector of the channel count, broadcast over N, H and W (1-D of length C, or a 4-D view with zero
  strides everywhere but the channels, e.g. ``bias.view(1, K, 1, 1).expand(N, K, P, Q)`` in torch); for wgrad only
  with a 1x1 filter (its kernel reads C as K x R*S*C rows, so a vector of C channels covers a row only when R*S = 1);
- interleaved layouts (TensorNC32HW32, TensorC32RSK32): contiguous tensors of N * H * W * C elements in the
  interleaved order. As in PyCUTLASS, the C32RSK32 filter is taken in natural order and its output channels are
  put in the kernels' order (CUTLASS's ``reorder_convK``) in a copy these arguments own; pass ``reordered=True``
  for a filter already in that order (``pycutlass.conv.reorder_interleaved_filter``).
- PyCUTLASS's forms: ``bias=True`` (C is one value per output channel), ``split_k_mode`` right after D, and
  ``cuda.CUdeviceptr`` operands (packed, sized from the problem).
Anything else raises ArgumentError naming the operand; nothing is copied to "fix" a view.
"""
from __future__ import annotations

from ...description.types import LayoutType
from ...errors import ArgumentError
from ...runtime.arguments import OperationArguments, memo_key
from ...runtime.tensors import (PartialsAddress, TensorInfo, as_flat, describe, gathered_copy, pointer_operand,
                                storage_type)
from ..families.arguments import (UNSET, check_split_k_output, coerce_output_op, compat_positional,
                                  zero_unwritten_partials)
from ..families.modes import Mode as GemmMode
from .. import registry
from .operation import Conv2dOperation
from ..families.conv import Conv2dProblemSize, Operator, SplitKMode, interleaved_filter_gather

_FAST_CLAMP_MAX_K = 256

# The role of each operand per kind, for messages.
_ROLES = {Operator.fprop: ("activation", "filter", "output"),
          Operator.dgrad: ("output gradient", "filter", "input gradient"),
          Operator.wgrad: ("output gradient", "activation", "filter gradient")}


def _packed_strides(extent) -> tuple[int, int, int, int]:
    n, h, w, c = extent
    return (h * w * c, w * c, c, 1)


def _nhwc_strides(info: TensorInfo, extent) -> tuple[int, int, int, int] | None:
    """The tensor's strides in NHWC order if it is a 4-D view of ``extent`` (NHWC or channels_last NCHW)."""
    n, h, w, c = extent
    candidates = []
    if info.shape == (n, h, w, c):
        candidates.append(tuple(info.strides))
    if info.shape == (n, c, h, w):
        sn, sc, sh, sw = info.strides
        candidates.append((sn, sh, sw, sc))
    if not candidates:
        return None
    # When C == H == W both readings fit the shape; the one whose strides are packed NHWC is the tensor's.
    packed = (h * w * c, w * c, c, 1)
    return next((cand for cand in candidates if _matches(cand, packed, extent)), candidates[0])


def _matches(strides, expected, extent) -> bool:
    """Strides equal, ignoring dimensions of size 1 (never stepped along)."""
    return all(size <= 1 or s == e for s, e, size in zip(strides, expected, extent))


def _memo_key(operation, problem_size, A, B, C, D, output_op, split_k_mode, split_k_slices, stream, device, session,
              bias, reordered):
    """A signature of the call for the fast path (no split-K, CUDA torch tensors), or None. ``bias`` changes how C
    is bound (part of the key); a filter reordered inside the Arguments is bound through a copy (no fast path)."""
    if split_k_slices != 1 or split_k_mode != SplitKMode.Serial or device is not None or \
            not isinstance(problem_size, Conv2dProblemSize) or problem_size.split_k_slices != 1 or \
            not isinstance(operation, Conv2dOperation) or (operation.B.layout.is_interleaved and not reordered) or \
            bias not in (None, False, True):
        return None
    return memo_key(operation.name, problem_size, output_op, bool(bias), bool(reordered), tensors=(A, B, C, D),
                    stream=stream, session=session)


def reorder_interleaved_operand_filter(B, problem_size, kind, name: str):
    """A copy of a TensorC32RSK32 filter (contiguous, K * R * S * C elements in interleaved memory order) with its
    output channels in the kernel's order, as PyCUTLASS's ``reorder_convK`` inside Conv2dArguments did."""
    k, r, s, c = tuple(problem_size.tensor_b_extent(kind))
    info = describe(B, name)
    if info.numel != k * r * s * c or not info.is_contiguous:
        raise ArgumentError(f"{name}: an interleaved TensorC32RSK32 operand must be a contiguous tensor of "
                            f"{k * r * s * c} elements in interleaved order; got shape {info.shape}, strides "
                            f"{info.strides}")
    if c % 32 or k % 32:
        raise ArgumentError(f"{name}: an interleaved filter needs C and K multiples of 32, got C={c}, K={k}")
    # TensorC32RSK32 (K, R, S, C): a (C/32, R, S, K, 32) array; the kernels read K permuted within groups of 32.
    return gathered_copy(B, name, (c // 32, r, s, k, 32), 3, interleaved_filter_gather(k))


class Conv2dArguments(OperationArguments):
    """D = epilogue(alpha * conv(A, B) + beta * C) for a Conv2dOperation (PyCUTLASS's constructor).

    ``split_k_mode=SplitKMode.Serial`` with ``split_k_slices`` > 1 reduces the slices in the kernel through
    semaphores these arguments own. ``SplitKMode.Parallel`` writes ``split_k_slices`` partial results to a workspace
    owned by these arguments (``ptr_D``; slice k at k * ``partition_stride`` elements, each the implicit GEMM's
    M x N output, row-major), to be reduced into D by a ReductionOperation / ReductionArguments
    (``problem_size=args.reduction_problem_size``, ``partitions=args.split_k_slices``, ``workspace=args``).
    """

    _POSITIONAL = ("output_op", "split_k_mode", "split_k_slices", "stream", "device", "session")

    def __new__(cls, operation=None, *args, **kwargs):
        if cls is Conv2dArguments:
            found = registry.arguments_class("Conv2dArguments", operation)  # the SM90 kind's, for its operations
            if found is not None:
                return object.__new__(found)  # Python then runs the subclass's __init__
        return super().__new__(cls)

    def __init__(self, operation, problem_size, A, B, C, D, *positional, output_op=UNSET, split_k_mode=UNSET,
                 split_k_slices=UNSET, stream=UNSET, device=UNSET, session=UNSET, bias=None,
                 reordered: bool = False):
        # Signature: (operation, problem_size, A, B, C, D, output_op=None, split_k_mode=SplitKMode.Serial,
        # split_k_slices=1, stream=None, device=None, session=None, *, bias=None, reordered=False), or PyCUTLASS's
        # (operation, problem_size, A, B, C, D, split_k_mode, **keywords).
        if positional:
            given = compat_positional("Conv2dArguments", positional, self._POSITIONAL,
                                      dict(output_op=output_op, split_k_mode=split_k_mode,
                                           split_k_slices=split_k_slices, stream=stream, device=device,
                                           session=session),
                                      "split_k_mode", SplitKMode)
            output_op, split_k_mode, split_k_slices, stream, device, session = (
                given[name] for name in self._POSITIONAL)
        output_op = None if output_op is UNSET else output_op
        split_k_mode = SplitKMode.Serial if split_k_mode is UNSET else split_k_mode
        split_k_slices = 1 if split_k_slices is UNSET else split_k_slices
        stream = None if stream is UNSET else stream
        device = None if device is UNSET else device
        session = None if session is UNSET else session
        memo_key = _memo_key(operation, problem_size, A, B, C, D, output_op, split_k_mode, split_k_slices, stream,
                             device, session, bias, reordered)
        if memo_key is not None:
            d = D.data_ptr()
            if self._from_memo(memo_key, session, (A.data_ptr(), B.data_ptr(), d if C is None else C.data_ptr(), d),
                               (A, B, C, D)):
                self.ptr_D = d
                return
        self._validate_and_prepare(operation, problem_size, A, B, C, D, output_op, split_k_mode, split_k_slices,
                                   stream, device, session, bias, reordered)
        if memo_key is not None:
            op = self.operation
            self._remember(memo_key, [x.alignment * x.element.bits // 8 for x in (op.A, op.B, op.C, op.C)],
                           ("problem_size", "split_k_slices", "split_k_mode", "output_op", "parallel", "bias",
                            "reordered"), operands=self._memo_operands())

    def _validate_and_prepare(self, operation, problem_size, A, B, C, D, output_op, split_k_mode, split_k_slices,
                              stream, device, session, bias=None, reordered=False):
        if not isinstance(operation, Conv2dOperation):
            raise ArgumentError(f"Conv2dArguments needs a Conv2dOperation, got {type(operation).__name__}")
        super().__init__(operation, stream, device, session)
        self._take_flags(bias, reordered)
        if not isinstance(problem_size, Conv2dProblemSize):
            raise ArgumentError(f"problem_size must be a pycutlass.conv.Conv2dProblemSize, got {problem_size!r}")
        try:
            self.split_k_mode = SplitKMode(split_k_mode)
        except ValueError:
            raise ArgumentError(f"split_k_mode must be pycutlass.conv.SplitKMode.Serial or .Parallel, "
                                f"got {split_k_mode!r}") from None
        if isinstance(split_k_slices, bool) or not hasattr(split_k_slices, "__index__") or int(split_k_slices) < 1:
            raise ArgumentError(f"split_k_slices must be a positive integer, got {split_k_slices!r}")
        split_k_slices = int(split_k_slices)
        if split_k_slices != problem_size.split_k_slices:
            if problem_size.split_k_slices != 1 and split_k_slices != 1:
                raise ArgumentError(f"split_k_slices={split_k_slices} disagrees with the problem size's "
                                    f"split_k_slices={problem_size.split_k_slices}")
            problem_size = problem_size.reset_split_k_slices(max(split_k_slices, problem_size.split_k_slices))
        self.problem_size = problem_size
        self.split_k_slices = problem_size.split_k_slices
        operation.check_problem_size(problem_size)
        self.output_op = coerce_output_op(operation, output_op)

        kind = operation.conv_kind
        gemm = problem_size.implicit_gemm_size(kind)
        functor = operation.epilogue_functor
        if functor.kind == "FastLinearCombinationClamp" and gemm.k() > _FAST_CLAMP_MAX_K:
            raise ArgumentError(f"FastLinearCombinationClamp is exact only for an implicit GEMM K <= "
                                f"{_FAST_CLAMP_MAX_K}; this problem has K = R*S*C = {gemm.k()}")
        # Parallel writes raw partials to the workspace even for one slice (as GemmSplitKParallel and PyCUTLASS
        # do): the ReductionOperation that follows reads them from there.
        self.parallel = self.split_k_mode is SplitKMode.Parallel
        # The implicit GEMM's split-K: the same rules for integer outputs as the GEMM's
        check_split_k_output(operation, GemmMode.GemmSplitKParallel if self.parallel else GemmMode.Gemm,
                             self.split_k_slices, self.output_op)
        if self.parallel and operation.is_strided_dgrad:
            # ImplicitGemmConvolutionStridedDgrad has no parallel split-K path: unlike ImplicitGemmConvolution it
            # never offsets D by the slice, so every slice would write its partial sum over slice 0's.
            raise ArgumentError(f"{operation.name}: the strided-dgrad kernel (dgrad with StrideSupport.Strided) "
                                f"does not implement SplitKMode.Parallel (every slice would write the same "
                                f"workspace slice); use SplitKMode.Serial, or a StrideSupport.Unity "
                                f"operation for stride-1 problems")
        if self.parallel:
            if functor.activation is not None or functor.kind != "LinearCombination":
                raise ArgumentError("SplitKMode.Parallel writes raw partial sums: build the convolution with a "
                                    "LinearCombination epilogue and apply alpha, beta and activations in the "
                                    "ReductionOperation")
            self.output_op = operation.epilogue_type(1.0, 0.0)
        elif C is None and self.output_op.beta != 0:
            raise ArgumentError(f"C is None but beta is {self.output_op.beta}; pass C or set beta to 0")

        roles = _ROLES[kind]
        extents = {"A": tuple(problem_size.tensor_a_extent(kind)), "B": tuple(problem_size.tensor_b_extent(kind)),
                   "C": tuple(problem_size.tensor_c_extent(kind)), "D": tuple(problem_size.tensor_c_extent(kind))}
        descriptions = {"A": operation.A, "B": operation.B, "C": operation.C, "D": operation.C}
        channels = extents["C"][3]
        if bias and C is None:
            raise ArgumentError("bias=True says C is a bias vector, but C is None")
        if bias and operation.C.layout.is_interleaved:
            raise ArgumentError(f"bias=True: a bias vector needs a TensorNHWC C, the operation's C is "
                                f"{operation.C.layout.value}")
        # Raw CUdeviceptr operands (PyCUTLASS): packed, sized from the problem.
        count = {label: extent[0] * extent[1] * extent[2] * extent[3] for label, extent in extents.items()}
        A = pointer_operand(A, count["A"], operation.A.element, f"A ({roles[0]})")
        B = pointer_operand(B, count["B"], operation.B.element, f"B ({roles[1]})")
        C = pointer_operand(C, channels if bias else count["C"], operation.C.element, f"C ({roles[2]})")
        D = pointer_operand(D, count["D"], operation.C.element, f"D ({roles[2]})")
        if operation.B.layout.is_interleaved and not reordered and B is not None and count["B"]:
            # PyCUTLASS reordered the filter (cutlass::reorder_convK) inside its Arguments: do the same, in a copy
            # these arguments own. reordered=True: the filter is already in the kernel's order.
            B = self._reordered_B = reorder_interleaved_operand_filter(B, problem_size, kind, f"B ({roles[1]})")
        self._operands: dict[str, tuple[TensorInfo, tuple | None]] = {}
        for label, tensor in (("A", A), ("B", B), ("C", C), ("D", D)):
            if tensor is None and (label == "C" or (label == "D" and self.parallel)):
                continue
            role = roles[{"A": 0, "B": 1, "C": 2, "D": 2}[label]]
            info = describe(tensor, f"{label} ({role})")
            if label == "C":
                info = self._as_bias(info, bias, extents["C"])
            desc = descriptions[label]
            if not (self.parallel and label in ("C", "D")):  # in parallel split-K, C and D are the reduction's
                if info.element is not storage_type(desc.element):
                    raise ArgumentError(f"{info.name}: the operation expects {storage_type(desc.element).label} "
                                        f"elements, got {info.element.label}")
            c_strides = self._check_geometry(info, desc.layout, extents[label], allow_broadcast=label == "C")
            if label == "C" and bias and c_strides is None and info.numel != channels:  # (N*P*Q = 1: the same)
                raise ArgumentError(f"{info.name}: bias=True says C is a bias vector of {channels} elements (one per "
                                    f"output channel, or a view broadcasting one), but it is a full output-size "
                                    f"tensor (shape {info.shape}, strides {info.strides})")
            if c_strides is not None and kind is Operator.wgrad and problem_size.R * problem_size.S != 1:
                # The wgrad epilogue reads C as the implicit GEMM's K x (R*S*C) row-major matrix and takes only its
                # leading dimension (the K stride) from the tensor: a bias broadcast over K (ld 0) is read as
                # R*S*C contiguous elements, past the end of a vector of C channels.
                raise ArgumentError(
                    f"{info.name}: wgrad reads C as a K x (R*S*C) = {gemm.m()} x {gemm.n()} matrix with only its "
                    f"K stride taken from the tensor, so a bias of the {problem_size.C} channels broadcast over K, "
                    f"R and S would be read as {gemm.n()} contiguous elements, past its end (R*S = "
                    f"{problem_size.R * problem_size.S}); pass the full (K, R, S, C) tensor")
            self._operands[label] = (info, c_strides)
        self.bias = "C" in self._operands and self._operands["C"][1] is not None
        self._materialize()

    @staticmethod
    def _as_bias(info: TensorInfo, bias, extent) -> TensorInfo:
        """C as PyCUTLASS's bias: with ``bias=True`` any contiguous tensor of one value per output channel (a
        full-size C is a contradiction); without it, a C of exactly that many elements when that is fewer than the
        output's (PyCUTLASS's auto-detection). Returned as the 1-D vector the geometry check reads as a bias."""
        n, h, w, c = extent
        numel = info.numel
        if not (numel == c and (bias or numel < n * h * w * c)) or len(info.shape) == 1:
            return info
        if len(info.shape) == 4 and not bias:
            return info  # a 4-D view: read by its strides
        if numel > 1 and not info.is_contiguous:
            raise ArgumentError(f"{info.name}: a bias vector must be contiguous, got shape {info.shape}, strides "
                                f"{info.strides}")
        return as_flat(info)

    # --- validation (no GPU) --------------------------------------------------------------------------------
    @staticmethod
    def _check_geometry(info: TensorInfo, layout: LayoutType, extent, allow_broadcast: bool):
        """Returns C's (w, h, n) strides for the kernel (None: packed)."""
        n, h, w, c = extent
        count = n * h * w * c
        shape_text = f"(N, H, W, C) = {extent}"
        if layout.is_interleaved:
            if info.numel != count or not info.is_contiguous:
                raise ArgumentError(f"{info.name}: an interleaved {layout.value} operand must be a contiguous tensor "
                                    f"of {count} elements in interleaved order; got shape {info.shape}, strides "
                                    f"{info.strides}")
            return None
        if len(info.shape) == 1:
            if info.shape[0] == count and (info.shape[0] <= 1 or info.strides[0] == 1):
                return None
            if allow_broadcast and info.shape[0] == c and (c <= 1 or info.strides[0] == 1):
                return (0, 0, 0)
            hint = f" or a bias vector of {c}" if allow_broadcast else ""
            raise ArgumentError(f"{info.name}: a 1-D operand must hold {count} contiguous elements (packed NHWC "
                                f"{shape_text}){hint}; got shape {info.shape}, strides {info.strides}")
        if len(info.shape) != 4:
            raise ArgumentError(f"{info.name}: expected a 4-D tensor of shape {(n, h, w, c)} (NHWC) or {(n, c, h, w)} "
                                f"(NCHW in channels_last memory), or a packed 1-D tensor; got shape {info.shape}")
        strides = _nhwc_strides(info, extent)
        if strides is None:
            raise ArgumentError(f"{info.name}: expected shape {(n, h, w, c)} (NHWC) or {(n, c, h, w)} (NCHW in "
                                f"channels_last memory) for {shape_text}; got shape {info.shape}")
        if _matches(strides, _packed_strides(extent), extent):
            return None
        if allow_broadcast and _matches(strides, (0, 0, 0, 1), extent):
            return (0, 0, 0)
        broadcast = " or a bias broadcast (zero strides but unit channel stride)" if allow_broadcast else ""
        raise ArgumentError(f"{info.name}: the kernel reads packed NHWC tensors{broadcast}: expected NHWC strides "
                            f"{_packed_strides(extent)}, got {strides} (shape {info.shape}, strides {info.strides}); "
                            f"pass a contiguous NHWC tensor or torch's channels_last memory format")

    # --- device state ---------------------------------------------------------------------------------------
    def _tensor_infos(self) -> list:
        return [info for info, _ in self._operands.values()]

    def _memo_operands(self) -> list:
        """The TensorInfo behind each fast-path address (A, B, C, D); None where C is absent or not read."""
        read = {id(info) for info in self._read()}
        return [info if label == "D" or id(info) in read else None
                for label, info in ((label, self._operands.get(label, (None,))[0]) for label in "ABCD")]

    def _written(self) -> list:
        # In parallel split-K the kernel writes only its workspace; C and D are the reduction's.
        return [] if self.parallel or "D" not in self._operands else [self._operands["D"][0]]

    def _read(self) -> list:
        unread = {"D"} | ({"C"} if self.parallel or self.output_op.beta == 0 else set())  # beta = 0: no source load
        return [info for label, (info, _) in self._operands.items() if label not in unread]

    def _in_place(self) -> list:
        if "C" not in self._operands or "D" not in self._operands:
            return []
        return [(self._operands["D"][0], self._operands["C"][0])]

    def _allocate(self) -> None:
        op = self.operation
        kind = op.conv_kind
        self.addresses = {}
        alignments = {"A": op.A.alignment, "B": op.B.alignment, "C": op.C.alignment, "D": op.C.alignment}
        for label, (info, _) in self._operands.items():
            address = self.tensors.address(info, is_output=label == "D")
            vector_bytes = alignments[label] * info.itemsize  # a broadcast bias is read with the same vectors
            if address % vector_bytes:
                raise ArgumentError(f"{info.name}: address {address:#x} is not aligned to the operation's "
                                    f"{vector_bytes}-byte vector accesses (alignment {alignments[label]}); use an "
                                    f"aligned tensor or an operation with a smaller alignment")
            self.addresses[label] = address
        self.c_strides = self._operands["C"][1] if "C" in self._operands else None
        self.partition_stride = self.problem_size.tensor_c_size(kind)
        self.workspace = 0
        if self.parallel:
            itemsize = op.C.element.bits // 8
            self._workspace_bytes = op.workspace_elements(self.problem_size, SplitKMode.Parallel) * itemsize
            self.workspace = self.tensors.allocate(self._workspace_bytes)
            self.addresses["C"] = self.addresses["D"] = self.workspace
            self.c_strides = None
        if "C" not in self.addresses:  # beta == 0: the kernel does not read C
            self.addresses["C"] = self.addresses["D"]
            self.c_strides = None
        self.ptr_D = PartialsAddress(self.workspace, op.C.element, self._workspace_bytes) if self.parallel \
            else self.addresses["D"]
        self.semaphore = 0
        self._semaphore_capacity = op.semaphore_count(self.problem_size, self.split_k_mode)
        if self._semaphore_capacity:
            self.semaphore = self.tensors.zeros(4 * self._semaphore_capacity)  # the kernel resets it after use

    @property
    def reduction_problem_size(self) -> tuple[int, int]:
        """(M, N) of the implicit GEMM: the row-major matrix each parallel split-K slice holds."""
        gemm = self.problem_size.implicit_gemm_size(self.operation.conv_kind)
        return gemm.m(), gemm.n()

    @property
    def reduction_output_nhwc(self) -> tuple[int, int, int, int]:
        """The NHWC extent of the output those slices reduce to (wgrad: the filter's K, R, S, C)."""
        extent = self.problem_size.tensor_c_extent(self.operation.conv_kind)
        return extent.n(), extent.h(), extent.w(), extent.c()

    def bind(self, loaded_op=None):
        return self.operation.make_abi_arguments(
            self.problem_size, self.addresses["A"], self.addresses["B"], self.addresses["C"], self.addresses["D"],
            self.output_op, self.split_k_mode, self.semaphore, self.c_strides)

    def after_build(self, loaded_op, launch, abi_struct) -> None:
        if launch.semaphore_count > self._semaphore_capacity:
            raise ArgumentError(f"{self.operation.name}: serial split-K needs {launch.semaphore_count} semaphores, "
                                f"{self._semaphore_capacity} were allocated")
        if self.parallel:
            slices = self.problem_size.split_k_slices
            zero_unwritten_partials(self, launch, slices, self._workspace_bytes // slices)

