"""SM90 grouped GEMM with fp8 block-wise scales (``scales="blockwise"``: float32 per 1 x 128 block of A_g, per
128 x 128 block of B_g) on the GPU against float64 of the dequantized operands. Group sizes on the device ((groups,)
M only and (groups, 3) per-group M, N, K), packed tokens and the masked layout, uneven M with empty groups, M, N
and K ending in partial blocks, K = 0 groups, alpha/beta and per-group alphas, DeepGEMM's padded scale_a, a CUDA
graph replayed with new counts and scales written in place. Inputs are exactly representable in their fp8 types;
outputs are NaN-poisoned before each run, and rows no group owns must stay NaN."""
from __future__ import annotations

import numpy as np
import pytest

import pycutlass as cutlass
from pycutlass import KernelScheduleType as KS

from .conftest import precompile_module, relative_error, scan_cubins
from .gemm_cases import CM, D, R, epilogue_reference, random_values, to_tensor
from .test_gemm_grouped import _activation_args
from .test_gemm_sm90_blockwise import blockwise_op

try:
    import torch
except ImportError:  # CPU machines collect (and skip) this module; OPS stay importable for precompiling
    torch = None
pytestmark = [pytest.mark.gpu, pytest.mark.skipif(torch is None, reason="needs torch")]

BLOCK = 128


def blockwise_grouped(**kwargs):
    return blockwise_op(operation=cutlass.GemmOperationGrouped, **kwargs)


OPS = {
    "e4m3_coop_bf16": blockwise_grouped(),
    "e4m3_pp_64x128_c2x1_f32": blockwise_grouped(out=D.float32, tile=(64, 128, 128), cluster=(2, 1, 1),
                                                 kernel=KS.TmaWarpSpecializedPingpong),
    "e4m3e5m2_coop_256x128_c2x1_f16_gelu": blockwise_grouped(b=D.float8_e5m2, out=D.float16, tile=(256, 128, 128),
                                                             cluster=(2, 1, 1), activation="gelu"),
    "e4m3_pp_128x128_bf16_silu": blockwise_grouped(kernel=KS.TmaWarpSpecializedPingpong, activation="silu"),
}
TOLERANCES = {D.bfloat16: 2e-2, D.float16: 5e-3, D.float32: 1e-3}


@pytest.fixture(scope="module", autouse=True)
def compiled(memory_pool):
    precompile_module((), list(OPS.values()))
    yield


def _scales(rng, shape):
    """Quantization-like scales: positive, spread over three decades (exact in float32)."""
    return (2.0 ** rng.uniform(-6, 4, shape)).astype(np.float32).astype(np.float64)


class Experts:
    """One MoE step's tensors: packed A (rows, K) or masked A (groups, capacity, K), B (groups, K, N) column-major
    per group, C and D like A, scale_a (rows, ceil(K/128)) M-major (K blocks ``ld`` apart) or (groups, capacity,
    ceil(K/128)), scale_b (groups, ceil(N/128), ceil(K/128)); float64 copies for the references."""

    def __init__(self, op, groups, rows, n, k, seed, masked=False, ld_pad=0):
        rng = np.random.default_rng(seed)
        self.op, self.groups, self.rows, self.n, self.k, self.masked = op, groups, rows, n, k, masked
        self.kb, self.nb = -(-k // BLOCK), -(-n // BLOCK)
        total = groups * rows if masked else rows
        self.a = random_values(rng, (total, k), op.A.element)
        self.b = random_values(rng, (groups, k, n), op.B.element)
        self.c = random_values(rng, (total, n), op.C.element)
        self.sa = _scales(rng, (total, self.kb))
        self.sb = _scales(rng, (groups, self.nb, self.kb))
        self.A = to_tensor(self.a, op.A.element, R, "torch")
        self.B = to_tensor(self.b, op.B.element, CM, "torch")
        self.C = to_tensor(self.c, op.C.element, R, "torch")
        self.D = torch.full((total, n), float("nan"), dtype=self.C.dtype, device="cuda")
        if masked:  # (groups, capacity, K blocks), each group's K blocks capacity (+ ld_pad) apart
            storage = torch.zeros(groups, self.kb, rows + ld_pad, dtype=torch.float32, device="cuda")
            storage[:, :, :rows] = torch.from_numpy(self.sa.reshape(groups, rows, self.kb).transpose(0, 2, 1)).cuda()
            self.scale_a = storage[:, :, :rows].transpose(1, 2)
        else:  # (rows, K blocks), M contiguous, K blocks rows (+ ld_pad) apart: DeepGEMM's TMA-aligned form
            storage = torch.zeros(self.kb, rows + ld_pad, dtype=torch.float32, device="cuda")
            storage[:, :rows] = torch.from_numpy(self.sa.T.copy()).cuda()
            self.scale_a = storage[:, :rows].t()
        self.scale_b = torch.from_numpy(self.sb.astype(np.float32)).cuda()

    def view(self, tensor):
        return tensor.view(self.groups, self.rows, *tensor.shape[1:]) if self.masked else tensor

    def arguments(self, sizes, alpha=1.0, beta=0.0, **kwargs):
        op = self.op
        return cutlass.GemmGroupedArguments(op, sizes, self.view(self.A), self.B, self.view(self.C) if beta else None,
                                            self.view(self.D), op.epilogue_type(alpha, beta, *_activation_args(op)),
                                            scale_a=self.scale_a, scale_b=self.scale_b, **kwargs)

    def refresh_scales(self, rng):
        """New scales written in place (a graph replay must read them)."""
        self.sa = _scales(rng, self.sa.shape)
        self.sb = _scales(rng, self.sb.shape)
        self.scale_a.copy_(torch.from_numpy(self.view_sa()).cuda())
        self.scale_b.copy_(torch.from_numpy(self.sb.astype(np.float32)).cuda())

    def view_sa(self):
        sa = self.sa.astype(np.float32)
        return sa.reshape(self.groups, self.rows, self.kb) if self.masked else sa

    def check(self, problems, alpha=1.0, beta=0.0, alphas=None):
        """Every group's rows against float64 (their first N_g columns); every other element must still be NaN."""
        op = self.op
        got = self.D.double().cpu().numpy()
        written = np.zeros(got.shape, dtype=bool)
        row = 0
        for g, (m, n, k) in enumerate(problems):
            first = g * self.rows if self.masked else row
            row += m
            if m == 0 or n == 0:
                continue
            rows = slice(first, first + m)
            written[rows, :n] = True
            sa = np.repeat(self.sa[rows], BLOCK, axis=1)[:, :k]
            sb = np.repeat(np.repeat(self.sb[g], BLOCK, axis=0)[:n], BLOCK, axis=1)[:, :k]
            accumulator = (self.a[rows, :k] * sa) @ (self.b[g][:k, :n] * sb.T)
            scale = alpha * (alphas[g] if alphas is not None else 1.0)
            reference = epilogue_reference(op, accumulator, self.c[rows, :n] if beta else None, scale, beta,
                                           _activation_args(op))
            error = relative_error(got[rows, :n], reference)
            assert error < TOLERANCES[op.C.element], f"group {g} {(m, n, k)}: relative error {error:.3e}"
        assert np.isnan(got[~written]).all(), "an element outside every group's output was written"


# Uneven M: an empty group, groups of 1 and 3 rows, M ending in partial 128-row blocks.
COUNTS = [130, 0, 1, 257, 64, 3, 200]


@pytest.mark.parametrize("key", list(OPS))
def test_packed_counts_against_float64(key):
    """(groups,) counts: N = 200 and K = 320 end in partial blocks; alpha and beta."""
    op = OPS[key]
    experts = Experts(op, len(COUNTS), 700, 200, 320, seed=1)
    args = experts.arguments(torch.tensor(COUNTS, dtype=torch.int32, device="cuda"), alpha=0.75, beta=-1.25)
    op.run(args)
    torch.cuda.synchronize()
    experts.check([(m, 200, 320) for m in COUNTS], alpha=0.75, beta=-1.25)
    assert args.size_flags() == 0


@pytest.mark.parametrize("key", ["e4m3_coop_bf16", "e4m3_pp_64x128_c2x1_f32"])
def test_per_group_shapes_and_empty_k(key):
    """(groups, 3) sizes: each group its own N and K below the bounds (partial blocks of both), one K = 0 group
    (D = beta * C: its product reads zero scales), per-group alphas; DeepGEMM's scale_a with padded K blocks."""
    op = OPS[key]
    problems = [(130, 256, 384), (0, 128, 128), (77, 136, 0), (257, 64, 176), (5, 200, 512)]
    experts = Experts(op, len(problems), 600, 256, 512, seed=2, ld_pad=4)
    alphas = [0.5, 1.0, 2.0, 0.25, 1.5]
    sizes = torch.tensor(problems, dtype=torch.int32, device="cuda")
    args = cutlass.GemmGroupedArguments(op, sizes, experts.A, experts.B, experts.C, experts.D,
                                        op.epilogue_type(1.0, 0.5, *_activation_args(op)), alpha=alphas,
                                        scale_a=experts.scale_a, scale_b=experts.scale_b)
    op.run(args)
    torch.cuda.synchronize()
    experts.check(problems, beta=0.5, alphas=alphas)
    assert args.size_flags() == 0


@pytest.mark.parametrize("key", ["e4m3_coop_bf16", "e4m3e5m2_coop_256x128_c2x1_f16_gelu"])
def test_masked_layout_under_a_cuda_graph(key):
    """Decode: A, C, D as (groups, capacity, columns), scale_a (groups, capacity, K blocks); one capture, replays
    with new counts (0 to the capacity) and new scales written in place."""
    op = OPS[key]
    rng = np.random.default_rng(3)
    groups, capacity, n, k = 6, 192, 256, 384
    experts = Experts(op, groups, capacity, n, k, seed=3, masked=True, ld_pad=8)
    counts = torch.zeros(groups, dtype=torch.int32, device="cuda")
    stream = torch.cuda.Stream()
    args = experts.arguments(counts, alpha=1.5, beta=0.5, stream=stream)
    assert args.masked
    stream.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, stream=stream):
        op.run(args)
    for step in range(3):
        values = rng.integers(0, capacity + 1, groups).astype(np.int32)
        values[step] = 0
        counts.copy_(torch.from_numpy(values).cuda())
        experts.refresh_scales(rng)
        experts.D.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        experts.check([(int(m), n, k) for m in values], alpha=1.5, beta=0.5)
    assert args.size_flags() == 0
    del graph


def test_packed_counts_under_a_cuda_graph():
    """An MoE step: packed tokens, counts and both scales on the device, replays with new counts and scales."""
    op = OPS["e4m3_pp_128x128_bf16_silu"]
    rng = np.random.default_rng(4)
    groups, rows, n, k = 9, 1024, 384, 640
    experts = Experts(op, groups, rows, n, k, seed=4)
    counts = torch.zeros(groups, dtype=torch.int32, device="cuda")
    stream = torch.cuda.Stream()
    args = experts.arguments(counts, stream=stream)
    stream.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, stream=stream):
        op.run(args)
    for step in range(3):
        weights = rng.lognormal(0.0, 1.0, groups)
        weights[rng.choice(groups, 2, replace=False)] = 0.0
        values = rng.multinomial(rows - 50, weights / weights.sum()).astype(np.int32)
        counts.copy_(torch.from_numpy(values).cuda())
        experts.refresh_scales(rng)
        experts.D.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        experts.check([(int(m), n, k) for m in values])
    del graph


def test_the_scales_are_applied_per_block_and_per_group():
    """Boosting one K block of one row's scale in group 1 changes exactly that row (a scale read from the wrong
    group, row or K block would change another or none)."""
    op = OPS["e4m3_pp_64x128_c2x1_f32"]
    counts = [40, 70, 30]
    experts = Experts(op, 3, 140, 128, 384, seed=5)
    sizes = torch.tensor(counts, dtype=torch.int32, device="cuda")
    outs = []
    for boost in (1.0, 1024.0):
        sa = experts.sa.copy()
        sa[40 + 7, 1] *= boost  # group 1's row 7, K block 1
        experts.scale_a.copy_(torch.from_numpy(sa.astype(np.float32)).cuda())
        experts.D.fill_(float("nan"))
        op.run(experts.arguments(sizes))
        torch.cuda.synchronize()
        outs.append(experts.D.double().cpu().numpy())
    changed = np.any(outs[0][:140] != outs[1][:140], axis=1)
    assert changed[47] and changed.sum() == 1


def test_cubins_hold_real_kernels_and_no_traps():
    scan_cubins(list(OPS.values()))
