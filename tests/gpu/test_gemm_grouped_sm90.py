"""SM90 (CUTLASS 3.x pointer-array) grouped GEMM on the GPU against per-group float64 references: f16/bf16 x
cooperative/ping-pong x clusters x layouts x epilogues (linear combination, activations, f32 output), random and odd
sizes, groups with M, N or K = 0, empty groups, 300 groups, beta = 0 without C, the runtime knobs, Params reused by
new groups of the same count, and the cubins' SASS. Outputs are NaN-poisoned before each run (conftest checks that
the allocator returns to its baseline after every test)."""
from __future__ import annotations

import numpy as np
import pytest

import pycutlass as cutlass
from pycutlass import EpilogueScheduleType as ES
from pycutlass import GemmGroupedArguments
from pycutlass import KernelScheduleType as KS
from pycutlass.gemm import GemmCoord

from .conftest import precompile_module
from .gemm_cases import CM, D, R
from .test_gemm_grouped import (Group, check_padded_leading_dimensions, check_reused_arguments, mixed_problems,
                                run_group)

pytestmark = pytest.mark.gpu


def grouped90(element, layouts, tile=(128, 128, 64), cluster=(1, 1, 1), kernel=KS.Auto, out=None, activation=None):
    """A GemmOperationGrouped(90, ...) with an SM90 tile (the pointer-array kernel)."""
    out = out or element
    math = cutlass.MathInstruction([64, tile[1], 16], element, element, D.float32, cutlass.OpClass.TensorOp)
    description = cutlass.TileDescription(list(tile), 0, None, math, cluster_shape=list(cluster),
                                          kernel_schedule=kernel, epilogue_schedule=ES.Auto)
    A = cutlass.TensorDescription(element, layouts[0], 8)
    B = cutlass.TensorDescription(element, layouts[1], 8)
    C = cutlass.TensorDescription(out, layouts[2], 128 // out.bits)
    if activation is None:
        functor = cutlass.LinearCombination(out, C.alignment, D.float32, D.float32)
    else:
        functor = cutlass.LinearCombinationGeneric(getattr(cutlass, activation)(D.float32), out, C.alignment,
                                                   D.float32, D.float32)
    return cutlass.GemmOperationGrouped(90, description, A, B, C, functor)


# Every layout of A and B, both C layouts, both schedules, three cluster shapes and three epilogues.
OPS = {
    "f16_tnt_coop": grouped90(D.float16, (R, CM, R)),
    "f16_ntn_pp_c2x1": grouped90(D.float16, (CM, R, CM), (64, 128, 64), (2, 1, 1), KS.TmaWarpSpecializedPingpong),
    "bf16_tnn_coop_128x256_c1x2_relu": grouped90(D.bfloat16, (R, CM, CM), (128, 256, 64), (1, 2, 1),
                                                 activation="relu"),
    "bf16_ttt_pp_f32out_gelu": grouped90(D.bfloat16, (R, R, R), (128, 128, 64), kernel=KS.TmaWarpSpecializedPingpong,
                                         out=D.float32, activation="gelu"),
    "f16_nnt_coop_256x128_leaky": grouped90(D.float16, (CM, CM, R), (256, 128, 64), activation="leaky_relu"),
    "bf16_tnt_pp_64x256_c2x1_silu": grouped90(D.bfloat16, (R, CM, R), (64, 256, 64), (2, 1, 1),
                                              KS.TmaWarpSpecializedPingpong, activation="silu"),
}
TOLERANCES = {D.float16: 5e-3, D.bfloat16: 2e-2, D.float32: 1e-3}


@pytest.fixture(scope="module", autouse=True)
def compiled(memory_pool):
    precompile_module((), OPS.values())
    yield


def _tol(op) -> float:
    return TOLERANCES[op.C.element] if op.C.element is not D.float32 else TOLERANCES[op.A.element]


def odd_problems(op, count=10, seed=0):
    """Sizes that are odd wherever the layouts allow it: TMA needs only each operand's contiguous extent aligned."""
    rng = np.random.default_rng(seed)
    odd_m = op.A.layout is R and op.C.layout is R
    odd_n = op.B.layout is CM and op.C.layout is CM
    odd_k = op.A.layout is CM and op.B.layout is R

    def extent(odd, top):
        value = int(rng.integers(1, top))
        return value if odd else -(-value // 8) * 8

    return [(extent(odd_m, 700), extent(odd_n, 700), extent(odd_k, 1100)) for _ in range(count)] + \
        [(extent(odd_m, 4), extent(odd_n, 4), extent(odd_k, 4))]


def _check_launch(op, args):
    assert args.tile_count == op.tile_count(args.problem_sizes)
    assert 0 < args.threadblock_count <= args.sm_count  # one persistent wave, one tensormap slot per CTA
    assert args.workspace_bytes == op.workspace_bytes(args.sm_count)


# --- tests -----------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("key", list(OPS))
def test_mixed_sizes_with_empty_groups(key):
    """Random multiples of 8 with K sometimes 0, then M = 0, N = 0, K = 0, tiny and tall-thin groups."""
    op = OPS[key]
    _, args = run_group(op, mixed_problems(8), _tol(op))
    _check_launch(op, args)


@pytest.mark.parametrize("key", list(OPS))
def test_odd_sizes(key):
    op = OPS[key]
    _, args = run_group(op, odd_problems(op, seed=1), _tol(op), alpha=0.75, beta=0.5, seed=1)
    _check_launch(op, args)


@pytest.mark.parametrize("key", ["f16_tnt_coop", "f16_ntn_pp_c2x1", "bf16_tnn_coop_128x256_c1x2_relu"])
def test_zero_sized_groups(key):
    """M, N or K = 0 in the first, middle and last places: K = 0 writes epilogue(beta * C)."""
    op = OPS[key]
    problems = [(0, 64, 64), (128, 0, 64), (136, 72, 0), (64, 64, 64), (0, 0, 0), (200, 328, 0), (8, 8, 0)]
    run_group(op, problems, _tol(op), seed=2)
    run_group(op, problems[::-1], _tol(op), seed=3, beta=0.0)


@pytest.mark.parametrize("problems", [[], [(0, 64, 64)], [(0, 64, 64), (64, 0, 32), (0, 0, 0)]],
                         ids=["no-group", "one-empty", "all-empty"])
def test_empty_group_launches_nothing(problems):
    op = OPS["f16_tnt_coop"]
    group = Group(op, problems)
    args = group.arguments()
    op.run(args)
    args.sync()
    assert args.tile_count == 0 and args.threadblock_count == 0 and args.workspace == 0
    group.check(_tol(op))


@pytest.mark.parametrize("key", ["f16_tnt_coop", "bf16_ttt_pp_f32out_gelu"])
def test_many_groups(key):
    """300 groups: the scheduler's warp-wide scan walks them 32 at a time."""
    op = OPS[key]
    rng = np.random.default_rng(4)
    problems = [(int(m) * 8, int(n) * 8, int(k) * 8) for m, n, k in
                zip(rng.integers(0, 24, 300), rng.integers(1, 24, 300), rng.integers(0, 24, 300))]
    run_group(op, problems, _tol(op), seed=4)


@pytest.mark.parametrize("key", list(OPS))
def test_beta_zero_without_c(key):
    """Cs=None: C aliases D, which is NaN-poisoned, so any read of C would show."""
    op = OPS[key]
    run_group(op, mixed_problems(8, count=10, seed=5), _tol(op), with_c=False, seed=5, alpha=1.5, beta=0.0, Cs=None)


def test_skewed_moe_routing():
    """Experts with very different token counts (many empty), N and K shared, as in a mixture-of-experts layer."""
    op = OPS["bf16_tnt_pp_64x256_c2x1_silu"]
    rng = np.random.default_rng(6)
    tokens = (rng.zipf(1.5, 32) % 900).astype(int)
    tokens[rng.integers(0, 32, 8)] = 0
    run_group(op, [(int(t), 512, 384) for t in tokens], _tol(op), seed=6, beta=0.0)


@pytest.mark.parametrize("knobs", [dict(raster_order="along_n"), dict(swizzle=2), dict(swizzle=8, sm_count=16),
                                   dict(raster_order="heuristic", sm_count=6), dict(sm_count=2)])
@pytest.mark.parametrize("key", ["f16_tnt_coop", "f16_ntn_pp_c2x1"])
def test_runtime_knobs(key, knobs):
    op = OPS[key]
    group = Group(op, mixed_problems(8, count=12, seed=7), seed=7)
    group.alpha, group.beta, group.used_c = 1.25, -0.5, group.Cs
    args = GemmGroupedArguments(op, [GemmCoord(*p) for p in group.problems], group.As, group.Bs, group.Cs, group.Ds,
                                op.epilogue_type(1.25, -0.5, *((0.2,) if op.epilogue_functor.num_activation_args
                                                               else ())), **knobs)
    op.run(args)
    args.sync()
    group.check(_tol(op))
    if "sm_count" in knobs:
        assert args.threadblock_count <= knobs["sm_count"]


def test_new_groups_of_the_same_count_reuse_params():
    """The sizes live on the device only, so Params depend on the group count: no builder runs for new sizes."""
    op = OPS["f16_tnt_coop"]
    _, first = run_group(op, mixed_problems(8, count=6, seed=8), _tol(op), seed=8)
    loaded = first._loaded_op
    launches = loaded.builder_launches
    for seed in (9, 10):
        run_group(op, mixed_problems(8, count=6, seed=seed), _tol(op), seed=seed)  # 11 groups each, other sizes
    assert loaded.builder_launches == launches or loaded.verifying


def test_reused_arguments_read_new_inputs():
    op = OPS["f16_ntn_pp_c2x1"]
    check_reused_arguments(op, mixed_problems(8, count=8, seed=11), _tol(op), seed=11)


@pytest.mark.parametrize("lib", ["numpy", "torch_cpu"])
def test_host_inputs(lib):
    """Host arrays are copied in; sync() copies every D back (row- and column-major)."""
    for key in ("f16_tnt_coop", "f16_ntn_pp_c2x1"):
        op = OPS[key]
        run_group(op, mixed_problems(8, count=6, seed=12), _tol(op), lib=lib, seed=12)


def test_padded_leading_dimensions():
    op = OPS["bf16_tnn_coop_128x256_c1x2_relu"]
    check_padded_leading_dimensions(op, mixed_problems(8, count=8, seed=13), _tol(op), seed=13, unit=8)


def test_bad_inputs_are_rejected_before_launch():
    import torch

    op = OPS["f16_tnt_coop"]
    group = Group(op, [(64, 64, 64)] * 3)
    base = torch.zeros(64 * 64 + 1, dtype=torch.float16, device="cuda")
    As = list(group.As)
    As[1] = base[1:].view(64, 64)  # 2-byte offset: TMA needs 16-byte aligned addresses
    with pytest.raises(cutlass.ArgumentError, match=r"As\[1\] \(problem 1, operand A\): address"):
        GemmGroupedArguments(op, group.problems, As, group.Bs, group.Cs, group.Ds, op.epilogue_type(1.0, 1.0))
    with pytest.raises(cutlass.ArgumentError, match="C broadcast"):
        GemmGroupedArguments(op, group.problems, group.As, group.Bs,
                             [torch.zeros(64, dtype=torch.float16, device="cuda")] * 3, group.Ds,
                             op.epilogue_type(1.0, 1.0))


def test_cubins_hold_real_kernels_and_no_traps():
    """Scan the SASS: no trap (NVRTC without native __int128, or tensormap.replace compiled out), and each kernel has
    a warpgroup MMA and a TMA load."""
    import shutil
    import subprocess
    import tempfile

    cuobjdump = shutil.which("cuobjdump")
    if cuobjdump is None:
        pytest.skip("cuobjdump (CUDA toolkit) is not on PATH")
    for op in OPS.values():
        kernel = cutlass.compiler.add_module([op])[0]
        with tempfile.NamedTemporaryFile(suffix=".cubin") as handle:
            handle.write(kernel.binary)
            handle.flush()
            sass = subprocess.run([cuobjdump, "-sass", handle.name], capture_output=True, text=True).stdout
        assert "BPT" not in sass, f"trap instruction in the SASS of {op.name}"
        body = next((f for f in sass.split("Function : ")[1:] if f.startswith(op.name + "\n")
                     or f.startswith(op.name + " ")), "")
        assert "GMMA" in body, f"{op.name}: no warpgroup MMA in its kernel"
        assert "UTMALDG" in body, f"{op.name}: no TMA load in its kernel"
