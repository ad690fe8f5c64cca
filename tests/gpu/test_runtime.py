"""The runtime on the GPU: cached and patched Params, CUDA-graph capture, sessions, and several devices.

Every result is checked against a float64 reference with NaN-poisoned outputs.
"""
from __future__ import annotations

import os
import threading

import numpy as np
import pytest

import pycutlass as cutlass
from pycutlass.runtime.launch import loaded

VERIFYING = os.environ.get("PYCUTLASS_VERIFY_PARAMS") == "1"  # then every problem is also built, and compared


def assert_reused(loaded_op, builds_before, reuses_before, expected_reuses):
    """The Params of ``expected_reuses`` new problems came from the cache, with no builder launch."""
    assert loaded_op.params_reused - reuses_before == expected_reuses
    if not VERIFYING:
        assert loaded_op.builder_launches == builds_before

from .conftest import precompile_module, relative_error
from .gemm_cases import make_op

pytestmark = pytest.mark.gpu
torch = pytest.importorskip("torch")

F16 = make_op("f16")
GROUPED = cutlass.GemmOperationGrouped(90, F16.tile_description, F16.A, F16.B, F16.C, F16.epilogue_functor)
NHWC = cutlass.TensorDescription(cutlass.float16, cutlass.TensorNHWC, 8)
CONV = cutlass.Conv2dOperation(
    cutlass.conv.Operator.fprop, cutlass.IteratorAlgorithm.optimized, 90,
    cutlass.TileDescription([128, 128, 64], 3, [2, 2, 1], F16.tile_description.math_instruction), NHWC, NHWC, NHWC,
    cutlass.StrideSupport.Strided, cutlass.LinearCombination(cutlass.float16, 8, cutlass.float32, cutlass.float32))
OPS = [F16, GROUPED, CONV]


@pytest.fixture(scope="module", autouse=True)
def compiled(memory_pool):
    precompile_module(OPS)
    yield


def gemm_inputs(m, n, k, device="cuda:0", seed=0):
    g = torch.Generator(device="cpu").manual_seed(seed)
    a = torch.randn(m, k, generator=g).half().to(device)
    b = torch.randn(n, k, generator=g).half().to(device).t()  # column-major B
    c = torch.randn(m, n, generator=g).half().to(device)
    d = torch.full((m, n), float("nan"), dtype=torch.float16, device=device)
    return a, b, c, d


def gemm_reference(a, b, c, alpha=1.0, beta=0.5):
    return alpha * a.double().cpu().numpy() @ b.double().cpu().numpy() + beta * c.double().cpu().numpy()


def check_gemm(op, a, b, c, d, device=None, stream=None):
    arguments = cutlass.GemmArguments(op, cutlass.gemm.GemmCoord(a.shape[0], b.shape[1], a.shape[1]), a, b, c, d,
                                      op.epilogue_type(1.0, 0.5), device=device, stream=stream)
    op.run(arguments)
    arguments.sync()
    assert relative_error(d.cpu().numpy(), gemm_reference(a, b, c)) < 1e-2
    return arguments


def test_new_arguments_for_a_seen_shape_patch_params_without_building():
    """The second problem of a shape launches no builder, and its patched Params compute the right thing."""
    first = check_gemm(F16, *gemm_inputs(200, 136, 72, seed=1))
    loaded_op = loaded(F16, first.device, first.session)
    builds, reuses = loaded_op.builder_launches, loaded_op.params_reused
    for seed in range(2, 6):  # other tensors (other addresses) of the same shape
        check_gemm(F16, *gemm_inputs(200, 136, 72, seed=seed))
    assert_reused(loaded_op, builds, reuses, 4)
    builds, reuses = loaded_op.builder_launches, loaded_op.params_reused
    check_gemm(F16, *gemm_inputs(264, 136, 72, seed=7))  # a new shape is built (twice: real and probe)
    assert loaded_op.builder_launches == builds + 2 and loaded_op.params_reused == reuses


@pytest.mark.parametrize("beta", [0.0, 0.5])
def test_patched_params_equal_built_params(beta):
    """For every kind: Params patched from the cache are byte-identical to Params built for the new addresses."""
    a, b, c, d = gemm_inputs(96, 64, 40)
    arguments = cutlass.GemmArguments(F16, cutlass.gemm.GemmCoord(96, 64, 40), a, b, c if beta else None, d,
                                      F16.epilogue_type(1.0, beta))
    loaded_op = loaded(F16, arguments.device, arguments.session)
    for seed in range(3):
        a, b, c, d = gemm_inputs(96, 64, 40, seed=seed + 10)
        fresh = cutlass.GemmArguments(F16, cutlass.gemm.GemmCoord(96, 64, 40), a, b, c if beta else None, d,
                                      F16.epilogue_type(1.0, beta), device=0)  # device=: the full path, with bind()
        abi = fresh.bind(loaded_op)
        info, params = loaded_op.params_for(abi, fresh.stream)
        built_info, built = loaded_op.build(abi, fresh.stream)
        assert info == built_info and bytes(params) == bytes(built)


def test_seen_problem_with_a_misaligned_tensor_is_still_rejected():
    """The fast path checks the new addresses; a misaligned one goes the full way and gets its error."""
    check_gemm(F16, *gemm_inputs(128, 64, 64, seed=20))
    a, b, c, d = gemm_inputs(128, 64, 64, seed=21)
    storage = torch.empty(128 * 64 + 1, dtype=torch.float16, device="cuda")
    misaligned = storage[1:].view(128, 64)  # same shape and strides, address off by one element
    misaligned.copy_(a)
    with pytest.raises(cutlass.ArgumentError, match="not aligned"):
        cutlass.GemmArguments(F16, cutlass.gemm.GemmCoord(128, 64, 64), misaligned, b, c, d,
                              F16.epilogue_type(1.0, 0.5))


def test_grouped_and_conv_reuse_params():
    problems = [cutlass.gemm.GemmCoord(64 + 8 * i, 128, 64) for i in range(5)]
    for round_ in range(3):
        As = [torch.randn(p.m(), p.k(), device="cuda").half() for p in problems]
        Bs = [torch.randn(p.n(), p.k(), device="cuda").half().t() for p in problems]
        Ds = [torch.full((p.m(), p.n()), float("nan"), dtype=torch.float16, device="cuda") for p in problems]
        arguments = cutlass.GemmGroupedArguments(GROUPED, problems, As, Bs, None, Ds)
        GROUPED.run(arguments)
        arguments.sync()
        for a, b, d in zip(As, Bs, Ds):
            assert relative_error(d.cpu().numpy(), a.double().cpu().numpy() @ b.double().cpu().numpy()) < 1e-2
        if round_ == 0:
            loaded_op = loaded(GROUPED, arguments.device, arguments.session)
            builds, reuses = loaded_op.builder_launches, loaded_op.params_reused
    assert_reused(loaded_op, builds, reuses, 2)
    del arguments

    problem = cutlass.Conv2dProblemSize(cutlass.Tensor4DCoord(2, 9, 11, 64), cutlass.Tensor4DCoord(72, 3, 3, 64),
                                        cutlass.Tensor4DCoord(1, 1, 1, 1), cutlass.MatrixCoord(1, 1),
                                        cutlass.MatrixCoord(1, 1), cutlass.conv.Mode.cross_correlation, 1, 1)
    for round_ in range(3):
        x = torch.randn(2, 9, 11, 64, device="cuda").half()
        w = torch.randn(72, 3, 3, 64, device="cuda").half()
        y = torch.full((2, 9, 11, 72), float("nan"), dtype=torch.float16, device="cuda")
        arguments = cutlass.Conv2dArguments(CONV, problem, x, w, None, y)
        CONV.run(arguments)
        arguments.sync()
        reference = torch.nn.functional.conv2d(x.double().permute(0, 3, 1, 2), w.double().permute(0, 3, 1, 2),
                                               padding=1).permute(0, 2, 3, 1)
        assert relative_error(y.cpu().numpy(), reference.cpu().numpy()) < 1e-2
        if round_ == 0:
            loaded_op = loaded(CONV, arguments.device, arguments.session)
            builds, reuses = loaded_op.builder_launches, loaded_op.params_reused
    assert_reused(loaded_op, builds, reuses, 2)


def test_run_is_capturable_in_a_cuda_graph():
    stream = torch.cuda.Stream()
    a, b, c, d = gemm_inputs(256, 128, 64, seed=3)
    arguments = cutlass.GemmArguments(F16, cutlass.gemm.GemmCoord(256, 128, 64), a, b, c, d,
                                      F16.epilogue_type(1.0, 0.5), stream=stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, stream=stream):
        F16.run(arguments)
    for seed in (4, 5):  # new inputs in place, poisoned output, replay
        fresh = gemm_inputs(256, 128, 64, seed=seed)
        for tensor, new in zip((a, b, c), fresh[:3]):
            tensor.copy_(new)
        d.fill_(float("nan"))
        torch.cuda.synchronize()
        graph.replay()
        torch.cuda.synchronize()
        assert relative_error(d.cpu().numpy(), gemm_reference(a, b, c)) < 1e-2


def test_own_session_keeps_its_own_state(tmp_path):
    session = cutlass.Session(cache_path=str(tmp_path / "own.db"))
    with session.activate():
        report = cutlass.compiler.add_module([F16])
        assert report.compiled + report.from_disk == 1  # its own cache: compiled or found there, never in memory
        arguments = check_gemm(F16, *gemm_inputs(64, 64, 64, seed=8))
    assert arguments.session is session
    assert cutlass.compiler.last_report() is not report  # the default session's report is untouched


def test_mixed_devices_and_bad_device_are_rejected():
    a, b, c, d = gemm_inputs(64, 64, 64)
    with pytest.raises(cutlass.ArgumentError, match="device"):
        cutlass.GemmArguments(F16, cutlass.gemm.GemmCoord(64, 64, 64), a, b, c, d, device="cpu")
    with pytest.raises(cutlass.NoGpuError, match="no CUDA device 99"):
        cutlass.GemmArguments(F16, cutlass.gemm.GemmCoord(64, 64, 64), a.cpu().numpy(), b.cpu().numpy(),
                              c.cpu().numpy(), d.cpu().numpy(), device=99)


# --- several devices ------------------------------------------------------------------------------------------------
def _need_two_gpus():
    if torch.cuda.device_count() < 2:
        pytest.skip("needs two GPUs")


@pytest.mark.multigpu
def test_operation_runs_on_the_device_of_its_tensors():
    _need_two_gpus()
    for device in ("cuda:0", "cuda:1"):
        arguments = check_gemm(F16, *gemm_inputs(128, 64, 96, device=device, seed=11))
        assert arguments.device.ordinal == int(device[-1])
    assert loaded(F16, cutlass.runtime.device.device_of(0), cutlass.session.current()) is not \
        loaded(F16, cutlass.runtime.device.device_of(1), cutlass.session.current())  # loaded per device
    a0, b0, c0, d0 = gemm_inputs(64, 64, 64, device="cuda:0")
    _, b1, _, _ = gemm_inputs(64, 64, 64, device="cuda:1")
    with pytest.raises(cutlass.ArgumentError, match="different devices"):
        cutlass.GemmArguments(F16, cutlass.gemm.GemmCoord(64, 64, 64), a0, b1, c0, d0)
    # Host tensors go where device= says.
    a, b, c, _ = gemm_inputs(64, 64, 64, device="cpu", seed=12)
    d = np.full((64, 64), np.nan, dtype=np.float16)
    arguments = cutlass.GemmArguments(F16, cutlass.gemm.GemmCoord(64, 64, 64), a.numpy(), b.numpy(), c.numpy(), d,
                                      F16.epilogue_type(1.0, 0.5), device=1)
    F16.run(arguments)
    arguments.sync()
    assert arguments.device.ordinal == 1
    assert relative_error(d, gemm_reference(a, b, c)) < 1e-2


@pytest.mark.multigpu
def test_same_operation_on_two_devices_from_two_threads():
    _need_two_gpus()
    errors, results = [], {}

    def work(device: str):
        try:
            torch.cuda.set_device(device)
            stream = torch.cuda.Stream(device=device)
            worst = 0.0
            for i in range(20):
                a, b, c, d = gemm_inputs(192, 128, 64 + 8 * (i % 3), device=device, seed=100 + i)
                arguments = cutlass.GemmArguments(F16, cutlass.gemm.GemmCoord(192, 128, a.shape[1]), a, b, c, d,
                                                  F16.epilogue_type(1.0, 0.5), stream=stream)
                F16.run(arguments)
                arguments.sync()
                assert arguments.device.ordinal == torch.device(device).index
                worst = max(worst, relative_error(d.cpu().numpy(), gemm_reference(a, b, c)))
            results[device] = worst
        except BaseException as error:  # reported by the main thread
            errors.append((device, repr(error)))

    threads = [threading.Thread(target=work, args=(device,)) for device in ("cuda:0", "cuda:1")]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=300)
    assert not errors, errors
    assert set(results) == {"cuda:0", "cuda:1"} and max(results.values()) < 1e-2, results
