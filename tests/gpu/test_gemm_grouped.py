"""Grouped GEMM on the GPU against per-problem float64 references: data types x scheduler modes x layouts, mixed
and zero-sized problems, one and 600 problems, empty groups, host inputs, beta = 0 without C, reuse, errors and
the NVRTC backend. Outputs are NaN-poisoned before each run."""
from __future__ import annotations

import numpy as np
import pytest

import pycutlass as cutlass
from pycutlass.gemm import GemmCoord
from pycutlass import GemmOperationGrouped, SchedulerMode
from pycutlass import GemmGroupedArguments

from .conftest import precompile_module, relative_error
from .gemm_cases import CM, CONFIGS, D, R, epilogue_reference, poisoned_output, random_values, to_float64, to_tensor

pytestmark = pytest.mark.gpu

MODES = (SchedulerMode.Host, SchedulerMode.Device)


def make_grouped(cfg, layouts, mode, activation=None, tile=None, stages=None, warps=None):
    """A GemmOperationGrouped from a gemm_cases CONFIGS entry (output in the operand type, same alignment)."""
    c = CONFIGS[cfg]
    math = cutlass.MathInstruction(c["inst"], c["el"], c["el"], c["acc"], c["cls"], c["math"])
    td = cutlass.TileDescription(tile or c["tile"], stages or c["stages"], warps or c["warps"], math)
    storage = c.get("storage", c["el"])
    align = c["align"]
    A = cutlass.TensorDescription(storage, layouts[0], align)
    B = cutlass.TensorDescription(storage, layouts[1], align)
    C = cutlass.TensorDescription(storage, layouts[2], align)
    compute = D.float64 if c["acc"] is D.float64 else D.float32
    if activation is not None:
        ep = cutlass.LinearCombinationGeneric(getattr(cutlass, activation)(compute), storage, align, c["acc"], compute)
    else:
        ep = cutlass.LinearCombination(storage, align, c["acc"], compute)
    return GemmOperationGrouped(80, td, A, B, C, ep, cutlass.IdentitySwizzle1, mode)


# --- the operations this module runs -------------------------------------------------------------------------
# name -> (CONFIGS entry, layouts of A, B, C, extra make_grouped arguments). Each runs in both scheduler modes.
VARIANTS = {
    "f16_tnt": ("f16", (R, CM, R), {}),  # LinearCombination, row-major C
    "f16_ntn_leaky": ("f16", (CM, R, CM), dict(activation="leaky_relu", tile=[64, 128, 32], stages=4)),
    "bf16_tnn_relu": ("bf16", (R, CM, CM), dict(activation="relu")),  # column-major C: internal transpose
    "tf32_tnt": ("tf32", (R, CM, R), {}),
    "f64_ttn": ("f64", (R, R, CM), {}),
}
GROUPED_OPS = {f"{name}-{mode.value}": make_grouped(cfg, layouts, mode, **extra)
               for name, (cfg, layouts, extra) in VARIANTS.items() for mode in MODES}
# NVRTC: the Host-mode operation also exercises <name>_precompute, built without CUTLASS's host-only code.
NVRTC_OPS = {"f16_ntn_leaky-Host": GROUPED_OPS["f16_ntn_leaky-Host"]}

TOLERANCES = {"f16": 5e-3, "bf16": 2e-2, "tf32": 5e-3, "f64": 1e-12}


@pytest.fixture(scope="module", autouse=True)
def compiled(memory_pool):
    precompile_module(GROUPED_OPS.values(), NVRTC_OPS.values())
    yield


def _variant(key):
    return VARIANTS[key.split("-")[0]]


def _tol(key):
    return TOLERANCES[_variant(key)[0]]


def _activation_args(op):
    return (0.2,) if op.epilogue_functor.num_activation_args else ()


# --- problem sets ----------------------------------------------------------------------------------------------
def mixed_problems(align, count=20, seed=0):
    """``count`` random problems (multiples of ``align``, K sometimes 0), then M == 0, N == 0, K == 0 and odd ones."""
    rng = np.random.default_rng(seed)
    top = max(1, 320 // align)
    problems = [(int(m) * align, int(n) * align, int(k) * align)
                for m, n, k in zip(rng.integers(1, top + 1, count), rng.integers(1, top + 1, count),
                                   rng.integers(0, top + 1, count))]
    return problems + [(0, 8 * align, 8 * align), (8 * align, 0, 8 * align), (9 * align, 17 * align, 0),
                       (align, align, align), (1000, 8, 1024)]


def many_problems(count=600, seed=1):
    """More problems than the precompute kernel's block (PRECOMPUTE_THREADS): the schedule takes several chunks."""
    rng = np.random.default_rng(seed)
    return [(int(m) * 8, 64, 64) for m in rng.integers(0, 20, count)]


# --- running and checking --------------------------------------------------------------------------------------
class Group:
    """Host float64 operands of a group, their tensors in ``lib`` and the (NaN-poisoned) outputs."""

    def __init__(self, op, problems, lib="torch", with_c=True, seed=0):
        rng = np.random.default_rng(seed)
        storage, out = op.A.element, op.C.element
        self.op, self.problems, self.lib = op, [tuple(p) for p in problems], lib
        self.a = [random_values(rng, (m, k), storage) for m, n, k in self.problems]
        self.b = [random_values(rng, (k, n), op.B.element) for m, n, k in self.problems]
        self.c = [random_values(rng, (m, n), out) if with_c else None for m, n, k in self.problems]
        self.As = [to_tensor(a, storage, op.A.layout, lib) for a in self.a]
        self.Bs = [to_tensor(b, op.B.element, op.B.layout, lib) for b in self.b]
        self.Cs = [to_tensor(c, out, op.C.layout, lib) for c in self.c] if with_c else None
        self.Ds = [poisoned_output((m, n), out, op.C.layout, lib) for m, n, k in self.problems]

    def arguments(self, alpha=1.25, beta=-0.5, Cs="own", group_alpha=None, **kwargs):
        """``group_alpha``: per-group alphas (SM90 grouped operations' ``alpha=``; a list or a float32 tensor, read
        again by ``check`` so that in-place updates count); it replaces the scalar alpha."""
        op = self.op
        self.alpha, self.beta, self.group_alpha = alpha, beta, group_alpha
        self.used_c = self.Cs if Cs == "own" else Cs
        if group_alpha is not None:
            kwargs["alpha"] = group_alpha
        return GemmGroupedArguments(op, [GemmCoord(*p) for p in self.problems], self.As, self.Bs, self.used_c,
                                    self.Ds, op.epilogue_type(alpha, beta, *_activation_args(op)), **kwargs)

    def poison(self):
        for Dt in self.Ds:
            if hasattr(Dt, "fill_"):
                Dt.fill_(float("nan"))
            else:
                Dt[...] = np.nan

    def check(self, tol):
        """Every problem against its float64 reference; reports all the problems that fail."""
        failures = []
        alphas = [self.alpha] * len(self.problems) if getattr(self, "group_alpha", None) is None else \
            to_float64(self.group_alpha).reshape(-1)
        for index, ((m, n, k), a, b, c, Dt) in enumerate(zip(self.problems, self.a, self.b, self.c, self.Ds)):
            got = to_float64(Dt)
            assert got.shape == (m, n)
            if m == 0 or n == 0:
                continue
            read_c = self.used_c is not None and self.used_c[index] is not None and self.beta != 0
            reference = epilogue_reference(self.op, a @ b, c if read_c else None, alphas[index],
                                           self.beta if read_c else 0.0, _activation_args(self.op))
            error = relative_error(got, reference)
            if not error < tol:
                failures.append(f"problem {index} {(m, n, k)}: relative error {error:.3e}")
        assert not failures, (f"{len(failures)} of {len(self.problems)} problems exceed {tol:.1e} for "
                              f"{self.op.describe()}:\n" + "\n".join(failures[:20]))


def run_group(op, problems, tol, lib="torch", with_c=True, seed=0, **kwargs):
    group = Group(op, problems, lib, with_c, seed)
    args = group.arguments(**kwargs)
    op.run(args)
    args.sync()
    group.check(tol)
    return group, args


def cutlass_host_schedule(op, problems, block_count):
    """CUTLASS's ProblemVisitor::host_precompute in Python: (problem, first tile) per entry, -1 where unused."""
    tiles = [op.problem_tile_count(p) for p in problems]
    entries_per_block = (sum(tiles) - 1 + block_count) // block_count
    schedule = np.full((entries_per_block * block_count, 2), -1, dtype=np.int32)
    tile = start = 0
    for index, count in enumerate(tiles):
        for _ in range(count):
            schedule[entries_per_block * (tile % block_count) + tile // block_count] = (index, start)
            tile += 1
        start += count
    return schedule


def check_host_schedule(op, args):
    from pycutlass.runtime import driver

    expected = cutlass_host_schedule(op, args.problem_sizes, args.threadblock_count)
    assert args.workspace_bytes == expected.nbytes
    got = np.zeros_like(expected)
    driver.memcpy_dtoh(got.ctypes.data, args.workspace, got.nbytes, args.stream)
    driver.synchronize_stream(args.stream)
    filled = expected[:, 0] >= 0  # entries past the last tile are never read (nor written by CUTLASS)
    assert int(filled.sum()) == args.tile_count
    np.testing.assert_array_equal(got[filled], expected[filled])


# --- tests -----------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("key", list(GROUPED_OPS))
def test_mixed_sizes(key):
    op = GROUPED_OPS[key]
    problems = mixed_problems(op.A.alignment)
    _, args = run_group(op, problems, _tol(key))
    assert args.tile_count == op.tile_count(problems) > 0
    assert 0 < args.threadblock_count <= args.tile_count


@pytest.mark.parametrize("key", list(GROUPED_OPS))
def test_single_problem(key):
    op = GROUPED_OPS[key]
    _, args = run_group(op, [(520, 392, 264)], _tol(key), alpha=0.75, beta=0.5, seed=1)
    assert args.threadblock_count == op.problem_tile_count((520, 392, 264))  # one block per tile


@pytest.mark.parametrize("key", ["f16_tnt-Host", "f16_tnt-Device", "bf16_tnn_relu-Host", "bf16_tnn_relu-Device"])
def test_many_problems(key):
    op = GROUPED_OPS[key]
    problems = many_problems()
    _, args = run_group(op, problems, _tol(key), seed=2)
    if op.precompute_mode is SchedulerMode.Host:
        check_host_schedule(op, args)  # 600 problems: three chunks of the precompute kernel's scan


@pytest.mark.parametrize("key", ["f16_tnt-Host", "f16_tnt-Device", "bf16_tnn_relu-Host", "f64_ttn-Host"])
def test_host_schedule_of_mixed_sizes(key):
    op = GROUPED_OPS[key]
    _, args = run_group(op, mixed_problems(op.A.alignment, seed=3), _tol(key), seed=3)
    if op.precompute_mode is SchedulerMode.Host:
        check_host_schedule(op, args)
    else:
        assert args.workspace == 0 and args.workspace_bytes == 0


@pytest.mark.parametrize("mode", MODES, ids=[m.value for m in MODES])
@pytest.mark.parametrize("problems", [[], [(0, 64, 64)], [(0, 64, 64), (64, 0, 32), (0, 0, 0), (0, 8, 0)]],
                         ids=["no-problem", "one-empty", "all-empty"])
def test_empty_group_launches_nothing(mode, problems):
    op = GROUPED_OPS[f"f16_tnt-{mode.value}"]
    group = Group(op, problems)
    args = group.arguments()
    op.run(args)
    args.sync()
    assert args.tile_count == 0 and args.threadblock_count == 0 and args.workspace == 0
    group.check(_tol("f16_tnt"))  # only shapes: every output is empty


@pytest.mark.parametrize("lib", ["numpy", "torch_cpu"])
@pytest.mark.parametrize("key", ["f16_tnt-Host", "f16_tnt-Device", "f16_ntn_leaky-Host", "f16_ntn_leaky-Device"])
def test_host_inputs(key, lib):
    """Host arrays are copied in; sync() copies every D back into the user's arrays (row- and column-major)."""
    op = GROUPED_OPS[key]
    run_group(op, mixed_problems(op.A.alignment, count=8, seed=4), _tol(key), lib=lib, seed=4)


@pytest.mark.parametrize("key", list(GROUPED_OPS))
def test_beta_zero_without_c(key):
    """Cs=None: C aliases D, which is NaN-poisoned, so any read of C would show."""
    op = GROUPED_OPS[key]
    run_group(op, mixed_problems(op.A.alignment, count=10, seed=5), _tol(key), with_c=False, seed=5, alpha=1.5,
              beta=0.0, Cs=None)


@pytest.mark.parametrize("key", ["f16_tnt-Host", "bf16_tnn_relu-Device"])
def test_beta_zero_with_some_c_missing(key):
    op = GROUPED_OPS[key]
    group = Group(op, mixed_problems(op.A.alignment, count=6, seed=6), seed=6)
    Cs = [c if i % 2 else None for i, c in enumerate(group.Cs)]
    args = group.arguments(alpha=-1.0, beta=0.0, Cs=Cs)
    op.run(args)
    args.sync()
    group.check(_tol(key))


@pytest.mark.parametrize("key", ["f16_tnt-Host", "f16_tnt-Device", "bf16_tnn_relu-Host", "f64_ttn-Device"])
def test_padded_leading_dimensions(key):
    """Every operand its own leading dimension (views into wider buffers, padded by multiples of the alignment)."""
    op = GROUPED_OPS[key]
    align = op.A.alignment
    check_padded_leading_dimensions(op, mixed_problems(align, count=8, seed=7), _tol(key), seed=7, unit=align)


def check_padded_leading_dimensions(op, problems, tolerance, seed, unit):
    """Runs ``problems`` with every operand a view into a wider NaN-filled buffer, padded by 1-3 ``unit``s."""
    import torch

    rng = np.random.default_rng(seed)
    group = Group(op, problems, seed=seed)

    def padded(tensor, layout, pad):
        rows, cols = tensor.shape
        if layout is R:  # row-major: each row padded
            wide = torch.full((rows, cols + pad), float("nan"), dtype=tensor.dtype, device="cuda")
            view = wide[:, :cols]
        else:  # column-major: each column padded
            wide = torch.full((cols, rows + pad), float("nan"), dtype=tensor.dtype, device="cuda")
            view = wide[:, :rows].t()
        view.copy_(tensor)
        return view

    for tensors, layout in ((group.As, op.A.layout), (group.Bs, op.B.layout), (group.Cs, op.C.layout),
                            (group.Ds, op.C.layout)):
        tensors[:] = [padded(t, layout, int(rng.integers(1, 4)) * unit) if t.numel() else t for t in tensors]
    args = group.arguments()
    op.run(args)
    args.sync()
    group.check(tolerance)


@pytest.mark.parametrize("key", ["f16_tnt-Host", "f16_tnt-Device", "bf16_tnn_relu-Host", "f16_ntn_leaky-Device"])
def test_reused_arguments(key):
    """The same arguments run twice give the same (correct) result; a later run reads the inputs' new contents."""
    op = GROUPED_OPS[key]
    check_reused_arguments(op, mixed_problems(op.A.alignment, count=10, seed=8), _tol(key), seed=8)


def check_reused_arguments(op, problems, tolerance, seed):
    group = Group(op, problems, seed=seed)
    args = group.arguments()
    for _ in range(2):
        group.poison()
        op.run(args)
        args.sync()
        group.check(tolerance)
    rng = np.random.default_rng(seed + 1)
    for index, (m, n, k) in enumerate(problems):
        if k and n:
            group.b[index] = random_values(rng, (k, n), op.B.element)
            group.Bs[index].copy_(to_tensor(group.b[index], op.B.element, op.B.layout, "torch"))
    group.poison()
    op.run(args)
    args.sync()
    group.check(tolerance)


def test_arguments_errors_name_the_problem():
    """Checks on device tensors happen in GemmGroupedArguments, before any launch, and name the problem."""
    import torch

    op = GROUPED_OPS["f16_tnt-Device"]
    problems = [(64, 64, 64)] * 5
    group = Group(op, problems)
    base = torch.zeros(64 * 64 + 1, dtype=torch.float16, device="cuda")
    As = list(group.As)
    As[3] = base[1:].view(64, 64)  # 2-byte offset: not 16-byte aligned
    with pytest.raises(cutlass.ArgumentError, match=r"As\[3\] \(problem 3, operand A\): address .* is not aligned"):
        GemmGroupedArguments(op, problems, As, group.Bs, group.Cs, group.Ds, op.epilogue_type(1.0, 1.0))
    As = list(group.As)
    As[1] = torch.zeros(64, 68, dtype=torch.float16, device="cuda")[:, :64]  # ld 68: not a multiple of 8
    with pytest.raises(cutlass.ArgumentError, match=r"As\[1\] \(problem 1, operand A\): leading dimension 68"):
        GemmGroupedArguments(op, problems, As, group.Bs, group.Cs, group.Ds, op.epilogue_type(1.0, 1.0))
    Ds = list(group.Ds)
    Ds[2] = torch.zeros(64, 64, dtype=torch.float32, device="cuda")
    with pytest.raises(cutlass.ArgumentError, match=r"Ds\[2\] \(problem 2, operand D\): the operation expects "
                                                    r"float16 elements, got float32"):
        GemmGroupedArguments(op, problems, group.As, group.Bs, group.Cs, Ds, op.epilogue_type(1.0, 1.0))
    with pytest.raises(cutlass.ArgumentError, match=r"problem 4 GemmCoord\(64, 60, 64\): .*N must be a multiple of 8"):
        GemmGroupedArguments(op, problems[:4] + [(64, 60, 64)], group.As, group.Bs, group.Cs, group.Ds)
    with pytest.raises(cutlass.ArgumentError, match=r"problem 0: Cs\[0\] is None but beta is 1.0"):
        GemmGroupedArguments(op, problems, group.As, group.Bs, [None] * 5, group.Ds, op.epilogue_type(1.0, 1.0))
    args = group.arguments()
    with pytest.raises(cutlass.ArgumentError, match="built for"):
        GROUPED_OPS["f16_tnt-Host"].run(args)


@pytest.mark.parametrize("key", list(NVRTC_OPS))
def test_nvrtc_backend(key):
    op = NVRTC_OPS[key]
    cutlass.compiler.nvrtc()
    try:
        assert cutlass.compiler.Compiler.of().lookup(op) is not None
        _, args = run_group(op, mixed_problems(op.A.alignment, seed=10), _tol(key), seed=10)
        if op.precompute_mode is SchedulerMode.Host:
            check_host_schedule(op, args)
    finally:
        cutlass.compiler.nvcc()
