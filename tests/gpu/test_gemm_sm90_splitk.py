"""SM90 GEMM parallel split-K (PyCUTLASS's GemmSplitKParallel) on the GPU: f32 partial products of equal K slices
(the L mode), then a ReductionOperation into D = alpha * sum + beta * C, against float64 references with NaN-poisoned
outputs, for every A/B layout pair, a ping-pong schedule and a 2x1 cluster."""
from __future__ import annotations

import pytest

import pycutlass as cutlass
from pycutlass import KernelScheduleType as KS
from pycutlass.gemm import GemmCoord, Mode

from .conftest import precompile_module, relative_error
from .test_gemm_sm90 import CM, D, R, TOLERANCE, _logical, _matrix, _poisoned, sm90_op, torch

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(torch is None, reason="needs torch")]

# Parallel split-K (PyCUTLASS's GemmSplitKParallel): f32 partial sums per K slice, then a ReductionOperation.
SPLITK_OPS = {f"{e.name}_{''.join('t' if x is R else 'n' for x in lay)}": sm90_op(e, (*lay, R), out=D.float32, **kw)
              for e, lay, kw in ((D.float16, (R, CM), {}), (D.float16, (R, R), {"tile": (64, 128, 64)}),
                                 (D.float16, (CM, CM), {"kernel": KS.TmaWarpSpecializedPingpong, "tile": (64, 128, 64)}),
                                 (D.bfloat16, (CM, R), {"cluster": (2, 1, 1)}))}
REDUCTIONS = {out: cutlass.ReductionOperation(cutlass.MatrixCoord(4, 32 * 8), cutlass.TensorDescription(out, R, 8),
                                              D.float32, D.float32, D.float32, count=8)
              for out in (D.float16, D.bfloat16)}


@pytest.fixture(scope="module", autouse=True)
def _compiled():
    precompile_module(REDUCTIONS.values(), SPLITK_OPS.values())


@pytest.mark.parametrize("name", sorted(SPLITK_OPS))
@pytest.mark.parametrize("size,slices", [((264, 136, 2048), 4), ((1000, 72, 4096), 16), ((8, 256, 1040), 5),
                                         ((136, 264, 64), 1)], ids=lambda v: "x".join(map(str, v)) if
                         isinstance(v, tuple) else str(v))
def test_parallel_split_k_then_reduction(name, size, slices):
    """The L mode over K slices into the workspace, then D = 1.5 * sum + (-0.5) * C by the reduction."""
    op = SPLITK_OPS[name]
    m, n, k = size
    element = op.A.element
    generator = torch.Generator().manual_seed(slices)
    A, A64 = _matrix(m, k, op.A.layout, element, generator)
    B, B64 = _matrix(k, n, op.B.layout, element, generator)
    C, C64 = _matrix(m, n, R, element, generator)
    D_ = _poisoned(m, n, R, element)
    arguments = cutlass.GemmArguments(op, GemmCoord(m, n, k), A, B, C, D_, gemm_mode=Mode.GemmSplitKParallel,
                                      split_k_slices=slices)
    op.run(arguments)
    reduction = REDUCTIONS[element]
    reduction_args = cutlass.ReductionArguments(reduction, [m, n], slices, arguments, D_, C,
                                                reduction.epilogue_type(1.5, -0.5))
    reduction.run(reduction_args)
    reduction_args.sync()
    error = relative_error(_logical(D_, R)[0], 1.5 * (A64[0] @ B64[0]) - 0.5 * C64[0])
    assert error < TOLERANCE[element], f"relative error {error}"
