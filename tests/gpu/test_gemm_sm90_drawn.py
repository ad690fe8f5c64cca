"""SM90 GEMMs drawn at random from what ``GemmOperationUniversal(90, ...)`` accepts (seeded, so every run draws the
same ones): operand and output types, accumulators, layouts, tiles, clusters, kernel and epilogue schedules, tile
schedulers, explicit stages, activations, bias vectors, the clamp. Descriptions the rules refuse are drawn again; every
accepted one must compile and match float64 on drawn problems (batched ones included), outputs poisoned first."""
from __future__ import annotations

import random

import pytest

from pycutlass import EpilogueScheduleType as ES
from pycutlass import KernelScheduleType as KS
from pycutlass import TileSchedulerType as TS

from .conftest import draw_accepted, precompile_module
from .test_gemm_sm90 import CM, ACTIVATIONS, D, R, run_case, sm90_op

pytestmark = pytest.mark.gpu

ELEMENTS = (D.float16, D.bfloat16, D.tfloat32, D.float8_e4m3, D.float8_e5m2, D.int8)
OUTPUTS = (D.float16, D.bfloat16, D.float32, D.int8, D.int32)


def _drawn_op(rng: random.Random):
    element = rng.choice(ELEMENTS)
    element_b = rng.choice((D.float8_e4m3, D.float8_e5m2)) if element.is_fp8 else element
    bits = {16: 64, 32: 32, 8: 128}[element.bits]  # tile K: the 128-byte swizzle atom
    integer = element is D.int8
    out = rng.choice((D.int8, D.int32) if integer else (D.float16, D.bfloat16, D.float32))
    clamp = integer and rng.random() < 0.5 and rng.choice((True, "fast"))
    return sm90_op(element, tuple(rng.choice((R, CM)) for _ in range(3)), out=out,
                   acc=D.float16 if element is D.float16 and rng.random() < 0.2 else None,
                   tile=(rng.choice((64, 128, 256)), rng.choice((64, 128, 256)), bits),
                   cluster=rng.choice(((1, 1, 1), (2, 1, 1), (1, 2, 1), (2, 2, 1))),
                   kernel=rng.choice(list(KS)), epilogue_schedule=rng.choice(list(ES)),
                   scheduler=rng.choice((TS.Default, TS.Default, TS.StreamK)),
                   stages=rng.choice((0, 0, 0, 3, 4, 5)),
                   activation=None if integer or rng.random() < 0.4 else rng.choice(ACTIVATIONS),
                   bias=rng.choice((None, None, "row", "column")), element_b=element_b, clamp=clamp)


DRAWN = draw_accepted(random.Random(9090), _drawn_op, 16, tries=4000)


@pytest.fixture(scope="module", autouse=True)
def _compiled():
    precompile_module((), DRAWN.values())


def test_the_draw_found_enough_accepted_configurations():
    assert len(DRAWN) == 16


@pytest.mark.parametrize("name", list(DRAWN))
def test_drawn_gemms_against_float64(name):
    op = DRAWN[name]
    rng = random.Random(name)
    step = 16  # every extent a multiple of 16 elements: TMA's 16-byte rows for every operand type here
    args = (0.1,) if op.epilogue_functor.activation and op.epilogue_functor.num_activation_args else ()
    for attempt in range(2):
        m, n, k = (step * rng.randint(1, 40) for _ in range(3))
        batch = rng.choice((1, 1, 3))
        run_case(op, m, n, k, batch=batch, seed=attempt, bias=op.bias is not None, activation_args=args,
                 use_c=rng.random() < 0.7)
