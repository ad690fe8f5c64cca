"""Programmatic dependent launch (``GemmArguments(..., pdl=True)``) without a GPU: what compiles the kernels to wait,
the launch configuration handed to ``cuLaunchKernelEx``, the launch path it replaces, and what is refused."""
from __future__ import annotations


import numpy as np
import pytest

import pycutlass as cutlass
from pycutlass import KernelScheduleType as KS
from pycutlass import TileSchedulerType as TS
from pycutlass.compiler.manager import _units
from pycutlass.gemm import GemmCoord
from pycutlass.kinds.gemm_sm90 import GemmArgumentsSm90
from pycutlass.kinds.gemm_sm90.operation import GDC_MACRO
from pycutlass.runtime import driver, launch

from .test_gemm_array_sm90 import _fake_device, array90
from .test_launch_path import SUCCESS, _prepared, _Recorder



def test_the_grid_dependency_wait_is_a_unit_macro_of_the_kernels_that_take_it():
    """CUTLASS's GemmUniversal kernels wait on the previous grid only where CUTLASS_ENABLE_GDC_FOR_SM90 is defined
    before the headers: it is in the source (so in the cache key) of the operations that support pdl, not of
    stream-K (CUTLASS 4.2's scheduler does not compile with it) or pointer-array ones (no wait)."""
    for schedule in (KS.TmaWarpSpecialized, KS.TmaWarpSpecializedCooperative, KS.TmaWarpSpecializedPingpong):
        op = array90(array=False, kernel=schedule, tile=(128, 128, 64) if schedule is not KS.TmaWarpSpecializedPingpong
                     else (64, 128, 64))
        assert op.pdl_refusal is None and op.unit_macros == (GDC_MACRO,)
        assert op.emit().index(f"#define {GDC_MACRO} 1") < op.emit().index('#include "cutlass/')
    streamk = array90(array=False, kernel=KS.TmaWarpSpecializedCooperative, scheduler=TS.StreamK)
    for refused in (streamk, array90()):
        assert refused.pdl_refusal and refused.unit_macros == () and GDC_MACRO not in refused.emit()


def test_units_never_mix_operations_with_different_macros():
    plain = array90(array=False)
    others = [array90(array=False, kernel=KS.TmaWarpSpecializedCooperative, scheduler=TS.StreamK), array90()]
    target = cutlass.compiler.manager.Target(90)
    units = _units([(op, target) for op in (plain, *others)], jobs=None)
    assert sorted(len(ops) for ops, *_ in units) == [1, 2]
    for ops, _, source, _ in units:
        assert (f"#define {GDC_MACRO} 1" in source) == (plain in ops)
        assert all(op.unit_macros == ops[0].unit_macros for op in ops)


def test_the_launch_config_asks_for_programmatic_stream_serialization():
    config = driver.launch_config((4, 2, 1), (384, 1, 1), 200 * 1024, 123, programmatic=True)
    cuda = driver._driver()
    assert (config.gridDimX, config.gridDimY, config.gridDimZ) == (4, 2, 1)
    assert (config.blockDimX, config.blockDimY, config.blockDimZ) == (384, 1, 1)
    assert config.sharedMemBytes == 200 * 1024 and int(config.hStream) == 123 and config.numAttrs == 1
    attribute = config.attrs[0]
    assert attribute.id == cuda.CUlaunchAttributeID.CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION
    assert attribute.value.programmaticStreamSerializationAllowed == 1
    assert driver.launch_config((4, 2, 1), (384, 1, 1), 0, 123).numAttrs == 0  # an ordinary launch


def test_a_programmatic_launch_carries_the_attribute_in_one_config_per_stream(monkeypatch):
    prepared, recorder = _prepared(monkeypatch, (8, 1, 1))
    prepared.launch(5)  # an ordinary launch first: the same object switches over
    prepared.use_programmatic_dependent_launch()
    prepared.use_programmatic_dependent_launch()  # idempotent
    for stream in (5, 5, 6):
        prepared.launch(stream)
    assert prepared.programmatic and [call[1:] for call in recorder.calls] == [("kernel", prepared.param_address, 0)] * 4
    configs = [call[0] for call in recorder.calls]
    assert [c.numAttrs for c in configs] == [0, 1, 1, 1]
    assert [int(c.hStream) for c in configs] == [5, 5, 5, 6] and configs[1] is configs[2]  # built once per stream
    assert all(c.gridDimX == 8 and c.blockDimX == 384 and c.sharedMemBytes == 1024 for c in configs)


def test_an_empty_grid_stays_a_launch_of_nothing(monkeypatch):
    prepared, recorder = _prepared(monkeypatch, (0, 1, 1))
    prepared.use_programmatic_dependent_launch()
    prepared.launch(5)
    assert not prepared.programmatic and recorder.calls == []


def _operands(m=64, n=64, k=64):
    A = np.zeros((m, k), np.float16)
    return A, np.zeros((k, n), np.float16, order="F"), None, np.zeros((m, n), np.float16)


@pytest.mark.parametrize("value", [1, "yes", None, 0.0])
def test_pdl_takes_a_bool(value):
    with pytest.raises(cutlass.ArgumentError, match="pdl must be True or False"):
        cutlass.GemmArguments(array90(array=False), GemmCoord(64, 64, 64), *_operands(), pdl=value)


@pytest.mark.parametrize("kind", ["array", "stream-K"])
def test_pdl_is_refused_where_the_kernel_does_not_wait(kind):
    """CUTLASS's pointer-array kernels never wait on the previous grid: launched early they could read inputs it
    is still writing. Stream-K kernels are built without the wait (CUTLASS 4.2 does not compile it)."""
    op = array90() if kind == "array" else array90(array=False, kernel=KS.TmaWarpSpecializedCooperative,
                                                   scheduler=TS.StreamK)
    match = "pointer-array kernels do not wait" if kind == "array" else "stream-K tile scheduler does not compile"
    with pytest.raises(cutlass.ArgumentError, match=match):
        cutlass.GemmArguments(op, GemmCoord(64, 64, 64), *_operands(), pdl=True)


def test_pdl_is_kept_by_the_arguments(monkeypatch):
    _fake_device(monkeypatch, GemmArgumentsSm90)
    op = array90(array=False)
    assert cutlass.GemmArguments(op, GemmCoord(64, 64, 64), *_operands(), pdl=True)._pdl
    assert not cutlass.GemmArguments(op, GemmCoord(64, 64, 64), *_operands())._pdl


def test_other_kinds_do_not_take_pdl():
    math = cutlass.MathInstruction([16, 8, 16], cutlass.float16, cutlass.float16, cutlass.float32,
                                   cutlass.OpClass.TensorOp)
    tile = cutlass.TileDescription([128, 128, 32], 3, [2, 2, 1], math)
    desc = cutlass.TensorDescription(cutlass.float16, cutlass.RowMajor, 8)
    op = cutlass.GemmOperationUniversal(80, tile, desc, cutlass.TensorDescription(cutlass.float16,
                                        cutlass.ColumnMajor, 8), desc,
                                        cutlass.LinearCombination(cutlass.float16, 8, cutlass.float32,
                                                                  cutlass.float32))
    with pytest.raises(TypeError, match="pdl"):
        cutlass.GemmArguments(op, GemmCoord(64, 64, 64), *_operands(), pdl=True)


def test_a_patched_launcher_launches_programmatically(monkeypatch):
    """pycutlass.torch's bound launches (PatchedLauncher): new addresses patched in, then one cuLaunchKernelEx."""
    import struct
    import types

    recorder = _Recorder()
    monkeypatch.setattr(driver, "kernel_launcher", lambda: (recorder, SUCCESS))
    device = types.SimpleNamespace(make_current=lambda: None)
    loaded = types.SimpleNamespace(name="op", device=device, kernel="kernel", ensure_shared_memory=lambda n: None)
    template = launch._ParamsTemplate(((4, 1, 1), (384, 1, 1), 1024, 0, 0, 0), bytes(16), ((0, 0, 0), (8, 1, 16)))
    launcher = launch.PatchedLauncher(loaded, template, programmatic=True)
    launcher.launch([0x1000, 0x2000], 7)
    plain = launch.PatchedLauncher(loaded, template)
    plain.launch([0x3000, 0x4000], 7)
    assert launcher.programmatic and not plain.programmatic
    (config, function, params, extra), (plain_config, *_) = recorder.calls
    assert function == "kernel" and params == launcher._pointers_address and extra == 0
    assert int(config.hStream) == 7 and config.gridDimX == 4 and config.numAttrs == 1 and plain_config.numAttrs == 0
    assert struct.unpack_from("<QQ", launcher.params) == (0x1000, 0x2010)


def test_the_torch_dispatch_takes_pdl():
    pytest.importorskip("torch")
    import pycutlass.torch as pct

    dispatch = pct.Dispatch.of(cutlass.Session())
    assert dispatch.pdl is False and dispatch.configure(pdl=True).pdl is True
    with pytest.raises(cutlass.ArgumentError, match="pdl must be True or False"):
        dispatch.configure(pdl="on")


@pytest.mark.slow
def test_one_add_module_compiles_operations_with_and_without_the_wait(tmp_path):
    """A real compile (about a minute on two cores): a stream-K operation (which CUTLASS 4.2 cannot compile with grid
    dependency control) and one that waits, asked for together, land in separate units and both compile."""
    session = cutlass.Session(backend="nvrtc", target=90, cache_path=tmp_path / "c.db", progress=False)
    compiler = cutlass.compiler.manager.Compiler.of(session)
    waits = array90(array=False, tile=(64, 128, 64), kernel=KS.TmaWarpSpecialized)
    streamk = array90(array=False, kernel=KS.TmaWarpSpecializedCooperative, scheduler=TS.StreamK)
    report = compiler.add_module([waits, streamk], jobs=2)
    assert report.compiled == 2 and not report.failures
    assert [k.kernel_symbol for k in report] == [waits.kernel_symbol, streamk.kernel_symbol]
    assert report[0].sha256 != report[1].sha256  # two units, two binaries


def _reduction(arch=80, **kwargs):
    return cutlass.ReductionOperation(cutlass.MatrixCoord(4, 32 * 8), cutlass.TensorDescription(
        cutlass.float16, cutlass.RowMajor, 8), cutlass.float32, count=8, arch=arch, **kwargs)


def test_a_reduction_built_for_sm90_waits_on_the_grid_before_it():
    """The split-K reduction's kernel waits (griddepcontrol.wait) where it is compiled for SM90 or newer, so a
    reduction built with arch=90 may start under the split-K kernel that writes its workspace; one built for 80
    (which may run as sm_80 code) is refused before anything is allocated."""
    assert _reduction(90).pdl_refusal is None
    assert "griddepcontrol.wait" in _reduction(90).emit()
    with pytest.raises(cutlass.ArgumentError, match="needs a reduction built with arch=90"):
        cutlass.ReductionArguments(_reduction(80), [64, 64], 4, 1 << 20, np.zeros((64, 64), np.float16), pdl=True)
    with pytest.raises(cutlass.ArgumentError, match="pdl must be True or False"):
        cutlass.ReductionArguments(_reduction(90), [64, 64], 4, 1 << 20, np.zeros((64, 64), np.float16), pdl=1)


@pytest.mark.parametrize("kw,match", [(dict(partition_lanes=0), "partition_lanes"),
                                      (dict(partition_lanes=65), "partition_lanes"),
                                      (dict(partition_lanes=True), "partition_lanes"),
                                      (dict(partitions_per_stage=0), "partitions_per_stage")])
def test_reduction_knobs_are_checked(kw, match):
    with pytest.raises(cutlass.DescriptionError, match=match):
        _reduction(**kw)


def test_capped_lanes_are_part_of_the_kernel_and_its_name():
    auto, one = _reduction(), _reduction(partition_lanes=1)
    assert auto.name != one.name and one.name.split("_")[-2] == "l1"
    assert "SplitKReduction<" in auto.emit_body() and " 4, 0>;" in auto.emit_body() and " 4, 1>;" in one.emit_body()
