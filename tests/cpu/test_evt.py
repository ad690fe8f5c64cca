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
    assert np.array_equal(reduction_op(D, "row"), [3.0, 12.0])  # no length: complete sums
    assert np.array_equal(reduction_op(D, "column"), [3.0, 5.0, 7.0])
    assert np.array_equal(reduction_op(D, "row", "Add", 128), [[3.0, 12.0]])  # one tile of partial sums
    assert np.array_equal(reduction_op(D, "column", "Add", 2), [[3.0, 5.0, 7.0]])


def test_per_tile_partial_sums_are_pycutlass_2_11s():
    """With a length, the numpy reduction is PyCUTLASS 2.11's: (batch, tiles, M) for "row", (batch, tiles, N) for
    "column", flattened in its buffer order; a ragged last tile sums what it holds."""
    rng = np.random.default_rng(0)
    x = rng.standard_normal((3, 8, 12))
    # PyCUTLASS 2.11's own formulas (epilogue.py reduction_op), for tiles that divide the extent
    row = np.transpose(np.sum(x.reshape(3, 8, 3, 4), axis=-1), axes=[0, 2, 1]).flatten()
    column = np.sum(x.reshape(3, 2, 4, 12), axis=-2).flatten()
    assert np.allclose(reduction_op(x, "row", "Add", 4).flatten(), row)
    assert np.allclose(reduction_op(x, "column", "Add", 4).flatten(), column)
    assert reduction_op(x, "row", "Add", 4).shape == (3, 3, 8)
    ragged = reduction_op(x, "row", "Add", 5)  # tiles of 5, 5 and 2 columns
    assert ragged.shape == (3, 3, 8) and np.allclose(ragged[:, 2], x[:, :, 10:].sum(-1))
    assert np.allclose(ragged.sum(axis=1), reduction_op(x, "row"))
    ragged = reduction_op(x, "column", "Add", 3)  # tiles of 3, 3 and 2 rows
    assert ragged.shape == (3, 3, 12) and np.allclose(ragged[:, 2], x[:, 6:].sum(-2))
    with pytest.raises(DescriptionError, match="length must be a positive integer"):
        reduction_op(x, "row", "Add", 0)


def test_reduction_length_must_be_the_tile():
    class Tile64(EpilogueVisitTree):
        def __call__(self, accum: 'tensor'):
            D = accum * 2.0
            R = reduction_op(D, "row", "Add", 64)
            return D, R

    class NoLength(EpilogueVisitTree):
        def __call__(self, accum: 'tensor'):
            D = accum * 2.0
            R = reduction_op(D, "column")
            return D, R

    with pytest.raises(DescriptionError, match=r"length 64, but .* tile's N = 128"):
        cutlass.GemmOperationUniversal(80, trees.TILE, trees.A, trees.B, trees.C, trees.make(Tile64), visitor=True)
    cutlass.GemmOperationUniversal(80, trees.TILE, trees.A, trees.B, trees.C, trees.make(NoLength), visitor=True)
    wide = cutlass.TileDescription([64, 256, 32], 3, [1, 8, 1], trees.MATH)
    with pytest.raises(DescriptionError, match="8 or more warps"):
        cutlass.GemmOperationUniversal(80, wide, trees.A, trees.B, trees.C, trees.make(NoLength), visitor=True)


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
    assert "Sm80EVT<pycutlass_evt::RowSums<ThreadMap, float, cutlass::half_t>" in reductions
    assert "Sm80EVT<pycutlass_evt::ColumnSums<ThreadMap, float, cutlass::half_t>" in reductions
    assert "a.reduction_mode[" in reductions and reductions.count("struct ColumnSums") == 2  # once per unit
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


class _FakeTensors:
    """Stands in for the device: every tensor lives at one aligned address."""

    def address(self, info, is_output=False):
        return 0x100000


def _bound_arguments(monkeypatch, tree, m, n, k, outputs, mode=None, batch=1, A=None, B=None):
    """GemmEvtArguments validated and bound on the CPU; ``outputs`` maps the tree's output names to arrays."""
    from pycutlass.gemm import Mode
    from pycutlass.kinds.gemm_evt.arguments import GemmEvtArguments

    def materialize(self):
        self.tensors = _FakeTensors()
        self._allocate()

    monkeypatch.setattr(GemmEvtArguments, "_materialize", materialize)
    op = trees.operation(tree)
    shape = (batch, m, n) if batch > 1 else (m, n)
    if A is None:
        A = np.zeros((batch, m, k) if batch > 1 else (m, k), np.float16)
        B = np.zeros((batch, n, k) if batch > 1 else (n, k), np.float16)
        B = np.swapaxes(B, -1, -2)  # column-major B
    values = dict(c=np.zeros(shape, np.float16), alpha=1.0, beta=0.5, **outputs)
    mode = mode or (Mode.Batched if batch > 1 else Mode.Gemm)
    args = cutlass.GemmArguments(op, [m, n, k], A, B, None, None, output_op=op.epilogue_type(**values,
                                 problem_size=[m, n]), gemm_mode=mode, batch=batch)
    return op, args, args.bind()


def test_reduction_buffers_choose_complete_or_per_tile_sums(monkeypatch):
    """A complete-sum buffer (M or N values per batch, compute type) is zeroed and added into atomically; a buffer
    of PyCUTLASS 2.11's per-tile size (one vector per 128-wide tile) is stored once, in the compute or output type."""
    m, n, k = 200, 296, 64  # 2 M tiles, 3 N tiles of 128
    D = np.zeros((m, n), np.float16)
    op, args, abi = _bound_arguments(monkeypatch, trees.RowReduction_, m, n, k,
                                     dict(D=D, reduction=np.zeros(m, np.float32)))
    slot = op.epilogue_functor.description.tensors.index("reduction")
    assert abi.reduction_mode[slot] == 0 and getattr(abi, f"ld_{slot}") == 0 and len(args._reductions) == 1
    op, args, abi = _bound_arguments(monkeypatch, trees.RowReduction_, m, n, k,
                                     dict(D=D, reduction=np.zeros(3 * m, np.float32)))
    assert abi.reduction_mode[slot] == 1 and getattr(abi, f"ld_{slot}") == m and args._reductions == []
    op, args, abi = _bound_arguments(monkeypatch, trees.RowReduction_, m, n, k,
                                     dict(D=D, reduction=np.zeros((3, m), np.float16)))  # the output type
    assert abi.reduction_mode[slot] == 2
    op, args, abi = _bound_arguments(monkeypatch, trees.ColumnReduction_, m, n, k,
                                     dict(D=D, reduction=np.zeros((2, n), np.float32)))
    assert abi.reduction_mode[slot] == 1 and getattr(abi, f"ld_{slot}") == n
    # batched: one set of partial sums per batch
    op, args, abi = _bound_arguments(monkeypatch, trees.ColumnReduction_, m, n, k,
                                     dict(D=np.zeros((3, m, n), np.float16),
                                          reduction=np.zeros(3 * 2 * n, np.float32)), batch=3)
    assert abi.reduction_mode[slot] == 1 and getattr(abi, f"batch_stride_{slot}") == 2 * n
    with pytest.raises(cutlass.ArgumentError, match=r"200 contiguous float32 elements \(complete sums.*600 "
                                                    r"contiguous float32 or float16 elements \(PyCUTLASS 2.11's "
                                                    r"per-tile partial sums: 200 per N tile of 128 columns"):
        _bound_arguments(monkeypatch, trees.RowReduction_, m, n, k, dict(D=D, reduction=np.zeros(400, np.float32)))
    with pytest.raises(cutlass.ArgumentError, match="got float16"):  # complete sums are added in float32
        _bound_arguments(monkeypatch, trees.RowReduction_, m, n, k, dict(D=D, reduction=np.zeros(m, np.float16)))


def test_array_mode_runs_single_tensors_batched(monkeypatch):
    """PyCUTLASS 2.11's Mode.Array with one tensor per operand reads the addresses a batched GEMM reads."""
    from pycutlass.gemm import Mode

    m, n, k, batch = 136, 128, 64, 3
    outputs = dict(D=np.zeros((batch, m, n), np.float16), reduction=np.zeros(batch * m, np.float32))
    _, args, abi = _bound_arguments(monkeypatch, trees.RowReduction_, m, n, k, outputs, Mode.Array, batch)
    assert args.gemm_mode is Mode.Array and abi.mode == int(Mode.Batched) and abi.batch_count == batch
    assert abi.batch_stride_A == m * k and abi.batch_stride_B == n * k
    A = [np.zeros((m, k), np.float16)] * batch
    B = [np.zeros((n, k), np.float16).T] * batch
    with pytest.raises(cutlass.ArgumentError, match="lists of separate matrices need a pointer-array kernel"):
        _bound_arguments(monkeypatch, trees.RowReduction_, m, n, k, outputs, Mode.Array, batch, A, B)
    with pytest.raises(cutlass.ArgumentError, match="cannot split K"):
        _bound_arguments(monkeypatch, trees.RowReduction_, m, n, k, outputs, Mode.GemmSplitKParallel, batch)
    with pytest.raises(cutlass.ArgumentError, match="batch 65536 exceeds 65535"):  # one grid z layer per batch
        _bound_arguments(monkeypatch, trees.RowReduction_, m, n, k, outputs, Mode.Batched, 65536)


@pytest.mark.slow
def test_pycutlass_2_11_example_operations_compile_with_nvrtc():
    """The four EVT invocations of PyCUTLASS 2.11's run_all_example.sh (f16, bf16 with a 64x128 tile, float32 with
    fast bf16 math; row and column sums, a column broadcast) in one unit."""
    pytest.importorskip("cuda.bindings.nvrtc")
    from pycutlass.compiler.backends import NvrtcBackend
    from pycutlass.emit.emitter import translation_unit

    ops = [op for _, op, _, _ in trees.EXAMPLES]
    source = translation_unit(ops)
    assert source.count("namespace pycutlass_evt {") == 1
    cubin = NvrtcBackend().compile(source, 90, "evt_examples")
    for op in ops:
        assert op.name.encode() in cubin and op.builder_symbol.encode() in cubin
