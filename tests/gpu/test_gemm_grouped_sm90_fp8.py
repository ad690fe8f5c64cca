"""SM90 grouped GEMM with fp8 operands and per-group alphas (``alpha=``), on the GPU against float64 references:
e4m3 and e4m3 x e5m2, fast accumulation and CUTLASS's promoting main loop, cooperative and ping-pong, clusters,
activations, a per-group bias, f16/bf16/f32 outputs; per-group alphas from a host list and from a device tensor
updated in place, device-side sizes under a CUDA graph, zero-sized groups. Inputs are exactly representable in
their fp8 types; outputs are NaN-poisoned before each run."""
from __future__ import annotations

import numpy as np
import pytest

import pycutlass as cutlass
from pycutlass import KernelScheduleType as KS

from .conftest import precompile_module, scan_cubins
from .gemm_cases import CM, D, R
from .test_gemm_grouped import _activation_args, mixed_problems, run_group
from .test_gemm_grouped_sm90 import OPS as F16_OPS
from .test_gemm_grouped_sm90 import Packed, _counts, _device_sizes

pytestmark = pytest.mark.gpu


def fp8_grouped(a=D.float8_e4m3, b=None, layouts=(R, CM, R), tile=(128, 128, 128), cluster=(1, 1, 1),
                kernel=KS.Auto, out=D.bfloat16, activation=None, bias=None, scales=None):
    b = b or a
    math = cutlass.MathInstruction([64, tile[1], 256 // a.bits], a, b, D.float32, cutlass.OpClass.TensorOp)
    description = cutlass.TileDescription(list(tile), 0, None, math, cluster_shape=list(cluster),
                                          kernel_schedule=kernel)
    C = cutlass.TensorDescription(out, layouts[2], 128 // out.bits)
    if activation is None:
        functor = cutlass.LinearCombination(out, C.alignment, D.float32, D.float32)
    else:
        functor = cutlass.LinearCombinationGeneric(getattr(cutlass, activation)(D.float32), out, C.alignment,
                                                   D.float32, D.float32)
    return cutlass.GemmOperationGrouped(90, description, cutlass.TensorDescription(a, layouts[0], 16 * 8 // a.bits),
                                        cutlass.TensorDescription(b, layouts[1], 16 * 8 // b.bits), C, functor,
                                        bias=bias, scales=scales)


OPS = {
    "e4m3_coopfa_bf16": fp8_grouped(),  # Auto: cooperative, fast accumulation
    "e4m3_coop_128x256_f32": fp8_grouped(tile=(128, 256, 128), kernel=KS.TmaWarpSpecializedCooperative,
                                         out=D.float32),
    "e4m3e5m2_ppfa_c2x1_f16cm_relu": fp8_grouped(b=D.float8_e5m2, layouts=(R, CM, CM), tile=(64, 128, 128),
                                                 cluster=(2, 1, 1), kernel=KS.TmaWarpSpecializedPingpongFP8FastAccum,
                                                 out=D.float16, activation="relu"),
    "e4m3_pp_c1x2_bf16_gelu": fp8_grouped(tile=(128, 128, 128), cluster=(1, 2, 1),
                                          kernel=KS.TmaWarpSpecializedPingpong, activation="gelu"),
    "e4m3_coopfa_256x128_bf16_silu_bias": fp8_grouped(tile=(256, 128, 128), activation="silu", bias="column"),
}
# Row-wise scales (scales="rowwise"): one float32 per row of A and per column of B in every group.
ROWWISE_OPS = {
    "e4m3_coopfa_bf16_rowwise": fp8_grouped(scales="rowwise"),
    "e4m3_pp_c2x1_f32_rowwise": fp8_grouped(tile=(64, 128, 128), cluster=(2, 1, 1),
                                            kernel=KS.TmaWarpSpecializedPingpong, out=D.float32, scales="rowwise"),
    "e4m3e5m2_coop_128x256_f16cm_silu_rowwise": fp8_grouped(b=D.float8_e5m2, layouts=(R, CM, CM),
                                                            tile=(128, 256, 128), kernel=KS.TmaWarpSpecializedCooperative,
                                                            out=D.float16, activation="silu", scales="rowwise"),
    "bf16_tnt_coop_gelu_rowwise": fp8_grouped(D.bfloat16, tile=(128, 128, 64), activation="gelu", scales="rowwise"),
}
# Output rounding dominates for 16-bit outputs; for f32 the fp8 products' accumulation does.
TOLERANCES = {D.bfloat16: 2e-2, D.float16: 5e-3, D.float32: 1e-3}


@pytest.fixture(scope="module", autouse=True)
def compiled(memory_pool):
    precompile_module((), [*OPS.values(), *ROWWISE_OPS.values(), F16_OPS["f16_tnt_coop"]])
    yield


def _tol(op) -> float:
    # a float32 output shows the fp8 products' accumulation; e5m2's two mantissa bits make it coarser than e4m3's
    if op.C.element is D.float32 and D.float8_e5m2 in (op.A.element, op.B.element):
        return 2.5e-3
    return TOLERANCES[op.C.element]


def _alphas(rng, count):
    """Per-group alphas as an fp8 MoE's scale_a[g] * scale_b[g] would be: positive, a decade apart."""
    return [float(x) for x in rng.uniform(0.05, 2.0, count).astype(np.float32)]


def _bias_kwargs(group, op):
    if op.bias is None:
        return {}
    rng = np.random.default_rng(7)
    from .gemm_cases import random_values, to_tensor

    group.bias = [random_values(rng, (n,), op.C.element) for m, n, k in group.problems]
    return {"bias": [to_tensor(v[None, :], op.C.element, R, "torch")[0] for v in group.bias]}


def _run(op, problems, seed, group_alpha, beta=0.5):
    """One group run: host sizes, per-group alphas, optional bias; checked against float64 per group."""
    from .gemm_cases import epilogue_reference, to_float64
    from .conftest import relative_error
    from .test_gemm_grouped import Group

    group = Group(op, problems, seed=seed)
    kwargs = _bias_kwargs(group, op)
    args = group.arguments(alpha=1.0, beta=beta, group_alpha=group_alpha, **kwargs)
    op.run(args)
    args.sync()
    if op.bias is None:
        group.check(_tol(op))
        return group, args
    alphas = to_float64(group_alpha).reshape(-1)
    failures = []
    for g, ((m, n, k), a, b, c, Dt) in enumerate(zip(group.problems, group.a, group.b, group.c, group.Ds)):
        if m == 0 or n == 0:
            continue
        accumulator = alphas[g] * (a @ b) + group.bias[g][None, :]
        reference = epilogue_reference(op, accumulator, c, 1.0, beta, _activation_args(op))
        error = relative_error(to_float64(Dt), reference)
        if not error < _tol(op):
            failures.append(f"group {g} {(m, n, k)}: {error:.3e}")
    assert not failures, "\n".join(failures)
    return group, args


# --- tests -----------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("key", list(OPS))
def test_mixed_sizes_with_per_group_alphas(key):
    """Random multiples of 16 with K sometimes 0, then M = 0, N = 0, K = 0, tiny and tall-thin groups."""
    op = OPS[key]
    problems = mixed_problems(16)
    rng = np.random.default_rng(1)
    _, args = _run(op, problems, seed=2, group_alpha=_alphas(rng, len(problems)))
    assert 0 < args.threadblock_count <= args.sm_count


@pytest.mark.parametrize("key", ["e4m3_coopfa_bf16", "e4m3_coop_128x256_f32", "e4m3e5m2_ppfa_c2x1_f16cm_relu"])
def test_odd_m_and_large_k(key):
    """M odd (TMA needs only the contiguous extents aligned), K up to 4096 (many promotion intervals)."""
    op = OPS[key]
    rng = np.random.default_rng(3)
    problems = [(int(rng.integers(1, 600)), 16 * int(rng.integers(1, 40)), 16 * int(rng.integers(1, 256)))
                for _ in range(9)] + [(3, 16, 4096), (517, 520, 4096)]
    if op.C.layout is CM:  # a column-major D is contiguous along M
        problems = [(-(-m // 8) * 8, n, k) for m, n, k in problems]
    _run(op, problems, seed=4, group_alpha=_alphas(rng, len(problems)), beta=-1.0)


@pytest.mark.parametrize("key", ["e4m3_coopfa_bf16", "e4m3_pp_c1x2_bf16_gelu"])
def test_scalar_alpha_still_applies(key):
    """Without alpha=, the epilogue's scalar alpha and beta are used for every group (no per-group pointer)."""
    op = OPS[key]
    group, args = run_group(op, mixed_problems(16), _tol(op), alpha=0.375, beta=-0.5, seed=5)
    assert args.bind().alpha_ptr == 0


def test_device_alphas_are_read_at_every_launch():
    """A float32 device tensor of alphas is referenced: updating it in place changes the next run, no rebuild."""
    import torch

    op = OPS["e4m3_coopfa_bf16"]
    from .test_gemm_grouped import Group

    problems = [(200, 128, 256), (64, 256, 512), (0, 64, 64), (300, 64, 128), (128, 128, 0)]
    group = Group(op, problems, seed=6)
    alpha = torch.tensor([0.5, 1.5, 1.0, 0.125, 2.0], dtype=torch.float32, device="cuda")
    args = group.arguments(alpha=1.0, beta=0.25, group_alpha=alpha)
    assert args.bind().alpha_ptr == alpha.data_ptr()
    for update in (None, -3.0, 0.01):
        if update is not None:
            alpha.mul_(update)
            group.poison()
        op.run(args)
        args.sync()
        group.check(_tol(op))


def test_f16_operations_take_per_group_alphas_too():
    op = F16_OPS["f16_tnt_coop"]
    problems = mixed_problems(8)
    rng = np.random.default_rng(8)
    _run(op, problems, seed=9, group_alpha=_alphas(rng, len(problems)), beta=-0.5)


@pytest.mark.parametrize("key", ["e4m3_coopfa_bf16", "e4m3_coopfa_256x128_bf16_silu_bias"])
def test_device_sizes_and_alphas_under_a_cuda_graph(key):
    """An MoE step: packed tokens, (groups, K, N) experts, counts and scales on the device; one capture, replays with
    new counts and new scales written in place."""
    import torch

    op = OPS[key]
    rng = np.random.default_rng(10)
    groups, rows, n, k = 16, 1024, 256, 512
    packed = Packed(op, groups, rows, n, k, seed=11, bias=op.bias is not None)
    sizes = _device_sizes(_counts(rng, groups, rows))
    alpha = torch.tensor(_alphas(rng, groups), dtype=torch.float32, device="cuda")
    stream = torch.cuda.Stream()
    args = packed.arguments(sizes, alpha=1.0, beta=0.5, group_alpha=alpha, stream=stream)
    stream.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, stream=stream):
        op.run(args)
    for step in range(3):
        counts = _counts(rng, groups, rows, empty=2 + step)
        sizes.copy_(torch.from_numpy(counts).to(sizes.device))
        alpha.copy_(torch.tensor(_alphas(rng, groups), dtype=torch.float32))
        packed.poison()
        graph.replay()
        torch.cuda.synchronize()
        packed.check(counts, _tol(op))
    assert args.size_flags() == 0
    del graph


def test_zero_sized_groups_write_beta_c():
    """K = 0 groups run over the zeroed fp8 stand-in: D = epilogue(beta * C) whatever the alpha."""
    op = OPS["e4m3_coop_128x256_f32"]
    problems = [(0, 64, 64), (128, 0, 64), (136, 72, 0), (64, 64, 64), (0, 0, 0), (200, 328, 0), (16, 16, 0)]
    rng = np.random.default_rng(12)
    _run(op, problems, seed=13, group_alpha=_alphas(rng, len(problems)), beta=0.75)


def test_bad_alphas_are_rejected_before_launch():
    import torch

    op = OPS["e4m3_coopfa_bf16"]
    from .test_gemm_grouped import Group

    group = Group(op, [(64, 64, 64), (32, 32, 32)], seed=14)
    for bad, message in ((torch.ones(3, device="cuda"), "vector of 2 values"),
                         (torch.ones(2, dtype=torch.float16, device="cuda"), "float32"),
                         ([1.0], "expected 2 finite values")):
        with pytest.raises(cutlass.ArgumentError, match=message):
            group.arguments(group_alpha=bad)


def test_cubins_hold_real_kernels_and_no_traps():
    scan_cubins(list(OPS.values()))


# --- row-wise scales --------------------------------------------------------------------------------------------
def _scales(rng, count):
    """Quantization-like scales: positive, spread over two decades."""
    return (2.0 ** rng.uniform(-4, 3, count)).astype(np.float32)


@pytest.mark.parametrize("key", list(ROWWISE_OPS))
@pytest.mark.parametrize("form", ["packed", "lists"])
def test_rowwise_scales_against_float64(key, form):
    """Host sizes with M, N or K = 0 groups: D_g = act(alpha_g * scale_a_g[m] * scale_b_g[n] * A_g @ B_g + beta * C_g);
    scale_a packed (the groups' rows one after the other) or as one vector per group, scale_b a (groups, N) tensor or
    vectors."""
    run_rowwise(ROWWISE_OPS[key], form, mixed_problems(16), seed=20)  # fp8 rows of A and B: K a multiple of 16


def run_rowwise(op, form, problems, seed):
    """One host-sizes run of a row-wise scaled operation against float64, every group checked."""
    import torch

    from .conftest import relative_error
    from .gemm_cases import epilogue_reference, to_float64
    from .test_gemm_grouped import Group

    if op.C.layout is CM:
        problems = [(-(-m // 8) * 8, n, k) for m, n, k in problems]
    rng = np.random.default_rng(seed)
    group = Group(op, problems, seed=seed + 1)
    sa = [_scales(rng, m) for m, _, _ in problems]
    width = max(n for _, n, _ in problems)
    sb = [_scales(rng, width) for _ in problems]
    if form == "packed":
        scale_a = torch.from_numpy(np.concatenate(sa + [np.ones(3, np.float32)])).cuda()  # longer than needed
        scale_b = torch.from_numpy(np.stack(sb)).cuda()
    else:
        scale_a = [torch.from_numpy(v).cuda() for v in sa]
        scale_b = [torch.from_numpy(v).cuda() for v in sb]
    alphas = _alphas(rng, len(problems))
    args = group.arguments(alpha=1.0, beta=-0.75, group_alpha=alphas, scale_a=scale_a, scale_b=scale_b)
    op.run(args)
    args.sync()
    failures = []
    for g, ((m, n, k), a, b, c, Dt) in enumerate(zip(group.problems, group.a, group.b, group.c, group.Ds)):
        if m == 0 or n == 0:
            continue
        accumulator = alphas[g] * sa[g].astype(np.float64)[:, None] * (a @ b) * sb[g][:n].astype(np.float64)[None, :]
        reference = epilogue_reference(op, accumulator, c, 1.0, -0.75, _activation_args(op))
        error = relative_error(to_float64(Dt), reference)
        if not error < _tol(op):
            failures.append(f"group {g} {(m, n, k)}: {error:.3e}")
    assert not failures, "\n".join(failures)


def run_rowwise_on_device_counts(op, layout, groups, capacity, rows, n, k, schedules, seed, tol=None):
    """An fp8 MoE step: counts and both scale vectors on the device, one capture (all counts 0), then for each counts
    of ``schedules`` the counts and new scales written in place and a replay; packed tokens (``rows`` of them,
    scale_a per packed row) or the masked layout (``groups`` slabs of ``capacity`` rows, scale_a per slab row).
    Every group against float64 (``tol``: the suite's), every row no group owns still NaN; returns the arguments."""
    import torch

    from .conftest import relative_error
    from .gemm_cases import epilogue_reference, random_values, to_tensor

    rng = np.random.default_rng(seed)
    masked = layout == "masked"
    rows = groups * capacity if masked else rows
    a = random_values(rng, (rows, k), op.A.element)
    b = random_values(rng, (groups, k, n), op.B.element)
    c = random_values(rng, (rows, n), op.C.element)
    A = to_tensor(a, op.A.element, R, "torch")
    B = to_tensor(b, op.B.element, op.B.layout, "torch")
    C = to_tensor(c, op.C.element, R, "torch")
    D_ = torch.full((rows, n), float("nan"), dtype=C.dtype, device="cuda")
    scale_a = torch.from_numpy(_scales(rng, rows)).cuda()
    scale_b = torch.from_numpy(np.stack([_scales(rng, n) for _ in range(groups)])).cuda()
    counts = _device_sizes(np.zeros(groups, np.int32))
    view = (lambda t: t.view(groups, capacity, *t.shape[1:])) if masked else (lambda t: t)
    stream = torch.cuda.Stream()
    args = cutlass.GemmGroupedArguments(op, counts, view(A), B, view(C), view(D_),
                                        op.epilogue_type(1.5, 0.5, *_activation_args(op)), stream=stream,
                                        scale_a=view(scale_a), scale_b=scale_b)
    assert args.masked is masked
    stream.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, stream=stream):
        op.run(args)
    tol = tol or _tol(op)
    for step, values in enumerate(schedules):
        counts.copy_(torch.from_numpy(np.asarray(values, dtype=np.int32)).to(counts.device))
        scale_a.copy_(torch.from_numpy(_scales(rng, rows)))
        scale_b.mul_(0.5)
        D_.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        got = D_.double().cpu().numpy()
        sa, sb = scale_a.double().cpu().numpy(), scale_b.double().cpu().numpy()
        written = np.zeros(got.shape, dtype=bool)
        row = 0
        for g, m in enumerate(values):
            first = g * capacity if masked else row
            row += m
            if m == 0:
                continue
            rows_g = slice(first, first + m)
            written[rows_g] = True
            accumulator = 1.5 * sa[rows_g, None] * (a[rows_g] @ b[g]) * sb[g][None, :]
            reference = epilogue_reference(op, accumulator, c[rows_g], 1.0, 0.5, _activation_args(op))
            error = relative_error(got[rows_g], reference)
            assert error < tol, f"group {g} ({m} rows), step {step}: relative error {error:.3e} (tolerance {tol:.1e})"
        assert np.isnan(got[~written]).all(), "a row no group owns was written"
    del graph
    return args


@pytest.mark.parametrize("key", ["e4m3_coopfa_bf16_rowwise", "bf16_tnt_coop_gelu_rowwise"])
@pytest.mark.parametrize("layout", ["packed", "masked"])
def test_rowwise_scales_with_device_counts_under_a_cuda_graph(key, layout):
    """Replays with new counts (skewed, empty groups) and new scales written in place, packed or masked."""
    rng = np.random.default_rng(30)
    groups, capacity, n, k = 12, 256, 192, 256
    rows = groups * capacity if layout == "masked" else 1536
    schedules = [np.minimum(_counts(rng, groups, rows if layout == "packed" else groups * capacity // 2,
                                    empty=1 + step), capacity if layout == "masked" else rows) for step in range(3)]
    args = run_rowwise_on_device_counts(ROWWISE_OPS[key], layout, groups, capacity, rows, n, k, schedules, seed=31)
    assert args.size_flags() == 0


def test_rowwise_scale_cubins_hold_real_kernels_and_no_traps():
    scan_cubins(list(ROWWISE_OPS.values()))
