"""Explicit SM90 epilogue tiles (``TileDescription(..., epilogue_tile=(rows, columns))``) on the GPU against float64
references: the SM90 GEMM (every kernel schedule, f16/bf16/f32 outputs, both C layouts, explicit stage counts,
stream-K, fused bias and activations, fp8 and tf32 operands), the grouped GEMM (skewed MoE-like groups, groups with
M, N or K = 0, odd sizes, a per-group bias) and Array mode. Outputs are NaN-poisoned before each run."""
from __future__ import annotations

import pytest

from .conftest import precompile_module
from .gemm_cases import CM, D, R
from .test_gemm_array_sm90 import array90, run_array
from .test_gemm_grouped import mixed_problems, run_group
from .test_gemm_grouped_sm90 import _tol, grouped90, odd_problems
from .test_gemm_sm90 import KS, SIZES, TS, run_case, sm90_op, tma_aligned_size, torch

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(torch is None, reason="needs torch")]

GEMM_OPS = {
    "f16_coop_e128x64": sm90_op(D.float16, (R, CM, R), epilogue_tile=(128, 64)),
    "bf16_coop_128x256_c2x1_e128x128_nnn": sm90_op(D.bfloat16, (CM, CM, CM), tile=(128, 256, 64), cluster=(2, 1, 1),
                                                   epilogue_tile=(128, 128)),
    "f16_coop_256x128_f32out_e128x64_ttt": sm90_op(D.float16, (R, R, R), out=D.float32, tile=(256, 128, 64),
                                                   epilogue_tile=(128, 64)),
    "bf16_pp_gelu_biasrow_e64x128": sm90_op(D.bfloat16, (R, CM, R), tile=(64, 128, 64),
                                            kernel=KS.TmaWarpSpecializedPingpong, activation="gelu", bias="row",
                                            epilogue_tile=(64, 128)),
    "f16_ws_64x192_e64x64_ntn": sm90_op(D.float16, (CM, R, CM), tile=(64, 192, 64), kernel=KS.TmaWarpSpecialized,
                                        epilogue_tile=(64, 64)),
    "bf16_streamk_biascolumn_e128x128": sm90_op(D.bfloat16, (R, CM, R), scheduler=TS.StreamK, bias="column",
                                                epilogue_tile=(128, 128)),
    "f16_coop_128x256_s3_e128x64": sm90_op(D.float16, (R, CM, R), tile=(128, 256, 64), stages=3,
                                           epilogue_tile=(128, 64)),
    "e4m3_coop_bf16out_e128x64": sm90_op(D.float8_e4m3, (R, CM, R), out=D.bfloat16, tile=(128, 128, 128),
                                         epilogue_tile=(128, 64)),
    "tf32_pp_e64x64": sm90_op(D.tfloat32, (R, CM, R), out=D.float32, tile=(64, 128, 32),
                              kernel=KS.TmaWarpSpecializedPingpong, epilogue_tile=(64, 64)),
}
GROUPED_OPS = {
    # the MoE weight gradient's layouts (dY^T column-major, X row-major)
    "bf16_ntt_coop_128x256_c2x1_e128x64": grouped90(D.bfloat16, (CM, R, R), (128, 256, 64), (2, 1, 1),
                                                    epilogue_tile=(128, 64)),
    "f16_tnt_pp_f32out_e64x64": grouped90(D.float16, (R, CM, R), (64, 128, 64), kernel=KS.TmaWarpSpecializedPingpong,
                                          out=D.float32, epilogue_tile=(64, 64)),
    "bf16_tnn_coop_e128x128": grouped90(D.bfloat16, (R, CM, CM), epilogue_tile=(128, 128)),
    "f16_tnt_coop_e128x64_bias": grouped90(D.float16, (R, CM, R), epilogue_tile=(128, 64), bias="column"),
}
UNBIASED = sorted(name for name, op in GROUPED_OPS.items() if op.bias is None)
ARRAY_OPS = {
    "bf16_tnt_coop_128x256_e128x64": array90(D.bfloat16, (R, CM, R), (128, 256, 64), epilogue_tile=(128, 64)),
}


@pytest.fixture(scope="module", autouse=True)
def _compiled(memory_pool):
    precompile_module((), [*GEMM_OPS.values(), *GROUPED_OPS.values(), *ARRAY_OPS.values()])
    yield


@pytest.mark.parametrize("name", sorted(GEMM_OPS))
@pytest.mark.parametrize("size", SIZES + [(4096, 2048, 128)], ids=lambda s: "x".join(map(str, s)))
def test_gemm(name, size):
    op = GEMM_OPS[name]
    m, n, k = tma_aligned_size(op, *size)
    knobs = {"split_k_slices": 3, "decomposition": "split_k"} if op.tile_scheduler is TS.StreamK and m < 64 else {}
    run_case(op, m, n, k, bias=op.bias is not None, **knobs)


@pytest.mark.parametrize("name", UNBIASED)
def test_grouped_mixed_and_odd_sizes(name):
    op = GROUPED_OPS[name]
    run_group(op, mixed_problems(8), _tol(op))
    run_group(op, odd_problems(op, seed=4), _tol(op), alpha=0.75, beta=0.5, seed=4)


def test_grouped_weight_gradient_over_few_tokens():
    """dW_e = dY_e^T X_e with K = each expert's token count: skewed, some experts without tokens (beta * C)."""
    op = GROUPED_OPS["bf16_ntt_coop_128x256_c2x1_e128x64"]
    counts = [0, 48, 244, 8, 131, 0, 96, 17]
    run_group(op, [(256, 512, k) for k in counts], _tol(op), beta=0.0, seed=5)
    run_group(op, [(256, 512, k) for k in counts], _tol(op), beta=0.5, seed=6)


def test_grouped_per_group_bias():
    """D_g = alpha * A_g @ B_g + beta * C_g + bias_g through the 128x64 epilogue tile, with empty groups."""
    import numpy as np

    from pycutlass import GemmGroupedArguments
    from pycutlass.gemm import GemmCoord

    from .test_gemm_grouped import Group
    from .test_gemm_grouped_sm90 import _bias_values, _check_biased_group

    op = GROUPED_OPS["f16_tnt_coop_e128x64_bias"]
    problems = mixed_problems(8, count=10, seed=30)
    bias = _bias_values(np.random.default_rng(31), len(problems), max(n for _, n, _ in problems), op.C.element)
    full = torch.from_numpy(bias).to(torch.float16).cuda()
    group = Group(op, problems, seed=32)
    group.alpha, group.beta, group.used_c = 1.5, 0.5, group.Cs
    args = GemmGroupedArguments(op, [GemmCoord(*p) for p in problems], group.As, group.Bs, group.Cs, group.Ds,
                                op.epilogue_type(1.5, 0.5), bias=full)
    op.run(args)
    args.sync()
    _check_biased_group(op, group, bias, _tol(op))


@pytest.mark.parametrize("size", [(256, 512, 128, 4), (264, 136, 2056, 3)], ids=lambda s: "x".join(map(str, s)))
def test_array(size):
    run_array(ARRAY_OPS["bf16_tnt_coop_128x256_e128x64"], *size)
