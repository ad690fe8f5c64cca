"""SM90 fp8 GEMM with block-wise scales (``scales="blockwise"``: float32 per 1 x 128 block of A, per 128 x 128 block
of B) on the GPU against float64 of the dequantized operands: cooperative and ping-pong, clusters, e4m3 and e5m2,
bf16/f16/f32 outputs, an activation, C with beta; K and N that end in partial blocks, M = 4, K below one block.
Inputs are exactly representable in their fp8 types; outputs are NaN-poisoned before each run."""
from __future__ import annotations

import numpy as np
import pytest

import pycutlass as cutlass
from pycutlass import KernelScheduleType as KS
from pycutlass.gemm import GemmCoord

from .conftest import precompile_module, relative_error, scan_cubins
from .gemm_cases import epilogue_reference, random_values, to_float64, to_tensor
from .test_gemm_grouped import _activation_args

try:
    import torch
except ImportError:  # CPU machines collect (and skip) this module; OPS stay importable for precompiling
    torch = None
pytestmark = [pytest.mark.gpu, pytest.mark.skipif(torch is None, reason="needs torch")]

D = cutlass.DataType
R, CM = cutlass.RowMajor, cutlass.ColumnMajor
BLOCK = 128


def blockwise_op(a=D.float8_e4m3, b=None, out=D.bfloat16, tile=(128, 128, 128), cluster=(1, 1, 1),
                 kernel=KS.Auto, activation=None, c_layout=R, operation=cutlass.GemmOperationUniversal):
    """A block-scaled fp8 operation (``operation``: the dense GEMM, or ``cutlass.GemmOperationGrouped``)."""
    b = b or a
    math = cutlass.MathInstruction([64, tile[1], 32], a, b, D.float32, cutlass.OpClass.TensorOp)
    description = cutlass.TileDescription(list(tile), 0, None, math, cluster_shape=list(cluster),
                                          kernel_schedule=kernel)
    C = cutlass.TensorDescription(out, c_layout, 128 // out.bits)
    functor = cutlass.LinearCombination(out, C.alignment, D.float32, D.float32) if activation is None else \
        cutlass.LinearCombinationGeneric(getattr(cutlass, activation)(D.float32), out, C.alignment, D.float32,
                                         D.float32)
    return operation(90, description, cutlass.TensorDescription(a, R, 16), cutlass.TensorDescription(b, CM, 16), C,
                     functor, scales="blockwise")


OPS = {
    "e4m3_coop_bf16": blockwise_op(),
    "e4m3_pp_64x128_c2x1_f32": blockwise_op(out=D.float32, tile=(64, 128, 128), cluster=(2, 1, 1),
                                            kernel=KS.TmaWarpSpecializedPingpong),
    "e4m3e5m2_coop_256x128_c1x2_f16_gelu": blockwise_op(b=D.float8_e5m2, out=D.float16, tile=(256, 128, 128),
                                                        cluster=(1, 2, 1), activation="gelu"),
    "e4m3_pp_128x128_bf16_silu": blockwise_op(tile=(128, 128, 128), kernel=KS.TmaWarpSpecializedPingpong,
                                              activation="silu"),
    "e5m2e4m3_coop_c2x1_bf16cm": blockwise_op(a=D.float8_e5m2, b=D.float8_e4m3, cluster=(2, 1, 1), c_layout=CM),
}
TOLERANCES = {D.bfloat16: 2e-2, D.float16: 5e-3, D.float32: 1e-3}


@pytest.fixture(scope="module", autouse=True)
def compiled(memory_pool):
    precompile_module((), list(OPS.values()))
    yield


def _scales(rng, shape):
    """Quantization-like scales: positive, spread over three decades."""
    return 2.0 ** rng.uniform(-6, 4, shape)


def run_blockwise(op, m, n, k, seed, alpha=1.0, beta=0.0, ld_pad=0):
    """One run against float64 of the dequantized operands: A[i, j] * sa[i, j // 128] and B[j, l] * sb[l // 128,
    j // 128]; returns the relative error. scale_a is DeepGEMM's TMA-aligned form: its rows padded to a multiple of
    4 (NaN in the padding, which must not reach D), its K blocks that many (+ ``ld_pad``) apart; compact where M is
    a multiple of 4."""
    rng = np.random.default_rng(seed)
    a = random_values(rng, (m, k), op.A.element)
    b = random_values(rng, (k, n), op.B.element)
    k_blocks, n_blocks = -(-k // BLOCK), -(-n // BLOCK)
    sa = _scales(rng, (m, k_blocks)).astype(np.float32).astype(np.float64)
    sb = _scales(rng, (n_blocks, k_blocks)).astype(np.float32).astype(np.float64)
    a_deq = a * np.repeat(sa, BLOCK, axis=1)[:, :k]
    b_deq = b * np.repeat(np.repeat(sb, BLOCK, axis=0)[:n], BLOCK, axis=1)[:, :k].T
    c = random_values(rng, (m, n), op.C.element) if beta else None
    A = to_tensor(a, op.A.element, R, "torch")
    B = to_tensor(b, op.B.element, CM, "torch")
    C = to_tensor(c, op.C.element, op.C.layout, "torch") if beta else None
    dtype = getattr(torch, {D.bfloat16: "bfloat16", D.float16: "float16", D.float32: "float32"}[op.C.element])
    out = torch.full((m, n), float("nan"), dtype=dtype, device="cuda") if op.C.layout is R else \
        torch.full((n, m), float("nan"), dtype=dtype, device="cuda").t()
    rows = -(-m // 4) * 4
    storage = torch.full((k_blocks, rows + ld_pad), float("nan"), dtype=torch.float32, device="cuda")
    storage[:, :m] = torch.from_numpy(sa.T.astype(np.float32)).cuda()
    scale_a = storage.t()[:rows]  # (M rounded up to 4, K blocks), M contiguous
    scale_b = torch.from_numpy(sb.astype(np.float32)).cuda()
    args = cutlass.GemmArguments(op, GemmCoord(m, n, k), A, B, C, out,
                                 op.epilogue_type(alpha, beta, *_activation_args(op)), scale_a=scale_a, scale_b=scale_b)
    op.run(args)
    args.sync()
    reference = epilogue_reference(op, a_deq @ b_deq, c, alpha, beta, _activation_args(op))
    return relative_error(to_float64(out), reference)


@pytest.mark.parametrize("key", list(OPS))
@pytest.mark.parametrize("shape", [(256, 384, 512), (260, 200, 1008), (4, 136, 128), (1028, 520, 2064),
                                   (96, 1024, 48)])
def test_blockwise_scales_against_float64(key, shape):
    """Whole blocks, K and N ending in partial blocks, M = 4, K below one block."""
    op = OPS[key]
    if op.C.layout is CM:  # a column-major D is contiguous along M
        shape = (-(-shape[0] // 8) * 8, *shape[1:])
    error = run_blockwise(op, *shape, seed=sum(shape))
    assert error < TOLERANCES[op.C.element], f"{shape}: relative error {error:.3e}"


@pytest.mark.parametrize("key", ["e4m3_coop_bf16", "e4m3_pp_64x128_c2x1_f32", "e4m3e5m2_coop_256x128_c1x2_f16_gelu"])
@pytest.mark.parametrize("shape,ld_pad", [((259, 200, 1008), 0), ((1, 136, 384), 0), ((37, 264, 144), 0),
                                          ((300, 256, 512), 12)])
def test_any_m_on_a_padded_scale_a(key, shape, ld_pad):
    """M not a multiple of 4 (one row, odd rows over several tiles) on scale_a's padded rows (NaN there), and a
    scale_a whose K blocks lie further apart than M: the builder lays scale_a out with the caller's stride."""
    error = run_blockwise(OPS[key], *shape, seed=sum(shape), ld_pad=ld_pad)
    assert error < TOLERANCES[OPS[key].C.element], f"{shape}: relative error {error:.3e}"


@pytest.mark.parametrize("key", ["e4m3_coop_bf16", "e4m3_pp_64x128_c2x1_f32", "e5m2e4m3_coop_c2x1_bf16cm"])
def test_blockwise_scales_with_alpha_and_beta(key):
    op = OPS[key]
    error = run_blockwise(op, 384, 256, 640, seed=7, alpha=0.75, beta=-1.25)
    assert error < TOLERANCES[op.C.element], f"relative error {error:.3e}"


def test_the_scales_are_applied_per_block():
    """Scaling one K block of A's row 0 by 2^10 changes exactly row 0 (a scale ignored or misplaced would not)."""
    op = OPS["e4m3_pp_64x128_c2x1_f32"]
    m, n, k = 64, 128, 384
    rng = np.random.default_rng(3)
    a = random_values(rng, (m, k), op.A.element)
    b = random_values(rng, (k, n), op.B.element)
    A, B = to_tensor(a, op.A.element, R, "torch"), to_tensor(b, op.B.element, CM, "torch")
    outs = []
    for boost in (1.0, 1024.0):
        sa = np.ones((m, 3), np.float32)
        sa[0, 1] = boost
        out = torch.full((m, n), float("nan"), dtype=torch.float32, device="cuda")
        args = cutlass.GemmArguments(op, GemmCoord(m, n, k), A, B, None, out, op.epilogue_type(1.0, 0.0),
                                     scale_a=torch.from_numpy(sa).cuda().t().contiguous().t(),
                                     scale_b=torch.ones(1, 3, device="cuda"))
        op.run(args)
        args.sync()
        outs.append(to_float64(out))
    expected_row0 = a[0, :128] @ b[:128] + 1024.0 * (a[0, 128:256] @ b[128:256]) + a[0, 256:] @ b[256:]
    assert relative_error(outs[1][0], expected_row0) < 1e-3
    np.testing.assert_array_equal(outs[0][1:], outs[1][1:])


def test_cubins_hold_real_kernels_and_no_traps():
    scan_cubins(list(OPS.values()))
