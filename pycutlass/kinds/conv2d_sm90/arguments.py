"""Conv2dArguments for SM90 convolutions: the same surface as the Sm80 kind's (``Conv2dArguments(op, ...)`` hands
out this class when ``op`` is a ``Conv2dOperationSm90``), less what CUTLASS 4.2's SM90 conv does not have: split-K
(serial or parallel) and C as a broadcast bias vector (TMA reads whole tensors)."""
from __future__ import annotations

from ...errors import ArgumentError
from ..conv2d import arguments as conv2d_arguments
from ..conv2d.arguments import Conv2dArguments
from .operation import Conv2dOperationSm90


class Conv2dArgumentsSm90(Conv2dArguments):
    """``Conv2dArguments(op, problem_size, A, B, C, D, output_op=None, split_k_mode=SplitKMode.Serial,
    split_k_slices=1, stream=None, device=None, session=None)`` for an SM90 operation. A, B, C and D are packed
    NHWC (or channels_last NCHW) tensors; C may be None when beta is 0."""

    def _validate_and_prepare(self, operation, problem_size, A, B, C, D, output_op, split_k_mode, split_k_slices,
                              stream, device, session, bias=None, reordered=False):
        if not isinstance(operation, Conv2dOperationSm90):
            raise ArgumentError(f"Conv2dArgumentsSm90 needs an SM90 Conv2dOperation, got {type(operation).__name__}")
        if split_k_slices not in (1, None) and not isinstance(split_k_slices, bool):
            try:
                many = int(split_k_slices) != 1
            except (TypeError, ValueError):
                many = False
            if many:
                raise ArgumentError(f"{operation.name}: CUTLASS 4.2's SM90 convolution has no split-K; "
                                    f"split_k_slices must be 1, got {split_k_slices} (use an Sm80-family operation)")
        if bias:
            raise ArgumentError(f"{operation.name}: bias=True (C as a broadcast vector) is not built for SM90 "
                                f"convolutions (TMA reads whole tensors); pass a full C")
        super()._validate_and_prepare(operation, problem_size, A, B, C, D, output_op, split_k_mode, split_k_slices,
                                      stream, device, session, bias, reordered)
        if self.bias or (self.c_strides_given is not None):
            raise ArgumentError(f"{operation.name}: C broadcast from a vector is not built for SM90 convolutions "
                                f"(TMA reads whole tensors); pass a full packed C")

    @property
    def c_strides_given(self):
        found = self._operands.get("C")
        return None if found is None else found[1]


conv2d_arguments.SM90_ARGUMENTS[Conv2dOperationSm90] = Conv2dArgumentsSm90
