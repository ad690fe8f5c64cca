"""Epilogue visitor tree GEMMs on the GPU, one tree per node type, against float64 references computed by the
tree's own ``__call__`` on numpy arrays. Outputs are NaN-poisoned (reductions are zeroed by the arguments)."""
from __future__ import annotations

import numpy as np
import pytest

import pycutlass as cutlass
from pycutlass.gemm import GemmCoord, Mode
from tests import evt_trees as trees

from .conftest import precompile_module, relative_error

pytestmark = pytest.mark.gpu

OPS = {t.__name__: trees.operation(t) for t in trees.TREES}


@pytest.fixture(scope="module", autouse=True)
def compiled(memory_pool):
    precompile_module([], OPS.values())  # NVRTC (the backend the CPU suite checked); nvcc is selected after
    yield


def _inputs(op, m, n, batch, rng, lib):
    import torch

    description = op.epilogue_functor.description
    shapes = {"tensor": (m, n), "row": (n,), "column": (m,)}
    values, reference_inputs = {}, {}
    for name, kind in description.inputs:
        if kind == "scalar":
            values[name] = reference_inputs[name] = float(rng.choice([0.5, -1.25, 2.0]))
            continue
        shape = (batch, *shapes[kind]) if batch > 1 else shapes[kind]
        x = np.ceil(rng.uniform(-4.5, 3.5, shape)).astype(np.float16)
        reference_inputs[name] = x.astype(np.float64).reshape((batch, *([1] if kind == "row" else []),
                                                              *shapes[kind], *([1] if kind == "column" else [])))
        values[name] = torch.from_numpy(x).cuda() if lib == "torch" else x
    for name, _ in description.outputs:
        kind = description.tensor_kind(name)
        if kind == "store":
            shape, dtype = ((batch, m, n) if batch > 1 else (m, n)), np.float16
        else:
            length = m if kind == "reduce_row" else n
            shape, dtype = ((batch, length) if batch > 1 else (length,)), np.float32
        poison = np.full(shape, np.nan, dtype=dtype)
        values[name] = torch.from_numpy(poison).cuda() if lib == "torch" else poison
    return values, reference_inputs


def run(op, m, n, k, batch=1, lib="torch", seed=0):
    import torch

    rng = np.random.default_rng(seed)
    mode = Mode.Batched if batch > 1 else Mode.Gemm
    a = np.ceil(rng.uniform(-4.5, 3.5, (batch, m, k))).astype(np.float16)
    b = np.ceil(rng.uniform(-4.5, 3.5, (batch, k, n))).astype(np.float16)
    A = torch.from_numpy(a).cuda() if batch > 1 else torch.from_numpy(a[0]).cuda()
    Bt = torch.from_numpy(np.ascontiguousarray(b.transpose(0, 2, 1))).cuda()  # column-major B: (n, k) rows
    B = Bt.transpose(1, 2) if batch > 1 else Bt[0].t()
    values, reference_inputs = _inputs(op, m, n, batch, rng, lib)
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
    for (name, _), expected in zip(op.epilogue_functor.description.outputs, reference):
        got = values[name].cpu().numpy() if lib == "torch" else values[name]
        expected = np.broadcast_to(expected, (batch, *np.shape(expected)[1:])).reshape(np.shape(got))
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


def test_repeated_runs_rezero_reductions():
    op = OPS["ColumnReduction_"]
    for seed in range(3):
        run(op, 128, 128, 64, seed=seed)
