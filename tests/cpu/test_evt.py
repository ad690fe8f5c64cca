"""The epilogue visitor tree: tracing, rejections, emission, and (slow) NVRTC compiles of visitor GEMMs."""
from __future__ import annotations

import numpy as np
import pytest

import pycutlass as cutlass
from pycutlass import DescriptionError, EpilogueVisitTree, reduction_op
from pycutlass.epilogue import relu
from pycutlass.kinds.gemm_evt import GemmOperationEvt
from tests import evt_trees as trees


def test_trees_trace_and_name_their_inputs_and_outputs():
    f = trees.make(trees.RowBroadcast_)
    d = f.description
    assert d.inputs == (("c", "tensor"), ("vector", "row"), ("alpha", "scalar"), ("beta", "scalar"))
    assert [name for name, _ in d.outputs] == ["Z", "T"]
    assert d.tensors == ("c", "vector", "Z", "T") and d.scalars == ("alpha", "beta")
    assert d.outputs[0][1].op == "relu"
    assert [d.tensor_kind(n) for n in d.tensors] == ["tensor", "row", "store", "store"]
    r = trees.make(trees.RowReduction_).description
    assert r.tensor_kind("reduction") == "reduce_row"
    assert trees.make(trees.ColumnReduction_).description.tensor_kind("reduction") == "reduce_column"


def test_equal_trees_give_equal_operations_and_different_trees_differ():
    names = {trees.operation(t).name for t in trees.TREES}
    assert len(names) == len(trees.TREES)
    assert trees.operation(trees.Linear_) == trees.operation(trees.Linear_)
    assert isinstance(trees.operation(trees.Linear_), GemmOperationEvt)


def test_call_is_the_numpy_reference():
    f = trees.make(trees.RowBroadcast_)
    accum, c, vector = np.ones((2, 3)), np.full((2, 3), 2.0), np.arange(3.0)
    Z, T = f(accum, c, vector, 2.0, -1.0)
    assert np.array_equal(T, accum + vector) and np.array_equal(Z, np.maximum(2 * (accum + vector) - c, 0))
    D = np.arange(6.0).reshape(2, 3)
    assert np.array_equal(reduction_op(D, "row", "Add", 128), [3.0, 12.0])
    assert np.array_equal(reduction_op(D, "column", "Add", 128), [3.0, 5.0, 7.0])


@pytest.mark.parametrize("body, message", [
    ("return accum ** 2", "\\*\\* on acc"),
    ("return abs(accum)", "abs"),
    ("return np.exp(accum)", "numpy.exp"),
    ("R = reduction_op(accum, 'row'); D = R + 1.0; return D", "can only be returned"),
    ("D = accum if accum > 0 else c; return D", ">"),
    ("return accum + 'x'", "must be a traced value or a Python number"),
    ("D = relu.numpy(accum) ; return D, D", "returned twice"),
    ("return accum + c", "return variable names"),
])
def test_unsupported_nodes_are_rejected_naming_them(body, message):
    namespace = {"EpilogueVisitTree": EpilogueVisitTree, "reduction_op": reduction_op, "relu": relu, "np": np}
    source = ("class Bad(EpilogueVisitTree):\n"
              "    def __call__(self, accum: 'tensor', c: 'tensor'):\n"
              f"        {body}\n")
    import linecache
    filename = f"<evt-test-{abs(hash(body))}>"
    linecache.cache[filename] = (len(source), None, source.splitlines(True), filename)  # inspect.getsource
    exec(compile(source, filename, "exec"), namespace)
    with pytest.raises(DescriptionError, match=message):
        trees.make(namespace["Bad"])


def test_annotations_and_accumulator_are_required():
    class NoAnnotation(EpilogueVisitTree):
        def __call__(self, accum, c):
            D = accum + c
            return D

    class NoAccumulator(EpilogueVisitTree):
        def __call__(self, c: 'tensor'):
            D = c * 2.0
            return D

    with pytest.raises(DescriptionError, match="needs an annotation"):
        trees.make(NoAnnotation)
    with pytest.raises(DescriptionError, match="named 'accum'"):
        trees.make(NoAccumulator)


def test_operation_checks():
    f = trees.make(trees.Linear_)
    with pytest.raises(DescriptionError, match="C must be RowMajor"):
        cutlass.GemmOperationUniversal(80, trees.TILE, trees.A, trees.B,
                                       cutlass.TensorDescription(cutlass.float16, cutlass.ColumnMajor, 8), f,
                                       visitor=True)
    with pytest.raises(DescriptionError, match="writes float16 but C is float32"):
        cutlass.GemmOperationUniversal(80, trees.TILE, trees.A, trees.B, trees.C32, f, visitor=True)
    op = trees.operation(trees.RowBroadcast_)
    with pytest.raises(cutlass.ArgumentError, match="missing"):
        op.epilogue_type(c=1, alpha=1.0, beta=0.0, problem_size=[1, 1])
    with pytest.raises(cutlass.ArgumentError, match="keyword"):
        op.epilogue_type(1.0, 0.0)


def test_emission_uses_cutlass_sm80_evt():
    source = trees.operation(trees.ColumnBroadcast_).emit()
    for piece in ("DefaultGemmWithVisitor", "Sm80EVT<", "VisitorAccFetch", "VisitorColBroadcast<ThreadMap",
                  "VisitorAuxLoad<ThreadMap", "VisitorAuxStore<ThreadMap", "VisitorScalarBroadcast<float>",
                  "LeakyReLU", "OutputTileThreadLayout", "struct GemmEvtArgs", "typename Callbacks::Params{"):
        assert piece in source, piece
    reductions = trees.operation(trees.RowReduction_).emit() + trees.operation(trees.ColumnReduction_).emit()
    assert "VisitorColReduction<cutlass::plus, cutlass::atomic_add" in reductions
    assert "VisitorRowReduction<cutlass::plus, cutlass::atomic_add" in reductions
    assert "KeepFirst" in trees.operation(trees.Independent_).emit_body().split("using Callbacks")[0]


@pytest.mark.slow
def test_visitor_gemms_compile_with_nvrtc():
    pytest.importorskip("cuda.bindings.nvrtc")
    from pycutlass.compiler.backends import NvrtcBackend
    from pycutlass.emit.emitter import translation_unit

    ops = [trees.operation(t) for t in (trees.RowBroadcast_, trees.RowReduction_, trees.ColumnReduction_,
                                         trees.Independent_)]
    cubin = NvrtcBackend().compile(translation_unit(ops), 90, "evt_test")
    assert cubin[:4] == b"\x7fELF"
    for op in ops:
        assert op.name.encode() in cubin and op.builder_symbol.encode() in cubin
