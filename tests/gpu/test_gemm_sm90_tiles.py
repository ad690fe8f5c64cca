"""SM90 GEMM tile widths N = 32 and 192 on the GPU against float64 references: every kernel schedule, 16-bit, tf32,
fp8 and int8 operands, all-layout mixes, clusters, stream-K split-K and fused bias + activation epilogues, at the odd
sizes of the main SM90 suite plus the decode shapes the narrow tile is for. Outputs are NaN-poisoned."""
from __future__ import annotations

import pytest

from .conftest import precompile_module
from .test_gemm_sm90 import (
    CM,
    KS,
    SIZES,
    TS,
    D,
    R,
    run_case,
    sm90_op,
    tma_aligned_size,
    torch,
)

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(torch is None, reason="needs torch")]

# Tile N 32 (decode shapes: more CTAs streaming B) and 192 (3000-wide outputs in one wave) across schedules, types,
# layouts, clusters, stream-K and fused epilogues.
TILE_N_OPS = {
    "f16_64x32_ws": sm90_op(D.float16, (R, CM, R), tile=(64, 32, 64), kernel=KS.TmaWarpSpecialized),
    "bf16_64x32_pp_gelu_biasrow_nnn": sm90_op(D.bfloat16, (CM, CM, CM), tile=(64, 32, 64),
                                              kernel=KS.TmaWarpSpecializedPingpong, activation="gelu", bias="row"),
    "f16_128x32_coop_c1x2_ttt": sm90_op(D.float16, (R, R, R), tile=(128, 32, 64), cluster=(1, 2, 1)),
    "bf16_128x32_streamk_biascolumn": sm90_op(D.bfloat16, (R, CM, R), tile=(128, 32, 64), scheduler=TS.StreamK,
                                              bias="column"),
    "f16_128x192_coop_c2x1": sm90_op(D.float16, (R, CM, R), tile=(128, 192, 64), cluster=(2, 1, 1)),
    "bf16_64x192_pp_silu_ntn": sm90_op(D.bfloat16, (CM, R, CM), tile=(64, 192, 64),
                                       kernel=KS.TmaWarpSpecializedPingpong, activation="silu"),
    "f16_256x192_coop_acc16": sm90_op(D.float16, (R, CM, CM), acc=D.float16, tile=(256, 192, 64)),
    "e4m3_64x32_ws_fa_bf16out": sm90_op(D.float8_e4m3, (R, CM, R), out=D.bfloat16, tile=(64, 32, 128),
                                        kernel=KS.TmaWarpSpecializedFP8FastAccum),
    "s8_128x192_coop_s8out": sm90_op(D.int8, (R, CM, R), out=D.int8, tile=(128, 192, 128)),
    "tf32_64x32_ws": sm90_op(D.tfloat32, (R, CM, R), out=D.float32, tile=(64, 32, 32), kernel=KS.TmaWarpSpecialized),
}


@pytest.fixture(scope="module", autouse=True)
def _compiled():
    precompile_module((), TILE_N_OPS.values())


@pytest.mark.parametrize("name", sorted(TILE_N_OPS))
@pytest.mark.parametrize("size", SIZES + [(16, 4096, 4096), (128, 4096, 1032)], ids=lambda s: "x".join(map(str, s)))
def test_tile_widths(name, size):
    op = TILE_N_OPS[name]
    m, n, k = tma_aligned_size(op, *size)
    knobs = {"split_k_slices": 3, "decomposition": "split_k"} if op.tile_scheduler is TS.StreamK and m < 64 else {}
    run_case(op, m, n, k, bias=op.bias is not None, **knobs)
