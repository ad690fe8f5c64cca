"""SM90 (CUTLASS 3.x) GEMM on the GPU against float64 references: data types x layouts x kernel schedules x tile
schedulers x clusters x epilogues (bias + every activation), odd sizes, K below a tile, M = 1, batched L > 1, the
runtime knobs, and the Params fast path. Outputs are NaN-poisoned before every run; torch tensors throughout."""
from __future__ import annotations

import numpy as np
import pytest

import pycutlass as cutlass
from pycutlass import EpilogueScheduleType as ES
from pycutlass import KernelScheduleType as KS
from pycutlass import TileSchedulerType as TS
from pycutlass.gemm import GemmCoord, Mode

from .conftest import precompile_module, relative_error, scan_cubins

try:
    import torch
except ImportError:  # CPU machines collect (and skip) this module; OPS stay importable for precompiling
    torch = None
pytestmark = [pytest.mark.gpu, pytest.mark.skipif(torch is None, reason="needs torch")]

D = cutlass.DataType
R, CM = cutlass.RowMajor, cutlass.ColumnMajor
TORCH = {D.float16: "float16", D.bfloat16: "bfloat16", D.float32: "float32", D.int8: "int8", D.int32: "int32",
         D.float8_e4m3: "float8_e4m3fn", D.float8_e5m2: "float8_e5m2"}
TOLERANCE = {D.float16: 2e-3, D.bfloat16: 1.5e-2, D.float32: 1e-5, D.float8_e4m3: 8e-2, D.float8_e5m2: 1.5e-1}


def sm90_op(element=D.float16, layouts=(R, CM, R), out=None, acc=None, tile=(128, 128, 64), cluster=(1, 1, 1),
            kernel=KS.Auto, epilogue_schedule=ES.Auto, scheduler=TS.Default, stages=0, activation=None, bias=None,
            element_b=None, clamp=None, epilogue_tile=None):
    out = out or (D.int32 if element is D.int8 else element if element.bits == 16 else D.float32)
    acc = acc or (D.int32 if element is D.int8 else D.float32)
    element_b = element_b or element
    k = {16: 16, 32: 8, 8: 32}[element.bits]
    memory = D.float32 if element is D.tfloat32 else element
    math = cutlass.MathInstruction([64, tile[1], k], element, element_b, acc, cutlass.OpClass.TensorOp)
    tile_description = cutlass.TileDescription(list(tile), stages, None, math, cluster_shape=list(cluster),
                                               kernel_schedule=kernel, epilogue_schedule=epilogue_schedule,
                                               tile_scheduler=scheduler, epilogue_tile=epilogue_tile)
    a = cutlass.TensorDescription(memory, layouts[0], 128 // memory.bits)
    b = cutlass.TensorDescription(D.float32 if element_b is D.tfloat32 else element_b, layouts[1],
                                  128 // (32 if element_b is D.tfloat32 else element_b.bits))
    c = cutlass.TensorDescription(out, layouts[2], 128 // out.bits)
    if clamp == "fast":
        functor = cutlass.FastLinearCombinationClamp(out, c.alignment)
    elif clamp:
        functor = cutlass.LinearCombinationClamp(out, c.alignment, acc, D.float32)
    elif activation is None:
        functor = cutlass.LinearCombination(out, c.alignment, acc, D.float32)
    else:
        functor = cutlass.LinearCombinationGeneric(getattr(cutlass, activation)(D.float32), out, c.alignment, acc,
                                                   D.float32)
    return cutlass.GemmOperationUniversal(90, tile_description, a, b, c, functor, bias=bias)


LAYOUTS = [(a, b, c) for a in (R, CM) for b in (R, CM) for c in (R, CM)]
SCHEDULES = [  # (kernel schedule, tile, cluster): every layout meets every schedule once
    (KS.TmaWarpSpecializedCooperative, (128, 128, 64), (1, 1, 1)),
    (KS.TmaWarpSpecializedPingpong, (64, 128, 64), (1, 1, 1)),
    (KS.TmaWarpSpecialized, (64, 128, 64), (1, 1, 1)),
    (KS.TmaWarpSpecializedCooperative, (128, 128, 64), (2, 1, 1)),
    (KS.TmaWarpSpecializedCooperative, (128, 256, 64), (1, 2, 1)),
    (KS.TmaWarpSpecializedPingpong, (128, 128, 64), (2, 1, 1)),
    (KS.TmaWarpSpecialized, (128, 64, 64), (1, 2, 1)),
    (KS.TmaWarpSpecializedCooperative, (256, 128, 64), (1, 1, 1)),
]
LAYOUT_OPS = {f"f16_{''.join('t' if x is R else 'n' for x in lay)}_{k.name}_{t[0]}x{t[1]}_c{c[0]}x{c[1]}":
              sm90_op(D.float16, lay, tile=t, cluster=c, kernel=k)
              for lay, (k, t, c) in zip(LAYOUTS, SCHEDULES)}
TYPE_OPS = {
    "bf16_coop": sm90_op(D.bfloat16, (R, CM, R)),
    "bf16_pp_nnt_f32out": sm90_op(D.bfloat16, (CM, CM, R), out=D.float32, tile=(64, 128, 64),
                                  kernel=KS.TmaWarpSpecializedPingpong),
    "f16_acc16_ws": sm90_op(D.float16, (R, R, CM), acc=D.float16, tile=(64, 128, 64), kernel=KS.TmaWarpSpecialized),
    "tf32_coop": sm90_op(D.tfloat32, (R, CM, R), out=D.float32, tile=(128, 128, 32)),
    "e4m3_bf16out_coop_fa": sm90_op(D.float8_e4m3, (R, CM, R), out=D.bfloat16, tile=(128, 128, 128),
                                    kernel=KS.TmaWarpSpecializedCooperativeFP8FastAccum),
    "e4m3e5m2_f16out_pp": sm90_op(D.float8_e4m3, (R, CM, CM), out=D.float16, tile=(64, 128, 128),
                                  kernel=KS.TmaWarpSpecializedPingpong, element_b=D.float8_e5m2),
    "e4m3_f32out_ws_fa": sm90_op(D.float8_e4m3, (R, CM, R), out=D.float32, tile=(64, 128, 128),
                                 kernel=KS.TmaWarpSpecializedFP8FastAccum),
    "s8_s32out_coop": sm90_op(D.int8, (R, CM, R), tile=(128, 128, 128)),
    "s8_s8out_pp": sm90_op(D.int8, (R, CM, R), out=D.int8, tile=(64, 128, 128), kernel=KS.TmaWarpSpecializedPingpong),
    "f16_streamk": sm90_op(D.float16, (R, CM, R), scheduler=TS.StreamK),
    "bf16_streamk_c2x1": sm90_op(D.bfloat16, (CM, R, R), scheduler=TS.StreamK, cluster=(2, 1, 1)),
    "f16_nosmem": sm90_op(D.float16, (R, CM, CM), epilogue_schedule=ES.NoSmemWarpSpecialized),
    "f16_stages4": sm90_op(D.float16, (R, CM, R), stages=4),
}
ACTIVATIONS = ["relu", "leaky_relu", "tanh", "sigmoid", "silu", "hardswish", "gelu", "gelu_taylor"]
EPILOGUE_OPS = {f"{act}_bias{bias or 'none'}": sm90_op(D.float16, (R, CM, R if i % 2 else CM), activation=act,
                                                       bias=bias, kernel=KS.TmaWarpSpecializedPingpong if i % 3 == 2
                                                       else KS.Auto, tile=(64, 128, 64) if i % 3 == 2
                                                       else (128, 128, 64))
                for i, (act, bias) in enumerate(zip(ACTIVATIONS, ["row", "column", None, "row", "column", None, "row",
                                                                    "column"]))}
EPILOGUE_OPS["identity_biascolumn"] = sm90_op(D.bfloat16, (R, CM, R), bias="column")
EPILOGUE_OPS["identity_biasrow_streamk"] = sm90_op(D.float16, (R, CM, R), bias="row", scheduler=TS.StreamK)
# LinearCombinationClamp / FastLinearCombinationClamp: int8 -> int8 (the common use), int32, f16 and bf16 outputs.
CLAMP_OPS = {
    "s8_s8out_clamp_coop": sm90_op(D.int8, (R, CM, R), out=D.int8, tile=(128, 128, 128), clamp=True),
    "s8_s8out_fastclamp_pp": sm90_op(D.int8, (R, CM, R), out=D.int8, tile=(64, 128, 128),
                                     kernel=KS.TmaWarpSpecializedPingpong, clamp="fast"),
    "s8_s8out_clamp_ws_biasrow_cm": sm90_op(D.int8, (R, CM, CM), out=D.int8, tile=(64, 128, 128),
                                            kernel=KS.TmaWarpSpecialized, bias="row", clamp=True),
    "s8_s32out_clamp_coop_c2x1": sm90_op(D.int8, (R, CM, R), out=D.int32, tile=(128, 128, 128), cluster=(2, 1, 1),
                                         clamp=True),
    "f16_clamp_coop_c1x2": sm90_op(D.float16, (R, CM, R), cluster=(1, 2, 1), clamp=True),
    "bf16_clamp_pp_biascolumn": sm90_op(D.bfloat16, (CM, R, CM), tile=(64, 128, 64),
                                        kernel=KS.TmaWarpSpecializedPingpong, bias="column", clamp=True),
}
OPS = {**LAYOUT_OPS, **TYPE_OPS, **EPILOGUE_OPS, **CLAMP_OPS}


@pytest.fixture(scope="module", autouse=True)
def _compiled():
    precompile_module((), OPS.values())


# --- helpers -------------------------------------------------------------------------------------------------
def _dtype(element):
    return getattr(torch, TORCH[element])


def _random(shape, element, generator):
    if element is D.int8:
        return torch.randint(-4, 5, shape, generator=generator, dtype=torch.int8).cuda()
    values = torch.randn(shape, generator=generator, dtype=torch.float32)
    if element.is_fp8:
        values = values.clamp(-6, 6)
    return values.to(_dtype(D.float32 if element is D.tfloat32 else element)).cuda()


def _matrix(rows, cols, layout, element, generator, batch=1):
    """A (batch,) rows x cols matrix stored in ``layout``; returns (tensor to pass, float64 logical view)."""
    if layout is R:
        stored = _random((batch, rows, cols), element, generator)
        logical = stored
    else:
        stored = _random((batch, cols, rows), element, generator)
        logical = stored.transpose(1, 2)
    tensor = logical if batch > 1 else logical[0]  # logical shape; a ColumnMajor operand is a transposed view
    return tensor, logical.double().cpu().numpy()


def _poisoned(rows, cols, layout, element, batch=1):
    shape = (batch, rows, cols) if layout is R else (batch, cols, rows)
    fill = float("nan") if element.is_float else -77
    tensor = torch.full(shape, fill, dtype=torch.float32).to(_dtype(element)).cuda()
    tensor = tensor if layout is R else tensor.transpose(1, 2)
    return tensor if batch > 1 else tensor[0]


def _logical(tensor, layout, batch=1):
    t = tensor if batch > 1 else tensor.unsqueeze(0)
    return t.double().cpu().numpy()


def _reference(op, A, B, C, alpha, beta, bias=None, activation_args=()):
    x = alpha * np.matmul(A, B) + (beta * C if C is not None else 0.0)
    if bias is not None:
        x = x + (bias[:, :, None] if op.bias == "row" else bias[:, None, :])
    functor = op.epilogue_functor
    if functor.activation is not None:
        x = cutlass.epilogue.activations.reference(functor.activation.name, x, *activation_args)
    return x


def _check(op, got, reference):
    out = op.C.element
    if out.is_integer:
        info = np.iinfo(np.int8 if out is D.int8 else np.int32)
        expected = np.clip(np.rint(reference), info.min, info.max) if out is D.int8 else np.rint(reference)
        assert np.array_equal(got, expected), f"max difference {np.abs(got - expected).max()}"
        return
    operand = op.tile_description.math_instruction.element_a
    tolerance = max(TOLERANCE.get(out, 1e-3), TOLERANCE.get(operand, 1e-3) if operand.is_fp8 else 0.0,
                    2e-3 if operand is D.tfloat32 else 0.0)
    if op.tile_description.math_instruction.element_accumulator is D.float16:
        tolerance = 1e-2
    error = relative_error(got, reference)
    assert error < tolerance, f"relative error {error} (tolerance {tolerance})"


def run_case(op, m, n, k, batch=1, alpha=1.25, beta=0.5, seed=0, use_c=True, bias=False, activation_args=(),
             rerun_on_garbage_workspace=False, **knobs):
    generator = torch.Generator().manual_seed(seed)
    A, A64 = _matrix(m, k, op.A.layout, op.tile_description.math_instruction.element_a, generator, batch)
    B, B64 = _matrix(k, n, op.B.layout, op.tile_description.math_instruction.element_b, generator, batch)
    out = op.C.element
    if out.is_integer:
        alpha, beta = (1.0, 1.0) if out is D.int32 else (0.25, 1.0)
    C, C64 = _matrix(m, n, op.C.layout, out, generator, batch) if use_c else (None, None)
    if not use_c:
        beta = 0.0
    vector = None
    bias64 = None
    if bias:
        length = m if op.bias == "row" else n
        vector = _random((batch, length) if batch > 1 else (length,), out, generator)
        bias64 = vector.double().cpu().numpy().reshape(batch, length)
    D_ = _poisoned(m, n, op.C.layout, out, batch)
    mode = Mode.Batched if batch > 1 else Mode.Gemm
    arguments = cutlass.GemmArguments(op, GemmCoord(m, n, k), A, B, C, D_,
                                      output_op=op.epilogue_type(alpha, beta, *activation_args), gemm_mode=mode,
                                      batch=batch, bias=vector, **knobs)
    op.run(arguments)
    arguments.sync()
    reference = _reference(op, A64, B64, C64, alpha, beta, bias64, activation_args)
    _check(op, _logical(D_, op.C.layout, batch), reference)
    if rerun_on_garbage_workspace and arguments.workspace_bytes:
        # Again on the same Arguments, with D poisoned and every workspace byte 0xFF (the reduction tiles NaN):
        # run() must zero what has to start at zero (stream-K's barriers) and nothing else may matter.
        from pycutlass.runtime import driver

        driver.memset_d8(arguments.workspace, 0xFF, arguments.workspace_bytes, arguments.stream)
        D_.copy_(_poisoned(m, n, op.C.layout, out, batch))
        op.run(arguments)
        arguments.sync()
        _check(op, _logical(D_, op.C.layout, batch), reference)
    return arguments


SIZES = [(256, 512, 128), (1000, 3000, 520), (257, 136, 2056), (1, 4096, 256), (8, 1024, 1024), (64, 64, 8)]


@pytest.mark.parametrize("name", sorted(LAYOUT_OPS))
@pytest.mark.parametrize("size", [(256, 512, 128), (1000, 3000, 520), (264, 136, 2056), (8, 4096, 256)],
                         ids=lambda s: "x".join(map(str, s)))
def test_layouts_and_schedules(name, size):
    run_case(OPS[name], *size)


def tma_aligned_size(op, m, n, k):
    """(m, n, k) with K rounded up to 16 bytes (K-contiguous operands need it); skips the case where another
    operand's contiguous extent is not 16-byte aligned, which TMA cannot describe."""
    alignment = 128 // op.A.element.bits
    k = -(-k // alignment) * alignment
    contiguous = [(m if op.A.layout is CM else k, op.A.alignment), (n if op.B.layout is R else k, op.B.alignment),
                  (m if op.C.layout is CM else n, op.C.alignment)]
    if any(extent % alignment for extent, alignment in contiguous):
        pytest.skip("TMA needs each operand's contiguous extent aligned to 16 bytes")
    return m, n, k


@pytest.mark.parametrize("name", sorted(TYPE_OPS))
@pytest.mark.parametrize("size", SIZES, ids=lambda s: "x".join(map(str, s)))
def test_types_schedulers_epilogue_schedules(name, size):
    op = OPS[name]
    run_case(op, *tma_aligned_size(op, *size))


@pytest.mark.parametrize("name", sorted(EPILOGUE_OPS))
def test_epilogues(name):
    op = OPS[name]
    args = (0.1,) if op.epilogue_functor.activation and op.epilogue_functor.activation.name == "leaky_relu" else ()
    run_case(op, 520, 264, 136, bias=op.bias is not None, activation_args=args)
    run_case(op, 128, 128, 64, batch=3, bias=op.bias is not None, activation_args=args, seed=1)


@pytest.mark.parametrize("name", ["f16_streamk", "bf16_streamk_c2x1", "identity_biasrow_streamk"])
@pytest.mark.parametrize("splits,decomposition", [(1, None), (3, "split_k"), (2, None), (1, "stream_k"),
                                                 (1, "data_parallel")])
def test_stream_k(name, splits, decomposition):
    op = OPS[name]
    arguments = run_case(op, 384, 256, 4096, split_k_slices=splits, decomposition=decomposition,
                         bias=op.bias is not None, rerun_on_garbage_workspace=True)
    launch = arguments.prepared()
    if launch.workspace_bytes:  # the barriers come last and are all that is zeroed per launch
        assert 0 < launch.workspace_zero_bytes < launch.workspace_bytes


def test_batched_and_no_c():
    op = OPS["bf16_coop"]
    run_case(op, 300, 200, 64, batch=4)
    run_case(op, 300, 200, 64, use_c=False)
    run_case(op, 0, 200, 64)  # an empty problem launches nothing
    run_case(op, 64, 0, 64)


@pytest.mark.parametrize("raster,swizzle,sm_count", [("along_m", 1, None), ("along_n", 4, None),
                                                     ("heuristic", 8, 20), (None, 2, 2)])
def test_runtime_knobs(raster, swizzle, sm_count):
    for op in (OPS["bf16_coop"], list(LAYOUT_OPS.values())[3], OPS["f16_streamk"]):
        run_case(op, 1000, 3000, 520, raster_order=raster, swizzle=swizzle, sm_count=sm_count)


def test_seen_shape_reuses_params_without_builder():
    op = OPS["bf16_coop"]
    first = run_case(op, 512, 256, 128, seed=3)
    loaded = first._loaded_op
    launches = loaded.builder_launches
    for seed in range(4, 7):  # new tensors, same shape: cached Params, descriptors patched with the new addresses
        run_case(op, 512, 256, 128, seed=seed)
    assert loaded.builder_launches == launches or loaded.verifying


BF16_MAX = float(np.frombuffer(np.array([0x7F7F0000], dtype=np.uint32).tobytes(), dtype=np.float32)[0])
CLAMP_LIMITS = {D.int8: (-128.0, 127.0), D.int32: (-2147483648.0, 2147483647.0), D.float16: (-65504.0, 65504.0),
                D.bfloat16: (-BF16_MAX, BF16_MAX)}


def run_clamp_case(op, m, n, k, batch=1, alpha=1.0, beta=1.0, seed=0, bias=False):
    """D = clamp(alpha * A @ B + beta * C (+ bias)) to the output type's range, then converted (rounded to nearest
    even for integers). Float outputs get +-inf planted in C and a large alpha (f16), so the clamp decides values."""
    generator = torch.Generator().manual_seed(seed)
    math = op.tile_description.math_instruction
    A, A64 = _matrix(m, k, op.A.layout, math.element_a, generator, batch)
    B, B64 = _matrix(k, n, op.B.layout, math.element_b, generator, batch)
    out = op.C.element
    C, C64 = _matrix(m, n, op.C.layout, out, generator, batch)
    if out.is_float:
        Cv = C if batch > 1 else C.unsqueeze(0)
        Cv[:, 0, 0], Cv[:, m - 1, n - 1] = float("inf"), float("-inf")
        C64 = Cv.double().cpu().numpy()
    vector = bias64 = None
    if bias:
        length = m if op.bias == "row" else n
        vector = _random((batch, length) if batch > 1 else (length,), out, generator)
        bias64 = vector.double().cpu().numpy().reshape(batch, length)
    D_ = _poisoned(m, n, op.C.layout, out, batch)
    arguments = cutlass.GemmArguments(op, GemmCoord(m, n, k), A, B, C, D_, output_op=op.epilogue_type(alpha, beta),
                                      gemm_mode=Mode.Batched if batch > 1 else Mode.Gemm, batch=batch, bias=vector)
    op.run(arguments)
    arguments.sync()
    with np.errstate(invalid="ignore"):
        reference = _reference(op, A64, B64, C64, alpha, beta, bias64)
    check_clamped(op, _logical(D_, op.C.layout, batch), reference)
    return arguments


def check_clamped(op, got, reference):
    out = op.C.element
    low, high = CLAMP_LIMITS[out]
    clamped = np.clip(reference, low, high)
    if out.is_integer:
        expected = np.clip(np.rint(clamped), low, high)
        assert np.array_equal(got, expected), f"max difference {np.abs(got - expected).max()}"
        if out is D.int8:
            assert np.mean((expected == low) | (expected == high)) > 0.02, "the case does not reach the clamp"
        return
    assert np.all(np.isfinite(got)), "an output is not finite (NaN poison left, or not clamped)"
    saturated = np.abs(reference) >= high
    assert saturated.any() and np.array_equal(got[saturated], np.sign(reference[saturated]) * high), \
        "values beyond the output range must be clamped to its largest finite value"
    error = relative_error(got[~saturated], clamped[~saturated])
    tolerance = TOLERANCE[out]
    assert error < tolerance, f"relative error {error} (tolerance {tolerance})"


@pytest.mark.parametrize("name", sorted(CLAMP_OPS))
def test_clamp_epilogues(name):
    """int8 sums over K = 528 (> 256: FastLinearCombinationClamp is exact for every K on SM90) overflow int8 often;
    f16 gets alpha = 3000 (most values beyond 65504) and both float types +-inf in C."""
    op = OPS[name]
    alpha = 3000.0 if op.C.element is D.float16 else 1.0
    for size, batch in (((512, 272, 528), 1), ((1008, 1008, 256), 1), ((128, 144, 256), 3)):
        run_clamp_case(op, *size, batch=batch, alpha=alpha, bias=op.bias is not None, seed=batch)


def test_bad_inputs_are_rejected_before_launch():
    op = OPS["bf16_coop"]
    A = torch.randn(64, 64, device="cuda").to(torch.bfloat16)
    B = torch.randn(64, 64, device="cuda").to(torch.bfloat16).t()
    C = torch.randn(64, 64, device="cuda").to(torch.bfloat16)
    odd = torch.randn(64, 66, device="cuda").to(torch.bfloat16)[:, :63]  # leading dimension 66: not 16-byte aligned
    with pytest.raises(cutlass.ArgumentError):
        cutlass.GemmArguments(op, GemmCoord(64, 63, 64), A, B, C[:, :63], odd)
    with pytest.raises(cutlass.ArgumentError, match="array=True"):  # lists need the pointer-array kernel
        cutlass.GemmArguments(op, GemmCoord(64, 64, 64), [A], [B], [C], [C], gemm_mode=Mode.Array, batch=1)
    with pytest.raises(cutlass.ArgumentError, match="stream-K"):
        cutlass.GemmArguments(op, GemmCoord(64, 64, 64), A, B, C, C, split_k_slices=2)
    with pytest.raises(cutlass.ArgumentError, match="bias"):
        cutlass.GemmArguments(OPS["identity_biascolumn"], GemmCoord(64, 64, 64), A, B, C, C)
    with pytest.raises(cutlass.ArgumentError, match="decomposition"):
        cutlass.GemmArguments(OPS["f16_streamk"], GemmCoord(64, 64, 64), A.half(), B.half(), C.half(), C.half(),
                              split_k_slices=2, decomposition="stream_k")
    with pytest.raises(cutlass.ArgumentError, match="cluster"):
        cutlass.GemmArguments(list(LAYOUT_OPS.values())[3], GemmCoord(64, 64, 64), A.half(), B.half(),
                              C.half(), C.half(), sm_count=1)


def test_cubins_hold_real_kernels_and_no_traps():
    """NVRTC without a native __int128 compiles CUTLASS's 128-bit division to a trap, and some constexpr collectives
    can compile to an empty kernel: neither may reach a user. Scans the SASS of every operation here."""
    scan_cubins(OPS.values())
