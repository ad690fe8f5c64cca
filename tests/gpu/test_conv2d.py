"""Conv2d on the GPU against float64 torch references: fprop / dgrad / wgrad x iterator algorithms x stride support x
data types (f16, bf16, tf32, f32 SIMT, f64 tensor op and SIMT, int8 NHWC and NC32HW32), padding / stride /
dilation variety and odd channel counts, serial and parallel split-K (with the ReductionOperation), a bias + relu
epilogue, convolution mode, torch channels_last / NHWC, numpy and cupy tensors, and the NVRTC backend.

References are computed with torch on float64 CPU tensors (``torch.nn.functional.conv2d``,
``torch.nn.grad.conv2d_input`` / ``conv2d_weight``) from exactly the values the kernel reads. Outputs are
NaN-poisoned (int8: -77) before each run.
"""
from __future__ import annotations

import numpy as np
import pytest

import pycutlass as cutlass
from pycutlass.conv import (Conv2dProblemSize, IteratorAlgorithm, Mode, Operator, SplitKMode, StrideSupport,
                            reorder_interleaved_filter)
from pycutlass.kinds.conv2d.operation import Conv2dOperation

from .conftest import precompile_module, relative_error
from .gemm_cases import check_integer, epilogue_reference, random_values

pytestmark = pytest.mark.gpu

D = cutlass.DataType
F16, BF16, F32, TF32, F64, S8, S32 = D.float16, D.bfloat16, D.float32, D.tfloat32, D.float64, D.int8, D.int32
NHWC, NC32HW32, C32RSK32 = cutlass.TensorNHWC, cutlass.TensorNC32HW32, cutlass.TensorC32RSK32
TensorOp, Simt = cutlass.OpClass.TensorOp, cutlass.OpClass.Simt
MO = cutlass.MathOperation
FPROP, DGRAD, WGRAD = Operator.fprop, Operator.dgrad, Operator.wgrad
ANALYTIC, OPTIMIZED = IteratorAlgorithm.analytic, IteratorAlgorithm.optimized
FIXED, FEW = IteratorAlgorithm.fixed_channels, IteratorAlgorithm.few_channels
STRIDED, UNITY = StrideSupport.Strided, StrideSupport.Unity

# Per data type: instruction, tile, stages, warps, operand alignment and relative-error tolerance.
CONFIGS = {
    "f16": dict(inst=[16, 8, 16], el=F16, acc=F32, cls=TensorOp, math=MO.multiply_add, tile=[128, 128, 32],
                stages=3, warps=[2, 2, 1], align=8, tol=2e-3),
    "bf16": dict(inst=[16, 8, 16], el=BF16, acc=F32, cls=TensorOp, math=MO.multiply_add, tile=[128, 128, 32],
                 stages=3, warps=[2, 2, 1], align=8, tol=2e-2),
    "tf32": dict(inst=[16, 8, 8], el=TF32, acc=F32, cls=TensorOp, math=MO.multiply_add, tile=[128, 128, 16],
                 stages=4, warps=[2, 2, 1], align=4, tol=5e-3),
    "f32_simt": dict(inst=[1, 1, 1], el=F32, acc=F32, cls=Simt, math=MO.multiply_add, tile=[128, 128, 8],
                     stages=4, warps=[4, 2, 1], align=1, tol=1e-5),
    "f64": dict(inst=[8, 8, 4], el=F64, acc=F64, cls=TensorOp, math=MO.multiply_add, tile=[64, 64, 16],
                stages=3, warps=[2, 2, 1], align=1, tol=1e-12),
    "f64_simt": dict(inst=[1, 1, 1], el=F64, acc=F64, cls=Simt, math=MO.multiply_add, tile=[64, 64, 8],
                     stages=3, warps=[2, 2, 1], align=1, tol=1e-12),
    "s8": dict(inst=[16, 8, 32], el=S8, acc=S32, cls=TensorOp, math=MO.multiply_add_saturate, tile=[128, 128, 64],
               stages=3, warps=[2, 2, 1], align=16, tol=0),
}
TOLERANCES = {F16: 2e-3, BF16: 2e-2}  # at least this for outputs stored in these types


def storage(element):
    return F32 if element is TF32 else element


def conv_op(kind, algorithm, cfg, stride_support=STRIDED, swizzle=None, out=None, out_align=None, align=None,
            stages=None, tile=None, warps=None, activation=None, epilogue=None, interleaved=False):
    """A Conv2dOperation (sm80) from a CONFIGS entry. Output in the operand type unless ``out`` says otherwise."""
    c = CONFIGS[cfg]
    math = cutlass.MathInstruction(c["inst"], c["el"], c["el"], c["acc"], c["cls"], c["math"])
    td = cutlass.TileDescription(tile or c["tile"], stages or c["stages"], warps or c["warps"], math)
    element = storage(c["el"])
    a = align or c["align"]
    out = out or element
    out_align = out_align or min(128 // out.bits, max(a * element.bits // out.bits, 1))
    layouts = (NC32HW32, C32RSK32, NC32HW32) if interleaved else (NHWC, NHWC, NHWC)
    A = cutlass.TensorDescription(element, layouts[0], a)
    B = cutlass.TensorDescription(element, layouts[1], a)
    C = cutlass.TensorDescription(out, layouts[2], out_align)
    compute = F64 if c["acc"] is F64 else F32
    if activation is not None:
        ep = cutlass.LinearCombinationGeneric(getattr(cutlass, activation)(compute), out, out_align, c["acc"], compute)
    elif epilogue == "clamp":
        ep = cutlass.LinearCombinationClamp(out, out_align, c["acc"], compute)
    else:
        ep = cutlass.LinearCombination(out, out_align, c["acc"], compute)
    if swizzle is None:
        strided_dgrad = kind is DGRAD and stride_support is STRIDED
        swizzle = cutlass.StridedDgradIdentitySwizzle1 if strided_dgrad else cutlass.IdentitySwizzle1
    return Conv2dOperation(kind, algorithm, 80, td, A, B, C, stride_support, ep, swizzle)


# --- the operations this module runs -------------------------------------------------------------------------
CONV_OPS = {
    # fprop: every iterator algorithm, Strided and Unity epilogues, every data type
    "fprop_f16_opt": conv_op(FPROP, OPTIMIZED, "f16"),
    "fprop_f16_opt_unity_sw4": conv_op(FPROP, OPTIMIZED, "f16", UNITY, cutlass.IdentitySwizzle4, tile=[64, 64, 32],
                                       stages=4),
    "fprop_f16_analytic_f32out": conv_op(FPROP, ANALYTIC, "f16", out=F32, tile=[128, 64, 32]),  # + parallel split-K
    "fprop_f16_analytic_a1": conv_op(FPROP, ANALYTIC, "f16", align=1, stages=2, tile=[128, 64, 32]),
    "fprop_f16_opt_a2": conv_op(FPROP, OPTIMIZED, "f16", align=2, tile=[64, 64, 32]),
    "fprop_f16_fixed_a4": conv_op(FPROP, FIXED, "f16", align=4, out_align=8, tile=[128, 64, 32]),
    "fprop_f16_few_a2": conv_op(FPROP, FEW, "f16", align=2, out_align=8, tile=[128, 64, 32]),
    "fprop_tf32_few_a1": conv_op(FPROP, FEW, "tf32", align=1, out_align=4, tile=[128, 64, 16]),
    "fprop_f16_relu": conv_op(FPROP, OPTIMIZED, "f16", activation="relu"),
    "fprop_bf16_opt": conv_op(FPROP, OPTIMIZED, "bf16", tile=[128, 128, 64]),
    "fprop_tf32_opt_unity": conv_op(FPROP, OPTIMIZED, "tf32", UNITY),
    "fprop_f32_simt_analytic": conv_op(FPROP, ANALYTIC, "f32_simt"),
    "fprop_f32_simt_opt": conv_op(FPROP, OPTIMIZED, "f32_simt"),
    "fprop_f64_opt": conv_op(FPROP, OPTIMIZED, "f64"),
    "fprop_s8_opt_clamp": conv_op(FPROP, OPTIMIZED, "s8", out=S8, out_align=8, epilogue="clamp"),
    "fprop_s8_analytic_s32out": conv_op(FPROP, ANALYTIC, "s8", out=S32, out_align=4),
    "fprop_s8_il_opt": conv_op(FPROP, OPTIMIZED, "s8", out=S8, out_align=8, epilogue="clamp", interleaved=True),
    "fprop_s8_il_analytic": conv_op(FPROP, ANALYTIC, "s8", out=S8, out_align=8, epilogue="clamp", interleaved=True),
    # dgrad: Unity (stride 1) and the strided-dgrad kernel, analytic and optimized
    "dgrad_f16_opt_unity": conv_op(DGRAD, OPTIMIZED, "f16", UNITY, cutlass.IdentitySwizzle2),
    "dgrad_f16_analytic_unity": conv_op(DGRAD, ANALYTIC, "f16", UNITY),
    "dgrad_f16_opt_strided": conv_op(DGRAD, OPTIMIZED, "f16"),
    "dgrad_f16_analytic_strided_sw4": conv_op(DGRAD, ANALYTIC, "f16", swizzle=cutlass.StridedDgradIdentitySwizzle4),
    "dgrad_f16_opt_unity_f32out": conv_op(DGRAD, OPTIMIZED, "f16", UNITY, out=F32),  # parallel split-K partials
    "dgrad_f16_analytic_a1_unity": conv_op(DGRAD, ANALYTIC, "f16", UNITY, align=1, stages=2, tile=[128, 64, 32]),
    "dgrad_bf16_opt_strided": conv_op(DGRAD, OPTIMIZED, "bf16"),
    "dgrad_tf32_opt_unity": conv_op(DGRAD, OPTIMIZED, "tf32", UNITY),
    "dgrad_f32_simt_analytic_strided": conv_op(DGRAD, ANALYTIC, "f32_simt"),
    "dgrad_f32_simt_opt_unity": conv_op(DGRAD, OPTIMIZED, "f32_simt", UNITY),
    "dgrad_f64_opt_strided": conv_op(DGRAD, OPTIMIZED, "f64"),
    # PyCUTLASS 2.11's example (run_all_example.sh): tf32, 128x128x16, 3 stages, alignment 4, f32 output
    "dgrad_tf32_opt_strided_s3": conv_op(DGRAD, OPTIMIZED, "tf32", stages=3),
    # wgrad (StrideSupport has no effect)
    "wgrad_f16_opt": conv_op(WGRAD, OPTIMIZED, "f16"),
    "wgrad_f16_analytic": conv_op(WGRAD, ANALYTIC, "f16", tile=[128, 64, 32]),
    "wgrad_f16_opt_f32out": conv_op(WGRAD, OPTIMIZED, "f16", out=F32),  # parallel split-K partials
    "wgrad_bf16_opt": conv_op(WGRAD, OPTIMIZED, "bf16"),
    "wgrad_tf32_opt": conv_op(WGRAD, OPTIMIZED, "tf32"),
    "wgrad_tf32_analytic_a1": conv_op(WGRAD, ANALYTIC, "tf32", align=1, out_align=1, tile=[64, 64, 16]),
    "wgrad_f32_simt_opt": conv_op(WGRAD, OPTIMIZED, "f32_simt"),
    "wgrad_f64_opt": conv_op(WGRAD, OPTIMIZED, "f64"),
    "wgrad_f64_simt_analytic": conv_op(WGRAD, ANALYTIC, "f64_simt"),
}
# Parallel split-K: f32 partials -> f16 D = epilogue(alpha * sum + beta * C).
REDUCTION = cutlass.ReductionOperation(
    cutlass.MatrixCoord(4, 32 * 8), cutlass.TensorDescription(F16, cutlass.RowMajor, 8), F32, F32, F32, count=8)
REDUCTION_RELU = cutlass.ReductionOperation(
    cutlass.MatrixCoord(4, 32 * 8), cutlass.TensorDescription(F16, cutlass.RowMajor, 8), F32, F32, F32,
    cutlass.LinearCombinationGeneric(cutlass.relu(F32), F16, 8, F32, F32), count=8)
# A TensorNHWC reduction takes the convolution's own 4-D tensors (channels_last) in place of (M, N) views.
REDUCTION_NHWC = cutlass.ReductionOperation(
    cutlass.MatrixCoord(4, 32 * 8), cutlass.TensorDescription(F16, cutlass.TensorNHWC, 8), F32, F32, F32, count=8)
NVRTC_OPS = {"fprop_f16_opt": CONV_OPS["fprop_f16_opt"]}

NVCC_OPS = list(CONV_OPS.values()) + [REDUCTION, REDUCTION_RELU, REDUCTION_NHWC]


@pytest.fixture(scope="module", autouse=True)
def compiled(memory_pool):
    precompile_module(NVCC_OPS, NVRTC_OPS.values())
    yield


# --- problems, tensors and references ----------------------------------------------------------------------------
def problem(n, h, w, c, k, r, s, pad=(1, 1), stride=(1, 1), dilation=(1, 1), split_k=1, mode=Mode.cross_correlation):
    """``pad``: (pad_h, pad_w) applied on both sides, or (pad_h, upper_pad_h, pad_w, upper_pad_w)."""
    pad = (pad[0], pad[0], pad[1], pad[1]) if len(pad) == 2 else tuple(pad)
    return Conv2dProblemSize((n, h, w, c), (k, r, s, c), pad, stride, dilation, mode, split_k, 1)


TORCH_DTYPES = {F16: "float16", BF16: "bfloat16", F32: "float32", F64: "float64", S8: "int8", S32: "int32"}
NUMPY_DTYPES = {F16: np.float16, F32: np.float32, F64: np.float64, S8: np.int8, S32: np.int32}
LIBS = ("torch", "torch_nhwc", "torch_cpu", "numpy", "cupy")


def to_lib(values, element, lib):
    """float64 values (NHWC 4-D, a 1-D vector, or an interleaved 5-D block) -> a tensor of ``lib``.

    "torch" / "torch_cpu": 4-D tensors as torch NCHW in channels_last memory; "torch_nhwc": contiguous NHWC on the
    GPU; "numpy": contiguous NHWC host arrays; "cupy": contiguous NHWC device arrays.
    """
    element = storage(element)
    values = np.ascontiguousarray(values)
    if lib in ("numpy", "cupy"):
        if element is BF16:
            raise ValueError("numpy/cupy have no bfloat16 here")
        array = values.astype(NUMPY_DTYPES[element])
        if lib == "numpy":
            return array
        import cupy

        return cupy.asarray(array)
    import torch

    t = torch.from_numpy(values).to(getattr(torch, TORCH_DTYPES[element]))
    channels_last = values.ndim == 4 and lib in ("torch", "torch_cpu")
    if channels_last:
        t = t.permute(0, 3, 1, 2)  # NCHW view of NHWC memory: channels_last
    if lib != "torch_cpu":
        t = t.cuda()
        if channels_last:
            t = t.contiguous(memory_format=torch.channels_last)
    return t


def poisoned(shape, element, lib):
    filler = np.full(shape, np.nan if element.is_float else -77.0)
    return to_lib(filler, element, lib)


def from_lib(tensor, lib):
    """A tensor made by ``to_lib`` -> float64 numpy in the order it was given (NHWC / 1-D / 5-D)."""
    if lib in ("torch", "torch_cpu") and tensor.dim() == 4:
        tensor = tensor.permute(0, 2, 3, 1)
    if hasattr(tensor, "detach"):
        return tensor.detach().cpu().double().numpy()
    if type(tensor).__module__.startswith("cupy"):
        return tensor.get().astype(np.float64)
    return np.asarray(tensor, dtype=np.float64)


def conv_reference(kind, ps, a, b):
    """The float64 convolution (torch on the CPU) of NHWC operands ``a`` and ``b`` of the implicit GEMM, in NHWC."""
    import torch
    import torch.nn.functional as F

    def nchw(x):
        return torch.from_numpy(np.ascontiguousarray(x, dtype=np.float64)).permute(0, 3, 1, 2)

    stride, dilation = (ps.stride_h, ps.stride_w), (ps.dilation_h, ps.dilation_w)
    if kind is FPROP:
        x, w = nchw(a), nchw(b)
        if ps.mode is Mode.convolution:
            w = w.flip(2, 3)
        x = F.pad(x, (ps.pad_w, ps.upper_pad_w, ps.pad_h, ps.upper_pad_h))
        y = F.conv2d(x, w, stride=stride, dilation=dilation)
    else:
        assert (ps.pad_h, ps.pad_w) == (ps.upper_pad_h, ps.upper_pad_w) and ps.mode is Mode.cross_correlation
        padding = (ps.pad_h, ps.pad_w)
        if kind is DGRAD:  # a: output gradient NPQK, b: filter KRSC -> input gradient NHWC
            y = torch.nn.grad.conv2d_input((ps.N, ps.C, ps.H, ps.W), nchw(b), nchw(a), stride, padding, dilation)
        else:  # a: output gradient NPQK, b: activation NHWC -> filter gradient KRSC
            y = torch.nn.grad.conv2d_weight(nchw(b), (ps.K, ps.C, ps.R, ps.S), nchw(a), stride, padding, dilation)
    return y.permute(0, 2, 3, 1).contiguous().numpy()


def tolerance(op) -> float:
    element = op.tile_description.math_instruction.element_a
    tol = CONFIGS[{F16: "f16", BF16: "bf16", TF32: "tf32", F32: "f32_simt", F64: "f64", S8: "s8"}[element]]["tol"]
    return max(tol, TOLERANCES.get(op.C.element, 0.0))


def assert_close(op, got, reference, tol=None):
    assert got.shape == reference.shape, (got.shape, reference.shape)
    if op.C.element.is_integer:
        assert check_integer(got, reference, op), f"max |diff| {np.abs(got - reference).max()} for {op.describe()}"
    else:
        tol = tolerance(op) if tol is None else tol
        error = relative_error(got, reference)
        assert error < tol, f"relative error {error:.3e} >= {tol:.1e} for {op.describe()}"


def run_conv(op, ps, lib="torch", alpha=1.25, beta=-0.5, with_c=True, bias=None, activation_args=(), seed=0,
             runs=1):
    """Run ``op`` on random operands (NaN-poisoned D); return (got, reference) as float64 NHWC arrays.

    ``bias``: None (C is a full tensor), "vector" (1-D bias of the output channels) or "expanded" (torch
    ``bias.view(1, K, 1, 1).expand(...)``, zero strides); both broadcast over N, H and W.
    """
    kind = op.conv_kind
    rng = np.random.default_rng(seed)
    element, out = op.A.element, op.C.element
    a = random_values(rng, tuple(ps.tensor_a_extent(kind)), element)
    b = random_values(rng, tuple(ps.tensor_b_extent(kind)), element)
    c_extent = tuple(ps.tensor_c_extent(kind))
    c = None
    if with_c:
        c = random_values(rng, (c_extent[3],) if bias else c_extent, out)
    A, B = to_lib(a, element, lib), to_lib(b, element, lib)
    C = None if c is None else to_lib(c, out, lib)
    if bias == "expanded":
        n, h, w, k = c_extent
        C = C.view(1, k, 1, 1).expand(n, k, h, w)
    Dt = poisoned(c_extent, out, lib)
    beta = beta if with_c else 0.0
    args = cutlass.Conv2dArguments(op, ps, A, B, C, Dt, op.epilogue_type(alpha, beta, *activation_args),
                                   split_k_slices=ps.split_k_slices)
    reference = epilogue_reference(op, conv_reference(kind, ps, a, b), c, alpha, beta, activation_args)
    for _ in range(runs):  # reused arguments: serial split-K semaphores must reset themselves
        if hasattr(Dt, "fill_"):
            Dt.fill_(float("nan") if Dt.is_floating_point() else -77)
        op.run(args)
        args.sync()
        got = from_lib(Dt, lib)
        assert_close(op, got, reference)
    return got, reference


# --- every operation on problems within its constraints ----------------------------------------------------------
# (id, operation, problem, run_conv options)
CASES = [
    # fprop
    ("f16-opt-s21", "fprop_f16_opt", problem(2, 15, 17, 32, 64, 3, 3, (1, 1), (2, 1)), {}),
    ("f16-opt-1x1-s2", "fprop_f16_opt", problem(3, 14, 14, 64, 128, 1, 1, (0, 0), (2, 2)), {}),
    ("f16-opt-dil2-asympad", "fprop_f16_opt", problem(1, 12, 13, 16, 32, 3, 3, (0, 2, 1, 0), (1, 1), (2, 2)), {}),
    ("f16-opt-numpy-nobeta", "fprop_f16_opt", problem(1, 9, 9, 16, 16, 3, 3), dict(lib="numpy", with_c=False)),
    ("f16-unity-sw4", "fprop_f16_opt_unity_sw4", problem(2, 20, 20, 32, 256, 3, 3), {}),
    ("f16-unity-sw4-7x7", "fprop_f16_opt_unity_sw4", problem(1, 17, 19, 24, 40, 7, 7, (3, 3), (1, 1)), {}),
    ("f16-analytic-f32out-5x5", "fprop_f16_analytic_f32out", problem(1, 20, 21, 24, 36, 5, 5, (2, 2), (1, 2)), {}),
    ("f16-analytic-a1-odd", "fprop_f16_analytic_a1", problem(2, 11, 10, 7, 13, 3, 3, (1, 1), (1, 1), (2, 1)), {}),
    ("f16-opt-a2", "fprop_f16_opt_a2", problem(2, 13, 12, 6, 10, 3, 3, (0, 1), (2, 2)), {}),
    ("f16-fixed-c4-7x7s2", "fprop_f16_fixed_a4", problem(2, 30, 30, 4, 64, 7, 7, (3, 3), (2, 2)), {}),
    ("f16-few-c6-7x7s2", "fprop_f16_few_a2", problem(2, 30, 30, 6, 64, 7, 7, (3, 3), (2, 2)), {}),
    ("f16-few-c2", "fprop_f16_few_a2", problem(1, 16, 17, 2, 32, 3, 3, (1, 1), (1, 1)), {}),
    ("tf32-few-c3", "fprop_tf32_few_a1", problem(2, 24, 23, 3, 32, 3, 3, (1, 1), (2, 2)), {}),
    ("bf16-opt-dil2", "fprop_bf16_opt", problem(2, 14, 15, 24, 48, 3, 3, (2, 2), (1, 1), (2, 2)), {}),
    ("tf32-unity-asympad", "fprop_tf32_opt_unity", problem(2, 15, 16, 20, 36, 3, 3, (1, 2, 0, 1), (1, 1)), {}),
    ("f32-simt-analytic-odd", "fprop_f32_simt_analytic", problem(2, 13, 11, 5, 7, 3, 3, (1, 1), (2, 2)), {}),
    ("f32-simt-opt-odd", "fprop_f32_simt_opt", problem(1, 12, 14, 9, 11, 5, 5, (2, 2), (1, 1), (1, 2)),
     dict(lib="numpy")),
    ("f64-opt-odd", "fprop_f64_opt", problem(2, 10, 11, 7, 9, 3, 3, (1, 1), (2, 2)), {}),
    ("s8-clamp", "fprop_s8_opt_clamp", problem(2, 12, 13, 48, 40, 3, 3), dict(alpha=0.05, beta=0.5)),
    ("s8-s32out-s2", "fprop_s8_analytic_s32out", problem(2, 12, 13, 32, 20, 3, 3, (1, 1), (2, 2)),
     dict(alpha=1.0, beta=1.0)),
    # dgrad
    ("f16-opt-unity", "dgrad_f16_opt_unity", problem(2, 13, 14, 64, 32, 3, 3), {}),
    ("f16-opt-unity-numpy", "dgrad_f16_opt_unity", problem(1, 9, 10, 16, 24, 1, 1, (0, 0)), dict(lib="numpy")),
    ("f16-analytic-unity-dil2", "dgrad_f16_analytic_unity", problem(1, 12, 11, 16, 24, 3, 3, (2, 2), (1, 1), (2, 2)),
     {}),
    ("f16-opt-strided-s2", "dgrad_f16_opt_strided", problem(2, 16, 15, 32, 64, 3, 3, (1, 1), (2, 2)), {}),
    ("f16-opt-strided-1x1-s3", "dgrad_f16_opt_strided", problem(2, 16, 15, 32, 64, 1, 1, (0, 0), (3, 3)), {}),
    ("f16-opt-strided-s1", "dgrad_f16_opt_strided", problem(1, 10, 11, 32, 48, 3, 3), {}),
    ("f16-analytic-strided-sw4-s23", "dgrad_f16_analytic_strided_sw4",
     problem(2, 17, 19, 40, 24, 3, 3, (1, 1), (2, 3)), {}),
    ("f16-f32out-unity", "dgrad_f16_opt_unity_f32out", problem(1, 11, 12, 24, 16, 3, 3), {}),
    ("f16-analytic-a1-odd", "dgrad_f16_analytic_a1_unity", problem(2, 9, 11, 5, 7, 3, 3), {}),
    ("bf16-opt-strided-4x4", "dgrad_bf16_opt_strided", problem(2, 16, 16, 32, 40, 4, 4, (1, 1), (2, 2)), {}),
    ("tf32-opt-unity", "dgrad_tf32_opt_unity", problem(2, 12, 13, 12, 20, 3, 3), {}),
    ("f32-simt-analytic-strided-odd", "dgrad_f32_simt_analytic_strided",
     problem(2, 13, 12, 5, 6, 3, 3, (1, 1), (2, 2)), dict(lib="numpy")),
    ("f32-simt-opt-unity-dil2", "dgrad_f32_simt_opt_unity", problem(1, 12, 12, 7, 9, 3, 3, (2, 2), (1, 1), (2, 2)),
     {}),
    ("f64-opt-strided", "dgrad_f64_opt_strided", problem(2, 11, 10, 6, 10, 3, 3, (1, 1), (2, 2)), {}),
    # wgrad
    ("f16-opt-s2", "wgrad_f16_opt", problem(2, 20, 22, 16, 32, 3, 3, (1, 1), (2, 2)), {}),
    ("f16-opt-numpy", "wgrad_f16_opt", problem(2, 9, 8, 8, 16, 3, 3), dict(lib="numpy")),
    ("f16-analytic-dil2", "wgrad_f16_analytic", problem(2, 14, 13, 24, 40, 3, 3, (2, 2), (1, 1), (2, 2)), {}),
    ("f16-f32out", "wgrad_f16_opt_f32out", problem(2, 10, 10, 16, 24, 3, 3), {}),
    ("bf16-opt-1x1-s2", "wgrad_bf16_opt", problem(2, 16, 16, 64, 32, 1, 1, (0, 0), (2, 2)), {}),
    ("tf32-opt-s2-dil2", "wgrad_tf32_opt", problem(3, 20, 22, 12, 20, 3, 3, (2, 2), (2, 2), (2, 2)), {}),
    ("tf32-analytic-a1-odd", "wgrad_tf32_analytic_a1", problem(2, 11, 12, 5, 7, 3, 3, (1, 1), (2, 1)), {}),
    ("f32-simt-opt", "wgrad_f32_simt_opt", problem(2, 10, 9, 6, 10, 5, 5, (2, 2)), {}),
    ("f64-opt", "wgrad_f64_opt", problem(2, 9, 10, 4, 8, 3, 3, (1, 1), (1, 2)), {}),
    ("f64-simt-analytic-odd", "wgrad_f64_simt_analytic", problem(2, 11, 9, 3, 5, 3, 3, (1, 1), (2, 2)), {}),
]


@pytest.mark.parametrize("name,ps,options", [c[1:] for c in CASES], ids=[f"{c[1].split('_')[0]}-{c[0]}" for c in CASES])
def test_conv(name, ps, options):
    run_conv(CONV_OPS[name], ps, **options)


def test_every_operation_has_a_case():
    covered = {c[1] for c in CASES} | {"fprop_f16_relu", "fprop_s8_il_opt", "fprop_s8_il_analytic",
                                       "dgrad_tf32_opt_strided_s3"}
    assert covered == set(CONV_OPS)


@pytest.mark.parametrize("lib", LIBS)
@pytest.mark.parametrize("name", ["fprop_f16_opt", "wgrad_f16_opt"])
def test_tensor_libraries(lib, name):
    if lib == "cupy":
        pytest.importorskip("cupy")
    run_conv(CONV_OPS[name], problem(2, 10, 11, 16, 24, 3, 3, (1, 1), (2, 1)), lib=lib)


@pytest.mark.parametrize("bias", ["vector", "expanded"])
def test_bias_relu(bias):
    """D = relu(conv(x, w) + bias): a bias vector of K as C with beta = 1 (zero strides over N, P and Q)."""
    op = CONV_OPS["fprop_f16_relu"]
    got, ref = run_conv(op, problem(2, 14, 15, 32, 48, 3, 3, (1, 1), (2, 2)), alpha=1.0, beta=1.0, bias=bias)
    assert (got >= 0).all() and (ref == 0).mean() > 0.2  # relu did something


def test_bias_vector_numpy():
    run_conv(CONV_OPS["fprop_f16_relu"], problem(1, 8, 9, 16, 16, 3, 3), lib="numpy", alpha=1.0, beta=1.0,
             bias="vector")


@pytest.mark.parametrize("name,ps", [
    ("fprop_f16_opt", problem(2, 15, 17, 64, 64, 3, 3, split_k=3)),
    ("dgrad_f16_opt_unity", problem(1, 10, 10, 32, 128, 3, 3, split_k=2)),
    ("dgrad_f16_opt_strided", problem(1, 10, 10, 32, 128, 3, 3, split_k=2)),  # the strided kernel at stride 1
    ("wgrad_f16_opt", problem(4, 20, 22, 16, 32, 3, 3, split_k=4)),
    ("wgrad_tf32_opt", problem(4, 20, 22, 16, 32, 3, 3, (1, 1), (2, 2), split_k=3)),
], ids=["fprop", "dgrad-unity", "dgrad-strided", "wgrad", "wgrad-tf32"])
def test_serial_split_k(name, ps):
    run_conv(CONV_OPS[name], ps, runs=2)


# Strided dgrad with serial split-K at stride > 1 (CUTLASS's can_implement refuses it; pycutlass runs it: see
# Conv2dOperation.check_problem_size). Odd sizes; stride 2 and 3; 2 and 3 slices; slices left without K chunks;
# filter phases without taps (stride > filter) and without pixels (H < stride); every run twice on the same
# arguments (the semaphores must reset themselves).
STRIDED_SPLIT_K = [
    ("example", "dgrad_tf32_opt_strided_s3", problem(1, 27, 27, 256, 512, 3, 3, (1, 1), (2, 1), split_k=2),
     dict(alpha=1.0, beta=0.0, with_c=False)),  # PyCUTLASS 2.11's invocation, as it ran it
    ("tf32-example-beta", "dgrad_tf32_opt_strided_s3", problem(1, 27, 27, 256, 512, 3, 3, (1, 1), (2, 1), split_k=3),
     {}),
    ("f16-opt-s2-k2", "dgrad_f16_opt_strided", problem(2, 15, 13, 24, 40, 3, 3, (1, 1), (2, 2), split_k=2), {}),
    ("f16-opt-s3-k3", "dgrad_f16_opt_strided", problem(2, 17, 19, 16, 72, 3, 3, (1, 1), (3, 3), split_k=3), {}),
    ("f16-opt-1x1-s3-k2", "dgrad_f16_opt_strided", problem(2, 16, 15, 32, 64, 1, 1, (0, 0), (3, 3), split_k=2),
     {}),  # stride > filter: phases without taps write beta * C
    ("f16-opt-h2-s32-k2", "dgrad_f16_opt_strided", problem(1, 2, 9, 16, 32, 3, 3, (1, 1), (3, 2), split_k=2),
     dict(lib="numpy")),  # H < stride_h: phases without pixels leave early
    ("f16-analytic-sw4-s23-k3", "dgrad_f16_analytic_strided_sw4",
     problem(1, 20, 17, 40, 96, 5, 5, (2, 2), (2, 3), split_k=3), {}),
    ("bf16-opt-4x4-s2-k2", "dgrad_bf16_opt_strided", problem(2, 16, 16, 32, 80, 4, 4, (1, 1), (2, 2), split_k=2),
     {}),
    ("f32-simt-s2-k3", "dgrad_f32_simt_analytic_strided", problem(2, 13, 12, 5, 6, 3, 3, (1, 1), (2, 2), split_k=3),
     {}),  # K = 6 < tile K: slices 1 and 2 get no K chunk and add zeros
    ("f64-opt-s2-k3", "dgrad_f64_opt_strided", problem(2, 11, 10, 6, 40, 3, 3, (1, 1), (2, 2), split_k=3), {}),
]


@pytest.mark.parametrize("name,ps,options", [c[1:] for c in STRIDED_SPLIT_K], ids=[c[0] for c in STRIDED_SPLIT_K])
def test_strided_dgrad_serial_split_k(name, ps, options):
    op = CONV_OPS[name]
    assert op.is_strided_dgrad and ps.split_k_slices > 1 and max(ps.stride_h, ps.stride_w) > 1
    run_conv(op, ps, runs=2, **options)


def run_f16_conv_split_k_parallel(op, ps, seed):
    """Random f16 operands (torch channels_last), D poisoned, the partials of parallel split-K written:
    (a, b, c, C, D, arguments)."""
    kind = op.conv_kind
    rng = np.random.default_rng(seed)
    a = random_values(rng, tuple(ps.tensor_a_extent(kind)), F16)
    b = random_values(rng, tuple(ps.tensor_b_extent(kind)), F16)
    c = random_values(rng, tuple(ps.tensor_c_extent(kind)), F16)
    A, B, C = to_lib(a, F16, "torch"), to_lib(b, F16, "torch"), to_lib(c, F16, "torch")
    Dt = poisoned(c.shape, F16, "torch")
    args = cutlass.Conv2dArguments(op, ps, A, B, None, None, split_k_mode=SplitKMode.Parallel,
                                   split_k_slices=ps.split_k_slices)
    op.run(args)
    return a, b, c, C, Dt, args


@pytest.mark.parametrize("name,ps,reduction", [
    ("fprop_f16_analytic_f32out", problem(2, 15, 17, 64, 64, 3, 3, split_k=4), "plain"),
    ("dgrad_f16_opt_unity_f32out", problem(2, 9, 10, 32, 64, 3, 3, split_k=3), "plain"),
    ("wgrad_f16_opt_f32out", problem(4, 16, 18, 16, 32, 3, 3, (1, 1), (2, 2), split_k=5), "relu"),
], ids=["fprop", "dgrad", "wgrad-relu"])
def test_parallel_split_k(name, ps, reduction):
    """f32 partials into a workspace owned by the arguments, then the ReductionOperation writes f16 D."""
    op = CONV_OPS[name]
    red = REDUCTION if reduction == "plain" else REDUCTION_RELU
    kind = op.conv_kind
    a, b, c, C, Dt, args = run_f16_conv_split_k_parallel(op, ps, seed=11)
    m, n = args.reduction_problem_size
    assert m * n == c.size
    # The channels_last NCHW tensors are packed NHWC: their (M, N) row-major views are what the reduction writes.
    d2, c2 = Dt.permute(0, 2, 3, 1).reshape(m, n), C.permute(0, 2, 3, 1).reshape(m, n)
    assert d2.data_ptr() == Dt.data_ptr()
    reduction_args = cutlass.ReductionArguments(red, [m, n], args.split_k_slices, args, d2, c2,
                                                red.epilogue_type(1.5, -0.5), partition_stride=args.partition_stride)
    red.run(reduction_args)
    reduction_args.sync()
    reference = 1.5 * conv_reference(kind, ps, a, b) - 0.5 * c
    if reduction == "relu":
        reference = np.maximum(reference, 0)
    assert_close(op, from_lib(Dt, "torch"), reference, 2e-3)


@pytest.mark.parametrize("name,ps", [
    ("fprop_f16_analytic_f32out", problem(2, 15, 17, 64, 64, 3, 3, split_k=3)),
    ("wgrad_f16_opt_f32out", problem(4, 16, 18, 16, 32, 3, 3, (1, 1), (2, 2), split_k=4)),
], ids=["fprop", "wgrad"])
def test_parallel_split_k_into_4d_tensors(name, ps):
    """A TensorNHWC reduction given the producer's Conv2dArguments takes D and C as the convolution's own 4-D
    channels_last tensors: N x K x P x Q for fprop, and for wgrad the filter K x C x R x S, whose packed KRSC memory
    is the K x RSC matrix the partials hold."""
    op = CONV_OPS[name]
    kind = op.conv_kind
    a, b, c, C, Dt, args = run_f16_conv_split_k_parallel(op, ps, seed=12)
    assert Dt.dim() == 4 and not Dt.is_contiguous()  # channels_last
    m, n = args.reduction_problem_size
    reduction_args = cutlass.ReductionArguments(REDUCTION_NHWC, [m, n], args.split_k_slices, args, Dt, C,
                                                REDUCTION_NHWC.epilogue_type(1.5, -0.5))
    REDUCTION_NHWC.run(reduction_args)
    reduction_args.sync()
    assert_close(op, from_lib(Dt, "torch"), 1.5 * conv_reference(kind, ps, a, b) - 0.5 * c, 2e-3)


@pytest.mark.parametrize("prereordered", [False, True])
@pytest.mark.parametrize("name", ["fprop_s8_il_opt", "fprop_s8_il_analytic"])
@pytest.mark.parametrize("lib", ["torch_nhwc", "numpy"])
def test_int8_interleaved(name, lib, prereordered):
    """NC32HW32 activation, C32RSK32 filter, NC32HW32 output with a clamping epilogue: exact, or off by one where
    float rounding of alpha * acc + beta * C ties. The filter's output channels are put in the kernels' order by
    Conv2dArguments (as PyCUTLASS's reorder_convK), or, prereordered, with reorder_interleaved_filter and
    reordered=True."""
    op = CONV_OPS[name]
    ps = problem(2, 11, 12, 64, 64, 3, 3, (1, 1), (2, 1) if "analytic" in name else (1, 1))
    rng = np.random.default_rng(5)
    a = random_values(rng, tuple(ps.activation_extent()), S8)  # NHWC
    b = random_values(rng, tuple(ps.filter_extent()), S8)  # KRSC
    c = random_values(rng, tuple(ps.output_extent()), S8)  # NPQK

    def nc32hw32(x):  # (N, H, W, C) -> (N, C/32, H, W, 32)
        n, h, w, ch = x.shape
        return x.reshape(n, h, w, ch // 32, 32).transpose(0, 3, 1, 2, 4)

    filter_c32rsk32 = b.reshape(ps.K, ps.R, ps.S, ps.C // 32, 32).transpose(3, 1, 2, 0, 4)  # (C/32, R, S, K, 32)
    A = to_lib(nc32hw32(a), S8, lib)
    B = to_lib(reorder_interleaved_filter(filter_c32rsk32) if prereordered else filter_c32rsk32, S8, lib)
    C = to_lib(nc32hw32(c), S8, lib)
    Dt = poisoned(nc32hw32(np.zeros(tuple(ps.output_extent()))).shape, S8, lib)
    alpha, beta = 0.05, 0.5
    B_before = from_lib(B, lib).copy()
    args = cutlass.Conv2dArguments(op, ps, A, B, C, Dt, op.epilogue_type(alpha, beta), reordered=prereordered)
    op.run(args)
    args.sync()
    assert np.array_equal(from_lib(B, lib), B_before)  # the caller's filter is left as it is
    got = from_lib(Dt, lib).transpose(0, 2, 3, 1, 4).reshape(tuple(ps.output_extent()))  # back to NPQK
    reference = epilogue_reference(op, conv_reference(FPROP, ps, a, b), c, alpha, beta)
    assert (np.abs(reference) < 127).mean() > 0.5  # not everything saturated
    assert_close(op, got, reference)


def test_convolution_mode():
    """Mode.convolution flips the filter: the reference is cross-correlation with w[:, ::-1, ::-1, :]."""
    ps = problem(2, 12, 13, 16, 24, 3, 5, (1, 2), (1, 2), mode=Mode.convolution)
    run_conv(CONV_OPS["fprop_f16_analytic_f32out"], ps)


@pytest.mark.parametrize("name", list(NVRTC_OPS))
def test_nvrtc_backend(name):
    op = NVRTC_OPS[name]
    cutlass.compiler.nvrtc()
    try:
        assert cutlass.compiler.Compiler.of().lookup(op) is not None
        run_conv(op, problem(2, 15, 17, 32, 64, 3, 3, (1, 1), (2, 1)))
    finally:
        cutlass.compiler.nvcc()


def test_rejections():
    """Problems an operation cannot run raise ArgumentError naming the constraint, before any launch."""
    import torch

    cl = torch.channels_last

    def tensors(ps, kind, c=None):
        def t(extent):
            n, h, w, ch = extent
            return torch.zeros(n, ch, h, w, dtype=torch.float16, device="cuda").to(memory_format=cl)

        return t(ps.tensor_a_extent(kind)), t(ps.tensor_b_extent(kind)), None, t(ps.tensor_c_extent(kind))

    ps = problem(1, 8, 8, 12, 16, 3, 3)  # C = 12: not a multiple of the 8-element accesses
    with pytest.raises(cutlass.ArgumentError, match="channel alignment"):
        cutlass.Conv2dArguments(CONV_OPS["fprop_f16_opt"], ps, *tensors(ps, FPROP))
    ps = problem(1, 8, 8, 16, 16, 3, 3, (1, 1), (2, 2))
    with pytest.raises(cutlass.ArgumentError, match="Unity"):
        cutlass.Conv2dArguments(CONV_OPS["dgrad_f16_opt_unity"], ps, *tensors(ps, DGRAD))
    ps = problem(1, 8, 8, 16, 16, 3, 3)
    A, B, _, Dt = tensors(ps, FPROP)
    with pytest.raises(cutlass.ArgumentError, match="channels_last"):
        cutlass.Conv2dArguments(CONV_OPS["fprop_f16_opt"], ps, A.contiguous(), B, None, Dt)  # NCHW-contiguous
    ps = problem(1, 8, 8, 8, 16, 3, 3)
    with pytest.raises(cutlass.ArgumentError, match="fixed_channels"):
        cutlass.Conv2dArguments(CONV_OPS["fprop_f16_fixed_a4"], ps, *tensors(ps, FPROP))
