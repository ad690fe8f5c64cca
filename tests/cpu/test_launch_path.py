"""run()'s hot path without a GPU: which kinds call before_launch, what one launch passes to the driver, and that an
empty grid calls nothing."""
from __future__ import annotations

import ctypes

import pytest

from pycutlass.errors import ArgumentError
from pycutlass.kinds.gemm_array_sm90.arguments import GemmArgumentsArraySm90
from pycutlass.kinds.gemm_evt.arguments import GemmEvtArguments
from pycutlass.kinds.gemm_grouped_sm90.arguments import GemmGroupedArgumentsSm90
from pycutlass.kinds.gemm_sm90.arguments import GemmArgumentsSm90
from pycutlass.runtime import driver, launch
from pycutlass.runtime.arguments import OperationArguments


def test_before_launch_runs_only_where_a_kind_has_work():
    assert OperationArguments._runs_before_launch is False
    assert GemmEvtArguments._runs_before_launch is True  # zeroes its reduction outputs
    assert GemmGroupedArgumentsSm90._runs_before_launch is True  # device-side sizes kernel
    # SM90 GEMM: only stream-K Arguments turn it on (per instance, once the workspace exists); array: never.
    assert GemmArgumentsSm90._runs_before_launch is False
    assert GemmArgumentsArraySm90._runs_before_launch is False

    class Overrides(OperationArguments):
        def before_launch(self):
            pass

    class Inherits(Overrides):
        pass

    class Declines(Overrides):
        _runs_before_launch = False

    assert Overrides._runs_before_launch and Inherits._runs_before_launch
    assert not Declines._runs_before_launch


SUCCESS = driver.kernel_launcher()[1]


class _Recorder:
    """Stands in for cuLaunchKernelEx."""

    def __init__(self):
        self.calls = []

    def __call__(self, *args):
        self.calls.append(args)
        return (SUCCESS,)


def _prepared(monkeypatch, grid):
    recorder = _Recorder()
    monkeypatch.setattr(driver, "kernel_launcher", lambda: (recorder, SUCCESS))
    params = (ctypes.c_byte * 16)()
    return launch.PreparedLaunch("kernel", grid, (384, 1, 1), 1024, params, 0, "op"), recorder


def test_one_launch_is_one_driver_call_with_bound_arguments(monkeypatch):
    prepared, recorder = _prepared(monkeypatch, (4, 2, 1))
    prepared.launch(77)
    prepared.launch(77)
    prepared.launch(78)
    assert [call[1:] for call in recorder.calls] == [("kernel", prepared.param_address, 0)] * 3
    # grid, block, shared memory and stream go as one launch config, made once per stream, not once per launch
    configs = [call[0] for call in recorder.calls]
    assert [int(c.hStream) for c in configs] == [77, 77, 78] and configs[0] is configs[1]
    assert all(isinstance(c, driver._driver().CUlaunchConfig) for c in configs)
    assert all((c.gridDimX, c.gridDimY, c.gridDimZ, c.blockDimX, c.sharedMemBytes, c.numAttrs) ==
               (4, 2, 1, 384, 1024, 0) for c in configs)


def test_empty_grid_calls_nothing(monkeypatch):
    prepared, recorder = _prepared(monkeypatch, (0, 1, 1))
    prepared.launch(5)
    assert prepared.empty and recorder.calls == []


class _Device:
    def __init__(self):
        self.made_current = 0

    def make_current(self):
        self.made_current += 1


class _Launch:
    def __init__(self):
        self.streams = []

    def launch(self, stream):
        self.streams.append(stream)


def _arguments(cls, operation):
    arguments = cls.__new__(cls)  # no GPU: only what launch_for reads
    arguments.operation, arguments.stream, arguments.device = operation, 9, _Device()
    arguments._prepared = _Launch()
    return arguments


@pytest.mark.parametrize("runs", [False, True])
def test_launch_for_checks_the_pairing_and_calls_before_launch_only_when_asked(runs):
    calls = []

    class Kind(OperationArguments):
        def before_launch(self):
            calls.append("before")

    operation = object()
    arguments = _arguments(Kind, operation)
    arguments._runs_before_launch = runs
    arguments.launch_for(operation)
    assert arguments._prepared.streams == [9] and arguments.device.made_current == 1
    assert calls == (["before"] if runs else [])

    class Other:
        name = "other"

    arguments.operation = type("Op", (), {"name": "mine", "__eq__": lambda self, other: False})()
    with pytest.raises(ArgumentError, match="built for mine, not other"):
        arguments.launch_for(Other())
    assert arguments._prepared.streams == [9]  # nothing launched for the wrong operation


@pytest.mark.parametrize("grid", [(1, 1, 65536), (1, 70000, 1), (-5, 1, 1)])
def test_a_grid_cuda_cannot_launch_is_refused_with_its_limits(grid):
    # the builder's LaunchInfo words are int32: a negative x is a grid past 2**31 - 1
    with pytest.raises(ArgumentError, match=r"launch grid .* CUDA allows at most 2147483647 x 65535 x 65535"):
        launch.check_grid(grid, "op")


@pytest.mark.parametrize("grid", [(0, 1, 1), (2**31 - 1, 65535, 65535), (132, 1, 1)])
def test_a_grid_within_cudas_limits_passes(grid):
    launch.check_grid(grid, "op")
