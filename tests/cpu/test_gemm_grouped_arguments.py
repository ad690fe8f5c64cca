"""CPU tests of GemmGroupedArguments validation with numpy inputs: every error is raised before any GPU work."""
from __future__ import annotations

import numpy as np
import pytest

import pycutlass as c
from pycutlass.errors import ArgumentError, NoGpuError
from pycutlass import GemmOperationGrouped, SchedulerMode
from pycutlass import GemmGroupedArguments


def f16_op(layout_c=c.RowMajor, mode=SchedulerMode.Device, activation=False):
    math = c.MathInstruction([16, 8, 16], c.float16, c.float16, c.float32, c.OpClass.TensorOp)
    tile = c.TileDescription([64, 128, 32], 4, [2, 2, 1], math)
    A = c.TensorDescription(c.float16, c.RowMajor, 8)
    B = c.TensorDescription(c.float16, c.ColumnMajor, 8)
    C = c.TensorDescription(c.float16, layout_c, 8)
    if activation:
        epilogue = c.LinearCombinationGeneric(c.leaky_relu(c.float32), c.float16, 8, c.float32, c.float32)
    else:
        epilogue = c.LinearCombination(c.float16, 8, c.float32, c.float32)
    return GemmOperationGrouped(80, tile, A, B, C, epilogue, precompute_mode=mode)


def tensors(problems, layout_c=c.RowMajor):
    """A row-major, B column-major (as the op), C/D in ``layout_c``."""
    order_c = "C" if layout_c is c.RowMajor else "F"
    As = [np.ones((m, k), np.float16) for m, n, k in problems]
    Bs = [np.ones((k, n), np.float16, order="F") for m, n, k in problems]
    Cs = [np.ones((m, n), np.float16, order=order_c) for m, n, k in problems]
    Ds = [np.zeros((m, n), np.float16, order=order_c) for m, n, k in problems]
    return As, Bs, Cs, Ds


@pytest.fixture
def no_device(monkeypatch):
    """Stop at the first device step, recording that validation got there."""
    reached = []

    def materialize(self):
        reached.append(self)

    monkeypatch.setattr(GemmGroupedArguments, "_materialize", materialize)
    return reached


PROBLEMS = [(128, 256, 64), (0, 64, 32), (64, 0, 32), (72, 136, 0), (8, 8, 8)]


def test_valid_group_with_zero_sized_problems(no_device):
    op = f16_op()
    problems = [c.GemmCoord(*p) for p in PROBLEMS]
    args = GemmGroupedArguments(op, problems, *tensors(PROBLEMS), output_op=op.epilogue_type(1.0, 0.5))
    assert no_device == [args]
    assert args.tile_count == 2 * 2 + 0 + 0 + 2 * 2 + 1  # 64x128 tiles; K == 0 still writes beta * C
    assert args.output_op.beta == 0.5
    # Tuples work as problem sizes; K == 0 operands (m x 0, 0 x n) need no particular leading dimension.
    args = GemmGroupedArguments(op, PROBLEMS, *tensors(PROBLEMS))
    a_info, a_geometry = args._operands[3]["A"]
    assert a_geometry.ld % 8 == 0
    assert args.problem_sizes[0] == c.GemmCoord(128, 256, 64)


def test_column_major_output(no_device):
    op = f16_op(layout_c=c.ColumnMajor)
    problems = [(64, 128, 16), (16, 8, 8)]
    args = GemmGroupedArguments(op, problems, *tensors(problems, c.ColumnMajor))
    assert args.tile_count == op.tile_count(problems) == 2 + 1  # transposed: (N, M) over 64x128 tiles
    with pytest.raises(ArgumentError, match=r"Cs\[0\] \(problem 0, operand C\): a ColumnMajor operand needs unit "
                                            r"stride along its rows"):
        GemmGroupedArguments(op, problems, *tensors(problems, c.RowMajor))


def test_beta_zero_allows_missing_c(no_device):
    op = f16_op()
    As, Bs, Cs, Ds = tensors(PROBLEMS)
    GemmGroupedArguments(op, PROBLEMS, As, Bs, None, Ds)
    GemmGroupedArguments(op, PROBLEMS, As, Bs, [None] + Cs[1:], Ds, output_op=op.epilogue_type(2.0, 0.0))
    with pytest.raises(ArgumentError, match=r"problem 0: Cs\[0\] is None but beta is 1.0"):
        GemmGroupedArguments(op, PROBLEMS, As, Bs, [None] + Cs[1:], Ds, output_op=op.epilogue_type(1.0, 1.0))


def test_bias_row_broadcast_in_c(no_device):
    op = f16_op()
    problems = [(16, 64, 8)]
    As, Bs, _, Ds = tensors(problems)
    GemmGroupedArguments(op, problems, As, Bs, [np.ones(64, np.float16)], Ds, output_op=op.epilogue_type(1.0, 1.0))


@pytest.mark.parametrize("mutate, message", [
    (lambda p, t: ("nope", *t), r"problem_sizes must be a list"),
    (lambda p, t: (p[:1] + [(1, 2)] + p[2:], *t), r"problem 1: problem_size must be a pycutlass.gemm.GemmCoord"),
    (lambda p, t: (p[:1] + [(1, -2, 3)] + p[2:], *t), r"problem 1: GemmCoord.n must be >= 0"),
    (lambda p, t: (p, t[0][:2], *t[1:]), r"As has 2 tensor\(s\) but there are 5 problem\(s\)"),
    (lambda p, t: (p, t[0], tuple(t[1]) + (None,), *t[2:]), r"Bs has 6 tensor\(s\)"),
    (lambda p, t: (p, t[0], t[1], t[2], t[3][0]), r"Ds must be a list with one tensor per problem"),
    (lambda p, t: (p, [None] + t[0][1:], *t[1:]), r"As\[0\] \(problem 0, operand A\): a tensor is required"),
    (lambda p, t: (p, t[0][:1] + [np.ones((64, 16), np.float16)] + t[0][2:], *t[1:]),
     r"As\[1\] \(problem 1, operand A\): expected shape \(0, 32\), got \(64, 16\)"),
    (lambda p, t: (p, t[0], t[1][:4] + [np.ones((8, 8), np.float32, order="F")], *t[2:]),
     r"Bs\[4\] \(problem 4, operand B\): the operation expects float16 elements, got float32"),
    (lambda p, t: (p, t[0], t[1], t[2], t[3][:4] + [np.zeros((8, 8), np.float16, order="F")]),
     r"Ds\[4\] \(problem 4, operand D\): a RowMajor operand needs unit stride along its columns"),
    (lambda p, t: (p, t[0], t[1], t[2], t[3][:4] + [np.zeros((1, 8, 8), np.float16)]),
     r"Ds\[4\] \(problem 4, operand D\): expected a 2-D tensor of shape \(8, 8\), got shape \(1, 8, 8\)"),
    (lambda p, t: (p, [np.ones((128, 128), np.float16)[:, :64]] + t[0][1:], *t[1:]),
     r"As\[0\] \(problem 0, operand A\): host arrays must be dense"),
    (lambda p, t: (p, t[0], t[1], t[2], [np.broadcast_to(np.zeros(256, np.float16), (128, 256))] + t[3][1:]),
     r"Ds\[0\] \(problem 0, operand D\)"),
    (lambda p, t: (p, t[0], t[1], [np.ones(3, np.float16)] + t[2][1:], t[3]),
     r"Cs\[0\] \(problem 0, operand C\): 1-D operand has 3 elements"),
    (lambda p, t: (p[:4] + [(8, 8, 12)], *t), r"problem 4 GemmCoord\(8, 8, 12\): .*K must be a multiple of 8"),
    (lambda p, t: (p[:4] + [(8, 12, 8)], *t), r"problem 4 GemmCoord\(8, 12, 8\): .*N must be a multiple of 8"),
])
def test_rejections_name_the_problem_and_operand(no_device, mutate, message):
    op = f16_op()
    problems = [tuple(p) for p in PROBLEMS]
    As, Bs, Cs, Ds = tensors(PROBLEMS)
    with pytest.raises(ArgumentError, match=message):
        GemmGroupedArguments(op, *mutate(list(problems), (As, Bs, Cs, Ds)))
    assert no_device == []  # nothing got as far as the device


def test_rejects_other_operations_and_bad_epilogue_values(no_device):
    op = f16_op(activation=True)
    problems = [(8, 8, 8)]
    with pytest.raises(ArgumentError, match="GemmGroupedArguments needs a GemmOperationGrouped"):
        GemmGroupedArguments(object(), problems, *tensors(problems))
    with pytest.raises(ArgumentError, match="takes alpha, beta and 1 activation argument"):
        GemmGroupedArguments(op, problems, *tensors(problems), output_op=(1.0, 0.0))
    args = GemmGroupedArguments(op, problems, *tensors(problems), output_op=op.epilogue_type(1.0, 0.0, 0.1))
    assert args.output_op.activation_args == (0.1,)


def test_padded_leading_dimensions_must_keep_alignment(no_device):
    op = f16_op()
    problems = [(16, 64, 16)]
    As, Bs, Cs, Ds = tensors(problems)
    padded = np.ones((16, 24), np.float16)[:, :16]  # not contiguous: host arrays must be dense
    with pytest.raises(ArgumentError, match="must be dense"):
        GemmGroupedArguments(op, problems, [padded], Bs, Cs, Ds)


class _DeviceArray:
    """A stand-in device tensor (``__cuda_array_interface__``) at a chosen address; never dereferenced."""

    def __init__(self, shape, address, strides=None):
        self.__cuda_array_interface__ = {"shape": shape, "typestr": "<f2", "data": (address, False),
                                         "strides": strides, "version": 3}


def test_device_tensor_alignment_is_checked_before_the_device(no_device):
    op = f16_op()
    problems = [(16, 64, 16)]
    _, Bs, Cs, Ds = tensors(problems)
    with pytest.raises(ArgumentError, match=r"As\[0\] \(problem 0, operand A\): address 0x1002 is not aligned to "
                                            r"the operation's 16-byte"):
        GemmGroupedArguments(op, problems, [_DeviceArray((16, 16), 0x1002)], Bs, Cs, Ds)
    with pytest.raises(ArgumentError, match=r"leading dimension 20 is not a multiple of the operation's A "
                                            r"alignment 8"):
        GemmGroupedArguments(op, problems, [_DeviceArray((16, 16), 0x1000, (40, 2))], Bs, Cs, Ds)
    GemmGroupedArguments(op, problems, [_DeviceArray((16, 16), 0x1000, (48, 2))], Bs, Cs, Ds)


def test_empty_group_is_valid(no_device):
    args = GemmGroupedArguments(f16_op(), [], [], [], None, [])
    assert args.tile_count == 0 and args.problem_sizes == []


def test_validation_precedes_any_device_work():
    """Without the stub: valid arguments get as far as the GPU (NoGpuError here), invalid ones never do."""
    from pycutlass.compiler.target import detected_compute_capability

    if detected_compute_capability() is not None:
        pytest.skip("a GPU is present")
    op = f16_op(mode=SchedulerMode.Host)
    with pytest.raises(NoGpuError):
        GemmGroupedArguments(op, PROBLEMS, *tensors(PROBLEMS))
    As, Bs, Cs, Ds = tensors(PROBLEMS)
    with pytest.raises(ArgumentError):
        GemmGroupedArguments(op, PROBLEMS, As, Bs, Cs, Ds[:1])


def test_device_side_sizes_on_an_sm80_family_operation_say_which_family_takes_them():
    op = f16_op()
    sizes = _DeviceArray((4,), 0x1000)
    sizes.__cuda_array_interface__["typestr"] = "<i4"
    with pytest.raises(ArgumentError, match=r"group sizes in a tensor .* need an SM90 grouped operation; this one "
                                            r"builds the Sm80-family kernel"):
        GemmGroupedArguments(op, sizes, [_DeviceArray((100, 64), 0x2000)], [_DeviceArray((4, 64, 32), 0x40000)],
                             None, [_DeviceArray((100, 32), 0x80000)])
