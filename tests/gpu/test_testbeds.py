"""PyCUTLASS 2.11's testbeds on the GPU: test_all_gemm / test_all_conv2d / TestbedGrouped as PyCUTLASS's own unit
tests call them (their sweeps: odd sizes, serial and parallel split-K, interleaved int8, random groups with
degenerate problems), the launchers' profiling path, and that a testbed does fail when the kernel leaves D untouched
(the output is NaN-poisoned)."""
from __future__ import annotations

import pytest

import pycutlass as cutlass
from pycutlass.gemm import GemmCoord, Mode
from pycutlass.test import Conv2dLauncher, GemmUniversalLauncher, TestbedGrouped, test_all_conv2d, test_all_gemm
from pycutlass.test import conv2d_testbed, gemm_grouped_testbed

from .conftest import precompile_module
from .gemm_cases import CM, CMI32, RI32, D, R, make_op
from .test_conv2d import DGRAD, FEW, FPROP, OPTIMIZED, UNITY, WGRAD, ANALYTIC, conv_op
from .test_conv2d_sm90 import sm90_conv

pytestmark = pytest.mark.gpu

GEMMS = {
    "f16_tensorop": make_op("f16"),
    "f16_cm_out": make_op("f16", (CM, R, CM)),
    "f16_relu": make_op("f16", activation="relu"),
    "f32_simt": make_op("f32_simt", (CM, R, R)),
    "f64_tensorop": make_op("f64", (R, CM, R)),
}
INTERLEAVED = make_op("s8", (CMI32, RI32, CMI32), out=D.int8, out_align=8, epilogue="clamp")
CONVS = {
    "fprop_f16": conv_op(FPROP, OPTIMIZED, "f16"),
    "dgrad_f16_unity": conv_op(DGRAD, OPTIMIZED, "f16", UNITY),
    "wgrad_f16_f32out": conv_op(WGRAD, ANALYTIC, "f16", out=D.float32, tile=[128, 64, 32]),
    "fprop_f16_few_channels": conv_op(FPROP, FEW, "f16", align=2),
}
INTERLEAVED_CONV = conv_op(FPROP, OPTIMIZED, "s8", out=D.int8, out_align=8, epilogue="clamp", interleaved=True)


def grouped80(element, acc, opclass, instruction, tile, warps, layouts, align, mode, activation=None):
    """PyCUTLASS's grouped unit tests' operations (GemmOperationGrouped at 80, either scheduler mode)."""
    math = cutlass.MathInstruction(instruction, element, element, acc, opclass)
    tile_description = cutlass.TileDescription(tile, 3 if element.bits == 16 else 4, warps, math)
    a, b = (cutlass.TensorDescription(element, layout, align) for layout in layouts[:2])
    c = cutlass.TensorDescription(acc, layouts[2], align if acc.bits == element.bits else align // 2 or 1)
    if activation is None:
        functor = cutlass.LinearCombination(c.element, c.alignment, acc, acc)
    else:
        functor = cutlass.LinearCombinationGeneric(activation(acc), c.element, c.alignment, acc, acc)
    return cutlass.GemmOperationGrouped(80, tile_description, a, b, c, functor, cutlass.BatchedIdentitySwizzle,
                                        precompute_mode=mode)


GROUPED = {
    "f16_tensorop_device": grouped80(D.float16, D.float32, cutlass.OpClass.TensorOp, [16, 8, 16], [128, 128, 32],
                                     [2, 2, 1], (CM, CM, CM), 8, cutlass.SchedulerMode.Device),
    "f16_tensorop_host_relu": grouped80(D.float16, D.float32, cutlass.OpClass.TensorOp, [16, 8, 16],
                                        [128, 128, 32], [2, 2, 1], (CM, CM, CM), 8, cutlass.SchedulerMode.Host,
                                        cutlass.relu),
    "f64_tensorop_host": grouped80(D.float64, D.float64, cutlass.OpClass.TensorOp, [8, 8, 4], [64, 64, 16],
                                   [2, 2, 1], (R, R, CM), 1, cutlass.SchedulerMode.Host),
    "f32_simt_device": grouped80(D.float32, D.float32, cutlass.OpClass.Simt, [1, 1, 1], [128, 64, 8], [2, 2, 1],
                                 (R, R, R), 1, cutlass.SchedulerMode.Device),
}


def sm90_grouped():
    math = cutlass.MathInstruction([64, 128, 16], D.float16, D.float16, D.float32, cutlass.OpClass.TensorOp)
    tile = cutlass.TileDescription([128, 128, 64], 0, None, math, cluster_shape=[2, 1, 1])
    a, b, c = (cutlass.TensorDescription(D.float16, layout, 8) for layout in (R, CM, R))
    functor = cutlass.LinearCombinationGeneric(cutlass.gelu(D.float32), D.float16, 8, D.float32, D.float32)
    return cutlass.GemmOperationGrouped(90, tile, a, b, c, functor, cutlass.IdentitySwizzle1)


SM90_CONVS = {
    "fprop_f16_sm90": sm90_conv(D.float16, (128, 128, 64), (1, 1, 1)),
    "wgrad_f16_sm90": sm90_conv(D.float16, (128, 64, 64), (1, 1, 1), kind=WGRAD),
}


def sm90_gemm():
    math = cutlass.MathInstruction([64, 128, 16], D.float16, D.float16, D.float32, cutlass.OpClass.TensorOp)
    tile = cutlass.TileDescription([128, 128, 64], 0, None, math, cluster_shape=[2, 1, 1],
                                   kernel_schedule=cutlass.KernelScheduleType.TmaWarpSpecializedCooperative)
    a, b, c = (cutlass.TensorDescription(D.float16, layout, 8) for layout in (R, CM, R))
    return cutlass.GemmOperationUniversal(90, tile, a, b, c, cutlass.LinearCombination(D.float16, 8, D.float32,
                                                                                     D.float32))


@pytest.fixture(scope="module", autouse=True)
def _compiled():
    precompile_module([*GEMMS.values(), INTERLEAVED, *CONVS.values(), INTERLEAVED_CONV, *GROUPED.values()],
                      [sm90_gemm(), sm90_grouped(), *SM90_CONVS.values()])


@pytest.mark.parametrize("name", sorted(GEMMS))
def test_all_gemm_universal(name):
    assert test_all_gemm(GEMMS[name], "universal")


def test_all_gemm_multistage_and_interleaved():
    assert test_all_gemm(GEMMS["f16_tensorop"], "multistage")
    assert test_all_gemm(INTERLEAVED, "interleaved")


def test_all_gemm_on_an_sm90_operation():
    assert test_all_gemm(sm90_gemm(), "universal", compilation_mode="nvrtc")


@pytest.mark.parametrize("name", sorted(CONVS))
def test_all_conv2d_default_sizes_and_split_k(name):
    assert test_all_conv2d(CONVS[name])


def test_all_conv2d_interleaved_int8_as_pycutlass_called_it():
    launcher = Conv2dLauncher(INTERLEAVED_CONV, interleaved=True)
    assert conv2d_testbed.sweep(launcher)
    assert len(launcher.skipped) < 10  # the split-K cases an int8 output refuses; the default sizes all ran
    assert test_all_conv2d(INTERLEAVED_CONV, interleaved=True)


@pytest.mark.parametrize("name", sorted(SM90_CONVS))
def test_all_conv2d_on_sm90_convolutions(name):
    assert test_all_conv2d(SM90_CONVS[name], compilation_mode="nvrtc")


@pytest.mark.parametrize("name", sorted(GROUPED))
def test_grouped_testbed_as_pycutlass_ran_it(name):
    """PyCUTLASS's own grouped tests: TestbedGrouped(operation=op).run(24) (and 27 for SIMT, 5 for its cache test)."""
    testbed = TestbedGrouped(operation=GROUPED[name])
    assert testbed.run(27 if "simt" in name else 24)
    assert testbed.run(5, 2.0, 2.0)
    assert not testbed.skipped


def test_grouped_sweep_on_an_sm90_grouped_operation():
    cutlass.compiler.nvrtc()
    try:
        testbed = TestbedGrouped(sm90_grouped())
        assert gemm_grouped_testbed.sweep(testbed)
        assert not testbed.skipped
    finally:
        cutlass.compiler.nvcc()


def test_a_grouped_kernel_that_writes_nothing_fails(monkeypatch):
    op = GROUPED["f16_tensorop_device"]
    assert TestbedGrouped(op).run(6)
    monkeypatch.setattr(type(op), "run", lambda self, arguments: None)
    assert TestbedGrouped(op).run(6) is False


def test_a_kernel_that_writes_nothing_fails(monkeypatch):
    op = GEMMS["f16_tensorop"]
    launcher = GemmUniversalLauncher(op)
    assert launcher.run(Mode.Gemm, GemmCoord(264, 136, 72), 1, 1.0, 2.0)
    monkeypatch.setattr(type(op), "run", lambda self, arguments: None)
    assert launcher.run(Mode.Gemm, GemmCoord(264, 136, 72), 1, 1.0, 2.0) is False
    conv = Conv2dLauncher(CONVS["fprop_f16"])
    problem = cutlass.Conv2dProblemSize((1, 8, 8, 16), (16, 3, 3, 16), (1, 1, 1, 1), (1, 1), (1, 1))
    monkeypatch.undo()
    assert conv.run(problem)
    monkeypatch.setattr(type(CONVS["fprop_f16"]), "run", lambda self, arguments: None)
    assert conv.run(problem) is False


def test_profiling_returns_milliseconds_per_run():
    launcher = GemmUniversalLauncher(GEMMS["f16_tensorop"], profiling=True, warmup_iterations=3, iterations=10)
    runtime = launcher.run(Mode.Gemm, GemmCoord(1024, 1024, 1024))
    assert isinstance(runtime, float) and 0.0 < runtime < 100.0


def test_a_reduction_refuses_arguments_that_wrote_d_itself():
    """Only parallel split-K arguments hold partials; a ReductionArguments over serial ones would read D as a
    workspace of another type (and past its end)."""
    import numpy as np

    op = GEMMS["f16_tensorop"]
    reduction = cutlass.ReductionOperation(cutlass.MatrixCoord(4, 256), op.C, D.float32, D.float16, D.float32,
                                           count=8)
    a, b, c = (np.ones(n, np.float16) for n in (64 * 32, 32 * 64, 64 * 64))
    d = np.zeros(64 * 64, np.float16)
    serial = cutlass.GemmArguments(op, GemmCoord(64, 64, 32), a, b, c, d, output_op=op.epilogue_type(1.0, 0.0))
    with pytest.raises(cutlass.ArgumentError, match="write D itself"):
        cutlass.ReductionArguments(reduction, [64, 64], 1, serial, d, c, output_op=reduction.epilogue_type(1.0, 0.0))
    serial.sync()
