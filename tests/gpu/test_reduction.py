"""The split-K reduction on the GPU against float64: random partial products in every workspace type, partition
counts from 1 to past the lanes a block holds (so lanes sum uneven shares), edge tiles, both layouts, source and
bias terms, activations. Outputs are NaN-poisoned before each run."""
from __future__ import annotations

import numpy as np
import pytest

import pycutlass as cutlass
from pycutlass import DataType as D

from .conftest import precompile_module, relative_error
from .gemm_cases import poisoned_output, random_values, to_float64, to_tensor

pytestmark = pytest.mark.gpu

R, CM = cutlass.RowMajor, cutlass.ColumnMajor


def _reduction(out, workspace, count, shape, layout=R, accumulator=D.float32, epilogue=None, **kwargs):
    return cutlass.ReductionOperation(cutlass.MatrixCoord(*shape), cutlass.TensorDescription(out, layout, count),
                                      accumulator, workspace, accumulator if accumulator is D.float64 else D.float32,
                                      epilogue, count=count, **kwargs)


OPS = {
    "f16_c8": _reduction(D.float16, D.float32, 8, (4, 256)),  # the conv and GEMM benchmarks' reduction
    "f16_c8_one_lane": _reduction(D.float16, D.float32, 8, (4, 256), partition_lanes=1),
    "f16_c8_two_lanes": _reduction(D.float16, D.float32, 8, (4, 256), partition_lanes=2),
    "f16_c8_stage1": _reduction(D.float16, D.float32, 8, (4, 256), partitions_per_stage=1),
    "f16_c8_stage8": _reduction(D.float16, D.float32, 8, (4, 256), partitions_per_stage=8),
    "f16_c8_col": _reduction(D.float16, D.float32, 8, (4, 256), CM),
    "f16_c1": _reduction(D.float16, D.float32, 1, (8, 32)),
    "f32_c4": _reduction(D.float32, D.float32, 4, (4, 128)),
    "f32_c4_wide": _reduction(D.float32, D.float32, 4, (1, 4096)),  # 1024 threads a lane: one lane only
    "f64_c1": _reduction(D.float64, D.float64, 1, (4, 32), accumulator=D.float64),
    "bf16_c8_bf16_ws": _reduction(D.bfloat16, D.bfloat16, 8, (4, 256)),
    "f16_c8_gelu": _reduction(D.float16, D.float32, 8, (4, 256),
                              epilogue=cutlass.LinearCombinationGeneric(cutlass.gelu(D.float32), D.float16, 8,
                                                                        D.float32, D.float32)),
}

# Programmatic dependent launch after an SM90 GEMM that writes float32 partials (parallel split-K over its L mode).
PDL_REDUCTION = _reduction(D.float16, D.float32, 8, (4, 256), arch=90)
OPS["f16_c8_sm90"] = PDL_REDUCTION


def _split_k_gemm():
    math = cutlass.MathInstruction([64, 64, 16], D.float16, D.float16, D.float32, cutlass.OpClass.TensorOp)
    tile = cutlass.TileDescription([128, 64, 64], 0, None, math,
                                   kernel_schedule=cutlass.KernelScheduleType.TmaWarpSpecializedPingpong)
    return cutlass.GemmOperationUniversal(90, tile, cutlass.TensorDescription(D.float16, CM, 8),
                                          cutlass.TensorDescription(D.float16, R, 8),
                                          cutlass.TensorDescription(D.float32, R, 4),
                                          cutlass.LinearCombination(D.float32, 4, D.float32, D.float32))


SPLIT_K_GEMM = _split_k_gemm()  # a 1x1 wgrad's shape: dW = dY^T X
NVRTC_OPS = [SPLIT_K_GEMM]

TOLERANCE = {D.float16: 2e-3, D.bfloat16: 1.5e-2, D.float32: 1e-6, D.float64: 1e-12}


@pytest.fixture(scope="module", autouse=True)
def compiled(memory_pool):
    precompile_module(OPS.values(), NVRTC_OPS)
    yield


def _gelu(x):
    from scipy.special import erf

    return 0.5 * x * (1.0 + erf(x / np.sqrt(2.0)))


def run_reduction(op, m, n, partitions, alpha=1.25, beta=-0.5, bias=False, seed=0):
    import torch

    rng = np.random.default_rng(seed)
    partials = random_values(rng, (partitions, m, n), op.element_workspace)
    if op.matrix_layout is CM:  # the workspace holds partitions of the output's layout
        stored = np.ascontiguousarray(partials.transpose(0, 2, 1))
    else:
        stored = partials
    dtype = {D.float16: torch.float16, D.bfloat16: torch.bfloat16, D.float32: torch.float32,
             D.float64: torch.float64}[op.element_workspace]
    workspace = torch.tensor(stored, dtype=torch.float64).to(dtype).cuda()
    c = random_values(rng, (n,) if bias else (m, n), op.C.element)
    C = to_tensor(c, op.C.element, R, "torch") if bias else to_tensor(c, op.C.element, op.C.layout, "torch")
    out = poisoned_output((m, n), op.C.element, op.C.layout, "torch")
    arguments = cutlass.ReductionArguments(op, [m, n], partitions, workspace.data_ptr(), out, C,
                                           op.epilogue_type(alpha, beta), bias=bias)
    op.run(arguments)
    arguments.sync()
    reference = alpha * partials.sum(axis=0) + beta * (c[None, :] if bias else c)
    if op.epilogue_functor.activation is not None:
        reference = _gelu(reference)
    block = arguments.prepared().block
    del workspace
    return to_float64(out), reference, block


@pytest.mark.parametrize("name", list(OPS))
@pytest.mark.parametrize("m,n,partitions", [(7, 264, 1), (64, 256, 3), (256, 64, 64), (130, 576, 37),
                                            (64, 576, 130)])
def test_reduction(name, m, n, partitions):
    op = OPS[name]
    if op.count > 1 and (n if op.matrix_layout is R else m) % op.count:
        m, n = n, m  # a column-major output vectorizes along M
    got, reference, block = run_reduction(op, m, n, partitions, seed=partitions)
    assert relative_error(got, reference) < TOLERANCE[op.C.element], (name, m, n, partitions)
    if op.partition_lanes:
        assert block[2] <= op.partition_lanes
    assert block[0] * block[1] * block[2] <= 1024


def test_lanes_share_many_partitions():
    """64 partitions of a 256 x 64 output (a 1x1 wgrad's filter gradient): the default reduction spreads them over
    eight lanes of a 128-thread block; capped at one lane it is the thread-per-vector loop. Both agree."""
    got, reference, block = run_reduction(OPS["f16_c8"], 256, 64, 64, seed=1)
    assert block == (32, 4, 8)
    assert relative_error(got, reference) < TOLERANCE[D.float16]
    got_one, _, block_one = run_reduction(OPS["f16_c8_one_lane"], 256, 64, 64, seed=1)
    assert block_one == (32, 4, 1)
    assert relative_error(got_one, reference) < TOLERANCE[D.float16]


@pytest.mark.parametrize("name", ["f16_c8", "f32_c4", "f16_c1"])
def test_bias_broadcast(name):
    op = OPS[name]
    got, reference, _ = run_reduction(op, 64, 576, 21, beta=0.75, bias=True, seed=3)
    assert relative_error(got, reference) < TOLERANCE[op.C.element]


def test_beta_zero_reads_no_source():
    op = OPS["f32_c4"]
    got, reference, _ = run_reduction(op, 33, 128, 9, alpha=2.0, beta=0.0, seed=5)
    assert relative_error(got, reference) < TOLERANCE[D.float32]


def test_pdl_reduction_waits_for_the_split_k_gemm_before_it():
    """The GEMM's partials are poisoned (all bits set: NaN) before each pass, then the GEMM and the reduction go back
    to back, the reduction launched with programmatic dependent launch: its blocks may start while the GEMM drains,
    and read the workspace only after it. A reduction that read early would sum NaN or a stale pass."""
    import torch

    from pycutlass.runtime import driver

    m, n, k, split = 256, 64, 64 * 1024, 64  # long slices: the GEMM is still writing when the reduction launches
    generator = torch.Generator(device="cuda").manual_seed(11)
    dy = torch.randn(k, m, device="cuda", generator=generator).half()  # A = dy^T: column-major M x K
    x = torch.randn(k, n, device="cuda", generator=generator).half()   # B: row-major K x N
    out = torch.empty(m, n, device="cuda", dtype=torch.float16)
    gemm_args = cutlass.GemmArguments(SPLIT_K_GEMM, (m, n, k), dy.t(), x, None, out,
                                      gemm_mode=cutlass.gemm.Mode.GemmSplitKParallel, split_k_slices=split)
    reduction_args = cutlass.ReductionArguments(PDL_REDUCTION, [m, n], split, gemm_args, out,
                                                output_op=PDL_REDUCTION.epilogue_type(0.5, 0.0), pdl=True)
    assert reduction_args.prepared().programmatic
    reference = 0.5 * (dy.double().t() @ x.double())
    partials = gemm_args.ptr_D
    for scale in (1.0, -2.0, 0.25):
        dy.mul_(scale)
        reference *= scale
        out.fill_(float("nan"))
        driver.memset_d8(int(partials), 0xFF, partials.nbytes, gemm_args.stream)
        SPLIT_K_GEMM.run(gemm_args)
        PDL_REDUCTION.run(reduction_args)
        reduction_args.sync()
        got = out.double()
        assert relative_error(got.cpu().numpy(), reference.cpu().numpy()) < TOLERANCE[D.float16], scale
