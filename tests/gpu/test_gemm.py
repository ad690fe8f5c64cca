"""GEMM on the GPU against float64 references: data types x layouts, epilogues, modes, swizzles, odd sizes,
alignments, both backends and every tensor library. Outputs are NaN-poisoned before each run."""
from __future__ import annotations

import numpy as np
import pytest

import pycutlass as cutlass
from pycutlass.gemm import GemmCoord, Mode

from .conftest import precompile_module, relative_error
from .gemm_cases import (CM, CMI32, CONFIGS, RI32, D, R, check_integer, deinterleave, epilogue_reference, make_op,
                         poisoned_output, random_values, to_float64, to_tensor)

pytestmark = pytest.mark.gpu

LAYOUTS = [(a, b, c) for a in (R, CM) for b in (R, CM) for c in (R, CM)]


def _layout_id(layouts):
    return "".join("t" if x is R else "n" for x in layouts)


# --- the operations this module runs -------------------------------------------------------------------------
DTYPE_LAYOUT = [(cfg, lay) for cfg in ("f16", "bf16", "tf32", "f64", "f32_simt") for lay in LAYOUTS]
DTYPE_LAYOUT += [(cfg, (R, CM, R)) for cfg in ("f16acc16", "f16_1688", "bf16_1688", "f32_ma", "f32_fast_f32",
                                                "f32_fast_f16", "f32_fast_bf16", "f64_simt")]
DTYPE_LAYOUT += [("f32_simt", (CM, R, CM)), ("f64_simt", (CM, CM, R))]
ACTIVATIONS = ["relu", "leaky_relu", "tanh", "sigmoid", "silu", "hardswish", "gelu", "gelu_taylor"]
SWIZZLES = [cutlass.IdentitySwizzle1, cutlass.IdentitySwizzle2, cutlass.IdentitySwizzle4, cutlass.IdentitySwizzle8]


def _op_dtype(cfg, layouts):
    return make_op(cfg, layouts)


INT8_OPS = {
    "s8_clamp_s8out": make_op("s8", (R, CM, R), out=D.int8, out_align=8, epilogue="clamp"),
    "s8_fastclamp": make_op("s8", (R, CM, R), out=D.int8, out_align=8, epilogue="fastclamp"),
    "s8_s32out": make_op("s8", (R, CM, R), out=D.int32, out_align=4),
    "s8_s32out_colC": make_op("s8", (R, CM, CM), out=D.int32, out_align=4),
    "s8_interleaved": make_op("s8", (CMI32, RI32, CMI32), out=D.int8, out_align=8, epilogue="clamp"),
}
ALIGNMENT_OPS = {  # (config, alignment, stages): narrow accesses need the 2-stage pipeline for 16-bit types
    "f16_a1": make_op("f16", align=1, stages=2, out_align=1),
    "f16_a2": make_op("f16", align=2, out_align=2),
    "f16_a4": make_op("f16", align=4, out_align=4),
    "f16_a8": make_op("f16", align=8, out_align=8),
    "tf32_a1": make_op("tf32", align=1, out_align=1),
    "bf16_a2": make_op("bf16", align=2, out_align=2),
}
F16 = make_op("f16")
F16_BATCHED = make_op("f16", swizzle=cutlass.BatchedIdentitySwizzle)
F16_F32OUT = make_op("f16", out=D.float32, out_align=4)  # parallel split-K partials in f32
REDUCTION = cutlass.ReductionOperation(cutlass.MatrixCoord(4, 32 * 8), cutlass.TensorDescription(D.float16, R, 8),
                                       D.float32, D.float32, D.float32, count=8)
REDUCTION_RELU = cutlass.ReductionOperation(
    cutlass.MatrixCoord(4, 32 * 8), cutlass.TensorDescription(D.float16, R, 8), D.float32, D.float32, D.float32,
    cutlass.LinearCombinationGeneric(cutlass.relu(D.float32), D.float16, 8, D.float32, D.float32), count=8)
ACT_OPS = {name: make_op("f16", activation=name) for name in ACTIVATIONS}
ACT_OPS["clamp"] = make_op("f16", epilogue="clamp")
# Parallel split-K partials in the GEMM's own 16-bit output type, reduced by reductions that read that type
PARTIALS_OPS = {"f16": make_op("f16"), "bf16": make_op("bf16", (R, CM, R))}
PARTIALS_REDUCTIONS = {name: cutlass.ReductionOperation(
    cutlass.MatrixCoord(4, 32 * 8), cutlass.TensorDescription(op.C.element, R, 8), D.float32, op.C.element, D.float32,
    count=8) for name, op in PARTIALS_OPS.items()}
SWIZZLE_OPS = {s.name: make_op("f16", swizzle=s) for s in SWIZZLES}
NVRTC_OPS = {"f16": make_op("f16"), "bf16_nt": make_op("bf16", (CM, R, CM)), "s8": INT8_OPS["s8_s32out"],
             "f64": make_op("f64", (R, R, R))}

NVCC_OPS = ([_op_dtype(c, lay) for c, lay in DTYPE_LAYOUT] + list(INT8_OPS.values()) + list(ALIGNMENT_OPS.values())
            + [F16, F16_BATCHED, F16_F32OUT, REDUCTION, REDUCTION_RELU] + list(ACT_OPS.values())
            + list(PARTIALS_OPS.values()) + list(PARTIALS_REDUCTIONS.values())
            + list(SWIZZLE_OPS.values()))


@pytest.fixture(scope="module", autouse=True)
def compiled(memory_pool):
    precompile_module(NVCC_OPS, NVRTC_OPS.values())
    yield


def run_gemm(op, m, n, k, lib="torch", alpha=1.25, beta=-0.5, activation_args=(), with_c=True, seed=0,
             mode=Mode.Gemm, split_k=1, c_vector=False):
    rng = np.random.default_rng(seed)
    storage = op.A.element
    a = random_values(rng, (m, k), storage)
    b = random_values(rng, (k, n), storage)
    out = op.C.element
    c = random_values(rng, (n,) if c_vector else (m, n), out) if with_c else None
    A = to_tensor(a, storage, op.A.layout, lib)
    # Interleaved int8 kernels read B's columns in their own order (cutlass::reorder_column<32>): GemmArguments puts
    # B (in natural order) into it in a copy, as PyCUTLASS did (tests/gpu/test_pycutlass_args_compat.py: reordered=True).
    B = to_tensor(b, storage, op.B.layout, lib)
    C = None
    if c is not None:
        C = to_tensor(c, out, R, lib) if c_vector and lib != "numpy" else \
            (np.ascontiguousarray(c.astype(np.float16 if out is D.float16 else np.float32)) if c_vector else
             to_tensor(c, out, op.C.layout, lib))
    Dt = poisoned_output((m, n), out, op.C.layout, lib)
    args = cutlass.GemmArguments(op, GemmCoord(m, n, k), A, B, C, Dt, op.epilogue_type(alpha, beta, *activation_args),
                                 gemm_mode=mode, split_k_slices=split_k)
    op.run(args)
    args.sync()
    got = to_float64(Dt)
    if op.C.layout is CMI32:
        got = deinterleave(got.reshape(-1), CMI32, m, n)
    accumulator = a @ b
    reference = epilogue_reference(op, accumulator, (c if c is not None else None), alpha,
                                   beta if c is not None else 0.0, activation_args)
    return got, reference


def assert_close(op, got, reference, tol):
    if op.C.element.is_integer:
        assert check_integer(got, reference, op), f"max |diff| {np.abs(got - reference).max()}"
    else:
        error = relative_error(got, reference)
        assert error < tol, f"relative error {error:.3e} >= {tol:.1e} for {op.describe()}"


def _tol(cfg, op):
    tol = CONFIGS[cfg]["tol"]
    if op.C.element is D.float16:
        tol = max(tol, 2e-3)
    if op.C.element is D.bfloat16:
        tol = max(tol, 1.5e-2)
    return tol


@pytest.mark.parametrize("cfg,layouts", DTYPE_LAYOUT, ids=[f"{c}-{_layout_id(lay)}" for c, lay in DTYPE_LAYOUT])
def test_dtype_layout(cfg, layouts):
    op = _op_dtype(cfg, layouts)
    align = CONFIGS[cfg]["align"]
    m, n, k = 200 + 3 * align, 136, 96 + 2 * align  # partial tiles in M, N and K
    got, ref = run_gemm(op, m, n, k)
    assert_close(op, got, ref, _tol(cfg, op))


@pytest.mark.parametrize("name", list(INT8_OPS))
def test_int8(name):
    op = INT8_OPS[name]
    k = 128 if name == "s8_fastclamp" else 320
    got, ref = run_gemm(op, 256, 192, k, alpha=1.0 if op.C.element is D.int32 else 0.25,
                        beta=1.0 if op.C.element is D.int32 else 0.5)
    assert_close(op, got, ref, 0)


@pytest.mark.parametrize("name", list(ALIGNMENT_OPS))
def test_alignment_and_odd_sizes(name):
    op = ALIGNMENT_OPS[name]
    a = op.A.alignment
    m, n, k = 131 * a, 77 * a, 45 * a  # odd multiples of the alignment
    got, ref = run_gemm(op, m, n, k)
    assert_close(op, got, ref, 2e-3 if op.C.element is D.float16 else (1.5e-2 if op.C.element is D.bfloat16 else 5e-3))


@pytest.mark.parametrize("name", list(ACT_OPS))
def test_epilogue(name):
    op = ACT_OPS[name]
    args = (0.2,) if name == "leaky_relu" else ()
    got, ref = run_gemm(op, 256, 128, 64, alpha=0.5, beta=0.25, activation_args=args)
    assert_close(op, got, ref, 3e-3)


def test_bias_vector_broadcast():
    op = ACT_OPS["relu"]
    got, ref = run_gemm(op, 264, 136, 64, alpha=1.0, beta=1.0, c_vector=True)
    assert_close(op, got, ref, 3e-3)


def test_bias_expanded_view():
    import torch

    op = F16
    m, n, k = 130, 72, 64
    rng = np.random.default_rng(1)
    a, b, bias = (random_values(rng, s, D.float16) for s in ((m, k), (k, n), (n,)))
    A, B = to_tensor(a, D.float16, R, "torch"), to_tensor(b, D.float16, CM, "torch")
    C = torch.from_numpy(bias).half().cuda().expand(m, n)  # stride (0, 1): ldc = 0
    Dt = poisoned_output((m, n), D.float16, R, "torch")
    args = cutlass.GemmArguments(op, (m, n, k), A, B, C, Dt, op.epilogue_type(1.0, 1.0))
    op.run(args)
    args.sync()
    assert_close(op, to_float64(Dt), a @ b + bias, 2e-3)


@pytest.mark.parametrize("name", list(SWIZZLE_OPS))
def test_swizzle(name):
    op = SWIZZLE_OPS[name]
    got, ref = run_gemm(op, 1000, 1104, 64)  # many tiles in both directions
    assert_close(op, got, ref, 2e-3)


@pytest.mark.parametrize("lib", ["torch", "numpy", "cupy", "torch_cpu"])
def test_tensor_libraries(lib):
    if lib == "cupy":
        pytest.importorskip("cupy")
    got, ref = run_gemm(F16, 192, 64, 128, lib=lib)
    assert_close(F16, got, ref, 2e-3)


def test_dlpack_input():
    import torch

    class DLPackOnly:
        def __init__(self, t):
            self.t = t

        def __dlpack__(self, **kwargs):
            return self.t.__dlpack__(**kwargs)

        def __dlpack_device__(self):
            return self.t.__dlpack_device__()

    rng = np.random.default_rng(2)
    m, n, k = 64, 64, 64
    a, b = random_values(rng, (m, k), D.float16), random_values(rng, (k, n), D.float16)
    A, B = DLPackOnly(to_tensor(a, D.float16, R, "torch")), DLPackOnly(to_tensor(b, D.float16, CM, "torch"))
    Dt = torch.full((m, n), float("nan"), dtype=torch.float16, device="cuda")
    args = cutlass.GemmArguments(F16, (m, n, k), A, B, None, Dt)
    F16.run(args)
    args.sync()
    assert_close(F16, to_float64(Dt), a @ b, 2e-3)


@pytest.mark.parametrize("split_k", [2, 3, 7])
def test_serial_split_k(split_k):
    got, ref = run_gemm(F16, 272, 136, 1024 + 64, split_k=split_k)
    assert_close(F16, got, ref, 2e-3)


# Serial split-K over every kind of output: each K slice but the first adds its product to what the slice before
# wrote to D, and the epilogue's activation runs on the last slice only.
SERIAL_SPLIT_K_OPS = {"bf16": _op_dtype("bf16", (R, CM, R)), "tf32": _op_dtype("tf32", (CM, R, R)),
                      "f64": _op_dtype("f64", (R, R, R)), "f32_simt": _op_dtype("f32_simt", (R, CM, R)),
                      "gelu": ACT_OPS["gelu"], "leaky_relu": ACT_OPS["leaky_relu"], "clamp_f16": ACT_OPS["clamp"],
                      "s8_s32out": INT8_OPS["s8_s32out"]}


@pytest.mark.parametrize("name", list(SERIAL_SPLIT_K_OPS))
def test_serial_split_k_every_output(name):
    op = SERIAL_SPLIT_K_OPS[name]
    alpha, beta = (1.0, 2.0) if op.C.element.is_integer else (1.25, -0.5)
    got, ref = run_gemm(op, 200, 136, 1024, alpha=alpha, beta=beta,
                        activation_args=(0.2,) if name == "leaky_relu" else (), split_k=3)
    assert_close(op, got, ref, 3e-3 if op.C.element is D.float16 else _tol(
        {"bf16": "bf16", "tf32": "tf32", "f64": "f64", "f32_simt": "f32_simt"}.get(name, "f16"), op))


def test_serial_split_k_reuse_resets_semaphores():
    """Semaphores reset themselves; running the same arguments twice must stay correct."""
    import torch

    m, n, k = 256, 256, 2048
    rng = np.random.default_rng(3)
    a, b = random_values(rng, (m, k), D.float16), random_values(rng, (k, n), D.float16)
    A, B = to_tensor(a, D.float16, R, "torch"), to_tensor(b, D.float16, CM, "torch")
    Dt = poisoned_output((m, n), D.float16, R, "torch")
    args = cutlass.GemmArguments(F16, (m, n, k), A, B, None, Dt, split_k_slices=4)
    for _ in range(3):
        Dt.fill_(float("nan"))
        F16.run(args)
        args.sync()
        assert_close(F16, to_float64(Dt), a @ b, 2e-3)
    del torch


def run_f16_split_k_parallel(m, n, k, split_k, seed):
    """Random f16 operands, D poisoned, the float32 partials of F16_F32OUT written: (a, b, c, C, D, arguments)."""
    rng = np.random.default_rng(seed)
    a, b = random_values(rng, (m, k), D.float16), random_values(rng, (k, n), D.float16)
    c = random_values(rng, (m, n), D.float16)
    A, B, C = (to_tensor(x, D.float16, lay, "torch") for x, lay in ((a, R), (b, CM), (c, R)))
    Dt = poisoned_output((m, n), D.float16, R, "torch")
    args = cutlass.GemmArguments(F16_F32OUT, (m, n, k), A, B, C, Dt, gemm_mode=Mode.GemmSplitKParallel,
                                 split_k_slices=split_k)
    F16_F32OUT.run(args)
    return a, b, c, C, Dt, args


@pytest.mark.parametrize("split_k,reduction", [(2, "plain"), (5, "plain"), (4, "relu")])
def test_parallel_split_k(split_k, reduction):
    red = REDUCTION if reduction == "plain" else REDUCTION_RELU
    m, n, k = 264, 256, 1000 + 8
    a, b, c, C, Dt, args = run_f16_split_k_parallel(m, n, k, split_k, seed=4)
    reduction_args = cutlass.ReductionArguments(red, [m, n], split_k, args, Dt, C, red.epilogue_type(1.5, -0.5))
    red.run(reduction_args)
    reduction_args.sync()
    ref = 1.5 * (a @ b) - 0.5 * c
    if reduction == "relu":
        ref = np.maximum(ref, 0)
    assert_close(F16_F32OUT if reduction == "plain" else ACT_OPS["relu"], to_float64(Dt), ref, 2e-3)


@pytest.mark.parametrize("k,split_k", [(8, 5), (24, 4), (40, 7)])
def test_parallel_split_k_with_fewer_k_chunks_than_slices(k, split_k, monkeypatch):
    """CUTLASS cuts K into chunks of whole 128-bit accesses (8 f16 values), so K=8 in 5 slices is one chunk: only
    one workspace slice is written. The reduction still sums all five: the others must be zeros, even in memory
    that held NaN before (every fresh allocation is filled with 0xFF bytes here)."""
    from pycutlass.runtime import driver
    from pycutlass.runtime.tensors import DeviceTensors

    allocate = DeviceTensors.allocate

    def poisoned_allocate(self, nbytes):
        address = allocate(self, nbytes)
        driver.memset_d8(address, 0xFF, max(int(nbytes), 1), self.stream)
        return address

    monkeypatch.setattr(DeviceTensors, "allocate", poisoned_allocate)
    m, n = 72, 256
    a, b, c, C, Dt, args = run_f16_split_k_parallel(m, n, k, split_k, seed=7)
    reduction_args = cutlass.ReductionArguments(REDUCTION, [m, n], split_k, args.ptr_D, Dt, C,
                                                REDUCTION.epilogue_type(1.5, -0.5))
    REDUCTION.run(reduction_args)
    reduction_args.sync()
    assert_close(F16_F32OUT, to_float64(Dt), 1.5 * (a @ b) - 0.5 * c, 2e-3)


@pytest.mark.parametrize("name", list(PARTIALS_OPS))
def test_parallel_split_k_partials_in_the_output_type(name):
    """PyCUTLASS's flow (workspace=arguments.ptr_D) on a GEMM whose partials are 16-bit: a reduction reading them as
    its default float32 workspace is refused; one built with element_workspace = the output type is exact."""
    op, red = PARTIALS_OPS[name], PARTIALS_REDUCTIONS[name]
    element = op.C.element
    m, n, k, split_k = 200, 136, 960, 3
    rng = np.random.default_rng(6)
    a, b, c = (random_values(rng, shape, element) for shape in ((m, k), (k, n), (m, n)))
    A, B, C = (to_tensor(x, element, lay, "torch") for x, lay in ((a, R), (b, CM), (c, R)))
    Dt = poisoned_output((m, n), element, R, "torch")
    args = cutlass.GemmArguments(op, (m, n, k), A, B, C, Dt, gemm_mode=Mode.GemmSplitKParallel, split_k_slices=split_k)
    default = cutlass.ReductionOperation(cutlass.MatrixCoord(4, 32 * 8), cutlass.TensorDescription(element, R, 8),
                                         D.float32, count=8)
    with pytest.raises(cutlass.ArgumentError, match=f"partial results are {element.label}"):
        cutlass.ReductionArguments(default, [m, n], split_k, args.ptr_D, Dt, C, default.epilogue_type(1.5, -0.5))
    op.run(args)
    reduction_args = cutlass.ReductionArguments(red, [m, n], split_k, args.ptr_D, Dt, C, red.epilogue_type(1.5, -0.5))
    red.run(reduction_args)
    reduction_args.sync()
    assert_close(op, to_float64(Dt), 1.5 * (a @ b) - 0.5 * c, 3e-3 if element is D.float16 else 1.5e-2)


@pytest.mark.parametrize("form", ["3d", "packed", "broadcast_b"])
def test_batched(form):
    import torch

    batch, m, n, k = 5, 136, 72, 64
    rng = np.random.default_rng(5)
    a = random_values(rng, (batch, m, k), D.float16)
    b = random_values(rng, (1 if form == "broadcast_b" else batch, k, n), D.float16)
    c = random_values(rng, (batch, m, n), D.float16)
    A = torch.from_numpy(a).half().cuda()
    Bt = torch.from_numpy(np.ascontiguousarray(np.swapaxes(b, 1, 2))).half().cuda().transpose(1, 2)  # column-major
    if form == "broadcast_b":
        Bt = Bt.expand(batch, k, n)  # batch stride 0
    C = torch.from_numpy(c).half().cuda()
    Dt = torch.full((batch, m, n), float("nan"), dtype=torch.float16, device="cuda")
    if form == "packed":
        A, C, Dt = A.reshape(-1), C.reshape(-1), Dt.reshape(-1)
        Bt = Bt.transpose(1, 2).contiguous().reshape(-1)  # packed column-major B
    args = cutlass.GemmArguments(F16_BATCHED, (m, n, k), A, Bt, C, Dt, F16_BATCHED.epilogue_type(1.0, 1.0),
                                 gemm_mode=Mode.Batched, batch=batch)
    F16_BATCHED.run(args)
    args.sync()
    assert_close(F16, to_float64(Dt).reshape(batch, m, n), a @ b + c, 2e-3)



@pytest.mark.parametrize("batch", [65535, 65536, 70000])
def test_batches_up_to_the_grid_limit_run_and_more_are_refused(batch):
    """CUTLASS's batched swizzle keeps batch % 65536 grid layers: 65536 batches would write nothing, 70000 only
    4464 of them."""
    import torch

    m, n, k = 16, 24, 32
    A = torch.randn(batch, m, k, device="cuda").half()
    Bt = torch.randn(batch, n, k, device="cuda").half().transpose(1, 2)  # column-major
    C = torch.randn(batch, m, n, device="cuda").half()
    Dt = torch.full((batch, m, n), float("nan"), dtype=torch.float16, device="cuda")
    args = lambda: cutlass.GemmArguments(F16_BATCHED, (m, n, k), A, Bt, C, Dt, F16_BATCHED.epilogue_type(1.0, 1.0),
                                         gemm_mode=Mode.Batched, batch=batch)
    if batch > 65535:
        with pytest.raises(cutlass.ArgumentError, match=f"batch {batch} exceeds 65535"):
            F16_BATCHED.run(args())
        assert torch.isnan(Dt).all()
        return
    arguments = args()
    F16_BATCHED.run(arguments)
    arguments.sync()
    reference = A.double() @ Bt.double() + C.double()
    assert_close(F16, Dt.double().cpu().numpy(), reference.cpu().numpy(), 2e-3)


def test_a_reversed_batch_view_steps_back_through_memory():
    """cupy's a[::-1]: the batch stride is negative and the address that of the view's first batch."""
    cupy = pytest.importorskip("cupy")
    batch, m, n, k = 3, 40, 48, 64
    rng = np.random.default_rng(8)
    a = random_values(rng, (batch, m, k), D.float16)
    b = random_values(rng, (batch, k, n), D.float16)
    A = cupy.asarray(np.ascontiguousarray(a[::-1], np.float16))[::-1]  # a's batches in reverse order
    Bt = cupy.asarray(np.ascontiguousarray(np.swapaxes(b, 1, 2), np.float16)).transpose(0, 2, 1)  # col-major
    Dt = cupy.full((batch, m, n), cupy.nan, dtype=cupy.float16)
    assert A.strides[0] < 0
    args = cutlass.GemmArguments(F16_BATCHED, (m, n, k), A, Bt, None, Dt, F16_BATCHED.epilogue_type(1.0, 0.0),
                                 gemm_mode=Mode.Batched, batch=batch)
    F16_BATCHED.run(args)
    args.sync()
    assert_close(F16, cupy.asnumpy(Dt).astype(np.float64), a @ b, 2e-3)


def test_an_output_past_two_to_the_31_elements():
    """D of 65544 x 32768 (2**31 + 2**18 elements, 4.3 GB): offsets into it need 64 bits."""
    import torch

    m, n, k = 65544, 32768, 16
    if torch.cuda.mem_get_info()[0] < 12 * 2**30:
        pytest.skip("needs about 5 GB of free GPU memory")
    generator = torch.Generator(device="cuda").manual_seed(9)
    A = torch.randn(m, k, device="cuda", generator=generator).half()
    Bt = torch.randn(n, k, device="cuda", generator=generator).half().t()  # column-major
    Dt = torch.full((m, n), float("nan"), dtype=torch.float16, device="cuda")
    args = cutlass.GemmArguments(F16, (m, n, k), A, Bt, None, Dt, F16.epilogue_type(1.0, 0.0))
    F16.run(args)
    args.sync()
    rows = torch.tensor([0, 1, 31337, 65535, 65536, m - 2, m - 1], device="cuda")  # row 65536 starts past 2**31
    reference = A[rows].double() @ Bt.double()
    assert_close(F16, Dt[rows].double().cpu().numpy(), reference.cpu().numpy(), 2e-3)
    assert not torch.isnan(Dt).any()
    del Dt

def test_array():
    import torch

    batch, m, n, k = 4, 96, 80, 64
    rng = np.random.default_rng(6)
    mats = [(random_values(rng, (m, k), D.float16), random_values(rng, (k, n), D.float16)) for _ in range(batch)]
    As = [to_tensor(a, D.float16, R, "torch") for a, _ in mats]
    Bs = [to_tensor(b, D.float16, CM, "torch") for _, b in mats]
    Ds = [poisoned_output((m, n), D.float16, R, "torch") for _ in range(batch)]
    args = cutlass.GemmArguments(F16_BATCHED, (m, n, k), As, Bs, None, Ds, gemm_mode=Mode.Array, batch=batch)
    F16_BATCHED.run(args)
    args.sync()
    for (a, b), Dt in zip(mats, Ds):
        assert_close(F16, to_float64(Dt), a @ b, 2e-3)
    del torch


@pytest.mark.parametrize("name", list(NVRTC_OPS))
def test_nvrtc_backend(name):
    op = NVRTC_OPS[name]
    cutlass.compiler.nvrtc()
    try:
        assert cutlass.compiler.Compiler.of().lookup(op) is not None
        k = 320 if op.A.element is D.int8 else 96
        got, ref = run_gemm(op, 256, 128, k, alpha=1.0, beta=1.0)
        tol = 0 if op.C.element.is_integer else (1e-12 if op.C.element is D.float64 else 1.5e-2)
        assert_close(op, got, ref, tol)
    finally:
        cutlass.compiler.nvcc()


@pytest.mark.parametrize("m,n,k", [(0, 64, 64), (64, 0, 64), (96, 64, 0), (1, 8, 8), (7, 16, 8)])
def test_degenerate_sizes(m, n, k):
    got, ref = run_gemm(F16, m, n, k)
    if m and n:
        assert_close(F16, got, ref, 2e-3)


def test_stream_argument():
    import torch

    stream = torch.cuda.Stream()
    rng = np.random.default_rng(7)
    m, n, k = 128, 128, 64
    a, b = random_values(rng, (m, k), D.float16), random_values(rng, (k, n), D.float16)
    A, B = to_tensor(a, D.float16, R, "torch"), to_tensor(b, D.float16, CM, "torch")
    Dt = poisoned_output((m, n), D.float16, R, "torch")
    torch.cuda.synchronize()
    args = cutlass.GemmArguments(F16, (m, n, k), A, B, None, Dt, stream=stream)
    assert args.stream == stream.cuda_stream
    F16.run(args)
    args.sync()
    assert_close(F16, to_float64(Dt), a @ b, 2e-3)


def test_reused_arguments_see_new_inputs():
    """run() with reused arguments reads the tensors' current contents (device tensors are not copied)."""
    import torch

    m, n, k = 128, 64, 64
    rng = np.random.default_rng(8)
    a = random_values(rng, (m, k), D.float16)
    b1, b2 = random_values(rng, (k, n), D.float16), random_values(rng, (k, n), D.float16)
    A, B = to_tensor(a, D.float16, R, "torch"), to_tensor(b1, D.float16, CM, "torch")
    Dt = poisoned_output((m, n), D.float16, R, "torch")
    args = cutlass.GemmArguments(F16, (m, n, k), A, B, None, Dt)
    F16.run(args)
    args.sync()
    assert_close(F16, to_float64(Dt), a @ b1, 2e-3)
    B.copy_(to_tensor(b2, D.float16, CM, "torch"))
    Dt.fill_(float("nan"))
    F16.run(args)
    args.sync()
    assert_close(F16, to_float64(Dt), a @ b2, 2e-3)
    del torch


def test_misaligned_device_pointer_rejected():
    import torch

    m, n, k = 64, 64, 64
    base = torch.zeros(m * k + 1, dtype=torch.float16, device="cuda")
    A = base[1:].view(m, k)  # 2-byte offset: not 16-byte aligned
    B = torch.zeros(n, k, dtype=torch.float16, device="cuda").t()
    Dt = torch.zeros(m, n, dtype=torch.float16, device="cuda")
    with pytest.raises(cutlass.ArgumentError, match="aligned"):
        cutlass.GemmArguments(F16, (m, n, k), A, B, None, Dt)


def test_arguments_for_another_operation_rejected():
    import torch

    A = torch.zeros(64, 64, dtype=torch.float16, device="cuda")
    B = torch.zeros(64, 64, dtype=torch.float16, device="cuda").t()
    Dt = torch.zeros(64, 64, dtype=torch.float16, device="cuda")
    args = cutlass.GemmArguments(F16, (64, 64, 64), A, B, None, Dt)
    with pytest.raises(cutlass.ArgumentError, match="built for"):
        ACT_OPS["relu"].run(args)
