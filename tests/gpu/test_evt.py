"""Epilogue visitor tree GEMMs on the GPU, one tree per node type, against float64 references computed by the
tree's own ``__call__`` on numpy arrays. Outputs are NaN-poisoned (complete-sum reductions are zeroed by the
arguments; per-tile partial sums are not). Last, PyCUTLASS 2.11's four EVT invocations of run_all_example.sh as its
gemm.py makes them: packed 1-D tensors, per-tile reductions, Mode.Batched and Mode.Array."""
from __future__ import annotations

import numpy as np
import pytest

import pycutlass as cutlass
from pycutlass.gemm import GemmCoord, Mode
from tests import evt_trees as trees

from .conftest import precompile_module, relative_error

pytestmark = pytest.mark.gpu

OPS = {t.__name__: trees.operation(t) for t in trees.TREES}
NVRTC_OPS = [*OPS.values(), *(example[1] for example in trees.EXAMPLES)]


@pytest.fixture(scope="module", autouse=True)
def compiled(memory_pool):
    # NVRTC (the backend the CPU suite checked); nvcc is selected after
    precompile_module([], NVRTC_OPS)
    yield


def _inputs(op, m, n, batch, rng, lib, reductions="complete"):
    """The tree's tensors by name, and their float64 reference inputs. ``reductions``: "complete" (one sum per row
    or column, float32), "tile" (PyCUTLASS 2.11's per-tile partial sums, float32) or "tile_output" (the same in the
    output type, float16)."""
    import torch

    description = op.epilogue_functor.description
    shapes = {"tensor": (m, n), "row": (n,), "column": (m,)}
    element = np.float32 if op.C.element is cutlass.float32 else np.float16  # the tree's tensors are C's type
    values, reference_inputs = {}, {}
    for name, kind in description.inputs:
        if kind == "scalar":
            values[name] = reference_inputs[name] = float(rng.choice([0.5, -1.25, 2.0]))
            continue
        shape = (batch, *shapes[kind]) if batch > 1 else shapes[kind]
        x = np.ceil(rng.uniform(-4.5, 3.5, shape)).astype(element)
        reference_inputs[name] = x.astype(np.float64).reshape((batch, *([1] if kind == "row" else []),
                                                              *shapes[kind], *([1] if kind == "column" else [])))
        values[name] = torch.from_numpy(x).cuda() if lib == "torch" else x
    for name, _ in description.outputs:
        kind = description.tensor_kind(name)
        if kind == "store":
            shape, dtype = ((batch, m, n) if batch > 1 else (m, n)), element
        else:
            tile_m, tile_n, _ = op.tile_description.threadblock_shape
            length, tiles = (m, -(-n // tile_n)) if kind == "reduce_row" else (n, -(-m // tile_m))
            shape = (batch, length) if reductions == "complete" else (batch, tiles, length)
            shape = shape[1:] if batch == 1 else shape
            dtype = element if reductions == "tile_output" else np.float32
        poison = np.full(shape, np.nan, dtype=dtype)
        values[name] = torch.from_numpy(poison).cuda() if lib == "torch" else poison
    return values, reference_inputs


def run(op, m, n, k, batch=1, lib="torch", seed=0, reductions="complete", check=None):
    """Run ``op`` on integer-valued f16 operands; compare every output with the tree's own float64 ``__call__``
    (``check(op, got, expected)`` in place of this suite's tolerances, if given)."""
    import torch

    rng = np.random.default_rng(seed)
    mode = Mode.Batched if batch > 1 else Mode.Gemm
    a = np.ceil(rng.uniform(-4.5, 3.5, (batch, m, k))).astype(np.float16)
    b = np.ceil(rng.uniform(-4.5, 3.5, (batch, k, n))).astype(np.float16)
    A = torch.from_numpy(a).cuda() if batch > 1 else torch.from_numpy(a[0]).cuda()
    Bt = torch.from_numpy(np.ascontiguousarray(b.transpose(0, 2, 1))).cuda()  # column-major B: (n, k) rows
    B = Bt.transpose(1, 2) if batch > 1 else Bt[0].t()
    values, reference_inputs = _inputs(op, m, n, batch, rng, lib, reductions)
    output_op = op.epilogue_type(**values, problem_size=[m, n])
    arguments = cutlass.GemmArguments(op, GemmCoord(m, n, k), A, B, None, None, output_op=output_op,
                                      gemm_mode=mode, batch=batch)
    op.run(arguments)
    if lib == "numpy":
        output_op.sync()  # PyCUTLASS 2.11: copies the tree's host outputs back
    else:
        arguments.sync()
    accum = a.astype(np.float64) @ b.astype(np.float64)
    params = [p for p in op.epilogue_functor.description.inputs]
    reference = op.epilogue_functor(accum, **{name: reference_inputs[name] for name, _ in params})
    reference = reference if isinstance(reference, tuple) else (reference,)
    for (name, node), expected in zip(op.epilogue_functor.description.outputs, reference):
        got = values[name].cpu().numpy() if lib == "torch" else values[name]
        if node.op == "reduction" and reductions == "complete":
            expected = expected.sum(axis=-2)  # the tree's reference gives per-tile partial sums (its length)
        expected = np.broadcast_to(expected, (batch, *np.shape(expected)[1:])).reshape(np.shape(got))
        if check is not None:
            check(op, got, expected)
            continue
        tolerance = 2e-3 if got.dtype == np.float16 else 1e-5
        assert relative_error(got, expected) < tolerance, (op.epilogue_functor.describe(), name)


@pytest.mark.parametrize("tree", list(OPS))
def test_tree(tree):
    run(OPS[tree], 256, 192, 96)


@pytest.mark.parametrize("tree", ["RowBroadcast_", "ColumnBroadcast_", "RowReduction_", "ColumnReduction_"])
def test_odd_sizes_and_partial_tiles(tree):
    run(OPS[tree], 200, 136, 40, seed=1)


@pytest.mark.parametrize("tree", ["Linear_", "RowBroadcast_", "RowReduction_", "ColumnReduction_"])
def test_batched(tree):
    run(OPS[tree], 136, 128, 64, batch=3, seed=2)


@pytest.mark.parametrize("tree", ["RowBroadcast_", "RowReduction_"])
def test_numpy_host_tensors_and_output_op_sync(tree):
    run(OPS[tree], 128, 64, 32, lib="numpy", seed=3)


@pytest.mark.parametrize("reductions", ["tile", "tile_output"])
@pytest.mark.parametrize("tree", ["RowReduction_", "ColumnReduction_"])
@pytest.mark.parametrize("m,n,k,batch", [(256, 384, 64, 1), (200, 136, 40, 1), (136, 264, 24, 3)],
                         ids=["whole-tiles", "ragged", "ragged-batched"])
def test_per_tile_partial_sums(tree, reductions, m, n, k, batch):
    """PyCUTLASS 2.11's per-tile partial sums, chosen by the buffer's size: NaN-poisoned and never zeroed, so every
    slot must be written; a ragged last tile sums only the rows / columns it holds."""
    run(OPS[tree], m, n, k, batch=batch, seed=4, reductions=reductions)


def test_per_tile_numpy_host_buffers():
    run(OPS["RowReduction_"], 136, 264, 32, lib="numpy", seed=5, reductions="tile")


def test_repeated_runs_rezero_reductions():
    op = OPS["ColumnReduction_"]
    for seed in range(3):
        run(op, 128, 128, 64, seed=seed)


@pytest.mark.parametrize("op,mode,batch", [e[1:] for e in trees.EXAMPLES], ids=[e[0] for e in trees.EXAMPLES])
def test_pycutlass_2_11_example_invocations(op, mode, batch):
    """As examples/40_cutlass_py/customizable/gemm.py builds them: packed 1-D operands in their layouts,
    integer-valued inputs, reductions sized batch * M * ceil(N / tile N) ("row") or batch * N * ceil(M / tile M)
    ("column") and compared with the tree's reference flattened, Array mode from single tensors."""
    import torch

    m, n, k = 512, 256, 128
    alpha, beta = 1.0, 0.5
    rng = np.random.default_rng(9)
    element = op.A.element
    a, b, c = (np.ceil(rng.uniform(-8.5, 7.5, shape)) for shape in ((batch, m, k), (batch, k, n), (batch, m, n)))

    def packed(x, layout):  # a (batch, rows, cols) logical matrix -> PyCUTLASS's packed 1-D tensor
        x = x.transpose(0, 2, 1) if layout is cutlass.ColumnMajor else x
        if element is cutlass.bfloat16:  # no numpy bfloat16: a torch tensor, as pycutlass takes it
            return torch.from_numpy(np.ascontiguousarray(x).reshape(-1)).to(torch.bfloat16).cuda()
        return np.ascontiguousarray(x).reshape(-1).astype(np.float32 if element is cutlass.float32 else np.float16)

    tensor_A, tensor_B = packed(a, op.A.layout), packed(b, op.B.layout)
    tensor_C = c.reshape(-1).astype(np.float32)
    tensor_D = np.full(batch * m * n, np.nan, np.float32)
    functor = op.epilogue_functor
    outputs = dict(functor.description.outputs)
    tile_m, tile_n, _ = op.tile_description.threadblock_shape
    values = dict(alpha=alpha, beta=beta, c=tensor_C)
    if "reduction" in outputs:
        tiles = -(-n // tile_n) if outputs["reduction"].value[0] == "row" else -(-m // tile_m)
        length = m if outputs["reduction"].value[0] == "row" else n
        reduction = np.full(batch * length * tiles, np.nan, np.float32)
        values.update(D=tensor_D, reduction=reduction)
    else:
        vector = np.ceil(rng.uniform(-8.5, 7.5, (batch, m, 1))).astype(np.float32)
        tensor_T = np.full(batch * m * n, np.nan, np.float32)
        values.update(vector=vector, Z=tensor_D, T=tensor_T)
    output_op = op.epilogue_type(**values, problem_size=[m, n])
    arguments = cutlass.GemmArguments(operation=op, problem_size=GemmCoord(m, n, k), A=tensor_A, B=tensor_B,
                                      C=tensor_C, D=tensor_D, output_op=output_op, gemm_mode=mode, split_k_slices=1,
                                      batch=batch)
    op.run(arguments)
    output_op.sync()
    accum = a @ b
    if "reduction" in outputs:
        D_ref, reduction_ref = functor(accum, c, alpha, beta)
        assert relative_error(reduction, reduction_ref.flatten()) < 1e-6
        assert np.allclose(reduction, reduction_ref.flatten(), atol=1e-2)  # the example's own check
    else:
        D_ref, T_ref = functor(accum, c, vector.astype(np.float64), alpha, beta)
        assert relative_error(tensor_T, T_ref.flatten()) < 1e-6
    assert relative_error(tensor_D, D_ref.flatten()) < 1e-6
