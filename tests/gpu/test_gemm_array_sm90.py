"""SM90 GEMM in Array mode on the GPU against float64 references: operations built with
``GemmOperationUniversal(90, ..., array=True)`` (the pointer-array kernel) over lists of separately allocated matrices
(padded leading dimensions too), tensors holding the batch, Mode.Batched and Mode.Gemm, f16/bf16 x cooperative/
ping-pong x clusters x layouts x epilogues (activations, f32 output, the clamp), odd sizes, 300 entries, beta = 0
without C, empty M, the runtime knobs, reused arguments; and ordinary SM90 operations running Array-mode tensors
batched. Outputs are NaN-poisoned before every run (conftest checks that the allocator returns to its baseline)."""
from __future__ import annotations

import numpy as np
import pytest

import pycutlass as cutlass
from pycutlass import KernelScheduleType as KS
from pycutlass.gemm import GemmCoord, Mode

from . import test_gemm_sm90 as sm90_suite
from .test_gemm_grouped_sm90 import ptr_array_parts
from .conftest import precompile_module, relative_error, scan_cubins

try:
    import torch
except ImportError:  # CPU machines collect (and skip) this module; OPS stay importable for precompiling
    torch = None
pytestmark = [pytest.mark.gpu, pytest.mark.skipif(torch is None, reason="needs torch")]

D = cutlass.DataType
R, CM = cutlass.RowMajor, cutlass.ColumnMajor
TOLERANCE = {D.float16: 2e-3, D.bfloat16: 1.5e-2, D.float32: 1e-5}


def array90(element, layouts, tile=(128, 128, 64), cluster=(1, 1, 1), kernel=KS.Auto, out=None, activation=None,
            clamp=False, epilogue_tile=None):
    parts = ptr_array_parts(element, layouts, tile, cluster, kernel, out, activation, clamp, epilogue_tile)
    return cutlass.GemmOperationUniversal(90, *parts, array=True)


ARRAY_OPS = {
    "f16_tnt_coop": array90(D.float16, (R, CM, R)),
    "bf16_ntn_pp_c2x1_relu": array90(D.bfloat16, (CM, R, CM), (64, 128, 64), (2, 1, 1), KS.TmaWarpSpecializedPingpong,
                                     activation="relu"),
    "f16_nnt_coop_256x128_c1x2_f32out_gelu": array90(D.float16, (CM, CM, R), (256, 128, 64), (1, 2, 1),
                                                     out=D.float32, activation="gelu"),
    "bf16_ttt_pp_clamp": array90(D.bfloat16, (R, R, R), (128, 128, 64), kernel=KS.TmaWarpSpecializedPingpong,
                                 clamp=True),
    "f16_tnn_coop_128x256_c2x1": array90(D.float16, (R, CM, CM), (128, 256, 64), (2, 1, 1)),
    "bf16_tnt_coop_128x192_c1x2": array90(D.bfloat16, (R, CM, R), (128, 192, 64), (1, 2, 1)),
}
ORDINARY = sm90_suite.OPS["bf16_coop"]  # an operation built without array=True
OPS = {**ARRAY_OPS, "ordinary_bf16_coop": ORDINARY}


@pytest.fixture(scope="module", autouse=True)
def compiled(memory_pool):
    precompile_module((), OPS.values())
    yield


# --- helpers -------------------------------------------------------------------------------------------------
def _random(rows, cols, layout, element, generator, pad=0):
    """One rows x cols matrix in ``layout`` (leading dimension padded by ``pad`` elements), and its float64 copy."""
    inner, outer = (cols, rows) if layout is R else (rows, cols)
    storage = torch.randn((outer, inner + pad), generator=generator).to(getattr(torch, TORCH[element])).cuda()
    stored = storage[:, :inner]
    logical = stored if layout is R else stored.t()
    return logical, logical.double().cpu().numpy()


def _poisoned(rows, cols, layout, element, pad=0):
    inner, outer = (cols, rows) if layout is R else (rows, cols)
    storage = torch.full((outer, inner + pad), float("nan"), dtype=getattr(torch, TORCH[element])).cuda()
    stored = storage[:, :inner]
    return stored if layout is R else stored.t()


TORCH = {D.float16: "float16", D.bfloat16: "bfloat16", D.float32: "float32"}


def _reference(op, A, B, C, alpha, beta, activation_args=()):
    x = alpha * (A @ B) + (beta * C if C is not None else 0.0)
    functor = op.epilogue_functor
    if functor.kind == "LinearCombinationClamp":
        limit = sm90_suite.CLAMP_LIMITS[op.C.element][1]
        return np.clip(x, -limit, limit)
    if functor.activation is not None:
        x = cutlass.epilogue.activations.reference(functor.activation.name, x, *activation_args)
    return x


def _check(op, got, reference):
    got = got.double().cpu().numpy()
    tolerance = TOLERANCE[op.C.element]
    if op.epilogue_functor.kind == "LinearCombinationClamp":
        limit = sm90_suite.CLAMP_LIMITS[op.C.element][1]
        saturated = np.abs(reference) >= limit
        assert np.array_equal(got[saturated], reference[saturated]), "values beyond the range must be clamped"
        got, reference = got[~saturated], reference[~saturated]
    error = relative_error(got, reference)
    assert error < tolerance, f"relative error {error} (tolerance {tolerance})"


def run_array(op, m, n, k, batch, form="list", mode=Mode.Array, use_c=True, alpha=1.25, beta=0.5, seed=0, pad=0,
              inf_in_c=False, activation_args=(), **knobs):
    """D_i = epilogue(alpha * A_i @ B_i + beta * C_i) for i < batch; returns the arguments."""
    generator = torch.Generator().manual_seed(seed)
    out = op.C.element
    entries = batch if mode in (Mode.Array, Mode.Batched) else 1
    A = [_random(m, k, op.A.layout, op.A.element, generator, pad) for _ in range(entries)]
    B = [_random(k, n, op.B.layout, op.B.element, generator, pad) for _ in range(entries)]
    C = [_random(m, n, op.C.layout, out, generator, pad) for _ in range(entries)] if use_c else None
    if C is not None and inf_in_c:
        for tensor, _ in C:
            tensor[0, 0], tensor[m - 1, n - 1] = float("inf"), float("-inf")
        C = [(tensor, tensor.double().cpu().numpy()) for tensor, _ in C]
    if form == "list":
        Ds = [_poisoned(m, n, op.C.layout, out, pad) for _ in range(entries)]
        args = [[t for t, _ in A], [t for t, _ in B], [t for t, _ in C] if C else None, Ds]
    else:  # tensors holding the batch, each in the operation's layout (pad ignored)
        def stack(items, layout):
            tensors = [t for t, _ in items]
            if entries == 1:
                return tensors[0]
            return torch.stack(tensors) if layout is R else torch.stack([t.t() for t in tensors]).transpose(1, 2)

        shape = (entries, m, n) if op.C.layout is R else (entries, n, m)
        D_all = torch.full(shape, float("nan"), dtype=getattr(torch, TORCH[out])).cuda()
        D_all = D_all if op.C.layout is R else D_all.transpose(1, 2)
        Ds = list(D_all)
        args = [stack(A, op.A.layout), stack(B, op.B.layout), stack(C, op.C.layout) if C else None,
                D_all if entries > 1 else Ds[0]]
    if not use_c:
        beta = 0.0
    arguments = cutlass.GemmArguments(op, GemmCoord(m, n, k), *args,
                                      output_op=op.epilogue_type(alpha, beta, *activation_args), gemm_mode=mode,
                                      batch=batch if mode is not Mode.Gemm else 1, **knobs)
    op.run(arguments)
    arguments.sync()
    for i in range(entries):
        reference = _reference(op, A[i][1], B[i][1], C[i][1] if C else None, alpha, beta, activation_args)
        _check(op, Ds[i], reference)
    return arguments


SIZES = [(256, 512, 128, 4), (1000, 3000, 520, 3), (264, 136, 2056, 5), (8, 4096, 256, 6), (64, 64, 8, 7),
         (1, 1024, 64, 2)]


@pytest.mark.parametrize("name", sorted(ARRAY_OPS))
@pytest.mark.parametrize("size", SIZES, ids=lambda s: "x".join(map(str, s)))
def test_lists_of_matrices(name, size):
    op = ARRAY_OPS[name]
    m, n, k, batch = size
    contiguous = [(m if op.A.layout is CM else k, 8), (n if op.B.layout is R else k, 8),
                  (m if op.C.layout is CM else n, op.C.alignment)]
    if any(extent % alignment for extent, alignment in contiguous):
        pytest.skip("TMA needs each operand's contiguous extent aligned to 16 bytes")
    run_array(op, m, n, k, batch)


@pytest.mark.parametrize("name", sorted(ARRAY_OPS))
def test_tensor_forms_batched_gemm_padding_and_no_c(name):
    op = ARRAY_OPS[name]
    run_array(op, 264, 136, 520, 3, form="tensor")  # PyCUTLASS's Array form: base + i * batch stride
    run_array(op, 264, 136, 520, 3, form="tensor", mode=Mode.Batched, seed=1)
    run_array(op, 264, 136, 520, 1, form="tensor", mode=Mode.Gemm, seed=2)
    run_array(op, 264, 136, 520, 4, pad=8, seed=3)  # padded leading dimensions (device views)
    run_array(op, 264, 136, 520, 4, use_c=False, seed=4)


def test_many_entries_and_empty_problems():
    op = ARRAY_OPS["f16_tnt_coop"]
    run_array(op, 64, 72, 40, 300)
    arguments = run_array(op, 0, 64, 64, 3)  # empty M: nothing launches
    assert arguments.threadblock_count == 0
    run_array(op, 64, 0, 64, 3)


@pytest.mark.parametrize("raster,swizzle,sm_count", [("along_m", 1, None), ("along_n", 4, None),
                                                     ("heuristic", 8, 20), (None, 2, 2)])
def test_runtime_knobs(raster, swizzle, sm_count):
    for name in ("f16_tnt_coop", "bf16_ntn_pp_c2x1_relu"):
        arguments = run_array(ARRAY_OPS[name], 1000, 1000, 264, 3, raster_order=raster, swizzle=swizzle,
                              sm_count=sm_count)
        assert 0 < arguments.threadblock_count <= (sm_count or arguments.device.sm_count)


def test_clamp_to_the_output_range():
    """LinearCombinationClamp in the pointer-array kernel: +-inf in C become bf16's largest finite values."""
    op = ARRAY_OPS["bf16_ttt_pp_clamp"]
    run_array(op, 264, 136, 520, 3, inf_in_c=True)
    run_array(op, 264, 136, 520, 2, inf_in_c=True, form="tensor", seed=1)


def test_reused_arguments_and_new_tensors():
    op = ARRAY_OPS["bf16_ntn_pp_c2x1_relu"]
    arguments = run_array(op, 512, 256, 128, 3)
    op.run(arguments)  # the same arguments again: the tensormap slots are rewritten by the kernel
    arguments.sync()
    for seed in (5, 6):  # new tensors of the same shape
        run_array(op, 512, 256, 128, 3, seed=seed)


def test_ordinary_operations_run_array_tensors_batched():
    """Without array=True, Mode.Array with tensors holding the batch runs in the L mode; lists are refused."""
    generator = torch.Generator().manual_seed(9)
    m, n, k, batch = 300, 200, 64, 4
    A = torch.randn((batch, m, k), generator=generator).to(torch.bfloat16).cuda()
    B = torch.randn((batch, n, k), generator=generator).to(torch.bfloat16).cuda().transpose(1, 2)
    C = torch.randn((batch, m, n), generator=generator).to(torch.bfloat16).cuda()
    D_ = torch.full((batch, m, n), float("nan"), dtype=torch.bfloat16).cuda()
    arguments = cutlass.GemmArguments(ORDINARY, GemmCoord(m, n, k), A, B, C, D_,
                                      output_op=ORDINARY.epilogue_type(1.25, 0.5), gemm_mode=Mode.Array, batch=batch)
    assert arguments.gemm_mode is Mode.Batched
    ORDINARY.run(arguments)
    arguments.sync()
    reference = 1.25 * (A.double() @ B.double()) + 0.5 * C.double()
    assert relative_error(D_.double().cpu().numpy(), reference.cpu().numpy()) < TOLERANCE[D.bfloat16]
    with pytest.raises(cutlass.ArgumentError, match="array=True"):
        cutlass.GemmArguments(ORDINARY, GemmCoord(m, n, k), list(A), list(B), list(C), list(D_),
                              gemm_mode=Mode.Array, batch=batch)


def test_cubins_hold_real_kernels_and_no_traps():
    scan_cubins(ARRAY_OPS.values())
