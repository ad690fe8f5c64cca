"""fp8 scales on configurations drawn at random from what the descriptions accept (seeded, so every run draws the
same ones): block-wise scaled GEMMs (operand types, outputs, tiles, schedules, clusters, activations, C layouts) and
row-wise scaled grouped GEMMs (16-bit and fp8 operands, layouts, tiles, schedules, clusters, activations), each
checked against float64 on two problems. An accepted description that does not compile or computes wrongly fails."""
from __future__ import annotations

import random

import pytest

from pycutlass import KernelScheduleType as KS

from .conftest import draw_accepted, precompile_module
from .gemm_cases import CM, D, R
from .test_gemm_grouped import mixed_problems
from .test_gemm_grouped_sm90_fp8 import fp8_grouped, run_rowwise
from .test_gemm_sm90_blockwise import TOLERANCES, blockwise_op, run_blockwise

pytestmark = pytest.mark.gpu

ACTIVATIONS = (None, "relu", "leaky_relu", "gelu", "silu", "sigmoid", "tanh", "hardswish")
CLUSTERS = ((1, 1, 1), (2, 1, 1), (1, 2, 1))
SCHEDULES = {64: (KS.Auto, KS.TmaWarpSpecializedPingpong), 128: (KS.Auto, KS.TmaWarpSpecializedCooperative,
                                                                  KS.TmaWarpSpecializedPingpong),
             256: (KS.Auto, KS.TmaWarpSpecializedCooperative)}


def _blockwise(rng):
    tile_m = rng.choice((64, 128, 256))
    return blockwise_op(a=rng.choice((D.float8_e4m3, D.float8_e5m2)), b=rng.choice((D.float8_e4m3, D.float8_e5m2)),
                        out=rng.choice((D.float16, D.bfloat16, D.float32)), tile=(tile_m, 128, 128),
                        cluster=rng.choice(CLUSTERS), kernel=rng.choice(SCHEDULES[tile_m]),
                        activation=rng.choice(ACTIVATIONS), c_layout=rng.choice((R, CM)))


def _rowwise(rng):
    a, b = rng.choice(((D.float16, D.float16), (D.bfloat16, D.bfloat16), (D.float8_e4m3, D.float8_e4m3),
                       (D.float8_e4m3, D.float8_e5m2), (D.float8_e5m2, D.float8_e4m3)))
    fp8 = a.bits == 8
    layouts = (R, CM) if fp8 else (rng.choice((R, CM)), rng.choice((R, CM)))
    out = rng.choice((D.float16, D.bfloat16, D.float32)) if fp8 else rng.choice((a, D.float32))
    tile_m = rng.choice((64, 128, 256))
    return fp8_grouped(a, b, (*layouts, rng.choice((R, CM))), (tile_m, rng.choice((64, 128, 256)), 128 if fp8 else 64),
                       rng.choice(CLUSTERS), rng.choice(SCHEDULES[tile_m]), out, rng.choice(ACTIVATIONS),
                       scales="rowwise")


BLOCKWISE = draw_accepted(random.Random(90), _blockwise, 8)
ROWWISE = draw_accepted(random.Random(91), _rowwise, 10)


@pytest.fixture(scope="module", autouse=True)
def compiled(memory_pool):
    precompile_module((), [*BLOCKWISE.values(), *ROWWISE.values()])
    yield


def test_the_draws_found_enough_accepted_configurations():
    assert len(BLOCKWISE) == 8 and len(ROWWISE) == 10


@pytest.mark.parametrize("name", list(BLOCKWISE))
def test_drawn_blockwise_scaled_gemms_against_float64(name):
    op = BLOCKWISE[name]
    rng = random.Random(name)
    for attempt in range(2):
        m = 8 * rng.randint(1, 96)
        n, k = 8 * rng.randint(1, 80), 16 * rng.randint(1, 90)
        error = run_blockwise(op, m, n, k, seed=attempt, alpha=rng.uniform(0.5, 2.0),
                              beta=rng.choice((0.0, -0.5, 1.0)))
        assert error < TOLERANCES[op.C.element], f"{op.describe()} on {(m, n, k)}: relative error {error:.3e}"


@pytest.mark.parametrize("name", list(ROWWISE))
def test_drawn_rowwise_scaled_grouped_gemms_against_float64(name):
    op = ROWWISE[name]
    for seed, form in ((3, "packed"), (4, "lists")):
        run_rowwise(op, form, mixed_problems(16, count=8, seed=seed), seed=seed)
