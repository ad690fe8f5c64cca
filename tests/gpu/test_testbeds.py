"""PyCUTLASS 2.11's testbeds on the GPU: test_all_gemm / test_all_conv2d as PyCUTLASS's own unit tests call them
(their sweeps: odd sizes, serial and parallel split-K, interleaved int8), the launchers' profiling path, and that a
testbed does fail when the kernel leaves D untouched (the output is NaN-poisoned)."""
from __future__ import annotations

import pytest

import pycutlass as cutlass
from pycutlass.gemm import GemmCoord, Mode
from pycutlass.test import Conv2dLauncher, GemmUniversalLauncher, test_all_conv2d, test_all_gemm

from .conftest import precompile_module
from .gemm_cases import CM, CMI32, RI32, D, R, make_op
from .test_conv2d import DGRAD, FEW, FPROP, OPTIMIZED, UNITY, WGRAD, ANALYTIC, conv_op

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


def sm90_gemm():
    math = cutlass.MathInstruction([64, 128, 16], D.float16, D.float16, D.float32, cutlass.OpClass.TensorOp)
    tile = cutlass.TileDescription([128, 128, 64], 0, None, math, cluster_shape=[2, 1, 1],
                                   kernel_schedule=cutlass.KernelScheduleType.TmaWarpSpecializedCooperative)
    a, b, c = (cutlass.TensorDescription(D.float16, layout, 8) for layout in (R, CM, R))
    return cutlass.GemmOperationUniversal(90, tile, a, b, c, cutlass.LinearCombination(D.float16, 8, D.float32,
                                                                                     D.float32))


@pytest.fixture(scope="module", autouse=True)
def _compiled():
    precompile_module([*GEMMS.values(), INTERLEAVED, *CONVS.values()], [sm90_gemm()])


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
