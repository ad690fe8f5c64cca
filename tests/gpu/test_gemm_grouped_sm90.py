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

from .conftest import precompile_module, relative_error, scan_cubins
from .gemm_cases import CM, D, R
from .test_gemm_grouped import (Group, _activation_args, check_padded_leading_dimensions, check_reused_arguments,
                                mixed_problems, run_group)

pytestmark = pytest.mark.gpu


def grouped90(element, layouts, tile=(128, 128, 64), cluster=(1, 1, 1), kernel=KS.Auto, out=None, activation=None,
              bias=None, clamp=False, epilogue_tile=None):
    """A GemmOperationGrouped(90, ...) with an SM90 tile (the pointer-array kernel)."""
    parts = ptr_array_parts(element, layouts, tile, cluster, kernel, out, activation, clamp, epilogue_tile)
    return cutlass.GemmOperationGrouped(90, *parts, bias=bias)


def ptr_array_parts(element, layouts, tile, cluster, kernel, out, activation, clamp, epilogue_tile=None):
    """(tile description, A, B, C, epilogue) of an SM90 pointer-array operation (grouped, or Array-mode GEMM)."""
    out = out or element
    math = cutlass.MathInstruction([64, tile[1], 16], element, element, D.float32, cutlass.OpClass.TensorOp)
    description = cutlass.TileDescription(list(tile), 0, None, math, cluster_shape=list(cluster),
                                          kernel_schedule=kernel, epilogue_schedule=ES.Auto,
                                          epilogue_tile=epilogue_tile)
    A = cutlass.TensorDescription(element, layouts[0], 8)
    B = cutlass.TensorDescription(element, layouts[1], 8)
    C = cutlass.TensorDescription(out, layouts[2], 128 // out.bits)
    if clamp:
        functor = cutlass.LinearCombinationClamp(out, C.alignment, D.float32, D.float32)
    elif activation is None:
        functor = cutlass.LinearCombination(out, C.alignment, D.float32, D.float32)
    else:
        functor = cutlass.LinearCombinationGeneric(getattr(cutlass, activation)(D.float32), out, C.alignment,
                                                   D.float32, D.float32)
    return description, A, B, C, functor


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
    # tile N 192: partial N tiles in every odd problem, 192 float32 accumulators per thread at 256x192
    "bf16_tnt_coop_256x192_c1x2": grouped90(D.bfloat16, (R, CM, R), (256, 192, 64), (1, 2, 1)),
    "f16_ntn_coop_128x192_c2x1_relu": grouped90(D.float16, (CM, R, CM), (128, 192, 64), (2, 1, 1),
                                                activation="relu"),
    "bf16_ttt_pp_64x192_f32out": grouped90(D.bfloat16, (R, R, R), (64, 192, 64), kernel=KS.TmaWarpSpecializedPingpong,
                                           out=D.float32),
}
# Per-group bias (N values per group, bias="column"): a CUTLASS EVT over the pointer-array epilogue.
BIAS_OPS = {
    "f16_tnt_coop_bias": grouped90(D.float16, (R, CM, R), bias="column"),
    "bf16_tnt_pp_c2x1_gelu_bias": grouped90(D.bfloat16, (R, CM, R), (128, 128, 64), (2, 1, 1),
                                            KS.TmaWarpSpecializedPingpong, activation="gelu", bias="column"),
    "bf16_tnn_coop_f32out_leaky_bias": grouped90(D.bfloat16, (R, CM, CM), (128, 256, 64), out=D.float32,
                                                 activation="leaky_relu", bias="column"),
    "f16_tnt_pp_64x192_c1x2_bias": grouped90(D.float16, (R, CM, R), (64, 192, 64), (1, 2, 1),
                                             KS.TmaWarpSpecializedPingpong, bias="column"),
}
# LinearCombinationClamp (CUTLASS's LinCombEltAct<Clamp>, as for array=True); not built with bias="column".
CLAMP_OPS = {
    "f16_tnt_coop_clamp": grouped90(D.float16, (R, CM, R), clamp=True),
}
TOLERANCES = {D.float16: 5e-3, D.bfloat16: 2e-2, D.float32: 1e-3}


@pytest.fixture(scope="module", autouse=True)
def compiled(memory_pool):
    precompile_module((), [*OPS.values(), *BIAS_OPS.values(), *CLAMP_OPS.values()])
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
    scan_cubins([*OPS.values(), *BIAS_OPS.values(), *CLAMP_OPS.values()])


# --- per-group bias --------------------------------------------------------------------------------------------
def _bias_values(rng, groups, width, element):
    from .gemm_cases import random_values

    return random_values(rng, (groups, width), element)


def _check_biased_group(op, group, bias, tol):
    """Group.check with bias_g added before the activation."""
    from .gemm_cases import epilogue_reference, to_float64

    failures = []
    args = _activation_args(op)
    for index, ((m, n, k), a, b, c, Dt) in enumerate(zip(group.problems, group.a, group.b, group.c, group.Ds)):
        if m == 0 or n == 0:
            continue
        read_c = group.used_c is not None and group.beta != 0
        accumulator = group.alpha * (a @ b) + bias[index][:n][None, :]  # alpha * AB + bias == alpha * (AB + bias/alpha)
        reference = epilogue_reference(op, accumulator, c if read_c else None, 1.0, group.beta if read_c else 0.0,
                                       args)
        error = relative_error(to_float64(Dt), reference)
        if not error < tol:
            failures.append(f"group {index} {(m, n, k)}: relative error {error:.3e}")
    assert not failures, "\n".join(failures[:20])


@pytest.mark.parametrize("form", ["list", "matrix"])
@pytest.mark.parametrize("key", list(BIAS_OPS))
def test_bias_per_group(key, form):
    """D_g = act(alpha * A_g @ B_g + beta * C_g + bias_g), with M, N or K = 0 groups; bias as a list of vectors or
    one (groups, max N) tensor."""
    import torch

    op = BIAS_OPS[key]
    problems = mixed_problems(8, count=10, seed=20)
    rng = np.random.default_rng(21)
    width = max(n for _, n, _ in problems)
    bias = _bias_values(rng, len(problems), width, op.C.element)
    dtype = {D.float16: torch.float16, D.bfloat16: torch.bfloat16, D.float32: torch.float32}[op.C.element]
    full = torch.from_numpy(bias).to(dtype).cuda()
    vectors = full if form == "matrix" else [full[g, :n].clone() for g, (_, n, _) in enumerate(problems)]
    for beta, with_c in ((0.5, True), (0.0, False)):
        group = Group(op, problems, with_c=with_c, seed=22)
        group.alpha, group.beta, group.used_c = 1.5, beta, group.Cs
        args = GemmGroupedArguments(op, [GemmCoord(*p) for p in problems], group.As, group.Bs, group.Cs, group.Ds,
                                    op.epilogue_type(1.5, beta, *_activation_args(op)), bias=vectors)
        op.run(args)
        args.sync()
        _check_biased_group(op, group, bias, _tol(op))


def test_bias_is_required_by_biased_operations():
    op = BIAS_OPS["f16_tnt_coop_bias"]
    group = Group(op, [(64, 64, 64)])
    with pytest.raises(cutlass.ArgumentError, match="pass them as bias="):
        GemmGroupedArguments(op, group.problems, group.As, group.Bs, group.Cs, group.Ds)


# --- the clamp -------------------------------------------------------------------------------------------------
def test_clamp_to_the_output_range():
    """LinearCombinationClamp: +-inf in C and products beyond float16's range become +-65504 (also in a K = 0 group,
    D = clamp(beta * C)); everything else as a linear combination."""
    from .gemm_cases import to_float64

    op = CLAMP_OPS["f16_tnt_coop_clamp"]
    limit = 65504.0
    problems = [(136, 72, 64), (64, 200, 0), (0, 64, 64), (264, 136, 520), (8, 8, 8)]
    group = Group(op, problems, seed=30)
    for (m, n, _), c, Ct in zip(problems, group.c, group.Cs):
        if m and n:
            for (i, j), value in (((0, 0), float("inf")), ((m - 1, n - 1), float("-inf"))):
                c[i, j] = value
                Ct[i, j] = value
    alpha, beta = 3000.0, 1.0  # |alpha * A @ B| often beyond 65504
    args = group.arguments(alpha=alpha, beta=beta)
    op.run(args)
    args.sync()
    for index, ((m, n, k), a, b, c, Dt) in enumerate(zip(problems, group.a, group.b, group.c, group.Ds)):
        got = to_float64(Dt)
        if m == 0 or n == 0:
            continue
        reference = alpha * (a @ b) + beta * c
        saturated = np.abs(reference) >= limit * 1.001
        assert saturated[0, 0] and saturated[m - 1, n - 1]
        assert np.array_equal(got[saturated], np.sign(reference[saturated]) * limit), \
            f"problem {index}: values beyond the range must be clamped"
        rest = ~saturated
        error = relative_error(got[rest], np.clip(reference[rest], -limit, limit))
        assert error < _tol(op), f"problem {index} {(m, n, k)}: relative error {error:.3e}"


# --- device-side sizes -----------------------------------------------------------------------------------------
class Packed:
    """The MoE layout: one packed A (rows x K), B as (groups, K, N), one packed C and D (rows x N), optional bias
    (groups, N); float64 values kept for the references. D sits inside a NaN guard band to catch stray writes."""

    GUARD = 16  # rows

    def __init__(self, op, groups, rows, n, k, seed=0, with_c=True, bias=False):
        import torch

        from .gemm_cases import random_values, to_tensor

        rng = np.random.default_rng(seed)
        storage, out = op.A.element, op.C.element
        self.op, self.groups, self.rows, self.n, self.k = op, groups, rows, n, k
        self.a = random_values(rng, (rows, k), storage)
        self.b = random_values(rng, (groups, k, n), op.B.element)
        self.c = random_values(rng, (rows, n), out) if with_c else None
        self.bias = random_values(rng, (groups, n), out) if bias else None
        self.A = to_tensor(self.a, storage, R, "torch")
        self.B = to_tensor(self.b, op.B.element, op.B.layout, "torch")
        self.C = to_tensor(self.c, out, R, "torch") if with_c else None
        self.Bias = to_tensor(self.bias, out, R, "torch") if bias else None
        dtype = {D.float16: torch.float16, D.bfloat16: torch.bfloat16, D.float32: torch.float32}[out]
        self.guarded = torch.full((rows + 2 * self.GUARD, n), float("nan"), dtype=dtype, device="cuda")
        self.D = self.guarded[self.GUARD:self.GUARD + rows]

    def poison(self):
        self.guarded.fill_(float("nan"))

    def arguments(self, sizes, alpha=1.25, beta=-0.5, group_alpha=None, **kwargs):
        """``group_alpha``: per-group alphas (``alpha=``), read again by ``check``; they replace the scalar."""
        op = self.op
        self.alpha, self.beta = alpha, beta if self.C is not None else 0.0
        self.group_alpha = group_alpha
        if group_alpha is not None:
            kwargs["alpha"] = group_alpha
        return GemmGroupedArguments(op, sizes, self.A, self.B, self.C, self.D,
                                    op.epilogue_type(alpha, self.beta, *_activation_args(op)),
                                    bias=self.Bias, **kwargs)

    def clamped(self, sizes):
        """What the sizes kernel does to (M, N, K) rows (or M only): each group's first row and its clamped size."""
        sizes = np.asarray(sizes, dtype=np.int64).reshape(self.groups, -1)
        row, out = 0, []
        for size in sizes:
            m, n, k = (int(size[0]), self.n, self.k) if len(size) == 1 else map(int, size)
            m, n, k = max(m, 0), max(n, 0), max(k, 0)
            first = min(row, self.rows)
            row += m
            m, n, k = min(m, self.rows - first), min(n, self.n), min(k, self.k)
            if n % self.op.C.alignment or k % self.op.A.alignment:
                m = 0
            out.append((first, m, n, k))
        return out

    def check(self, sizes, tol):
        """Every group's rows against float64; every other element of D and the guard bands still NaN."""
        from .gemm_cases import epilogue_reference, to_float64

        got = self.guarded.double().cpu().numpy()
        written = np.zeros(got.shape, dtype=bool)
        failures = []
        alphas = [self.alpha] * self.groups if getattr(self, "group_alpha", None) is None else \
            to_float64(self.group_alpha).reshape(-1)
        for g, (first, m, n, k) in enumerate(self.clamped(sizes)):
            if m == 0 or n == 0:
                continue
            rows = slice(self.GUARD + first, self.GUARD + first + m)
            written[rows, :n] = True
            accumulator = self.a[first:first + m, :k] @ self.b[g, :k, :n]
            accumulator = alphas[g] * accumulator + (self.bias[g, :n][None, :] if self.bias is not None else 0.0)
            c = self.c[first:first + m, :n] if self.c is not None and self.beta != 0 else None
            reference = epilogue_reference(self.op, accumulator, c, 1.0, self.beta if c is not None else 0.0,
                                           _activation_args(self.op))
            error = relative_error(got[rows, :n], reference)
            if not error < tol:
                failures.append(f"group {g} rows {first}..{first + m} (N {n}, K {k}): relative error {error:.3e}")
        assert np.isnan(got[~written]).all(), "the kernel wrote outside the groups' rows and columns"
        assert not failures, "\n".join(failures[:20])


def _device_sizes(values):
    import torch

    return torch.tensor(np.asarray(values, dtype=np.int32), dtype=torch.int32, device="cuda")


def _counts(rng, groups, rows, empty=3):
    """Skewed M per group summing to at most ``rows``, some groups empty."""
    weights = rng.lognormal(0.0, 1.0, groups)
    weights[rng.choice(groups, empty, replace=False)] = 0.0
    return rng.multinomial(int(rows * 0.9), weights / weights.sum()).astype(np.int32)


DEVICE_KEYS = ["f16_tnt_coop", "bf16_tnt_pp_64x256_c2x1_silu"]


@pytest.mark.parametrize("key", DEVICE_KEYS + ["bf16_tnt_pp_c2x1_gelu_bias"])
def test_device_sizes_match_the_packed_reference(key):
    """(groups, 3) sizes on the device, skewed M with empty groups, then M only ((groups,)), with and without C."""
    op = {**OPS, **BIAS_OPS}[key]
    rng = np.random.default_rng(30)
    groups, rows, n, k = 24, 1500, 200, 136
    for with_c, columns in ((True, 3), (False, 1)):
        packed = Packed(op, groups, rows, n, k, seed=31, with_c=with_c, bias=op.bias is not None)
        counts = _counts(rng, groups, rows)
        values = np.stack([counts, np.full(groups, n), np.full(groups, k)], 1) if columns == 3 else counts
        args = packed.arguments(_device_sizes(values))
        assert args.device_sizes and args.tile_count is None
        op.run(args)
        args.sync()
        packed.check(values, _tol(op))
        assert args.size_flags() == 0
        assert 0 < args.threadblock_count <= args.sm_count


@pytest.mark.parametrize("groups", [1, 33, 300, 1100])
def test_device_sizes_at_every_width_of_the_sizes_kernel(groups):
    """The sizes kernel's block is as wide as the groups (a warp, a power of two, 1024 threads that take several
    groups each): every group's rows land where the packed reference puts them."""
    op = OPS["f16_tnt_coop"]
    rng = np.random.default_rng(70 + groups)
    rows = 3000
    packed = Packed(op, groups, rows, 64, 64, seed=71)
    counts = _counts(rng, groups, rows, empty=min(3, groups - 1))
    assert op.sizes_block(groups) == {1: 32, 33: 64, 300: 512, 1100: 1024}[groups]
    args = packed.arguments(_device_sizes(counts))
    op.run(args)
    args.sync()
    packed.check(counts, _tol(op))
    assert args.size_flags() == 0


@pytest.mark.parametrize("key", ["f16_tnt_coop", "bf16_tnt_pp_c2x1_gelu_bias"])
def test_device_sizes_per_group_n_and_k_with_zero_sized_groups(key):
    """N_g <= N and K_g <= K per group, K = 0 (D = act(beta * C + bias)), M = 0 and N = 0 groups, one B list."""
    op = {**OPS, **BIAS_OPS}[key]
    groups, rows, n, k = 8, 700, 264, 192
    packed = Packed(op, groups, rows, n, k, seed=32, bias=op.bias is not None)
    values = [(100, 264, 192), (0, 264, 192), (64, 0, 192), (90, 128, 0), (33, 8, 8), (200, 256, 64), (0, 0, 0),
              (150, 264, 192)]
    args = packed.arguments(_device_sizes(values))
    op.run(args)
    args.sync()
    packed.check(values, _tol(op))
    assert args.size_flags() == 0
    # B as a list of matrices instead of one tensor.
    packed.poison()
    Bs = list(packed.B.unbind(0))
    args = GemmGroupedArguments(op, _device_sizes(values), packed.A, Bs, packed.C, packed.D,
                                op.epilogue_type(packed.alpha, packed.beta, *_activation_args(op)), bias=packed.Bias)
    op.run(args)
    args.sync()
    packed.check(values, _tol(op))


@pytest.mark.parametrize("key", ["f16_tnt_coop", "bf16_tnt_pp_64x256_c2x1_silu", "bf16_tnt_pp_c2x1_gelu_bias"])
def test_cuda_graph_replays_new_counts(key):
    """Capture one run, then write new counts (incl. empty groups, all empty, one group taking every row) into the
    sizes tensor and replay: every replay is checked; no builder runs after capture."""
    import torch

    op = {**OPS, **BIAS_OPS}[key]
    rng = np.random.default_rng(40)
    groups, rows, n, k = 32, 2048, 256, 256
    packed = Packed(op, groups, rows, n, k, seed=41, bias=op.bias is not None)
    sizes = _device_sizes(_counts(rng, groups, rows))
    stream = torch.cuda.Stream()
    args = packed.arguments(sizes, stream=stream)
    stream.synchronize()
    launches = args._loaded_op.builder_launches
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, stream=stream):
        op.run(args)
    schedules = [_counts(rng, groups, rows, empty=10), np.zeros(groups, np.int32),
                 np.eye(groups, dtype=np.int32)[5] * rows, _counts(rng, groups, rows // 4, empty=1),
                 np.r_[np.zeros(groups - 1, np.int32), [rows]].astype(np.int32)]
    for counts in schedules:
        sizes.copy_(torch.from_numpy(counts).to(sizes.device))
        packed.poison()
        graph.replay()
        torch.cuda.synchronize()
        packed.check(counts, _tol(op))
    assert args.size_flags() == 0
    assert args._loaded_op.builder_launches == launches or args._loaded_op.verifying
    del graph


def test_out_of_bounds_sizes_are_clamped_and_flagged():
    """Sizes beyond the tensors are cut on the device (nothing written outside D, checked by its NaN guard bands),
    and reported: sum of M over the rows, N or K over the bounds, negative sizes, misaligned N or K."""
    op = OPS["f16_tnt_coop"]
    groups, rows, n, k = 6, 512, 128, 128
    packed = Packed(op, groups, rows, n, k, seed=50)
    cases = [([(300, 128, 128), (300, 128, 128), (100, 128, 128)] + [(10, 128, 128)] * 3, 1),
             ([(64, 512, 128)] + [(64, 128, 128)] * 5, 2),
             ([(64, 128, 4096)] + [(64, 128, 128)] * 5, 4),
             ([(-5, 128, 128), (64, -8, 128)] + [(64, 128, 128)] * 4, 8),
             ([(64, 120, 128), (64, 128, 100)] + [(64, 128, 128)] * 4, 0)]
    for values, flag in cases:
        packed.poison()
        args = packed.arguments(_device_sizes(values))
        op.run(args)
        args.sync()
        flags = args.size_flags()
        if flag:
            assert flags & flag, (values, flags)
        packed.check(values, _tol(op))
        if flags:
            with pytest.raises(cutlass.ArgumentError, match="out of bounds"):
                args.check_sizes()
            assert args.size_flags() == 0  # check_sizes resets
    # 120 is a multiple of 8 (allowed); 100 is not: that group is skipped and flagged.
    assert flags & 16


# --- masked layout ---------------------------------------------------------------------------------------------
class Masked:
    """The decode layout: A (groups, capacity, K), B (groups, K, N), C and D (groups, capacity, N); group g computes
    its first counts[g] rows. D sits inside a NaN guard band (a padded slab per group) to catch stray writes."""

    def __init__(self, op, groups, capacity, n, k, seed=0, bias=False):
        import torch

        from .gemm_cases import random_values, to_tensor

        rng = np.random.default_rng(seed)
        out = op.C.element
        self.op, self.groups, self.capacity, self.n, self.k = op, groups, capacity, n, k
        self.a = random_values(rng, (groups, capacity, k), op.A.element)
        self.b = random_values(rng, (groups, k, n), op.B.element)
        self.c = random_values(rng, (groups, capacity, n), out)
        self.bias = random_values(rng, (groups, n), out) if bias else None
        self.A = to_tensor(self.a, op.A.element, R, "torch")
        self.B = to_tensor(self.b, op.B.element, op.B.layout, "torch")
        self.C = to_tensor(self.c, out, R, "torch")
        self.Bias = to_tensor(self.bias, out, R, "torch") if bias else None
        dtype = {D.float16: torch.float16, D.bfloat16: torch.bfloat16, D.float32: torch.float32}[out]
        # Each group's slab is followed by 8 guard rows; D is the (groups, capacity, N) view of it.
        self.guarded = torch.full((groups, capacity + 8, n), float("nan"), dtype=dtype, device="cuda")
        self.D = self.guarded[:, :capacity]

    def arguments(self, counts, alpha=1.25, beta=-0.5, **kwargs):
        op = self.op
        self.alpha, self.beta = alpha, beta
        return GemmGroupedArguments(op, counts, self.A, self.B, self.C, self.D,
                                    op.epilogue_type(alpha, beta, *_activation_args(op)), bias=self.Bias, **kwargs)

    def check(self, counts, tol):
        """Every group's first min(count, capacity) rows (and first N columns, over its first K, for (groups, 3)
        sizes) against float64; every other element of D still NaN."""
        from .gemm_cases import epilogue_reference

        got = self.guarded.double().cpu().numpy()
        written = np.zeros(got.shape, dtype=bool)
        failures = []
        sizes = np.asarray(counts).reshape(self.groups, -1)
        for g, size in enumerate(sizes):
            m, n, k = (int(size[0]), self.n, self.k) if len(size) == 1 else map(int, size)
            m = min(max(m, 0), self.capacity)
            if m == 0 or n == 0:
                continue
            written[g, :m, :n] = True
            accumulator = self.alpha * (self.a[g, :m, :k] @ self.b[g, :k, :n]) + \
                (self.bias[g][None, :n] if self.bias is not None else 0.0)
            reference = epilogue_reference(self.op, accumulator, self.c[g, :m, :n], 1.0, self.beta,
                                           _activation_args(self.op))
            error = relative_error(got[g, :m, :n], reference)
            if not error < tol:
                failures.append(f"group {g} ({m} rows): relative error {error:.3e}")
        assert np.isnan(got[~written]).all(), "the kernel wrote past a group's count or outside its slab"
        assert not failures, "\n".join(failures[:20])


@pytest.mark.parametrize("key", ["f16_tnt_coop", "bf16_tnt_pp_64x256_c2x1_silu", "bf16_tnt_pp_c2x1_gelu_bias"])
def test_masked_layout_in_a_cuda_graph_replays_new_counts(key):
    """Capture one masked run, then write new counts into the tensor and replay: skewed counts with empty experts,
    all empty, every expert full, odd counts; a count over the capacity is clamped to it and flagged."""
    import torch

    op = {**OPS, **BIAS_OPS}[key]
    rng = np.random.default_rng(60)
    groups, capacity, n, k = 16, 384, 256, 192
    masked = Masked(op, groups, capacity, n, k, seed=61, bias=op.bias is not None)
    counts = _device_sizes(np.minimum(_counts(rng, groups, groups * capacity // 3), capacity))
    stream = torch.cuda.Stream()
    args = masked.arguments(counts, stream=stream)
    assert args.masked and args.device_sizes
    stream.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, stream=stream):
        op.run(args)
    schedules = [np.minimum(_counts(rng, groups, groups * capacity // 2, empty=4), capacity),
                 np.zeros(groups, np.int32), np.full(groups, capacity, np.int32),
                 rng.integers(0, capacity, groups).astype(np.int32) | 1]
    for values in schedules:
        counts.copy_(torch.from_numpy(values).to(counts.device))
        masked.guarded.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        masked.check(values, _tol(op))
    assert args.size_flags() == 0
    # per-group N and K ((groups, 3) sizes) in the same slabs, K = 0 groups included (D = act(beta * C + bias))
    masked.guarded.fill_(float("nan"))
    sizes = np.stack([rng.integers(0, capacity + 1, groups), rng.choice([0, 64, 128, 200, 256], groups),
                      rng.choice([0, 64, 128, 192], groups)], 1).astype(np.int32)
    per_group = masked.arguments(_device_sizes(sizes), stream=stream)
    op.run(per_group)
    per_group.sync()
    masked.check(sizes, _tol(op))
    assert per_group.size_flags() == 0
    over = np.r_[[capacity + 100], np.full(groups - 1, 7)].astype(np.int32)
    counts.copy_(torch.from_numpy(over).to(counts.device))
    masked.guarded.fill_(float("nan"))
    graph.replay()
    torch.cuda.synchronize()
    masked.check(over, _tol(op))  # the first expert computed its full capacity, nothing past it
    with pytest.raises(cutlass.ArgumentError, match="capacity 384 per group"):
        args.check_sizes()
    del graph
