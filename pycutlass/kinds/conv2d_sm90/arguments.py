"""Conv2dArguments for SM90 convolutions: the same surface as the Sm80 kind's (``Conv2dArguments(op, ...)`` hands
out this class when ``op`` is a ``Conv2dOperationSm90``), less what CUTLASS 4.2's SM90 conv does not have: split-K
(serial or parallel). C as a bias vector works with operations built with ``bias=True`` (the fused per-channel bias)."""
from __future__ import annotations

from ...errors import ArgumentError
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
        if bias and not operation.bias:
            raise ArgumentError(f"{operation.name}: bias=True (C as a broadcast vector) needs an SM90 operation built "
                                f"with Conv2dOperation(..., bias=True) (the fused per-channel bias; TMA reads C as a "
                                f"whole tensor otherwise)")
        super()._validate_and_prepare(operation, problem_size, A, B, C, D, output_op, split_k_mode, split_k_slices,
                                      stream, device, session, bias, reordered)

    def _materialize(self) -> None:
        # What C may be, checked after the base class validated the tensors and before anything reaches a device.
        operation = self.operation
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

    @property
    def c_strides_given(self):
        found = self._operands.get("C")
        return None if found is None else found[1]
