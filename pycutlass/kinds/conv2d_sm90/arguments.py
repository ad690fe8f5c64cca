"""Conv2dArguments for SM90 convolutions: the same surface as the Sm80 kind's (``Conv2dArguments(op, ...)`` hands
out this class when ``op`` is a ``Conv2dOperationSm90``). C as a bias vector works with operations built with
``bias=True`` (the fused per-channel bias).

CUTLASS 4.2's SM90 conv has no split-K. wgrad, whose GEMM K (N*P*Q) is long while its output (K x R*S*C) is small
and fills few SMs, takes ``SplitKMode.Parallel`` here: the GEMM K is cut into ``split_k_slices`` slices that are each
an ordinary wgrad problem (Params built as for any problem) writing its own partial filter gradient, and one launch
runs them all (blockIdx.z picks the slice's Params from an array on the device). Up to N slices are runs of whole
images; N*F slices cut every image into F runs of output rows, each a one-image problem over the input rows those
rows read (its own top and bottom padding). A ReductionOperation then adds the partials, as for Sm80-family parallel
split-K. Serial split-K is refused. The filter-tap-reuse wgrad (tile N = 9*64) splits K itself: one Params, and
``split_k_slices`` clusters of CTAs along the grid's z, each summing its own run of output-row segments."""
from __future__ import annotations


from ...errors import ArgumentError, CudaError
from ...runtime.launch import PreparedLaunch, loaded
from ..conv2d.arguments import Conv2dArguments
from ..families.conv import Conv2dProblemSize, Operator, SplitKMode
from ..families.sm90_arguments import persistent_sm_count
from .abi import Sm90ConvSlices
from .operation import Conv2dOperationSm90

_DESCRIPTOR_ALIGNMENT = 128  # each slice's Params start where its TMA descriptors keep their 64-byte alignment


def image_slices(images: int, slices: int) -> list[tuple[int, int]]:
    """``slices`` runs covering ``images`` (or rows), sizes differing by at most one: [(first, end), ...]."""
    base, extra = divmod(images, slices)
    bounds, first = [], 0
    for index in range(slices):
        end = first + base + (1 if index < extra else 0)
        bounds.append((first, end))
        first = end
    return bounds


def wgrad_slices(problem_size: Conv2dProblemSize, slices: int) -> list[tuple[Conv2dProblemSize, int, int]]:
    """The slices of a wgrad's GEMM K (N*P*Q): [(problem, first activation element, first output-gradient element)].
    ``slices`` <= N: runs of whole images; a multiple of N up to N*P: each image cut into runs of output rows
    (``Conv2dOperationSm90.check_problem_size`` says which counts are allowed)."""
    ps = problem_size
    if slices <= ps.N:
        return [(Conv2dProblemSize((end - first, ps.H, ps.W, ps.C), (ps.K, ps.R, ps.S, ps.C), ps.padding(),
                                   ps.stride(), ps.dilation(), ps.mode),
                 first * ps.H * ps.W * ps.C, first * ps.P * ps.Q * ps.K)
                for first, end in image_slices(ps.N, slices)]
    parts = []
    for first_row, end_row in image_slices(ps.P, slices // ps.N):
        # Output rows [first_row, end_row) read input rows [top, bottom] (rows outside the image are padding): the
        # slice is a one-image problem over the rows inside, padded by what lies outside.
        top = first_row * ps.stride_h - ps.pad_h
        bottom = (end_row - 1) * ps.stride_h - ps.pad_h + (ps.R - 1) * ps.dilation_h
        first_in, last_in = max(top, 0), min(bottom, ps.H - 1)
        if last_in < first_in:
            raise ArgumentError(f"wgrad split into {slices} slices: output rows {first_row}..{end_row - 1} read only "
                                f"padding (no input row); use fewer slices")
        part = Conv2dProblemSize((1, last_in - first_in + 1, ps.W, ps.C), (ps.K, ps.R, ps.S, ps.C),
                                 (first_in - top, bottom - last_in, ps.pad_w, ps.upper_pad_w), ps.stride(),
                                 ps.dilation(), ps.mode)
        assert (part.P, part.Q) == (end_row - first_row, ps.Q), (part, first_row, end_row)
        parts.append((part, first_in * ps.W * ps.C, first_row * ps.Q * ps.K))
    return [(part, image * ps.H * ps.W * ps.C + activation, image * ps.P * ps.Q * ps.K + gradient)
            for image in range(ps.N) for part, activation, gradient in parts]


class Conv2dArgumentsSm90(Conv2dArguments):
    """``Conv2dArguments(op, problem_size, A, B, C, D, output_op=None, split_k_mode=SplitKMode.Serial,
    split_k_slices=1, stream=None, device=None, session=None)`` for an SM90 operation. A, B, C and D are packed
    NHWC (or channels_last NCHW) tensors; C may be None when beta is 0. wgrad also takes
    ``split_k_mode=SplitKMode.Parallel`` with 1 <= ``split_k_slices`` <= N (see the module docstring)."""

    def _validate_and_prepare(self, operation, problem_size, A, B, C, D, output_op, split_k_mode, split_k_slices,
                              stream, device, session, bias=None, reordered=False):
        if not isinstance(operation, Conv2dOperationSm90):
            raise ArgumentError(f"Conv2dArgumentsSm90 needs an SM90 Conv2dOperation, got {type(operation).__name__}")
        many = False
        if split_k_slices not in (1, None) and not isinstance(split_k_slices, bool):
            try:
                many = int(split_k_slices) != 1
            except (TypeError, ValueError):
                many = False  # the base class says what is wrong with it
        many = many or (isinstance(problem_size, Conv2dProblemSize) and problem_size.split_k_slices != 1)
        wgrad = operation.conv_kind is Operator.wgrad
        try:
            parallel = SplitKMode(split_k_mode) is SplitKMode.Parallel
        except ValueError:
            parallel = False  # the base class says what is wrong with it
        if parallel and not wgrad:
            raise ArgumentError(f"{operation.name}: CUTLASS 4.2's SM90 convolution has no split-K; SM90 splits only "
                                f"wgrad (SplitKMode.Parallel, by images); use an Sm80-family operation for split-K "
                                f"of {operation.conv_kind.name}")
        if many and not parallel:
            if wgrad:
                raise ArgumentError(f"{operation.name}: SM90 wgrad splits K in parallel only (CUTLASS 4.2's SM90 "
                                    f"conv has no serial fix-up): pass split_k_mode=SplitKMode.Parallel with an "
                                    f"operation writing float32 partials and reduce them with a ReductionOperation, "
                                    f"or split_k_slices=1")
            raise ArgumentError(f"{operation.name}: CUTLASS 4.2's SM90 convolution has no split-K; split_k_slices "
                                f"must be 1, got {split_k_slices} (use an Sm80-family operation)")
        if bias and not operation.bias:
            raise ArgumentError(f"{operation.name}: bias=True (C as a broadcast vector) needs an SM90 operation built "
                                f"with Conv2dOperation(..., bias=True) (the fused per-channel bias; TMA reads C as a "
                                f"whole tensor otherwise)")
        self._slices = None
        super()._validate_and_prepare(operation, problem_size, A, B, C, D, output_op, split_k_mode, split_k_slices,
                                      stream, device, session, bias, reordered)

    def _materialize(self) -> None:
        # What C may be, checked after the base class validated the tensors and before anything reaches a device.
        operation = self.operation
        if self._split_by_images:
            self._slices = wgrad_slices(self.problem_size, self.split_k_slices)
            for part, _, _ in self._slices:
                operation.check_problem_size(part)
        C = self._operands.get("C")
        broadcast = self.bias or (self.c_strides_given is not None)
        if operation.bias:
            # The fused bias: C is the vector (one value per output channel), added once: D = act(alpha * conv + C).
            if C is None or not broadcast:
                raise ArgumentError(f"{operation.name}: built with bias=True, so C must be the bias vector (one value "
                                    f"per output channel, 1-D or a broadcast view), got "
                                    f"{'None' if C is None else 'a full tensor'}")
            if self.output_op.beta != 1:
                raise ArgumentError(f"{operation.name}: the fused bias is added once (D = act(alpha * conv + bias)); "
                                    f"beta must be 1, got {self.output_op.beta}")
        elif broadcast:
            raise ArgumentError(f"{operation.name}: C broadcast from a vector needs an SM90 operation built with "
                                f"bias=True (TMA reads C as a whole tensor); pass a full packed C")
        super()._materialize()

    def bind(self, loaded_op=None):
        return self.operation.make_abi_arguments(
            self.problem_size, self.addresses["A"], self.addresses["B"], self.addresses["C"], self.addresses["D"],
            self.output_op, sm_count=self._sm_count())

    def _sm_count(self) -> int:
        """The persistent grid's SMs (the cooperative kernel's): the device's, in whole clusters."""
        return persistent_sm_count(self.operation, None, self.device) if self.operation.cooperative else 0

    @property
    def c_strides_given(self):
        found = self._operands.get("C")
        return None if found is None else found[1]

    # --- parallel split-K by images --------------------------------------------------------------------------
    @property
    def _split_by_images(self) -> bool:
        """Parallel split-K as one problem per slice (the filter-tap-reuse kernel splits K over its own grid)."""
        return self.parallel and self.split_k_slices > 1 and not self.operation.filter_taps

    def _prepare(self) -> PreparedLaunch:
        if self._prepared is None and self._split_by_images:
            self._prepared = self._prepare_slices()
        return super()._prepare()

    prepared = _prepare

    def _prepare_slices(self) -> PreparedLaunch:
        """Params for every slice (each a wgrad over its images into its own partial), copied to the device one
        after another; the launch runs the unit's ``<name>_slices`` kernel with one z layer per slice."""
        operation, ps = self.operation, self.problem_size
        loaded_op = loaded(operation, self.device, self.session)
        operand_bytes = operation.A.element.bits // 8
        partial_bytes = ps.tensor_c_size(operation.conv_kind) * operation.C.element.bits // 8
        shape, blobs = None, []
        for index, (part, activation, gradient) in enumerate(self._slices):
            partial = self.workspace + index * partial_bytes
            # wgrad's A is the output gradient (N, P, Q, K), B the activation (N, H, W, C)
            abi = operation.make_abi_arguments(part, self.addresses["A"] + gradient * operand_bytes,
                                               self.addresses["B"] + activation * operand_bytes, partial, partial,
                                               self.output_op, sm_count=self._sm_count())
            found, params = loaded_op.params_for(abi, self.stream)
            if shape is None:
                shape = found
            elif found[:3] != shape[:3]:  # every slice covers the same filter-gradient tiles
                raise CudaError(f"{operation.name}: the slices' launch shapes differ ({found[:3]} vs {shape[:3]})",
                                operation=operation.name)
            blobs.append(bytes(params))
        (grid_x, grid_y, _), block, smem, *_ = shape
        stride = -(-len(blobs[0]) // _DESCRIPTOR_ALIGNMENT) * _DESCRIPTOR_ALIGNMENT
        slices = Sm90ConvSlices()
        slices.params = self.tensors.upload(b"".join(blob.ljust(stride, b"\0") for blob in blobs))
        slices.slice_bytes = stride
        function = loaded_op.function(operation.name + "_slices", smem)
        self._loaded_op = loaded_op
        return PreparedLaunch(function, (grid_x, grid_y, self.split_k_slices), block, smem, slices, 0,
                              operation.name + "_slices")
