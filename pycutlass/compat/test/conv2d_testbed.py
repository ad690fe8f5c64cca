"""PyCUTLASS 2.11's conv2d testbed: ``Conv2dLauncher`` runs one problem and checks it, ``test_all_conv2d`` sweeps a
set of problem sizes (and PyCUTLASS's split-K sweep) for an operation.

The default sizes are pycutlass's own (PyCUTLASS took CUTLASS's C++ list, which its Python bindings exposed): 1x1,
3x3, 5x5-by-dilation and 7x7 filters, rectangular filters and strides, padding, odd extents, batch > 1, with
channel counts that are multiples of the operation's access widths. Inputs, the NaN-poisoned output, the float64
reference of the whole epilogue and the skipping of refused cases are as in the GEMM testbed (``gemm_testbed``).
Interleaved int8 fprop (NC32HW32 activations and output, C32RSK32 filter) runs as in PyCUTLASS
(``test_all_conv2d(op, interleaved=True)``): the operands are drawn as NHWC / KRSC, interleaved for the kernel (the
filter's reordering for the kernel is Conv2dArguments' own, as PyCUTLASS's testbed called ``reorder_convK``), and D
is brought back to NPQK for the check; channel counts are then multiples of 32.
"""
from __future__ import annotations

import numpy as np

from ...description.types import LayoutType
from ...errors import ArgumentError
from ...kinds.conv2d.problem import (Conv2dProblemSize, IteratorAlgorithm, Operator, SplitKMode, StrideSupport,
                                    implicit_gemm_problem_size, implicit_gemm_tensor_a_extent,
                                    implicit_gemm_tensor_b_extent, implicit_gemm_tensor_c_extent)
from ..utils.reference_model import conv2d_dgrad, conv2d_fprop, conv2d_wgrad
from . import _common


_INTERLEAVED = (LayoutType.TensorNC32HW32, LayoutType.TensorC32RSK32, LayoutType.TensorNC32HW32)


def _extent(coord) -> tuple:
    return coord.n(), coord.h(), coord.w(), coord.c()


def _interleave(x: np.ndarray, filter_: bool = False) -> np.ndarray:
    """NHWC -> NC32HW32 (N, C/32, H, W, 32), or a KRSC filter -> C32RSK32 (C/32, R, S, K, 32); flattened."""
    n, h, w, c = x.shape
    order = (3, 1, 2, 0, 4) if filter_ else (0, 3, 1, 2, 4)
    return np.ascontiguousarray(x.reshape(n, h, w, c // 32, 32).transpose(order)).ravel()


def _deinterleave(flat: np.ndarray, shape) -> np.ndarray:
    """An NC32HW32 output, flat, back to NHWC (``shape``)."""
    n, h, w, c = shape
    return flat.reshape(n, c // 32, h, w, 32).transpose(0, 2, 3, 1, 4).reshape(shape)


class Conv2dLauncher(_common.Launcher):
    """Runs ``operation`` on one problem at a time and checks it (``run`` returns True or False; with
    ``profiling=True`` the average milliseconds per run instead)."""

    def __init__(self, operation, seed: int = _common.SEED, interleaved: bool = False,
                 enable_cached_results: bool = True, profiling: bool = False, warmup_iterations: int = 500,
                 iterations: int = 500, verification: bool = True, activation_args=(), **kwargs) -> None:
        layouts = tuple(d.layout for d in (operation.A, operation.B, operation.C))
        if interleaved and layouts != _INTERLEAVED:
            raise ArgumentError(f"interleaved=True needs an NC32HW32 / C32RSK32 / NC32HW32 operation; its layouts "
                                f"are {[layout.value for layout in layouts]}")
        super().__init__(operation, seed, verification, profiling, warmup_iterations, iterations, activation_args,
                         kwargs)
        self.interleaved = layouts == _INTERLEAVED  # the operation says; PyCUTLASS's flag is then optional
        self.conv_kind = operation.conv_kind

    def host_reference(self, problem_size, tensor_A, tensor_B, tensor_C, alpha, beta):
        """The float64 reference of D (4-D, the output's extent) from 4-D float64 operands."""
        compute = {Operator.fprop: conv2d_fprop, Operator.dgrad: conv2d_dgrad,
                   Operator.wgrad: conv2d_wgrad}[self.conv_kind]
        accumulator = compute(tensor_A, tensor_B, problem_size)
        return _common.epilogue_reference(self.functor, self.operation.C.element, accumulator, tensor_C, alpha, beta,
                                          self.activation_args)

    def run(self, problem_size, split_k_mode=SplitKMode.Serial, alpha: float = 1.0, beta: float = 0.0):
        from ...kinds.conv2d.arguments import Conv2dArguments

        op = self.operation
        rng = np.random.default_rng(self.seed)
        shapes = [_extent(f(self.conv_kind, problem_size)) for f in (
            implicit_gemm_tensor_a_extent, implicit_gemm_tensor_b_extent, implicit_gemm_tensor_c_extent)]
        a, b, c = (_common.uniform_integers(rng, shape, d.element, self.bounds)
                   for shape, d in zip(shapes, (op.A, op.B, op.C)))
        tensor_D = _common.poisoned(int(np.prod(shapes[2])), op.C.element)
        if self.interleaved:  # fprop: A activation, B filter, C/D output
            packed = (_interleave(a), _interleave(b, filter_=True), _interleave(c))
            output = lambda: _deinterleave(tensor_D, shapes[2])  # noqa: E731
        else:
            packed = (a.ravel(), b.ravel(), c.ravel())
            output = lambda: tensor_D.reshape(shapes[2])  # noqa: E731
        slices = problem_size.split_k_slices
        parallel = split_k_mode == SplitKMode.Parallel
        case = f"{problem_size} split_k_mode={SplitKMode(split_k_mode).name} alpha={alpha} beta={beta}"

        def build():
            arguments = Conv2dArguments(op, problem_size, *packed, tensor_D,
                                        output_op=op.epilogue_type(alpha, beta, *self.activation_args),
                                        split_k_mode=split_k_mode, split_k_slices=slices)
            if not parallel:
                return arguments, None
            gemm = implicit_gemm_problem_size(self.conv_kind, problem_size)
            return arguments, self.reduction_arguments(arguments, [gemm.m(), gemm.n()], slices, tensor_D,
                                                       packed[2], alpha, beta)

        return self.execute(
            case, build,
            lambda: self.host_reference(problem_size, *(x.astype(np.float64) for x in (a, b, c)), alpha, beta),
            output, 1 if parallel else slices,
            lambda detail: print(f"{self.conv_kind.name} {case}: {detail}"))


def default_problem_sizes(operation) -> list:
    """pycutlass's default conv sizes for ``operation``: channel counts in multiples of its access widths (exactly
    A's width for fixed_channels); for the filter-tap-reuse wgrad, the 3x3 stride-1 problems it computes."""
    unit = max(8, operation.A.alignment, operation.B.alignment, operation.C.alignment)
    if operation.A.layout is LayoutType.TensorNC32HW32:
        unit = max(unit, 32)  # interleaved tensors hold channels in groups of 32
    fixed = operation.iterator_algorithm is IteratorAlgorithm.fixed_channels

    def size(n, h, w, c, k, r, s, pad=(0, 0), stride=(1, 1), dilation=(1, 1)):
        c = operation.A.alignment if fixed else c * unit
        return Conv2dProblemSize((n, h, w, c), (k * unit, r, s, c), (pad[0], pad[0], pad[1], pad[1]), stride,
                                 dilation)

    if getattr(operation, "filter_taps", False):
        # the filter-tap-reuse wgrad computes 3x3 filters at stride and dilation 1 with channels in 64s only
        return [size(1, 8, 8, 8, 8, 3, 3, pad=(1, 1)), size(2, 11, 13, 16, 8, 3, 3, pad=(1, 1)),
                size(1, 17, 11, 8, 16, 3, 3), size(3, 5, 7, 8, 8, 3, 3, pad=(2, 2))]
    return [
        size(1, 1, 1, 1, 1, 1, 1),
        size(1, 8, 8, 2, 1, 3, 3, pad=(1, 1)),
        size(1, 7, 9, 1, 2, 3, 3, pad=(1, 1), stride=(2, 2)),
        size(2, 11, 13, 3, 1, 3, 3, pad=(2, 2), dilation=(2, 2)),
        size(1, 16, 16, 4, 2, 1, 1, stride=(2, 2)),
        size(3, 5, 5, 1, 1, 3, 2, pad=(1, 0), stride=(1, 2)),
        size(1, 17, 11, 2, 3, 3, 3, pad=(1, 1)),
        size(1, 23, 21, 1, 1, 7, 7, pad=(3, 3), stride=(2, 2)),
        size(2, 9, 9, 4, 4, 3, 3),
        size(1, 4, 4, 1, 1, 2, 2, stride=(2, 2)),
    ]


def test_all_conv2d(operation, conv_test_sizes=(), interleaved: bool = False, compilation_mode: str = "nvcc",
                    **launcher_kwargs) -> bool:
    """The default sizes plus ``conv_test_sizes`` (serial, one slice, alpha 1, beta 0), then PyCUTLASS's split-K
    sweep on one size (serial and parallel, 1-4 and 201 slices, alpha 2, beta 2). Skips what each kernel
    specializes away (unity-stride dgrad on strides > 1; strided dgrad on stride 1). Returns False when any
    result is wrong. ``compilation_mode``: "nvcc" or "nvrtc", the session's backend for this call."""
    from ... import compiler

    if compilation_mode not in ("nvcc", "nvrtc"):
        raise ArgumentError(f"compilation_mode must be 'nvcc' or 'nvrtc', got {compilation_mode!r}")
    previous = compiler.backend()
    getattr(compiler, compilation_mode)()
    try:
        return sweep(Conv2dLauncher(operation, interleaved=interleaved, **launcher_kwargs), list(conv_test_sizes))
    finally:
        compiler.use(previous)


def sweep(launcher: Conv2dLauncher, extra_sizes=()) -> bool:
    """``test_all_conv2d``'s cases on a launcher of one's own (whose ``skipped`` then tells what was refused)."""
    operation = launcher.operation
    dgrad = operation.conv_kind is Operator.dgrad
    strided = operation.stride_support is StrideSupport.Strided
    skipped_before, attempts, passed = len(launcher.skipped), 0, True

    def run(*case) -> None:
        nonlocal attempts, passed
        attempts += 1
        passed = launcher.run(*case) and passed

    seen = []
    for problem in default_problem_sizes(operation) + list(extra_sizes):
        if problem in seen:
            continue
        unit_stride = problem.stride_h == 1 and problem.stride_w == 1
        if dgrad and (unit_stride if strided else not unit_stride):
            continue
        if operation.iterator_algorithm is IteratorAlgorithm.few_channels and problem.C % operation.A.alignment:
            continue
        seen.append(problem)
        run(problem)
    if dgrad and strided:
        run(Conv2dProblemSize((1, 56, 56, 8), (8, 1, 1, 8), (0, 0, 0, 0), (2, 2), (1, 1)))
    elif operation.iterator_algorithm not in (IteratorAlgorithm.fixed_channels, IteratorAlgorithm.few_channels):
        split_k_size = Conv2dProblemSize((1, 17, 11, 288), (160, 3, 3, 288), (1, 1, 1, 1), (1, 1), (1, 1))
        if getattr(operation, "filter_taps", False):  # channels in 64s
            split_k_size = Conv2dProblemSize((2, 17, 11, 128), (64, 3, 3, 128), (1, 1, 1, 1), (1, 1), (1, 1))
        for mode in (SplitKMode.Parallel, SplitKMode.Serial):
            for slices in (1, 2, 3, 4, 201):
                run(split_k_size.reset_split_k_slices(slices), mode, 2.0, 2.0)
    return _common.sweep_verdict(launcher, "test_all_conv2d", attempts, skipped_before, passed)


test_all_conv2d.__test__ = False  # a library function: pytest must not collect it from ``from pycutlass.test import *``
